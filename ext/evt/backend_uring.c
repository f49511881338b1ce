/* The io_uring backend (Linux 5.11 and later).
 *
 * Everything goes through one ring, and the ring goes to the kernel once per loop iteration:
 * requests queue up in the submission queue while fibers run and are submitted together with the
 * wait (io_uring_submit_and_wait_timeout). Transfers that may wait are done by the ring itself
 * (recv, send, read, write into the caller's memory, the kernel polling for readiness); readiness
 * (io_wait, io_select) is a one-shot poll request per descriptor; another thread ends a wait by
 * writing to the core's wakeup descriptor, which the ring is reading. A completion backend: wait
 * fires nothing itself, complete() reports what the ring has.
 *
 * Features are probed at run time, never taken from liburing's headers: the kernel may be older
 * or newer than the library. */
#include "backend.h"

#ifdef HAVE_LIBURING_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <liburing.h>
#include <ruby/ractor.h>
#include <ruby/thread.h>

/* A request's user_data: a struct evt_op pointer (8-aligned, tag 0), or a tagged value. */
enum { TAG_OP = 0, TAG_POLL = 1, TAG_WAKEUP = 2, TAG_IGNORE = 3, TAG_MASK = 3 };

/* Opcodes newer than liburing 2.3's headers, filled in by hand (the kernel's numbering). */
#define OP_WAITID 50 /* Linux 6.7 */

#define RING_ENTRIES 256
#define COMPLETION_ENTRIES 16384
#define TASKRUN_ROUNDS 256 /* kernel entries a dispatch makes at most for completions still in task work */
#define TASKRUN_BATCH 16   /* completions an entry brings at least when a backlog is left (the kernel's batch: 20) */

/* What the ring watches for one descriptor: the backend's own table, indexed by descriptor, so
 * that a completion is matched to its request without looking into the core's registrations. */
struct uring_poll {
    uint32_t serial;     /* which of the descriptor's poll requests is current (30 bits travel) */
    uint32_t generation; /* the registration's generation that request watches for */
    int interest;        /* the events it asks for; 0: none in flight */
};

struct uring_backend {
    struct io_uring ring;
    struct uring_poll *polls; /* [polls_size], zeroed */
    int polls_size;
    int wakeup_fd;         /* the core's (kernel->wakeup) */
    uint64_t wakeup_value; /* its read lands here */
    uint64_t cancel_serial; /* of the last cancellation asked (uring_cancel); its answer: */
    int cancel_answer;      /* CANCEL_UNANSWERED, or what the kernel said (0, -ENOENT, -EALREADY) */
    struct evt_kernel *kernel; /* whose counts it keeps */
};

/* A cancellation's user_data: TAG_IGNORE with its serial above the tag (plain TAG_IGNORE: serial 0). */
enum { CANCEL_UNANSWERED = 1 };

static uint64_t
poll_data(int fd, uint32_t serial)
{
    return ((uint64_t)serial << 34) | ((uint64_t)(uint32_t)fd << 2) | TAG_POLL;
}

/* ---- probing -------------------------------------------------------------------------------- */

/* What the probe found, once for the process (Ractors may probe at once: under probe_lock). */
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *probe_reason;
static int probed;
static int has_waitid;
static int mn_threads_everywhere; /* RUBY_MN_THREADS, read once (ENV may change under another Ractor) */

static const unsigned setup_choices[] = {
    /* TASKRUN_FLAG: the kernel says in the SQ ring's flags when completions wait in task work it
     * has not run yet (see dispatch_completions). */
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_TASKRUN_FLAG, /* 6.1 */
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_TASKRUN_FLAG,                               /* 5.19 */
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL,                                                           /* 5.18 */
    0,
};

/* Makes a ring with the best setup flags this kernel takes (from `first` on). 0 or -errno. */
static int
ring_create(struct io_uring *ring, size_t first)
{
    int err = -EINVAL;
    for (size_t i = first; i < sizeof(setup_choices) / sizeof(setup_choices[0]); i++) {
        struct io_uring_params params;
        memset(&params, 0, sizeof(params));
        params.flags = setup_choices[i] | IORING_SETUP_CQSIZE;
        params.cq_entries = COMPLETION_ENTRIES;
        err = io_uring_queue_init_params(RING_ENTRIES, ring, &params);
        if (err == 0) {
            if (!(params.features & IORING_FEAT_EXT_ARG) || !(params.features & IORING_FEAT_NODROP)) {
                io_uring_queue_exit(ring);
                return -ENOSYS; /* timeouts on the wait itself (5.11), no lost completions (5.5) */
            }
            return 0;
        }
        if (err != -EINVAL) return err; /* not a question of flags: ENOSYS, EPERM, ENOMEM */
    }
    return err;
}

