/* The poll backend (POSIX: Linux, macOS, the BSDs), for where neither io_uring nor epoll runs.
 *
 * One pollfd array lives across waits: slot 0 is the core's wakeup descriptor; a registration holds
 * the slot its slot.index names only while a waiter wants events (added by arm, swap-removed by
 * disarm: O(1)). poll(2) is level-triggered, which suits the core: it waits only after EAGAIN, and a
 * woken waiter's events leave the slot at once. wait() copies what fired, with the generations, into
 * the core's kernel->fired: dispatching (and the requests served before it) disarms, which moves slots. */
#include "backend.h"

#ifdef HAVE_POLL_H

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INITIAL_CAPACITY 64

struct poll_backend {
    nfds_t count;                     /* slots in use, the wakeup descriptor's included */
    nfds_t capacity;                  /* of both arrays */
    struct pollfd *fds;
    struct evt_watch **watches;   /* the registration in each slot (watches[0]: none) */
};

static const char *
poll_probe(void)
{
    return NULL; /* poll(2) is POSIX; the wakeup descriptor is the core's */
}

/* The arrays come from malloc, not ruby_xmalloc: running short is an -ENOMEM the core raises,
 * rather than an exception from inside open or arm with arrays half made. */
static void
poll_free(struct poll_backend *backend)
{
    free(backend->fds);
    free(backend->watches);
    free(backend);
}

static int
poll_open(struct evt_kernel *kernel)
{
    struct poll_backend *backend = calloc(1, sizeof(*backend));
    if (!backend) return -ENOMEM;
    backend->capacity = INITIAL_CAPACITY;
    backend->fds = malloc(INITIAL_CAPACITY * sizeof(*backend->fds));
    backend->watches = malloc(INITIAL_CAPACITY * sizeof(*backend->watches));
    if (!backend->fds || !backend->watches) {
        poll_free(backend);
        return -ENOMEM;
    }
    backend->fds[0] = (struct pollfd){.fd = kernel->wakeup.read_fd, .events = POLLIN};
    backend->watches[0] = NULL;
    backend->count = 1;
    kernel->data = backend;
    return 0;
}

static void
poll_close(struct evt_kernel *kernel)
{
    poll_free(kernel->data);
}

/* Doubles both arrays. A failure part way leaves a bigger block behind, which is harmless:
 * capacity only changes once both have grown. */
static int
poll_grow(struct poll_backend *backend)
{
    if (backend->capacity > INT_MAX / 2) return -ENOMEM; /* slots are ints in slot.index */
    nfds_t capacity = backend->capacity * 2;
    struct pollfd *fds = realloc(backend->fds, capacity * sizeof(*fds));
    if (!fds) return -ENOMEM;
    backend->fds = fds;
    struct evt_watch **watches = realloc(backend->watches, capacity * sizeof(*watches));
    if (!watches) return -ENOMEM;
    backend->watches = watches;
    backend->capacity = capacity;
    return 0;
}

static int
poll_arm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct poll_backend *backend = kernel->data;
    struct evt_backend_slot *slot = &watch->slot;
    int err = evt_backend_slot_check(slot, fd, watch->generation);
    if (err < 0) return err;
    int index = slot->index;
    if (index < 0) {
        if (backend->count == backend->capacity) {
            err = poll_grow(backend);
            if (err < 0) return err;
        }
        index = (int)backend->count++;
        backend->fds[index].fd = fd;
        backend->watches[index] = watch;
        slot->index = index;
    }
    backend->fds[index].events = (short)evt_backend_poll_mask(watch->events);
    slot->interest = watch->events;
    return 0;
}

static void
poll_disarm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct evt_backend_slot *slot = &watch->slot;
    int index = slot->index;
    if (index < 0) return; /* never armed (a file), or the backend was closed since */
    struct poll_backend *backend = kernel->data;
    nfds_t last = --backend->count;
    if ((nfds_t)index != last) {
        backend->fds[index] = backend->fds[last];
        backend->watches[index] = backend->watches[last];
        backend->watches[index]->slot.index = index;
    }
    slot->index = -1;
    slot->interest = 0;
}

/* Level-triggered: what does not fit in kernel->fired this time is reported again by the next wait. */
static int
poll_wait(struct evt_kernel *kernel, int64_t timeout_ns)
{
    struct poll_backend *backend = kernel->data;
    int n;
#ifdef HAVE_PPOLL
    struct timespec ts = {(time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
    n = ppoll(backend->fds, backend->count, timeout_ns < 0 ? NULL : &ts, NULL);
#else
    /* Milliseconds, rounded up: waking before the timer is due would only spin. */
    int ms = timeout_ns < 0 ? -1 : timeout_ns >= (int64_t)INT_MAX * 1000000 ? INT_MAX : (int)((timeout_ns + 999999) / 1000000);
    n = poll(backend->fds, backend->count, ms);
#endif
    if (n < 0) return errno == EINTR ? 0 : -errno;
    /* Copied out now, with the generations: slots move when dispatching disarms. n counts the
     * slots with revents. */
    int found = 0, fired = 0;
    for (nfds_t i = 0; i < backend->count && found < n && fired < kernel->fired_capacity; i++) {
        short revents = backend->fds[i].revents;
        if (!revents) continue;
        found++;
        if (i == 0) {
            evt_wakeup_drain(&kernel->wakeup);
            continue;
        }
        kernel->fired[fired++] = (struct evt_fired){
            .fd = backend->fds[i].fd,
            .generation = backend->watches[i]->generation,
            .events = evt_backend_events((unsigned short)revents),
        };
    }
    return fired;
}

const struct evt_backend evt_backend_poll = {
    .name = "poll",
    .probe = poll_probe,
    .open = poll_open,
    .close = poll_close,
    .arm = poll_arm,
    .disarm = poll_disarm,
    .wait = poll_wait,
};

#endif
