/* Waits (wait.c): one suspension of the current fiber, made by one of the constructors below and run
 * by evt_wait_suspend. The whole of it (linking the waiter into the loop's structures, switching
 * away, unlinking) runs under rb_ensure, so however the fiber is unwound the waiter has left every
 * structure before its stack frame goes away. */
#ifndef EVT_WAIT_H
#define EVT_WAIT_H

#include "core.h"

enum evt_wait_kind { EVT_WAIT_IO, EVT_WAIT_BLOCK, EVT_WAIT_YIELD, EVT_WAIT_START, EVT_WAIT_SELECT, EVT_WAIT_OP };

/* io_select's IOs: a waiter each, all waking the select's own waiter. */
struct evt_selection {
    long count;
    VALUE *ios;
    int *fds;
    int *events;
    struct evt_waiter *waiters;
};

struct evt_wait {
    /* The header every kind shares. */
    struct evt_waiter waiter;        /* what the loop's structures hold meanwhile */
    struct evt_loop *loop;
    enum evt_wait_kind kind;
    int64_t timeout;                 /* -1: none */
    unsigned forks;                  /* the loop's, when made: a wait resumed in a forked child is the parent's */
    unsigned epoch;                  /* the loop's, when made: a wait the loop has forgotten since is left alone */
    int64_t since;                   /* when it began, to the loop's turn (the loop's last clock reading) */
    VALUE subject;                   /* what it is for, as Evt::Loop#waits shows it: a block's blocker (nil:
                                        a sleep), the IO a close waits on; on the stack, so the GC sees it */
    /* What one kind needs besides (its constructor sets it; nothing else is read). */
    union {
        struct {
            int ready_now;           /* these events are ready already: to the ready queue */
        } io;                        /* EVT_WAIT_IO */
        struct {
            VALUE target;            /* the new fiber */
            int argc;                /* what to transfer to it (the selector's resume) */
            const VALUE *argv;
            int raise;               /* Fiber#raise it with argv instead (kw_splat: keywords) */
            int kw_splat;
            VALUE value;             /* what came back to the starter */
        } start;                     /* EVT_WAIT_START */
        struct evt_selection *selection; /* EVT_WAIT_SELECT */
        struct {
            struct evt_op *op;
            VALUE buffer;            /* the IO::Buffer, locked by us while the kernel may write to it */
            int locked;
        } op;                        /* EVT_WAIT_OP */
    } as;
};

/* Until fd (of io) has one of `events`, or `timeout` ns (-1: none). */
void evt_wait_io(struct evt_wait *wait, struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout);
/* Until unblock, or `timeout`; `blocker` is what Ruby blocks on (nil: a sleep). */
void evt_wait_block(struct evt_wait *wait, struct evt_loop *loop, VALUE blocker, int64_t timeout);
/* Lets the other ready fibers run first (sleep(0)). */
void evt_wait_yield(struct evt_wait *wait, struct evt_loop *loop);
/* Starts `fiber`; the current fiber waits in the ready queue meanwhile. */
void evt_wait_start(struct evt_wait *wait, struct evt_loop *loop, VALUE fiber);
/* Until one of the selection's IOs is ready, or `timeout` (none and nothing to watch: until unblock). */
void evt_wait_select(struct evt_wait *wait, struct evt_loop *loop, struct evt_selection *selection, int64_t timeout);
/* Until the backend has done `op` (on io, into or from `buffer`: either may be nil), or `timeout`. */
void evt_wait_op(struct evt_wait *wait, struct evt_loop *loop, VALUE io, struct evt_op *op, VALUE buffer, int64_t timeout);

/* Suspends the current fiber on `wait`, the one way into the loop from a hook: what ended it. */
enum evt_outcome evt_wait_suspend(struct evt_wait *wait);
void evt_wait_init(void);

#endif