/* The first number on the line of `path` that starts with `prefix` (or the file's first line, for
 * an empty prefix), or -1 when there is none or the file cannot be read. */
static long
number_in_file(const char *path, const char *prefix)
{
    FILE *file = fopen(path, "r");
    if (!file) return -1;
    char line[256];
    long value = -1;
    size_t length = strlen(prefix);
    while (fgets(line, sizeof(line), file)) {
        if (strncmp(line, prefix, length) != 0) continue;
        char *end;
        long parsed = strtol(line + length, &end, 10);
        if (end != line + length) value = parsed;
        break;
    }
    if (fclose(file) != 0) return -1;
    return value;
}

/* Why io_uring_setup said EPERM: the sysctl (Linux 6.6), a seccomp filter, or some other policy. */
static const char *
refusal_reason(void)
{
    long disabled = number_in_file("/proc/sys/kernel/io_uring_disabled", "");
    if (disabled == 2) return "io_uring is disabled by the sysctl kernel.io_uring_disabled = 2";
    if (disabled == 1)
        return "io_uring is allowed by the sysctl kernel.io_uring_disabled = 1 only to CAP_SYS_ADMIN and the "
               "group kernel.io_uring_group, and this process has neither";
    if (number_in_file("/proc/self/status", "Seccomp:") == 2)
        return "io_uring is refused by this process's seccomp filter (as a container's default profile does)";
    return "io_uring is not permitted (EPERM: neither the sysctl nor a seccomp filter; a security module?)";
}

static const char *
probe_once(void)
{
    if (probed) return probe_reason;
    const char *mn = getenv("RUBY_MN_THREADS");
    mn_threads_everywhere = mn && *mn && strcmp(mn, "0") != 0;
    struct io_uring ring;
    int err = ring_create(&ring, 0);
    /* Out of descriptors says nothing about io_uring: not remembered, and opening raises EMFILE.
     * Another error may pass too (ENOMEM: memlock), so it is not remembered either. */
    if (evt_backend_out_of_descriptors(-err)) return NULL;
    if (err == -ENOMEM) return "io_uring_setup: out of memory (before Linux 5.12, the rings count against ulimit -l)";
    if (err < 0 && err != -ENOSYS && err != -EPERM) return strerror(-err);
    probed = 1;
    if (err == -ENOSYS) return probe_reason = "the kernel has no io_uring, or one older than 5.11";
    if (err == -EPERM) return probe_reason = refusal_reason();
    if (err < 0) return probe_reason = strerror(-err);
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    static const int needed[] = {IORING_OP_POLL_ADD, IORING_OP_POLL_REMOVE, IORING_OP_ASYNC_CANCEL, IORING_OP_READ,
                                 IORING_OP_WRITE,    IORING_OP_RECV,        IORING_OP_SEND};
    for (size_t i = 0; i < sizeof(needed) / sizeof(needed[0]); i++)
        if (!probe || !io_uring_opcode_supported(probe, needed[i])) probe_reason = "the kernel's io_uring lacks operations evt needs";
    has_waitid = probe && probe->last_op >= OP_WAITID && (probe->ops[OP_WAITID].flags & IO_URING_OP_SUPPORTED);
    if (probe) io_uring_free_probe(probe);
    io_uring_queue_exit(&ring);
    return probe_reason;
}

static const char *
uring_probe(void)
{
    int err = pthread_mutex_lock(&probe_lock);
    if (err) rb_bug("evt: locking io_uring's probe: %s", strerror(err));
    const char *reason = probe_once();
    err = pthread_mutex_unlock(&probe_lock);
    if (err) rb_bug("evt: unlocking io_uring's probe: %s", strerror(err));
    return reason;
}

/* ---- submission --------------------------------------------------------------------------------- */

/* A free submission entry; a full queue is submitted first, never an error. */
static struct io_uring_sqe *
next_sqe(struct uring_backend *backend)
{
    struct io_uring_sqe *sqe;
    backend->kernel->submitted++;
    while (!(sqe = io_uring_get_sqe(&backend->ring))) {
        int r = io_uring_submit(&backend->ring);
        if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR) rb_syserr_fail(-r, "io_uring_submit");
        if (r == -EBUSY || r == -EAGAIN) io_uring_get_events(&backend->ring); /* room for completions first */
    }
    return sqe;
}

