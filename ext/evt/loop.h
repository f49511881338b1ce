/* The loop's driver (loop.c). */
#ifndef EVT_LOOP_H
#define EVT_LOOP_H

#include "core.h"

/* How evt_loop_run drives the loop, as libuv's uv_run modes. */
enum evt_run_mode {
    EVT_RUN_DEFAULT, /* turns until no fiber waits (Evt::Loop#run) */
    EVT_RUN_UNTIL,   /* turns until `until` (the loop fiber's own waiter) is resumed; others run meanwhile */
    EVT_RUN_ONCE,    /* a selector's select(timeout): one turn, blocking up to `timeout` ns (-1: no limit)
                        only when there was nothing to do; returns the waiters its events woke */
    EVT_RUN_ALONE,   /* a selector's loop fiber waiting itself: until `until` is woken, nothing else runs */
};

/* One call of the loop's driver: what it is asked, and (EVT_RUN_ONCE) what it did. */
struct evt_run {
    enum evt_run_mode mode;
    struct evt_waiter *until; /* EVT_RUN_UNTIL, EVT_RUN_ALONE: the waiter to run until */
    int64_t timeout;          /* EVT_RUN_ONCE: the longest wait, in ns (-1: no limit) */
    size_t queued;            /* out: the fibers ready when its last turn began */
    int woke;                 /* EVT_RUN_ONCE, out: the waiters its events woke */
    int64_t idle_ns;          /* EVT_RUN_ONCE, out: the time it spent blocked in the kernel */
};

/* The one driver of the loop. Every mode collects events with the same step. */
void evt_loop_run(struct evt_loop *loop, struct evt_run *run);

/* A push (a selector's): `object` (a Fiber, or anything answering alive? and transfer) runs on a later
 * select. From any thread holding the GVL. */
void evt_loop_push(struct evt_loop *loop, VALUE object);
void evt_loop_init(void);

#endif
