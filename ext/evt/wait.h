/* Waits (wait.c): one constructor per kind of suspension; loop.h's evt_loop_suspend runs them. */
#ifndef EVT_WAIT_H
#define EVT_WAIT_H

#include "core.h"

/* Until fd (of io) has one of `events`, or `timeout` ns (-1: none). */
void evt_wait_io(struct evt_wait *wait, struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout);
/* Until unblock, or `timeout`. */
void evt_wait_block(struct evt_wait *wait, struct evt_loop *loop, int64_t timeout);
/* Lets the other ready fibers run first (sleep(0)). */
void evt_wait_yield(struct evt_wait *wait, struct evt_loop *loop);
/* Starts `fiber`; the current fiber waits in the ready queue meanwhile. */
void evt_wait_start(struct evt_wait *wait, struct evt_loop *loop, VALUE fiber);
/* Until one of the selection's IOs is ready, or `timeout` (none and nothing to watch: until unblock). */
void evt_wait_select(struct evt_wait *wait, struct evt_loop *loop, struct evt_selection *selection, int64_t timeout);
/* Until the backend has done `op` (on io, into or from `buffer`: either may be nil), or `timeout`. */
void evt_wait_op(struct evt_wait *wait, struct evt_loop *loop, VALUE io, struct evt_op *op, VALUE buffer, int64_t timeout);

#endif
