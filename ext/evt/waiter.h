/* Waiters (waiter.c): a suspended fiber's place in the loop's structures, and waking it. */
#ifndef EVT_WAITER_H
#define EVT_WAITER_H

#include "registration.h"

void evt_waiter_attach(struct evt_loop *loop, struct evt_waiter *w, VALUE io);
/* Takes the waiter out of everything it waits on (not out of the ready queue). */
void evt_waiter_detach(struct evt_loop *loop, struct evt_waiter *w);
void evt_waiter_ready(struct evt_loop *loop, struct evt_waiter *w);
void evt_waiter_ready_first(struct evt_loop *loop, struct evt_waiter *w);
/* Wakes a waiting waiter with `outcome` (and, for EVT_IO_READY, the events that arrived). */
void evt_waiter_wake(struct evt_loop *loop, struct evt_waiter *w, enum evt_outcome outcome, int ready);

/* What backends report (backend.h): */
/* `events` (EVT_* bits, by evt_events_from_poll) fired on fd, registered as `generation`. */
void evt_waiter_fired(struct evt_loop *loop, int fd, uint32_t generation, int events);
/* A transfer the backend does (struct evt_op) completed with `result`. */
void evt_waiter_done(struct evt_loop *loop, struct evt_op *op, long result);

#endif
