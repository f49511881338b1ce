/* The kqueue backend (macOS, the BSDs; on Linux through libkqueue, an emulation over epoll).
 *
 * A waiter's interest is one one-shot knote per filter: EVFILT_READ for IO::READABLE,
 * EVFILT_WRITE for IO::WRITABLE, EVFILT_EXCEPT with NOTE_OOB for IO::PRIORITY where the kernel
 * has it. A knote ends with its report (.oneshot: the core arms again while waiters remain), so a
 * descriptor nobody waits on holds nothing in the kqueue. The registration's generation and the
 * descriptor ride in the knote's udata: a report for an older file that had the same number is
 * recognised and dropped by the core.
 *
 * The backend keeps, per descriptor, which knotes it added and has not seen end (its own table,
 * as io_uring's backend does): a wait marks the filters it reports, so that dropping a watch
 * deletes only what the kqueue still holds. A real kqueue forgets a descriptor's knotes when the
 * descriptor closes; libkqueue cannot see the close, and the next EV_ADD on the number fails.
 * So the backend deletes what is left before a close the loop sees (disarm, release), and when an
 * EV_ADD fails, it deletes the number's knotes and adds them once more before it gives up.
 *
 * Process.wait watches the child with EVFILT_PROC and NOTE_EXIT (below).
 *
 * A kqueue is not inherited by fork(2) (libkqueue closes its copies in the child): a child frees
 * the backend's memory and leaves the number alone, which may name another file by then. On Linux
 * kqueues are kept for reuse instead of closed (below: libkqueue's closes race). */
#include "core.h"
#include "waiter.h"

#ifdef HAVE_KQUEUE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/event.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#define WAKEUP_TAG ((uintptr_t)UINTPTR_MAX)
#define INITIAL_DESCRIPTORS 64
#define CHUNK 512 /* events a kevent call asks for: libkqueue's most (MAX_KEVENT) */

_Static_assert(sizeof(void *) >= sizeof(uint64_t), "a knote's udata holds a descriptor and a generation");

/* What the kqueue holds for one descriptor: the knotes added for `generation` and not yet reported
 * (EVT_READABLE, EVT_WRITABLE, EVT_PRIORITY bits). */
struct kqueue_descriptor {
    uint32_t generation;
    unsigned char knotes;
};

struct kqueue_backend {
    int kq;
    pid_t owner;                           /* the process that made kq: a forked child has none */
    int capacity;                          /* of events: grows to the core's fired capacity */
    struct kevent *events;                 /* malloc'd: grown inside wait, without the GVL */
    int descriptors_size;
    struct kqueue_descriptor *descriptors; /* by descriptor number, grown by arm (with the GVL) */
    int watches;                           /* EVFILT_PROC knotes added and not yet reported */
    int exited_count, exited_capacity;     /* the capacity is at least `watches`, grown with the GVL */
    struct evt_op **exited;                /* what a wait collected for complete() to report */
};

#ifdef EVFILT_EXCEPT
#define WATCHED (EVT_READABLE | EVT_WRITABLE | EVT_PRIORITY)
#else
#define WATCHED (EVT_READABLE | EVT_WRITABLE) /* IO::PRIORITY: only an error or end of file reports it */
#endif

static void *
tag(int fd, uint32_t generation)
{
    return (void *)(uintptr_t)(((uint64_t)generation << 32) | (uint32_t)fd);
}

/* The knote of `filter` on fd: to add for `generation` (add), or to delete. */
static void
knote(struct kevent *change, int fd, int event, int add, uint32_t generation)
{
    short filter = event == EVT_READABLE ? EVFILT_READ : EVFILT_WRITE;
    unsigned int fflags = 0;
#ifdef EVFILT_EXCEPT
    if (event == EVT_PRIORITY) {
        filter = EVFILT_EXCEPT;
        fflags = NOTE_OOB;
    }
#endif
    EV_SET(change, (uintptr_t)fd, filter, add ? EV_ADD | EV_ONESHOT : EV_DELETE, fflags, 0, add ? tag(fd, generation) : NULL);
}

