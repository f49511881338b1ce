/* The poll backend (POSIX: Linux, macOS, the BSDs), for where neither io_uring nor epoll runs.
 *
 * One pollfd array lives across waits: slot 0 is the wakeup descriptor; a registration holds the
 * slot its `index` names only while a waiter wants events (added by arm, swap-removed by disarm:
 * O(1)). poll(2) is level-triggered, which suits the core: it waits only after EAGAIN, and a woken
 * waiter's events leave the slot at once. wait() copies what arrived, with the generations, into an
 * array of its own: dispatching (and the requests served before it) disarms, which moves slots. */
#include "loop.h"

#ifdef HAVE_POLL_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_SYS_EVENTFD_H
#include <sys/eventfd.h>
#endif

#define INITIAL_CAPACITY 64

/* An event copied out of the pollfd array by wait(), for dispatch(). */
struct poll_ready {
    int fd;
    uint32_t generation;
    short revents;
};

struct poll_backend {
    int wakeup_read;                  /* slot 0: readable once another thread or a signal woke us */
    int wakeup_write;                 /* the same eventfd, or the pipe's other end */
    int woken;                        /* the last wait saw the wakeup descriptor readable */
    nfds_t count;                     /* slots in use, the wakeup descriptor's included */
    nfds_t capacity;                  /* of each of the three arrays */
    struct pollfd *fds;
    struct evt_registration **regs;   /* the registration in each slot (regs[0]: none) */
    int ready_count;                  /* entries the last wait collected */
    struct poll_ready *ready;
};

/* The wakeup descriptor(s): an eventfd, or a self-pipe. Non-blocking (a wakeup never waits, a
 * drain stops when empty) and close-on-exec. 0, or -errno with nothing left open. */
static int
wakeup_open(int fds[2])
{
#ifdef HAVE_SYS_EVENTFD_H
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return -errno;
    fds[0] = fds[1] = fd;
    return 0;
#elif defined(HAVE_PIPE2)
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
    return 0;
#else
    if (pipe(fds) < 0) return -errno;
    for (int i = 0; i < 2; i++) {
        int flags = fcntl(fds[i], F_GETFL);
        if (flags < 0 || fcntl(fds[i], F_SETFL, flags | O_NONBLOCK) < 0 || fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0) {
            int err = errno;
            (void)close(fds[0]);
            (void)close(fds[1]);
            return -err;
        }
    }
    return 0;
#endif
}

static void
wakeup_close(int read_fd, int write_fd)
{
    /* close(2) errors leave nothing to do: the descriptor is released either way. */
    (void)close(read_fd);
    if (write_fd != read_fd) (void)close(write_fd);
}

static const char *
poll_probe(void)
{
    int fds[2] = {-1, -1};
    int err = wakeup_open(fds);
    if (err < 0) return evt_out_of_descriptors(-err) ? NULL : strerror(-err);
    wakeup_close(fds[0], fds[1]);
    return NULL;
}

/* The arrays come from malloc, not ruby_xmalloc: running short is an -ENOMEM the core raises,
 * rather than an exception from inside open or arm with descriptors or arrays half made. */
static void
poll_free(struct poll_backend *backend)
{
    free(backend->fds);
    free(backend->regs);
    free(backend->ready);
    free(backend);
}

static int
poll_open(struct evt_loop *loop)
{
    struct poll_backend *backend = calloc(1, sizeof(*backend));
    if (!backend) return -ENOMEM;
    backend->capacity = INITIAL_CAPACITY;
    backend->fds = malloc(INITIAL_CAPACITY * sizeof(*backend->fds));
    backend->regs = malloc(INITIAL_CAPACITY * sizeof(*backend->regs));
    backend->ready = malloc(INITIAL_CAPACITY * sizeof(*backend->ready));
    if (!backend->fds || !backend->regs || !backend->ready) {
        poll_free(backend);
        return -ENOMEM;
    }
    int fds[2] = {-1, -1};
    int err = wakeup_open(fds);
    if (err < 0) {
        poll_free(backend);
        return err;
    }
    backend->wakeup_read = fds[0];
    backend->wakeup_write = fds[1];
    backend->fds[0] = (struct pollfd){.fd = fds[0], .events = POLLIN};
    backend->regs[0] = NULL;
    backend->count = 1;
    loop->backend_data = backend;
    return 0;
}

static void
poll_close(struct evt_loop *loop)
{
    struct poll_backend *backend = loop->backend_data;
    wakeup_close(backend->wakeup_read, backend->wakeup_write);
    poll_free(backend);
}

/* Doubles the three arrays together. A failure part way leaves a bigger block behind, which is
 * harmless: capacity only changes once all three have grown. */
