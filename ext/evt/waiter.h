/* Waiters (waiter.c): a suspended fiber's place in the loop's structures, and waking it. */
#ifndef EVT_WAITER_H
#define EVT_WAITER_H

#include "registration.h"

static inline void
evt_waiter_init(struct evt_waiter *w, VALUE fiber)
{
    w->fiber = fiber;
    w->io = Qnil;
    w->op = NULL;
    evt_list_init(&w->ready_link);
    evt_list_init(&w->io_link);
    evt_timer_init(&w->timer, EVT_TIMER_WAITER);
    w->owner = NULL;
    w->fd = -1;
    w->events = 0;
    w->ready = 0;
    w->outcome = EVT_INTERRUPTED;
    w->state = EVT_IDLE;
    w->unblockable = 0;
    w->allocated = 0;
}

void evt_waiter_attach(struct evt_loop *loop, struct evt_waiter *w, VALUE io);
/* Takes the waiter out of everything it waits on (not out of the ready queue). */
void evt_waiter_detach(struct evt_loop *loop, struct evt_waiter *w);
void evt_waiter_ready(struct evt_loop *loop, struct evt_waiter *w);
void evt_waiter_ready_first(struct evt_loop *loop, struct evt_waiter *w);
/* Wakes a waiting waiter with `outcome` (and, for EVT_IO_READY, the events that arrived). */
void evt_waiter_wake(struct evt_loop *loop, struct evt_waiter *w, enum evt_outcome outcome, int ready);

/* The backends' reports, evt_waiter_fired and evt_waiter_done, are declared in backend.h. */

#endif