/* ---- kqueues kept for reuse (libkqueue) --------------------------------------------------------
 *
 * libkqueue learns that a kqueue was closed from a thread of its own, which matches the close to a
 * kqueue by number: while other threads open and close kqueues, it can free a kqueue just made on
 * that number, and close descriptors that are no longer its own. So on Linux the backend never
 * closes a kqueue: it empties it and keeps it for the next loop of the process (Evt::Loop's
 * private close_kept closes those kept, for a caller that knows no other thread opens one). A real
 * kqueue is closed as usual. */
#ifdef __linux__
#include <pthread.h>

static pthread_mutex_t spares_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t spares_once = PTHREAD_ONCE_INIT;
static int *spares;
static int spares_count, spares_capacity;

static void
spares_before_fork(void)
{
    (void)pthread_mutex_lock(&spares_lock);
}

static void
spares_after_fork(void)
{
    (void)pthread_mutex_unlock(&spares_lock);
}

/* A child has none: libkqueue closed the parent's kqueues in it. */
static void
spares_in_child(void)
{
    spares_count = 0;
    (void)pthread_mutex_unlock(&spares_lock);
}

static void
spares_init(void)
{
    (void)pthread_atfork(spares_before_fork, spares_after_fork, spares_in_child);
}

static int
spare_take(void)
{
    (void)pthread_once(&spares_once, spares_init);
    (void)pthread_mutex_lock(&spares_lock);
    int kq = spares_count ? spares[--spares_count] : -1;
    (void)pthread_mutex_unlock(&spares_lock);
    return kq;
}

/* Whether kq, empty, was kept (else the caller closes it). */
static int
spare_keep(int kq)
{
    (void)pthread_once(&spares_once, spares_init);
    (void)pthread_mutex_lock(&spares_lock);
    if (spares_count == spares_capacity) {
        int capacity = spares_capacity ? spares_capacity * 2 : 8;
        int *grown = realloc(spares, (size_t)capacity * sizeof(*grown));
        if (grown) {
            spares = grown;
            spares_capacity = capacity;
        }
    }
    int kept = spares_count < spares_capacity;
    if (kept) spares[spares_count++] = kq;
    (void)pthread_mutex_unlock(&spares_lock);
    return kept;
}

static int
kqueue_close_kept(void)
{
    (void)pthread_once(&spares_once, spares_init);
    (void)pthread_mutex_lock(&spares_lock);
    int closed = spares_count;
    while (spares_count) (void)close(spares[--spares_count]);
    (void)pthread_mutex_unlock(&spares_lock);
    return closed;
}
#else
static int
spare_take(void)
{
    return -1;
}

static int
spare_keep(int kq)
{
    return 0;
}
#endif

/* A kqueue, a kept one if there is one: its number, or -errno. */
static int
kqueue_get(void)
{
    int kq = spare_take();
    if (kq >= 0) return kq;
    kq = kqueue();
    int err = kq < 0 || fcntl(kq, F_SETFD, FD_CLOEXEC) < 0 ? errno : 0;
    if (err) {
        if (kq >= 0) (void)close(kq);
        return -err;
    }
    return kq;
}

/* Done with kq: kept for reuse when `empty` (libkqueue), else closed. */
static void
kqueue_put(int kq, int empty)
{
    if (!empty || !spare_keep(kq)) (void)close(kq); /* released whatever close(2) says */
}

/* kqueue(2) fails only for want of descriptors or memory, which opening reports: nothing to try
 * (a kqueue made and closed for each probe would cost libkqueue a thread's work, later). */
static const char *
kqueue_probe(void)
{
    return NULL;
}

/* Adds or deletes the wakeup descriptor's knote: one for good (not one-shot), drained on each
 * report. 0, or -errno. */
static int
wakeup_knote(int kq, struct evt_loop *loop, int add)
{
    struct kevent change;
    EV_SET(&change, (uintptr_t)loop->kernel.wakeup.read_fd, EVFILT_READ, add ? EV_ADD : EV_DELETE, 0, 0, (void *)WAKEUP_TAG);
    return kevent(kq, &change, 1, NULL, 0, NULL) < 0 ? -errno : 0;
}

