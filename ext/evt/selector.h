/* Evt::Selector (selector.c): the same loop, driven by async through io-event's selector interface. */
#ifndef EVT_SELECTOR_H
#define EVT_SELECTOR_H

#include "core.h"

void evt_selector_init(VALUE mEvt);

#endif
