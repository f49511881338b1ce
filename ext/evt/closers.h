/* IO#close, #close_read and #close_write as evt prepends them (closers.c). */
#ifndef EVT_CLOSERS_H
#define EVT_CLOSERS_H

#include "core.h"

/* Defines Evt::CloseWakesWaiters, prepended to IO, and Evt::SocketShutdownWakesWaiters. */
void evt_closers_init(VALUE mEvt);

#endif