static void
arm_wakeup(struct uring_backend *backend)
{
    struct io_uring_sqe *sqe = next_sqe(backend);
    io_uring_prep_read(sqe, backend->wakeup_fd, &backend->wakeup_value, sizeof(backend->wakeup_value), 0);
    io_uring_sqe_set_data64(sqe, TAG_WAKEUP);
}

/* Whether the calling Ruby thread may go on on another native thread: Ruby's M:N scheduler runs the
 * threads of a Ractor other than the main one on a few native threads, moving them between those
 * (and the main Ractor's too, with RUBY_MN_THREADS=1). A ring made with SINGLE_ISSUER takes
 * submissions from the thread that made it only (EEXIST from any other), so such a ring is made
 * without it (setup_choices[1] on). */
static int
thread_may_move(void)
{
    if (mn_threads_everywhere) return 1;
    static ID id_main, id_current;
    if (!id_main) {
        id_main = rb_intern("main");
        id_current = rb_intern("current");
    }
    return rb_funcall(rb_cRactor, id_current, 0) != rb_funcall(rb_cRactor, id_main, 0);
}

static int
uring_open(struct evt_kernel *kernel)
{
    /* The features this ring may use (a probe that met EMFILE learnt none of them). */
    if (uring_probe()) return -ENOSYS;
    size_t first = thread_may_move() ? 1 : 0;
    struct uring_backend *backend = ALLOC(struct uring_backend);
    int err = ring_create(&backend->ring, first);
    if (err < 0) {
        ruby_xfree(backend);
        return err;
    }
    backend->wakeup_fd = kernel->wakeup.read_fd;
    backend->kernel = kernel;
    backend->cancel_serial = 0;
    backend->cancel_answer = 0;
    backend->polls = NULL;
    backend->polls_size = 0;
    kernel->data = backend;
    arm_wakeup(backend);
    return 0;
}

static void
uring_close(struct evt_kernel *kernel)
{
    struct uring_backend *backend = kernel->data;
    /* Closing the ring cancels what is still in it; in a forked child it only drops the child's
     * mappings and descriptor: the parent's ring is untouched. */
    io_uring_queue_exit(&backend->ring);
    ruby_xfree(backend->polls);
    ruby_xfree(backend);
}

/* fd's entry in the poll table, NULL when the ring never watched it. */
static struct uring_poll *
poll_of(struct uring_backend *backend, int fd)
{
    return fd >= 0 && fd < backend->polls_size ? &backend->polls[fd] : NULL;
}

static void
poll_remove(struct uring_backend *backend, int fd, struct uring_poll *poll)
{
    struct io_uring_sqe *sqe = next_sqe(backend);
    io_uring_prep_poll_remove(sqe, poll_data(fd, poll->serial));
    io_uring_sqe_set_data64(sqe, TAG_IGNORE);
    poll->interest = 0;
}

/* One-shot polls: a request per wait, submitted with the next wait, no system call of its own.
 * The core arms again after each report while waiters remain (the backend is .oneshot). */
static int
uring_arm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct uring_backend *backend = kernel->data;
    if (fd >= backend->polls_size) {
        int size = backend->polls_size ? backend->polls_size : 64;
        while (size <= fd) size *= 2;
        REALLOC_N(backend->polls, struct uring_poll, size);
        memset(&backend->polls[backend->polls_size], 0, (size_t)(size - backend->polls_size) * sizeof(struct uring_poll));
        backend->polls_size = size;
    }
    struct uring_poll *poll = &backend->polls[fd];
    if (poll->interest && poll->generation == watch->generation && !(watch->events & ~poll->interest))
        return 0; /* one in flight covers it */
    if (poll->interest) poll_remove(backend, fd, poll); /* for fewer events, or for the file this number had */
    struct io_uring_sqe *sqe = next_sqe(backend);
    io_uring_prep_poll_add(sqe, fd, evt_backend_poll_mask(watch->events));
    io_uring_sqe_set_data64(sqe, poll_data(fd, ++poll->serial));
    poll->interest = watch->events;
    poll->generation = watch->generation;
    return 0;
}

static void
uring_disarm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    (void)watch;
    /* A poll in flight keeps the file open in the kernel: take it back. */
    struct uring_poll *poll = poll_of(kernel->data, fd);
    if (poll && poll->interest) poll_remove(kernel->data, fd, poll);
}

