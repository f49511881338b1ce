/* Closing IOs that fibers wait on, and requests from other threads (close.c). */
#ifndef EVT_CLOSE_H
#define EVT_CLOSE_H

#include "core.h"

/* Raises the IOError of a read or write whose IO another fiber or thread closed. */
NORETURN(void evt_close_raise(void));
/* IO#close from any thread of this process: wakes every fiber waiting on io (the object, not just
 * its descriptor) with EVT_CLOSED, before the descriptor is closed. */
void evt_close_io(VALUE io, int fd);
/* Ruby 4.0's io_close(fd): wakes the waiters on fd whose IO Ruby has marked closed. */
void evt_close_descriptor(struct evt_loop *loop, int fd);
/* From another thread (holding the GVL): [io, fd] closed, or [fiber, exception] to raise. */
void evt_close_request(struct evt_loop *loop, VALUE first, VALUE second);
/* Serves the closes among the requests; returns the rest (interrupts), or nil. */
VALUE evt_close_serve(struct evt_loop *loop);
struct evt_orphan;
void evt_close_orphan_release(struct evt_orphan *orphan);
void evt_close_init(VALUE mEvt);

#endif
