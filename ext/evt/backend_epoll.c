/* The epoll backend (Linux).
 *
 * Each descriptor is registered edge-triggered, once per IO object, and stays registered between
 * waits: a wait after EAGAIN costs no epoll_ctl. The core only waits after a transfer failed with
 * EAGAIN or poll(2) found the descriptor not ready, so the next readiness is always a new edge.
 * The registration's generation rides in the event data: events for an older file that had the
 * same number (still open elsewhere, say in a forked child) are recognised and ignored. A wait hands
 * what fired to the core (kernel->fired), which dispatches. */
#include "backend.h"

#ifdef HAVE_SYS_EPOLL_H

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* A wait with a nanosecond timeout (epoll_pwait2, Linux 5.11). The precompiled gem's build calls
 * the system call itself: glibc has its wrapper only from 2.35, and the gem loads on 2.33. */
#if defined(EVT_EPOLL_PWAIT2_SYSCALL)
#include <sys/syscall.h>
/* The kernel takes a struct __kernel_timespec: the same as struct timespec where time_t is 64-bit. */
_Static_assert(sizeof(time_t) == 8, "epoll_pwait2's timespec is the kernel's only with a 64-bit time_t");
#define EPOLL_WAIT_NS 1
static int epoll_wait_ns(int epfd, struct epoll_event *events, int capacity, const struct timespec *ts)
{
    return (int)syscall(SYS_epoll_pwait2, epfd, events, capacity, ts, NULL, (size_t)0);
}
#elif defined(HAVE_EPOLL_PWAIT2)
#define EPOLL_WAIT_NS 1
static int epoll_wait_ns(int epfd, struct epoll_event *events, int capacity, const struct timespec *ts)
{
    return epoll_pwait2(epfd, events, capacity, ts, NULL);
}
#endif

/* Readiness travels as poll(2) bits (backend.h): epoll's have the same values. */
_Static_assert(EPOLLIN == POLLIN && EPOLLPRI == POLLPRI && EPOLLOUT == POLLOUT && EPOLLERR == POLLERR &&
                   EPOLLHUP == POLLHUP && EPOLLRDHUP == POLLRDHUP,
               "epoll's event bits are poll's");

#define WAKEUP_TAG UINT64_MAX

struct epoll_backend {
    int epfd;
    int capacity;                 /* of events: grows to the core's fired capacity */
    struct epoll_event *events;   /* malloc'd: grown inside wait, without the GVL */
};

static const char *
epoll_probe(void)
{
    int fd = epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) return evt_backend_out_of_descriptors(errno) ? NULL : strerror(errno);
    (void)close(fd);
    return NULL;
}

static int
epoll_open(struct evt_kernel *kernel)
{
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return -errno;
    struct epoll_event event = {.events = EPOLLIN, .data.u64 = WAKEUP_TAG};
    struct epoll_backend *backend = malloc(sizeof(*backend));
    if (!backend || epoll_ctl(epfd, EPOLL_CTL_ADD, kernel->wakeup.read_fd, &event) < 0) {
        int err = backend ? errno : ENOMEM;
        free(backend);
        (void)close(epfd);
        return -err;
    }
    backend->epfd = epfd;
    backend->capacity = 0;
    backend->events = NULL;
    kernel->data = backend;
    return 0;
}

static void
epoll_close(struct evt_kernel *kernel)
{
    struct epoll_backend *backend = kernel->data;
    (void)close(backend->epfd); /* released whatever close(2) says */
    free(backend->events);
    free(backend);
}

static int
epoll_arm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct epoll_backend *backend = kernel->data;
    struct evt_backend_slot *slot = &watch->slot;
    int known = slot->generation == watch->generation;
    if (known && !(watch->events & ~slot->interest)) return 0; /* already watched: the usual case */
    int interest = known ? slot->interest | watch->events : watch->events;
    struct epoll_event event = {
        .events = evt_backend_poll_mask(interest) | EPOLLET,
        .data.u64 = ((uint64_t)watch->generation << 32) | (uint32_t)fd,
    };
    /* A registration may survive from an earlier IO with this number, or be gone with its file. */
    int op = slot->interest ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    int result = epoll_ctl(backend->epfd, op, fd, &event);
    if (result < 0 && op == EPOLL_CTL_MOD && errno == ENOENT) result = epoll_ctl(backend->epfd, EPOLL_CTL_ADD, fd, &event);
    else if (result < 0 && op == EPOLL_CTL_ADD && errno == EEXIST) result = epoll_ctl(backend->epfd, EPOLL_CTL_MOD, fd, &event);
    if (result < 0) return -errno;
    slot->interest = interest;
    slot->generation = watch->generation;
    return 0;
}

static void
epoll_disarm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    /* Edge-triggered: an idle registration costs nothing, and keeping it saves an epoll_ctl on the
     * next wait. The kernel drops it when the file is closed. (An EPOLL_CTL_DEL before IO#close
     * would add a system call to every close of a waited IO; what a file kept open elsewhere, by a
     * dup or a child, still reports carries the old generation and is ignored.) */
}

static int
epoll_wait_events(struct evt_kernel *kernel, int64_t timeout_ns)
{
    struct epoll_backend *backend = kernel->data;
    if (backend->capacity < kernel->fired_capacity) {
        /* The core's array grew: so does ours (a failure keeps the smaller one). */
        struct epoll_event *events = realloc(backend->events, (size_t)kernel->fired_capacity * sizeof(*events));
        if (events) {
            backend->events = events;
            backend->capacity = kernel->fired_capacity;
        }
        else if (!backend->capacity) return -ENOMEM;
    }
    int n;
#ifdef EPOLL_WAIT_NS
    /* Missing before Linux 5.11; refused with EPERM by a seccomp profile that predates it. */
    static int pwait2_missing;
    if (!pwait2_missing) {
        struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
        n = epoll_wait_ns(backend->epfd, backend->events, backend->capacity, timeout_ns < 0 ? NULL : &ts);
        if (n >= 0 || (errno != ENOSYS && errno != EPERM)) goto done;
        pwait2_missing = 1;
    }
#endif
    {
        /* Milliseconds, rounded up: waking before the timer is due would only spin. */
        int ms = timeout_ns < 0 ? -1 : timeout_ns >= (int64_t)INT_MAX * 1000000 ? INT_MAX : (int)((timeout_ns + 999999) / 1000000);
        n = epoll_wait(backend->epfd, backend->events, backend->capacity, ms);
    }
#ifdef EPOLL_WAIT_NS
done:
#endif
    if (n < 0) return errno == EINTR ? 0 : -errno;
    int fired = 0;
    for (int i = 0; i < n; i++) {
        struct epoll_event *event = &backend->events[i];
        if (event->data.u64 == WAKEUP_TAG) {
            evt_wakeup_drain(&kernel->wakeup);
            continue;
        }
        kernel->fired[fired++] = (struct evt_fired){
            .fd = (int)(uint32_t)event->data.u64,
            .generation = (uint32_t)(event->data.u64 >> 32),
            .events = evt_backend_events(event->events),
        };
    }
    return fired;
}

const struct evt_backend evt_backend_epoll = {
    .name = "epoll",
    .probe = epoll_probe,
    .open = epoll_open,
    .close = epoll_close,
    .arm = epoll_arm,
    .disarm = epoll_disarm,
    .wait = epoll_wait_events,
};

#endif
