/* Closing IOs that fibers wait on (close.c). */
#ifndef EVT_CLOSE_H
#define EVT_CLOSE_H

#include "core.h"

/* Raises the IOError of a read or write whose IO another fiber or thread closed. */
NORETURN(void evt_close_raise(void));
/* IO#close from any thread of this process: wakes every fiber waiting on io (the object, not just
 * its descriptor) with EVT_CLOSED, before the descriptor is closed. Returns the loop whose woken
 * fibers must run before the close goes on (Ruby 4.0, a blocking closer), or NULL. */
struct evt_loop *evt_close_io(VALUE io, int fd);
/* Ruby 4.0's io_close(fd): wakes the waiters on fd whose IO Ruby has marked closed. */
void evt_close_descriptor(struct evt_loop *loop, int fd);
/* Another thread's close of io on fd, which it asked of the loop: served on the loop's thread. */
void evt_close_heard(struct evt_loop *loop, VALUE io, int fd);
struct evt_orphan;
void evt_close_orphan_release(struct evt_orphan *orphan);

#endif
