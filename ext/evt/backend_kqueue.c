/* The kqueue backend (macOS, the BSDs; on Linux through libkqueue, an emulation over epoll).
 *
 * A waiter's interest is one one-shot knote per filter: EVFILT_READ for IO::READABLE,
 * EVFILT_WRITE for IO::WRITABLE, EVFILT_EXCEPT with NOTE_OOB for IO::PRIORITY where the kernel
 * has it and takes it for the descriptor (else, for IO::PRIORITY alone, an EVFILT_READ that only
 * an error or the end reaches: NOTE_LOWAT at INT_MAX, where there is NOTE_LOWAT). A knote ends
 * with its report (.oneshot: the core arms again while waiters remain), so a descriptor nobody
 * waits on holds nothing in the kqueue. The descriptor is the knote's ident, the registration's
 * generation its udata: a report for an older file that had the same number is dropped by the
 * core.
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
#include "backend.h"

#ifdef HAVE_KQUEUE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#ifdef __linux__
#include <pthread.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/event.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#define INITIAL_DESCRIPTORS 64
#define CHUNK 512 /* events a kevent call asks for: libkqueue's most (MAX_KEVENT) */

/* NetBSD before 10 types udata as an intptr_t. */
#if defined(__NetBSD__) && defined(__NetBSD_Version__) && __NetBSD_Version__ < 1000000000
#define UDATA(value) ((intptr_t)(value))
#else
#define UDATA(value) ((void *)(value))
#endif

/* The knotes of one descriptor, as bits: the filter each stands for. */
enum {
    K_READ = 1,   /* EVFILT_READ */
    K_EXCEPT = 2, /* EVFILT_EXCEPT */
    K_WRITE = 4,  /* EVFILT_WRITE */
    K_LOWAT = 8,  /* K_READ reports only an error or the end (IO::PRIORITY alone, no K_EXCEPT) */
    K_ALL = K_READ | K_EXCEPT | K_WRITE,
};

/* What the kqueue holds for one descriptor: the knotes (K_ bits) added for `generation` and not yet
 * reported. */
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
    int watches, watches_capacity;         /* EVFILT_PROC knotes added and not yet reported */
    struct evt_op **watched;               /* their ops; both arrays grow together, with the GVL */
    int exited_count;
    struct evt_op **exited;                /* what a wait collected for complete() to report */
};

/* The knotes for waiters that want `events`; `except`: EVFILT_EXCEPT may be used. */
static int
knotes_for(int events, int except)
{
    int knotes = 0;
    if (events & EVT_READABLE) knotes |= K_READ;
    if (events & EVT_WRITABLE) knotes |= K_WRITE;
    if (events & EVT_PRIORITY) {
#ifdef EVFILT_EXCEPT
        if (except) return knotes | K_EXCEPT;
#endif
#ifdef NOTE_LOWAT
        if (!(knotes & K_READ)) knotes |= K_READ | K_LOWAT;
#endif
        /* Else IO::PRIORITY alone is not watched (libkqueue): its timeout or the IO's close ends it. */
    }
    return knotes;
}

/* The change for knote `k` (one K_ bit) on fd: added for `generation` (`lowat`: K_LOWAT's read),
 * or deleted. */
static void
knote(struct kevent *change, int fd, int k, int add, uint32_t generation, int lowat)
{
    short filter = k == K_WRITE ? EVFILT_WRITE : EVFILT_READ;
    unsigned int fflags = 0;
    intptr_t data = 0;
#ifdef EVFILT_EXCEPT
    if (k == K_EXCEPT) {
        filter = EVFILT_EXCEPT;
        fflags = NOTE_OOB;
    }
#endif
#ifdef NOTE_LOWAT
    if (k == K_READ && lowat) {
        fflags = NOTE_LOWAT;
        data = INT_MAX;
    }
#endif
    EV_SET(change, (uintptr_t)fd, filter, add ? EV_ADD | EV_ONESHOT : EV_DELETE, fflags, data,
           UDATA(add ? (uintptr_t)generation : 0));
}

/* Deletes the knotes `knotes` of fd from kq one by one (one call for all would stop at the first
 * that fails): whether each went or had ended already (ENOENT). */
