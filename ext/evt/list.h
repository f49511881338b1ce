/* An intrusive, circular, doubly linked list: nodes live inside the structures they link (usually
 * on a waiting fiber's stack), so linking and unlinking never allocate. */
#ifndef EVT_LIST_H
#define EVT_LIST_H

#include <stddef.h>

struct evt_list {
    struct evt_list *prev, *next;
};

#define evt_container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

static inline void
evt_list_init(struct evt_list *list)
{
    list->prev = list->next = list;
}

static inline int
evt_list_empty(const struct evt_list *list)
{
    return list->next == list;
}

/* A node is linked when it is in some list; an unlinked node points at itself. */
static inline int
evt_list_linked(const struct evt_list *node)
{
    return node->next != node;
}

static inline void
evt_list_append(struct evt_list *head, struct evt_list *node)
{
    node->prev = head->prev;
    node->next = head;
    head->prev->next = node;
    head->prev = node;
}

static inline void
evt_list_prepend(struct evt_list *head, struct evt_list *node)
{
    evt_list_append(head->next, node);
}

static inline void
evt_list_remove(struct evt_list *node)
{
    node->prev->next = node->next;
    node->next->prev = node->prev;
    evt_list_init(node);
}

#endif