static int
kqueue_open(struct evt_loop *loop)
{
    struct kqueue_backend *backend = calloc(1, sizeof(*backend));
    if (!backend) return -ENOMEM;
    int kq = kqueue_get();
    int err = kq < 0 ? kq : wakeup_knote(kq, loop, 1);
    if (err < 0) {
        if (kq >= 0) kqueue_put(kq, 0);
        free(backend);
        return err;
    }
    backend->kq = kq;
    backend->owner = getpid();
    loop->kernel.data = backend;
    return 0;
}

/* Deletes what the backend added to its kqueue: whether all of it went. */
static int
kqueue_empty(struct evt_loop *loop)
{
    struct kqueue_backend *backend = loop->kernel.data;
    int empty = wakeup_knote(backend->kq, loop, 0) == 0;
    for (int fd = 0; fd < backend->descriptors_size; fd++) {
        for (int event = 1; event <= EVT_WRITABLE; event <<= 1) {
            if (!(backend->descriptors[fd].knotes & event)) continue;
            struct kevent change;
            knote(&change, fd, event, 0, 0);
            if (kevent(backend->kq, &change, 1, NULL, 0, NULL) < 0 && errno != ENOENT) empty = 0;
        }
    }
    return empty;
}

static void
kqueue_close(struct evt_loop *loop)
{
    struct kqueue_backend *backend = loop->kernel.data;
    /* In a forked child the number is not a kqueue of this process: it may name another file. */
    if (backend->owner == getpid()) {
        kqueue_put(backend->kq, kqueue_empty(loop));
    }
    free(backend->events);
    free(backend->descriptors);
    free(backend->exited);
    free(backend);
}

/* The backend's entry for fd, the table grown to hold it; NULL when memory runs out. */
static struct kqueue_descriptor *
descriptor(struct kqueue_backend *backend, int fd)
{
    if (fd < backend->descriptors_size) return &backend->descriptors[fd];
    if (fd > INT_MAX / 2) return NULL;
    int size = backend->descriptors_size ? backend->descriptors_size : INITIAL_DESCRIPTORS;
    while (size <= fd) size *= 2;
    struct kqueue_descriptor *grown = realloc(backend->descriptors, (size_t)size * sizeof(*grown));
    if (!grown) return NULL;
    memset(grown + backend->descriptors_size, 0, (size_t)(size - backend->descriptors_size) * sizeof(*grown));
    backend->descriptors = grown;
    backend->descriptors_size = size;
    return &backend->descriptors[fd];
}

/* Deletes the knotes of `events` on fd one by one, whatever each answers (ENOENT: it had ended). */
static void
delete_knotes(struct kqueue_backend *backend, int fd, int events)
{
    for (int event = 1; event <= EVT_WRITABLE; event <<= 1) {
        if (!(events & event)) continue;
        struct kevent change;
        knote(&change, fd, event, 0, 0);
        (void)kevent(backend->kq, &change, 1, NULL, 0, NULL);
    }
}

/* Adds a knote for each event wanted and deletes those not wanted any more, in one call. */
static int
apply(struct kqueue_backend *backend, int fd, int add, int delete, uint32_t generation)
{
    struct kevent changes[3];
    int n = 0;
    for (int event = 1; event <= EVT_WRITABLE; event <<= 1) {
        if (add & event) knote(&changes[n++], fd, event, 1, generation);
        else if (delete & event) knote(&changes[n++], fd, event, 0, 0);
    }
    if (n == 0 || kevent(backend->kq, changes, n, NULL, 0, NULL) == 0) return 0;
    /* A delete of a knote that ended as the wait reported it is no failure. */
    if (errno == ENOENT && !add) return 0;
    /* libkqueue's errno is not always set. */
    return errno ? -errno : -EBADF;
}

