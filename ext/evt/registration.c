/* Registrations: what the loop knows about each descriptor number (the IO on it, its generation,
 * the events its waiters want and how many want each), and keeping the backend's interest equal to
 * that. Knows waiters only as counts of events. */
#include "core.h"
#include "registration.h"

/* Never 0, which a backend slot takes for none. */
static uint32_t
next_generation(struct evt_loop *loop)
{
    if (RB_UNLIKELY(++loop->generation == 0)) loop->generation = 1;
    return loop->generation;
}

struct evt_registration *
evt_registration_get(struct evt_loop *loop, int fd, VALUE io)
{
    if (fd >= loop->registrations_size) {
        int size = loop->registrations_size ? loop->registrations_size : 64;
        while (size <= fd) size *= 2;
        REALLOC_N(loop->registrations, struct evt_registration *, size);
        for (int i = loop->registrations_size; i < size; i++) loop->registrations[i] = NULL;
        loop->registrations_size = size;
    }
    struct evt_registration *reg = loop->registrations[fd];
    if (!reg) {
        reg = ALLOC(struct evt_registration);
        reg->io = Qnil;
        reg->closing = Qnil;
        evt_list_init(&reg->waiters);
        reg->watch.generation = next_generation(loop);
        reg->watch.events = reg->armed = reg->flags = reg->exhausted = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
        evt_backend_slot_clear(&reg->watch.slot);
        loop->registrations[fd] = reg;
    }
    if (reg->io != io) {
        /* Another IO on this number (or one forgotten at GC): what the kernel and we knew was for
         * the old one. Waiters of another IO sharing the descriptor stay. */
        reg->io = io;
        reg->watch.generation = next_generation(loop);
        reg->armed = 0;
        reg->flags = 0;
        reg->exhausted = 0;
    }
    return reg;
}

/* Counts a waiter's events in or out (delta 1 or -1); returns the union of what the waiters want. */
static int
registration_count(struct evt_registration *reg, int events, int delta)
{
    static const int bits[3] = {EVT_READABLE, EVT_PRIORITY, EVT_WRITABLE};
    int wanted = 0;
    for (int i = 0; i < 3; i++) {
        if (events & bits[i]) reg->counts[i] += delta;
        if (reg->counts[i]) wanted |= bits[i];
    }
    return wanted;
}

/* Has the backend watch what reg's waiters want. 0, or -errno. */
int
evt_registration_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    int err = loop->kernel.backend->arm(&loop->kernel, fd, &reg->watch);
    reg->armed = err == 0;
    return err;
}

/* A waiter for `events` joins reg: arms the backend when the interest grows, or was not armed for
 * this IO yet. 0, or -errno with the counts as they were. */
int
evt_registration_join(struct evt_loop *loop, int fd, struct evt_registration *reg, int events)
{
    int previous = reg->watch.events;
    reg->watch.events = registration_count(reg, events, 1);
    if (reg->watch.events == previous && reg->armed) return 0;
    int err = evt_registration_arm(loop, fd, reg);
    if (err < 0) reg->watch.events = registration_count(reg, events, -1);
    return err;
}

/* A waiter left: keeps the kernel's interest equal to what the remaining waiters want. */
void
evt_registration_leave(struct evt_loop *loop, struct evt_waiter *w)
{
    struct evt_registration *reg = loop->registrations[w->fd];
    int events = registration_count(reg, w->events, -1);
    if (events == reg->watch.events) return;
    reg->watch.events = events;
    if (events) evt_registration_arm(loop, w->fd, reg); /* fewer events than before: cannot fail usefully */
    else loop->kernel.backend->disarm(&loop->kernel, w->fd, &reg->watch);
}