static int
delete_knotes(int kq, int fd, int knotes)
{
    int deleted = 1;
    for (int k = 1; k <= K_WRITE; k <<= 1) {
        if (!(knotes & k)) continue;
        struct kevent change;
        knote(&change, fd, k, 0, 0, 0);
        if (kevent(kq, &change, 1, NULL, 0, NULL) < 0 && errno != ENOENT) deleted = 0;
    }
    return deleted;
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
#define KEEPS_KQUEUES 1

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
#define KEEPS_KQUEUES 0

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
wakeup_knote(int kq, struct evt_kernel *kernel, int add)
{
    struct kevent change;
    EV_SET(&change, (uintptr_t)kernel->wakeup.read_fd, EVFILT_READ, add ? EV_ADD : EV_DELETE, 0, 0, UDATA(0));
    return kevent(kq, &change, 1, NULL, 0, NULL) < 0 ? -errno : 0;
}

static int
kqueue_open(struct evt_kernel *kernel)
{
    struct kqueue_backend *backend = calloc(1, sizeof(*backend));
    if (!backend) return -ENOMEM;
    int kq = kqueue_get();
    int err = kq < 0 ? kq : wakeup_knote(kq, kernel, 1);
    if (err < 0) {
        if (kq >= 0) kqueue_put(kq, 0);
        free(backend);
        return err;
    }
    backend->kq = kq;
    backend->owner = getpid();
    kernel->data = backend;
    return 0;
}

/* Deletes what the backend added to its kqueue, to keep it for reuse: whether all of it went. */
static int
kqueue_empty(struct evt_kernel *kernel)
{
    struct kqueue_backend *backend = kernel->data;
    int empty = wakeup_knote(backend->kq, kernel, 0) == 0;
    for (int fd = 0; fd < backend->descriptors_size; fd++)
        if (!delete_knotes(backend->kq, fd, backend->descriptors[fd].knotes)) empty = 0;
    return empty;
}

static void
kqueue_close(struct evt_kernel *kernel)
{
    struct kqueue_backend *backend = kernel->data;
    /* In a forked child the number is not a kqueue of this process: it may name another file. */
    if (backend->owner == getpid()) {
        kqueue_put(backend->kq, KEEPS_KQUEUES && kqueue_empty(kernel));
    }
    free(backend->events);
    free(backend->descriptors);
    free(backend->watched);
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

/* Adds the knotes `add` (for `generation`) in one call, after deleting those of `held` not among
 * them: 0, or -errno. */
static int
apply(struct kqueue_backend *backend, int fd, int add, int held, uint32_t generation)
{
    delete_knotes(backend->kq, fd, held & ~add & K_ALL);
    struct kevent changes[3];
    int n = 0;
    for (int k = 1; k <= K_WRITE; k <<= 1)
        if (add & k) knote(&changes[n++], fd, k, 1, generation, (add & K_LOWAT) != 0);
    errno = 0;
    if (n == 0 || kevent(backend->kq, changes, n, NULL, 0, NULL) == 0) return 0;
    return errno ? -errno : -EBADF; /* libkqueue's errno is not always set */
}

/* A kqueue refusing a filter for a kind of descriptor. */
static int
refused(int err)
{
    return err == -EINVAL || err == -ENODEV || err == -EOPNOTSUPP || err == -ENOTSUP;
}

static int
kqueue_arm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct kqueue_backend *backend = kernel->data;
    int err = evt_backend_slot_check(&watch->slot, fd, watch->generation);
    if (err < 0) return err;
    struct kqueue_descriptor *d = descriptor(backend, fd);
    if (!d) return -ENOMEM;
    /* Knotes of an older file on the number: a real kqueue dropped them at its close. */
    int held = d->generation == watch->generation ? d->knotes : 0;
    /* Every knote wanted is added again: one that was reported has ended, and the core arms after
     * each report. Adding one that is still there only renews it. */
    int want = knotes_for(watch->events, 1);
    err = apply(backend, fd, want, held, watch->generation);
    if (err < 0 && refused(err) && (want & K_EXCEPT)) {
        /* EVFILT_EXCEPT is for sockets only on some kernels (macOS refuses it on a pipe). */
        int without = knotes_for(watch->events, 0);
        err = apply(backend, fd, without, want, watch->generation);
        want = without;
    }
    if (err < 0 && refused(err)) {
        /* A device kqueue cannot watch (macOS takes only ttys among character devices): always
         * ready, as a file is. */
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode)) {
            delete_knotes(backend->kq, fd, K_ALL);
            d->knotes = 0;
            return -EPERM;
        }
    }
    if (err < 0 && err != -ENOMEM) {
        /* Knotes left by a file closed without EV_DELETE (libkqueue): gone, then once more. */
        delete_knotes(backend->kq, fd, K_ALL);
        err = apply(backend, fd, want, 0, watch->generation);
    }
    /* Even after a failure: an add of several may have been made, and deleting one that is not
     * there costs nothing. */
    d->generation = watch->generation;
    d->knotes = (unsigned char)want;
    return err;
}

/* Also the backend's release: a waiter leaving does not always disarm first (the last one of an
 * IO that closes), and nothing of the file may stay in a libkqueue that cannot see the close. */
static void
kqueue_disarm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct kqueue_backend *backend = kernel->data;
    if (fd >= backend->descriptors_size) return;
    struct kqueue_descriptor *d = &backend->descriptors[fd];
    if (d->knotes && d->generation == watch->generation) delete_knotes(backend->kq, fd, d->knotes);
    d->knotes = 0;
}

