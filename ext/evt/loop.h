/* The run loop and suspension (loop.c). */
#ifndef EVT_LOOP_H
#define EVT_LOOP_H

#include "core.h"

/* Runs the loop until no fiber waits, or until `until` (the loop fiber's own waiter) is resumed. */
void evt_loop_run(struct evt_loop *loop, struct evt_waiter *until);
/* A selector's one turn (select(duration)): the ready fibers, then the events, waiting up to `timeout`
 * ns (-1: no limit) only when there was nothing to do. Returns the waiters the events woke. */
int evt_loop_select(struct evt_loop *loop, int64_t timeout);
/* A selector's push: `object` (a Fiber, or anything answering alive? and transfer) runs on a later
 * select. From any thread holding the GVL. */
void evt_loop_push(struct evt_loop *loop, VALUE object);
/* Suspends the current fiber on `wait`, the one way into the loop from a hook: what ended it. */
enum evt_outcome evt_loop_suspend(struct evt_wait *wait);
void evt_loop_init(void);

#endif
