/* Registrations (registration.c): what the loop knows about each descriptor number. */
#ifndef EVT_REGISTRATION_H
#define EVT_REGISTRATION_H

#include "core.h"

struct evt_registration *evt_registration_get(struct evt_loop *loop, int fd, VALUE io);
/* Has the backend watch what reg's waiters want. 0, or -errno. */
int evt_registration_arm(struct evt_loop *loop, int fd, struct evt_registration *reg);
/* A waiter for `events` joins reg: arms the backend when the interest grows, or was not armed for
 * this IO yet. 0, or -errno with the counts as they were. */
int evt_registration_join(struct evt_loop *loop, int fd, struct evt_registration *reg, int events);
/* Waiter w left its registration: keeps the kernel's interest equal to what the others want. */
void evt_registration_leave(struct evt_loop *loop, struct evt_waiter *w);

/* The registration of fd, or NULL if the loop never had one. */
static inline struct evt_registration *
evt_registration_find(const struct evt_loop *loop, int fd)
{
    return fd >= 0 && fd < loop->registrations_size ? loop->registrations[fd] : NULL;
}

#endif
