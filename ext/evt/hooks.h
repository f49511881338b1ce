/* The other scheduler hooks (hooks.c). */
#ifndef EVT_HOOKS_H
#define EVT_HOOKS_H

#include "core.h"

void evt_hooks_init(VALUE cLoop);

#endif