static int
poll_grow(struct poll_backend *backend)
{
    if (backend->capacity > INT_MAX / 2) return -ENOMEM; /* slots are ints in reg->index */
    nfds_t capacity = backend->capacity * 2;
    struct pollfd *fds = realloc(backend->fds, capacity * sizeof(*fds));
    if (!fds) return -ENOMEM;
    backend->fds = fds;
    struct evt_registration **regs = realloc(backend->regs, capacity * sizeof(*regs));
    if (!regs) return -ENOMEM;
    backend->regs = regs;
    struct poll_ready *ready = realloc(backend->ready, capacity * sizeof(*ready));
    if (!ready) return -ENOMEM;
    backend->ready = ready;
    backend->capacity = capacity;
    return 0;
}

static short
poll_events(int events)
{
    short result = 0;
    if (events & EVT_READABLE) result |= POLLIN;
    if (events & EVT_PRIORITY) result |= POLLPRI;
    if (events & EVT_WRITABLE) result |= POLLOUT;
    return result;
}

static int
poll_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    struct poll_backend *backend = loop->backend_data;
    if (!reg->trusted) {
        /* Once per IO on the descriptor. poll(2) calls files always ready where epoll refuses them
         * with EPERM; say so as epoll does, so that every backend wakes their waiters alike (a
         * PRIORITY wait on a file included, which poll would never report). */
        struct stat st;
        if (fstat(fd, &st) < 0) return -errno;
        if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode)) return -EPERM;
        reg->trusted = 1;
    }
    int index = reg->index;
    if (index < 0) {
        if (backend->count == backend->capacity) {
            int err = poll_grow(backend);
            if (err < 0) return err;
        }
        index = (int)backend->count++;
        backend->fds[index].fd = fd;
        backend->regs[index] = reg;
        reg->index = index;
    }
    backend->fds[index].events = poll_events(reg->events);
    reg->interest = reg->events;
    return 0;
}

static void
poll_disarm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    int index = reg->index;
    if (index < 0) return; /* never armed (a file), or the backend was closed since */
    struct poll_backend *backend = loop->backend_data;
    nfds_t last = --backend->count;
    if ((nfds_t)index != last) {
        backend->fds[index] = backend->fds[last];
        backend->regs[index] = backend->regs[last];
        backend->regs[index]->index = index;
    }
    reg->index = -1;
    reg->interest = 0;
}

static int
poll_wait(struct evt_loop *loop, int64_t timeout_ns)
{
    struct poll_backend *backend = loop->backend_data;
    backend->ready_count = 0;
    backend->woken = 0;
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
    /* Copied out now: slots move when dispatching disarms. n counts the slots with revents. */
    int found = 0, ready = 0;
    for (nfds_t i = 0; i < backend->count && found < n; i++) {
        short revents = backend->fds[i].revents;
        if (!revents) continue;
        found++;
        if (i == 0) {
            backend->woken = 1;
            continue;
        }
        backend->ready[ready++] = (struct poll_ready){
            .fd = backend->fds[i].fd,
            .generation = backend->regs[i]->generation,
            .revents = revents,
        };
    }
    backend->ready_count = ready;
    return found;
}

static void
poll_dispatch(struct evt_loop *loop)
{
    struct poll_backend *backend = loop->backend_data;
    int count = backend->ready_count;
    backend->ready_count = 0;
    if (backend->woken) {
        backend->woken = 0;
#ifdef HAVE_SYS_EVENTFD_H
        uint64_t value;
        /* EAGAIN: another wakeup already drained it. */
        (void)!read(backend->wakeup_read, &value, sizeof(value));
#else
        char buffer[64];
        while (read(backend->wakeup_read, buffer, sizeof(buffer)) == (ssize_t)sizeof(buffer)) continue;
#endif
    }
    for (int i = 0; i < count; i++) {
        struct poll_ready *entry = &backend->ready[i];
        int events = 0;
        if (entry->revents & POLLIN) events |= EVT_READABLE;
        if (entry->revents & POLLPRI) events |= EVT_PRIORITY;
        if (entry->revents & POLLOUT) events |= EVT_WRITABLE;
        /* Level-triggered: an error, hang-up or closed descriptor (POLLNVAL) is reported again on
         * every wait, so it must wake every waiter, which then meets the error itself (EBADF for
         * POLLNVAL) and stops waiting; a waiter left out would make the loop spin. */
        if (entry->revents & (POLLERR | POLLHUP | POLLNVAL)) events |= EVT_EVENTS;
        evt_loop_io_ready(loop, entry->fd, entry->generation, events);
    }
}

static void
poll_wakeup(struct evt_loop *loop)
{
    struct poll_backend *backend = loop->backend_data;
#ifdef HAVE_SYS_EVENTFD_H
    uint64_t one = 1;
#else
    char one = 1;
#endif
    /* EAGAIN means the counter is non-zero, or the pipe full: the wait ends anyway. */
    (void)!write(backend->wakeup_write, &one, sizeof(one));
}

const struct evt_backend evt_backend_poll = {
    .name = "poll",
    .probe = poll_probe,
    .open = poll_open,
    .close = poll_close,
    .arm = poll_arm,
    .disarm = poll_disarm,
    .wait = poll_wait,
    .dispatch = poll_dispatch,
    .wakeup = poll_wakeup,
};

#endif