static int
kqueue_wait(struct evt_kernel *kernel, int64_t timeout_ns)
{
    struct kqueue_backend *backend = kernel->data;
    if (backend->capacity < kernel->fired_capacity) {
        /* The core's array grew: so does ours (a failure keeps the smaller one). */
        struct kevent *events = realloc(backend->events, (size_t)kernel->fired_capacity * sizeof(*events));
        if (events) {
            backend->events = events;
            backend->capacity = kernel->fired_capacity;
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
        if (event->filter == EVFILT_PROC) {
            backend->exited[backend->exited_count++] = (struct evt_op *)(uintptr_t)event->udata; /* for complete() */
            continue;
        }
        int fd = (int)event->ident;
        if (event->filter == EVFILT_READ && fd == kernel->wakeup.read_fd) {
            evt_wakeup_drain(&kernel->wakeup);
            continue;
        }
        uint32_t generation = (uint32_t)(uintptr_t)event->udata;
        /* Into poll(2)'s bits, under the one rule (backend.h): an error, or the end of the stream
         * (EV_EOF: the peer closed, a socket error in fflags), counts as every event. */
        unsigned revents = 0;
        int ended = K_READ | K_LOWAT;
        if (event->filter == EVFILT_READ) revents = POLLIN;
        else if (event->filter == EVFILT_WRITE) revents = POLLOUT, ended = K_WRITE;
#ifdef EVFILT_EXCEPT
        else if (event->filter == EVFILT_EXCEPT) revents = POLLPRI, ended = K_EXCEPT;
#endif
        if (event->flags & EV_EOF) revents |= POLLHUP;
        if (event->flags & EV_ERROR) revents |= POLLERR;
        /* The knote has ended (one-shot, or refused with EV_ERROR): the table says so, for disarm. */
        if (fd >= 0 && fd < backend->descriptors_size && backend->descriptors[fd].generation == generation)
            backend->descriptors[fd].knotes &= (unsigned char)~ended;
        kernel->fired[fired++] = (struct evt_fired){
            .fd = fd,
            .generation = generation,
            .events = evt_backend_events(revents),
        };
    }
    return fired;
}

/* ---- Process.wait: EVFILT_PROC, NOTE_EXIT ---------------------------------------------------------
 *
 * The child is left to be reaped by Ruby, which makes the Process::Status. A knote's udata is the
 * op; a wait collects the exits, complete() reports them with the GVL. A kqueue holds one knote per
 * process: a second wait for a process already watched waits another way (-ENOTSUP). */

static int
grow_watches(struct kqueue_backend *backend)
{
    int capacity = backend->watches_capacity ? backend->watches_capacity * 2 : 4;
    struct evt_op **watched = realloc(backend->watched, (size_t)capacity * sizeof(*watched));
    if (!watched) return -ENOMEM;
    backend->watched = watched;
    struct evt_op **exited = realloc(backend->exited, (size_t)capacity * sizeof(*exited));
    if (!exited) return -ENOMEM;
    backend->exited = exited;
    backend->watches_capacity = capacity;
    return 0;
}

/* Takes op off the list of watches: whether it was on it. */
static int
unwatch(struct kqueue_backend *backend, struct evt_op *op)
{
    for (int i = 0; i < backend->watches; i++) {
        if (backend->watched[i] != op) continue;
        backend->watched[i] = backend->watched[--backend->watches];
        return 1;
    }
    return 0;
}

static int
kqueue_wait_exit(struct evt_kernel *kernel, struct evt_op *op)
{
    struct kqueue_backend *backend = kernel->data;
    for (int i = 0; i < backend->watches; i++)
        if (backend->watched[i]->fd == op->fd) return -ENOTSUP;
    if (backend->watches == backend->watches_capacity) {
        int err = grow_watches(backend);
        if (err < 0) return err;
    }
    struct kevent change;
    EV_SET(&change, (uintptr_t)op->fd, EVFILT_PROC, EV_ADD | EV_ONESHOT, NOTE_EXIT, 0, UDATA(op));
    if (kevent(backend->kq, &change, 1, NULL, 0, NULL) < 0) return errno == ESRCH ? -ESRCH : -ENOTSUP;
    backend->watched[backend->watches++] = op;
    op->pending = 1;
    return 0;
}

static void
kqueue_complete(struct evt_kernel *kernel)
{
    struct kqueue_backend *backend = kernel->data;
    int count = backend->exited_count;
    backend->exited_count = 0;
    for (int i = 0; i < count; i++) {
        struct evt_op *op = backend->exited[i];
        if (unwatch(backend, op)) evt_waiter_done(kernel, op, 0);
    }
}

/* The exit a wait collected and nobody reported yet, or the knote: gone before this returns. */
static void
kqueue_cancel(struct evt_kernel *kernel, struct evt_op *op)
{
    struct kqueue_backend *backend = kernel->data;
    int collected = 0;
    for (int i = 0; i < backend->exited_count && !collected; i++) {
        if (backend->exited[i] != op) continue;
        backend->exited[i] = backend->exited[--backend->exited_count];
        collected = 1;
    }
    if (!collected) {
        struct kevent change;
        EV_SET(&change, (uintptr_t)op->fd, EVFILT_PROC, EV_DELETE, 0, 0, UDATA(0));
        (void)kevent(backend->kq, &change, 1, NULL, 0, NULL); /* ENOENT: the process is gone, and so is the knote */
    }
    unwatch(backend, op);
    evt_waiter_done(kernel, op, -ECANCELED);
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
    .release = kqueue_disarm,
#ifdef __linux__
    .close_kept = kqueue_close_kept,
#endif
};

#endif