static int
kqueue_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    struct kqueue_backend *backend = loop->kernel.data;
    struct evt_backend_slot *slot = &reg->slot;
    if (slot->generation != reg->generation) {
        /* Once per IO on the descriptor: a file, directory or block device is always ready (kqueue
         * reports a regular file readable only before its end, and libkqueue refuses some): say
         * so as epoll does, so that every backend wakes their waiters alike. */
        struct stat st;
        if (fstat(fd, &st) < 0) return -errno;
        if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode)) return -EPERM;
        slot->generation = reg->generation;
    }
    struct kqueue_descriptor *d = descriptor(backend, fd);
    if (!d) return -ENOMEM;
    /* Knotes of an older file on the number: a real kqueue dropped them at its close. */
    int held = d->generation == reg->generation ? d->knotes : 0;
    int want = reg->events & WATCHED;
    /* Every knote wanted is added again: one that was reported has ended, and the core arms after
     * each report. Adding one that is still there only renews it. */
    errno = 0;
    int err = apply(backend, fd, want, held & ~want, reg->generation);
    if (err < 0 && err != -ENOMEM) {
        /* Knotes left by a file closed without EV_DELETE (libkqueue): gone, then once more. */
        delete_knotes(backend, fd, WATCHED);
        errno = 0;
        err = apply(backend, fd, want, 0, reg->generation);
    }
    d->generation = reg->generation;
    d->knotes = err < 0 ? 0 : (unsigned char)want;
    slot->interest = reg->events;
    return err;
}

static void
kqueue_disarm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    struct kqueue_backend *backend = loop->kernel.data;
    reg->slot.interest = 0;
    if (fd >= backend->descriptors_size) return;
    struct kqueue_descriptor *d = &backend->descriptors[fd];
    if (d->knotes && d->generation == reg->generation) {
        errno = 0;
        (void)apply(backend, fd, 0, d->knotes, 0); /* a failure: the descriptor is gone already */
    }
    d->knotes = 0;
}

/* A waiter leaving does not always disarm first (the last one of an IO that closes): nothing of
 * the file may stay in a libkqueue that cannot see the close. */
static void
kqueue_release(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    kqueue_disarm(loop, fd, reg);
}

