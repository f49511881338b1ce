/* The IO hooks (io.c): io_wait and the transfers, one primitive under both interface conventions. */
#ifndef EVT_IO_H
#define EVT_IO_H

#include "core.h"

/* nil -> -1 (no limit); otherwise nanoseconds, with Kernel#sleep's errors for bad values. */
int64_t evt_io_timeout_ns(VALUE timeout);
void evt_io_init(VALUE cLoop);

/* For the selector: */
VALUE evt_io_wait_once(VALUE self, VALUE io, VALUE events);
VALUE evt_io_transfer_minimum(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset, VALUE from, int events);
VALUE evt_io_transfer_single(VALUE self, VALUE io, VALUE buffer, VALUE offset, VALUE length, VALUE from, int events);

#endif
