/* The epoll backend (Linux).
 *
 * Each descriptor is registered edge-triggered, once per IO object, and stays registered between
 * waits: a wait after EAGAIN costs no epoll_ctl. The core only waits after a transfer failed with
 * EAGAIN or poll(2) found the descriptor not ready, so the next readiness is always a new edge.
 * The registration's generation rides in the event data: events for an older file that had the
 * same number (still open elsewhere, say in a forked child) are recognised and ignored. */
#include "loop.h"

#ifdef HAVE_SYS_EPOLL_H

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define WAKEUP_TAG UINT64_MAX
#define MAX_EVENTS 8192

struct epoll_backend {
    int epfd;
    int wakeup_fd;      /* eventfd: written to end a wait from another thread or a signal */
    int count;          /* events collected by the last wait */
    int capacity;
    struct epoll_event *events;
};

static const char *
epoll_probe(void)
{
    int fd = epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) return evt_out_of_descriptors(errno) ? NULL : strerror(errno);
    (void)close(fd);
    return NULL;
}

static int
epoll_open(struct evt_loop *loop)
{
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return -errno;
    int wakeup_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wakeup_fd < 0) {
        int err = errno;
        (void)close(epfd);
        return -err;
    }
    struct epoll_event event = {.events = EPOLLIN, .data.u64 = WAKEUP_TAG};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, wakeup_fd, &event) < 0) {
        int err = errno;
        (void)close(wakeup_fd);
        (void)close(epfd);
        return -err;
    }
    struct epoll_backend *backend = ALLOC(struct epoll_backend);
    backend->epfd = epfd;
    backend->wakeup_fd = wakeup_fd;
    backend->count = 0;
    backend->capacity = 256;
    backend->events = ALLOC_N(struct epoll_event, backend->capacity);
    loop->backend_data = backend;
    return 0;
}

static void
epoll_close(struct evt_loop *loop)
{
    struct epoll_backend *backend = loop->backend_data;
    /* close(2) errors leave nothing to do: the descriptor is released either way. */
    (void)close(backend->wakeup_fd);
    (void)close(backend->epfd);
    ruby_xfree(backend->events);
    ruby_xfree(backend);
}

static uint32_t
epoll_events(int events)
{
    uint32_t result = EPOLLET;
    if (events & EVT_READABLE) result |= EPOLLIN | EPOLLRDHUP;
    if (events & EVT_PRIORITY) result |= EPOLLPRI;
    if (events & EVT_WRITABLE) result |= EPOLLOUT;
    return result;
}

static int
epoll_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    struct epoll_backend *backend = loop->backend_data;
    if (reg->trusted && !(reg->events & ~reg->interest)) return 0; /* already watched: the usual case */
    int interest = reg->trusted ? reg->interest | reg->events : reg->events;
    struct epoll_event event = {
        .events = epoll_events(interest),
        .data.u64 = ((uint64_t)reg->generation << 32) | (uint32_t)fd,
    };
    /* A registration may survive from an earlier IO with this number, or be gone with its file. */
    int op = reg->interest ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    int result = epoll_ctl(backend->epfd, op, fd, &event);
    if (result < 0 && op == EPOLL_CTL_MOD && errno == ENOENT) result = epoll_ctl(backend->epfd, EPOLL_CTL_ADD, fd, &event);
    else if (result < 0 && op == EPOLL_CTL_ADD && errno == EEXIST) result = epoll_ctl(backend->epfd, EPOLL_CTL_MOD, fd, &event);
    if (result < 0) return -errno;
    reg->interest = interest;
    reg->trusted = 1;
    return 0;
}

static void
epoll_disarm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    /* Edge-triggered: an idle registration costs nothing, and keeping it saves an epoll_ctl on the
     * next wait. The kernel drops it when the file is closed. (An EPOLL_CTL_DEL before IO#close
     * would cost every close of a waited IO 1.4 us here; what a file kept open elsewhere, by a dup
     * or a child, still reports carries the old generation and is ignored.) */
}

static int
epoll_wait_events(struct evt_loop *loop, int64_t timeout_ns)
{
    struct epoll_backend *backend = loop->backend_data;
    int n;
#ifdef HAVE_EPOLL_PWAIT2
    static int pwait2_missing; /* kernels before 5.11 */
    if (!pwait2_missing) {
        struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
        n = epoll_pwait2(backend->epfd, backend->events, backend->capacity, timeout_ns < 0 ? NULL : &ts, NULL);
        if (n >= 0 || errno != ENOSYS) goto done;
        pwait2_missing = 1;
    }
#endif
    {
        /* Milliseconds, rounded up: waking before the timer is due would only spin. */
        int ms = timeout_ns < 0 ? -1 : timeout_ns >= (int64_t)INT_MAX * 1000000 ? INT_MAX : (int)((timeout_ns + 999999) / 1000000);
        n = epoll_wait(backend->epfd, backend->events, backend->capacity, ms);
    }
#ifdef HAVE_EPOLL_PWAIT2
done:
#endif
    if (n < 0) {
        if (errno != EINTR) return -errno;
        n = 0;
    }
    backend->count = n;
    return n;
}

static void
epoll_dispatch(struct evt_loop *loop)
{
    struct epoll_backend *backend = loop->backend_data;
    int count = backend->count;
    backend->count = 0;
    for (int i = 0; i < count; i++) {
        struct epoll_event *event = &backend->events[i];
        if (event->data.u64 == WAKEUP_TAG) {
            uint64_t value;
            /* EAGAIN: another wakeup already drained it. */
            (void)!read(backend->wakeup_fd, &value, sizeof(value));
            continue;
        }
        int events = 0;
        if (event->events & (EPOLLIN | EPOLLRDHUP)) events |= EVT_READABLE;
        if (event->events & EPOLLPRI) events |= EVT_PRIORITY;
        if (event->events & EPOLLOUT) events |= EVT_WRITABLE;
        if (event->events & (EPOLLERR | EPOLLHUP)) events |= EVT_READABLE | EVT_WRITABLE;
        evt_loop_io_ready(loop, (int)(uint32_t)event->data.u64, (uint32_t)(event->data.u64 >> 32), events);
    }
    if (count == backend->capacity && backend->capacity < MAX_EVENTS) {
        backend->capacity *= 2;
        REALLOC_N(backend->events, struct epoll_event, backend->capacity);
    }
}

static void
epoll_wakeup(struct evt_loop *loop)
{
    struct epoll_backend *backend = loop->backend_data;
    uint64_t one = 1;
    /* EAGAIN means the counter is already non-zero: the wait ends anyway. */
    (void)!write(backend->wakeup_fd, &one, sizeof(one));
}

const struct evt_backend evt_backend_epoll = {
    .name = "epoll",
    .probe = epoll_probe,
    .open = epoll_open,
    .close = epoll_close,
    .arm = epoll_arm,
    .disarm = epoll_disarm,
    .wait = epoll_wait_events,
    .dispatch = epoll_dispatch,
    .wakeup = epoll_wakeup,
};

#endif