static int
kqueue_wait(struct evt_loop *loop, int64_t timeout_ns)
{
    struct kqueue_backend *backend = loop->kernel.data;
    if (backend->capacity < loop->kernel.fired_capacity) {
        /* The core's array grew: so does ours (a failure keeps the smaller one). */
        struct kevent *events = realloc(backend->events, (size_t)loop->kernel.fired_capacity * sizeof(*events));
        if (events) {
            backend->events = events;
            backend->capacity = loop->kernel.fired_capacity;
        }
        else if (!backend->capacity) return -ENOMEM;
    }
    /* libkqueue hands out at most CHUNK events a call, however many it has: while a call returns
     * all it was asked for, the next looks for more, without waiting. */
    struct timespec ts = {(time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
    static const struct timespec no_wait = {0, 0};
    const struct timespec *limit = timeout_ns < 0 ? NULL : &ts;
    int n = 0;
    for (;;) {
        int ask = backend->capacity - n < CHUNK ? backend->capacity - n : CHUNK;
        int got = kevent(backend->kq, NULL, 0, backend->events + n, ask, limit);
        if (got < 0) {
            if (n) break; /* what the earlier calls took is reported */
            return errno == EINTR ? 0 : -errno;
        }
        n += got;
        if (got < ask || n == backend->capacity) break;
        limit = &no_wait;
    }
    int fired = 0;
    for (int i = 0; i < n; i++) {
        struct kevent *event = &backend->events[i];
        if ((uintptr_t)event->udata == WAKEUP_TAG) {
            evt_wakeup_drain(&loop->kernel.wakeup);
            continue;
        }
        if (event->filter == EVFILT_PROC) {
            backend->exited[backend->exited_count++] = event->udata; /* reported by complete() */
            continue;
        }
        uint64_t data = (uint64_t)(uintptr_t)event->udata;
        int fd = (int)(uint32_t)data;
        uint32_t generation = (uint32_t)(data >> 32);
        /* Into poll(2)'s bits, under the one rule (backend.h): an error, or the end of the stream
         * (EV_EOF: the peer closed, a socket error in fflags), counts as every event. */
        unsigned revents = 0;
        int event_bit = EVT_READABLE;
        if (event->filter == EVFILT_READ) revents = POLLIN;
        else if (event->filter == EVFILT_WRITE) revents = POLLOUT, event_bit = EVT_WRITABLE;
#ifdef EVFILT_EXCEPT
        else if (event->filter == EVFILT_EXCEPT) revents = POLLPRI, event_bit = EVT_PRIORITY;
#endif
        if (event->flags & EV_EOF) revents |= POLLHUP;
        if (event->flags & EV_ERROR) revents |= POLLERR;
        /* The knote has ended (one-shot, or refused with EV_ERROR): the table says so, for disarm. */
        if (fd >= 0 && fd < backend->descriptors_size && backend->descriptors[fd].generation == generation)
            backend->descriptors[fd].knotes &= (unsigned char)~event_bit;
        loop->kernel.fired[fired++] = (struct evt_fired){
            .fd = fd,
            .generation = generation,
            .events = evt_events_from_poll(revents),
        };
    }
    return fired;
}

/* ---- Process.wait: EVFILT_PROC, NOTE_EXIT ---------------------------------------------------------
 *
 * The child is left to be reaped by Ruby, which makes the Process::Status. A knote's udata is the
 * op; a wait collects the exits, complete() reports them with the GVL. */

static int
kqueue_wait_exit(struct evt_loop *loop, struct evt_op *op)
{
    struct kqueue_backend *backend = loop->kernel.data;
    if (backend->watches == backend->exited_capacity) {
        int capacity = backend->exited_capacity ? backend->exited_capacity * 2 : 4;
        struct evt_op **grown = realloc(backend->exited, (size_t)capacity * sizeof(*grown));
        if (!grown) return -ENOMEM;
        backend->exited = grown;
        backend->exited_capacity = capacity;
    }
    struct kevent change;
    EV_SET(&change, (uintptr_t)op->fd, EVFILT_PROC, EV_ADD | EV_ONESHOT, NOTE_EXIT, 0, op);
    if (kevent(backend->kq, &change, 1, NULL, 0, NULL) < 0) return errno == ESRCH ? -ESRCH : -ENOTSUP;
    backend->watches++;
    op->pending = 1;
    return 0;
}

static void
kqueue_complete(struct evt_loop *loop)
{
    struct kqueue_backend *backend = loop->kernel.data;
    int count = backend->exited_count;
    backend->exited_count = 0;
    for (int i = 0; i < count; i++) {
        backend->watches--;
        evt_waiter_done(loop, backend->exited[i], 0);
    }
}

/* The exit a wait collected and nobody reported yet, or the knote: gone before this returns. */
static void
kqueue_cancel(struct evt_loop *loop, struct evt_op *op)
{
    struct kqueue_backend *backend = loop->kernel.data;
    int collected = 0;
    for (int i = 0; i < backend->exited_count && !collected; i++) {
        if (backend->exited[i] != op) continue;
        backend->exited[i] = backend->exited[--backend->exited_count];
        collected = 1;
    }
    if (!collected) {
        struct kevent change;
        EV_SET(&change, (uintptr_t)op->fd, EVFILT_PROC, EV_DELETE, 0, 0, NULL);
        (void)kevent(backend->kq, &change, 1, NULL, 0, NULL); /* ENOENT: the process is gone, and so is the knote */
    }
    backend->watches--;
    evt_waiter_done(loop, op, -ECANCELED);
}

const struct evt_backend evt_backend_kqueue = {
    .name = "kqueue",
    .oneshot = 1,
#ifdef __linux__
    .emulation = "libkqueue, over epoll",
#endif
    .probe = kqueue_probe,
    .open = kqueue_open,
    .close = kqueue_close,
    .arm = kqueue_arm,
    .disarm = kqueue_disarm,
    .wait = kqueue_wait,
    .complete = kqueue_complete,
    .wait_exit = kqueue_wait_exit,
    .cancel = kqueue_cancel,
    .release = kqueue_release,
#ifdef __linux__
    .close_kept = kqueue_close_kept,
#endif
};

#endif