static int
uring_wait(struct evt_kernel *kernel, int64_t timeout_ns)
{
    struct uring_backend *backend = kernel->data;
    int r;
    if (timeout_ns == 0) {
        r = io_uring_submit_and_get_events(&backend->ring);
    }
    else {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
        r = io_uring_submit_and_wait_timeout(&backend->ring, &cqe, 1, timeout_ns < 0 ? NULL : &ts, NULL);
    }
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EBUSY && r != -EAGAIN) return r;
    return 0; /* nothing fired: complete() reports what the ring has */
}

/* A poll request completed: reported to the core (which arms again for waiters that remain) if
 * it is the descriptor's current one, from the backend's own table alone. */
static void
poll_done(struct evt_kernel *kernel, struct uring_backend *backend, uint64_t data, int res)
{
    int fd = (int)(uint32_t)(data >> 2);
    uint32_t serial = (uint32_t)(data >> 34);
    struct uring_poll *poll = poll_of(backend, fd);
    if (!poll || (poll->serial & 0x3fffffff) != serial || !poll->interest) return; /* removed or replaced */
    poll->interest = 0; /* one-shot: nothing in flight now */
    /* A failed poll (-EBADF) counts as POLLNVAL: the waiters meet the error themselves. */
    evt_waiter_fired(kernel, fd, poll->generation, evt_backend_events(res < 0 ? POLLNVAL : (unsigned)res));
}

/* Reports what the ring has, and what the kernel still holds back of it (below). */
static void
dispatch_completions(struct evt_kernel *kernel, struct uring_backend *backend)
{
    int rounds = 0;
    for (;;) {
        struct io_uring_cqe *cqe;
        unsigned head, count = 0;
        io_uring_for_each_cqe(&backend->ring, head, cqe) {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            switch (data & TAG_MASK) {
            case TAG_OP: {
                struct evt_op *op = (struct evt_op *)(uintptr_t)data;
                evt_waiter_done(kernel, op, op->cancelled ? -ECANCELED : cqe->res);
                break;
            }
            case TAG_POLL:
                poll_done(kernel, backend, data, cqe->res);
                break;
            case TAG_WAKEUP:
                arm_wakeup(backend);
                break;
            case TAG_IGNORE:
                if (data >> 2 && data >> 2 == backend->cancel_serial) backend->cancel_answer = cqe->res;
                break;
            }
            count++;
        }
        io_uring_cq_advance(&backend->ring, count);
        kernel->completed += count;
        if (io_uring_cq_has_overflow(&backend->ring)) kernel->overflowed++;
        /* Completions the CQ had no room for wait in the kernel, and completions still in task work:
         * a kernel wait that need not block runs only a small batch of those (IO_LOCAL_TW_DEFAULT_MAX).
         * Left to the next turn's wait, a backlog drains one batch a turn, and under thousands of
         * connections waiters whose data has come can wait long enough to time out. So they are
         * fetched now, a batch per kernel entry, while the last entry brought a whole batch (a
         * backlog, not the trickle that keeps coming under load, which fetching until none is left
         * would chase with a system call each), a bounded number of times. (Asking for all of them
         * at once, io_uring_wait_cqes with a large count and a zero timeout, has the kernel spin in
         * io_cqring_wait while completions keep coming.) */
        if (!io_uring_cq_has_overflow(&backend->ring) &&
            !(IO_URING_READ_ONCE(*backend->ring.sq.kflags) & IORING_SQ_TASKRUN))
            return;
        if (rounds > 0 && count < TASKRUN_BATCH) return;
        if (++rounds > TASKRUN_ROUNDS) return;
        int r = io_uring_get_events(&backend->ring);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) return; /* the next wait reports it */
    }
}

static void
uring_complete(struct evt_kernel *kernel)
{
    dispatch_completions(kernel, kernel->data);
}

/* waitid(P_PID, pid, info, WEXITED | WNOWAIT) in the ring: the child stays to be reaped by Ruby,
 * which makes the Process::Status. */
static void
prep_waitid(struct io_uring_sqe *sqe, pid_t pid, siginfo_t *info)
{
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = OP_WAITID;
    sqe->fd = pid;
    sqe->len = P_PID;
    sqe->file_index = WEXITED | WNOWAIT;
    sqe->addr2 = (uint64_t)(uintptr_t)info;
}

