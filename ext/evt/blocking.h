/* Ruby 4.0's BlockingOperation for the worker pool (blocking.c); knows no loop. */
#ifndef EVT_BLOCKING_H
#define EVT_BLOCKING_H

#include <ruby.h>

void evt_blocking_init(VALUE mEvt);

#endif
