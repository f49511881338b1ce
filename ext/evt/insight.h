/* What the loop shows of itself: its counters, its waits, the stall watch (insight.c). */
#ifndef EVT_INSIGHT_H
#define EVT_INSIGHT_H

#include "core.h"

void evt_insight_init(VALUE cLoop);

#endif