static int
uring_transfer(struct evt_kernel *kernel, struct evt_op *op)
{
    struct uring_backend *backend = kernel->data;
    if (op->kind == EVT_OP_WAITID && !has_waitid) return -ENOTSUP;
    struct io_uring_sqe *sqe = next_sqe(backend);
    if (op->kind == EVT_OP_WAITID) {
        prep_waitid(sqe, op->fd, op->base);
        io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)op);
        op->pending = 1;
        return 0;
    }
    unsigned size = op->size > 0x7ffff000 ? 0x7ffff000 : (unsigned)op->size; /* what read(2) does at most */
    /* The kernel waits for readiness itself (it polls inside); an older one may answer -EAGAIN
     * for a descriptor in non-blocking mode, and the core then waits with a poll and asks again. */
    if (op->socket) {
        int flags = op->nowait ? MSG_DONTWAIT : 0;
        if (op->events == EVT_READABLE) io_uring_prep_recv(sqe, op->fd, op->base, size, flags);
        else io_uring_prep_send(sqe, op->fd, op->base, size, flags);
    }
    else {
        uint64_t offset = op->position < 0 ? (uint64_t)-1 : (uint64_t)op->position; /* -1: the file's position */
        if (op->events == EVT_READABLE) io_uring_prep_read(sqe, op->fd, op->base, size, offset);
        else io_uring_prep_write(sqe, op->fd, op->base, size, offset);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)op);
    op->pending = 1;
    return 0;
}

/* Turns op's request into a no-op with the same user_data, if the kernel has not taken it yet (it is
 * still in the submission queue, which only this thread fills and submits). */
static int
unsubmit(struct io_uring_sq *sq, struct evt_op *op)
{
    uint64_t data = (uint64_t)(uintptr_t)op;
    for (unsigned i = io_uring_smp_load_acquire(sq->khead); i != sq->sqe_tail; i++) {
        struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
        if (sqe->user_data != data) continue;
        io_uring_prep_nop(sqe);
        sqe->user_data = data;
        op->cancelled = 1;
        return 1;
    }
    return 0;
}

static void
uring_cancel(struct evt_kernel *kernel, struct evt_op *op)
{
    struct uring_backend *backend = kernel->data;
    /* A request the kernel has not seen is simply never made: cheaper than a cancellation. */
    if (unsubmit(&backend->ring.sq, op)) backend->cancel_answer = 0;
    else backend->cancel_answer = -ENOENT;
    /* Wait here, with the thread: cancelling a request waiting for readiness is immediate, and a
     * file read under way ends soon. Other completions that arrive meanwhile are dispatched. The
     * kernel may not find the request where a cancellation looks (-ENOENT) while it moves between
     * its poll and its retry, which run as task work; waiting for it then would never end, so it is
     * asked again once the wait has run the kernel's task work. */
    while (op->pending) {
        if (backend->cancel_answer == -ENOENT) {
            struct io_uring_sqe *sqe = next_sqe(backend);
            io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)op, 0);
            backend->cancel_serial = (backend->cancel_serial + 1) & (UINT64_MAX >> 2);
            if (!backend->cancel_serial) backend->cancel_serial = 1;
            io_uring_sqe_set_data64(sqe, (backend->cancel_serial << 2) | TAG_IGNORE);
            backend->cancel_answer = CANCEL_UNANSWERED;
        }
        struct io_uring_cqe *cqe;
        int r = io_uring_submit_and_wait_timeout(&backend->ring, &cqe, 1, NULL, NULL);
        if (r < 0 && r != -EINTR && r != -ETIME && r != -EBUSY && r != -EAGAIN) rb_syserr_fail(-r, "io_uring_enter");
        dispatch_completions(kernel, backend);
    }
}

/* The IO on fd is being closed on the loop's thread, its waiters gone: their polls' removals are
 * still queued. Submit them and run the kernel's deferred work, which completes the removed polls
 * and so lets go of the file before the close. */
static void
uring_release(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct uring_backend *backend = kernel->data;
    if (!io_uring_sq_ready(&backend->ring)) return;
    int r = io_uring_submit_and_get_events(&backend->ring);
    if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) rb_syserr_fail(-r, "io_uring_enter");
    dispatch_completions(kernel, backend);
}

/* Whether a queued request names the descriptor fd. */
static int
names_descriptor(const struct io_uring_sqe *sqe, int fd)
{
    if (sqe->fd != fd) return 0;
    switch (sqe->opcode) {
    case IORING_OP_POLL_ADD:
    case IORING_OP_READ:
    case IORING_OP_WRITE:
    case IORING_OP_RECV:
    case IORING_OP_SEND:
    case IORING_OP_CLOSE:
        return 1;
    }
    return 0;
}

