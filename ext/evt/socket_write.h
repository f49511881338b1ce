/* BasicSocket#write as one sendmsg from the strings under evt (socket_write.c). */
#ifndef EVT_SOCKET_WRITE_H
#define EVT_SOCKET_WRITE_H

#include "core.h"

void evt_socket_write_init(VALUE mEvt);

#endif