/* Whether a request the kernel has not taken yet names fd. */
static int
queued_for(struct io_uring_sq *sq, int fd)
{
    for (unsigned i = io_uring_smp_load_acquire(sq->khead); i != sq->sqe_tail; i++)
        if (names_descriptor(&sq->sqes[i & sq->ring_mask], fd)) return 1;
    return 0;
}

static void *
yield_cpu(void *unused)
{
    sched_yield();
    return NULL;
}

/* Another thread, holding the GVL, is about to close fd: no request naming it may reach the kernel
 * after that, when the number may belong to another file. The kernel takes queued requests only
 * inside io_uring_enter, which the loop's thread calls either with the GVL (cancel, release, a
 * zero-timeout wait: not now, then) or between setting and clearing kernel->blocked, both under the
 * GVL. So while blocked is clear, the loop's thread is away from the ring and cannot come back
 * before the closer is done: the queued requests become no-ops with the same user_data, so their
 * waiters still get a completion. While it is set, the loop's thread is on its way into the kernel,
 * in it (every queued request taken on entry), or back from it and waiting for the GVL (it may have
 * returned without taking them: an interrupt, -EBUSY): wait, letting it have the GVL, until either
 * the requests are taken (the kernel then holds the file, not the number) or blocked is clear. */
static void
uring_closed_elsewhere(struct evt_kernel *kernel, int fd)
{
    struct io_uring_sq *sq = &((struct uring_backend *)kernel->data)->ring.sq;
    while (__atomic_load_n(&kernel->blocked, __ATOMIC_SEQ_CST)) {
        if (!queued_for(sq, fd)) return;
        rb_thread_call_without_gvl(yield_cpu, NULL, RUBY_UBF_IO, NULL);
        /* Other threads ran meanwhile: the ring may have been closed (its requests with it) or
         * replaced. */
        if (!kernel->data) return;
        sq = &((struct uring_backend *)kernel->data)->ring.sq;
    }
    for (unsigned i = io_uring_smp_load_acquire(sq->khead); i != sq->sqe_tail; i++) {
        struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
        if (!names_descriptor(sqe, fd)) continue;
        uint64_t data = sqe->user_data;
        io_uring_prep_nop(sqe);
        sqe->user_data = data;
    }
}

/* read_now: a read the ring would wait for is tried at once first (recv(2) with MSG_DONTWAIT, or
 * read(2) on a descriptor in non-blocking mode) while such tries keep finding data: then it is one
 * system call, with no trip through the ring and no fiber switch (a pipe read in a loop, a new
 * connection's first request). A score per descriptor, in the backend's slot, counts recent hits up
 * and misses down; at zero (a keep-alive connection read just after its answer went out: the next
 * request is not there yet) only one read in PROBE_SKIP + 1 tries, the others go straight to the
 * ring. A new IO on the number (a new generation) starts at 1: a new connection's first request is
 * usually there already. */
enum { PROBE_SCORE_MAX = 4, PROBE_SKIP = 15 };

static long
uring_read_now(struct evt_kernel *kernel, int fd, struct evt_watch *watch, int socket, void *base, size_t size)
{
    (void)kernel;
    struct evt_backend_slot *slot = &watch->slot;
    if (slot->read_generation != watch->generation) {
        slot->read_generation = watch->generation;
        slot->read_score = 1;
        slot->read_skips = 0;
    }
    if (slot->read_skips) {
        slot->read_skips--;
        return -EAGAIN;
    }
    ssize_t n = socket ? recv(fd, base, size, MSG_DONTWAIT) : read(fd, base, size);
    if (n >= 0) {
        if (slot->read_score < PROBE_SCORE_MAX) slot->read_score++;
        return n;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
    if (slot->read_score) slot->read_score--;
    if (!slot->read_score) slot->read_skips = PROBE_SKIP;
    return -EAGAIN;
}

const struct evt_backend evt_backend_uring = {
    .name = "io_uring",
    .oneshot = 1,
    .probe = uring_probe,
    .open = uring_open,
    .close = uring_close,
    .arm = uring_arm,
    .disarm = uring_disarm,
    .wait = uring_wait,
    .complete = uring_complete,
    .transfer = uring_transfer,
    .wait_exit = uring_transfer,
    .cancel = uring_cancel,
    .read_now = uring_read_now,
    .release = uring_release,
    .closed_elsewhere = uring_closed_elsewhere,
};

#endif
