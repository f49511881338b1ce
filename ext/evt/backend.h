/* The dialect between the core and its backends (backend_<mechanism>.c), in the spirit of redis's ae.c.
 *
 * A backend knows descriptors, events and its own per-descriptor slot; it never touches fibers or
 * Ruby objects. It sees the loop only as this header shows it: its kernel side (struct evt_kernel)
 * and, for each descriptor, a struct evt_watch; it includes no other header of evt's, so the
 * compiler holds it to that (the core's struct evt_loop, registrations, waiters and timers are
 * not even declared to it). The core owns the registrations and the waiters hanging off them,
 * the array of fired events, and the wakeup descriptor. A backend:
 *
 *   open, close    makes and releases its kernel objects (close also runs in a forked child)
 *   arm, disarm    keeps the kernel watching what a descriptor's waiters want, or nothing
 *   wait           waits without the GVL; a readiness backend (epoll, poll, select) writes what
 *                  fired into kernel->fired as {descriptor, generation, events} and returns the count;
 *                  the core dispatches them, with the GVL
 *   complete       a completion backend (io_uring) instead reports its completions here, with the
 *                  GVL: evt_waiter_fired() for polls, evt_waiter_done() for its own transfers
 *
 * Every backend reads the kernel's readiness through evt_backend_events(), so every backend
 * follows one rule for errors and hang-ups (below), and watches kernel->wakeup.read_fd, which any
 * thread writes to end a wait (wakeup.h). */
#ifndef EVT_BACKEND_H
#define EVT_BACKEND_H

/* First, as in every file of evt: its feature macros (_GNU_SOURCE, for POLLRDHUP) come before any
 * system header; backends use Ruby's allocator and errors too. */
#include <ruby.h>

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "wakeup.h"

struct evt_waiter;

/* Events, with the values of Ruby's IO::READABLE, IO::PRIORITY and IO::WRITABLE (poll(2)'s bits). */
enum {
    EVT_READABLE = 1,
    EVT_PRIORITY = 2,
    EVT_WRITABLE = 4,
    EVT_EVENTS = EVT_READABLE | EVT_PRIORITY | EVT_WRITABLE,
};

/* ---- the one translation -------------------------------------------------------------------
 *
 * poll(2)'s bits are the common tongue: epoll's EPOLLIN, EPOLLPRI, EPOLLOUT, EPOLLERR, EPOLLHUP and
 * EPOLLRDHUP have the same values on Linux, io_uring's poll requests take and give them, and the
 * select backend writes its three sets as POLLIN, POLLOUT and POLLPRI (POLLNVAL for a descriptor
 * closed behind its back). */

#ifdef POLLRDHUP
#define EVT_POLLRDHUP POLLRDHUP
#else
#define EVT_POLLRDHUP 0
#endif

/* What to ask the kernel for, for waiters that want `events`. */
static inline unsigned
evt_backend_poll_mask(int events)
{
    unsigned mask = 0;
    if (events & EVT_READABLE) mask |= POLLIN | EVT_POLLRDHUP;
    if (events & EVT_PRIORITY) mask |= POLLPRI;
    if (events & EVT_WRITABLE) mask |= POLLOUT;
    return mask;
}

/* What arrived. The rule for errors and hang-ups, the same on every backend: an error, a hang-up or
 * a closed descriptor (POLLERR, POLLHUP, POLLNVAL) counts as every event, so each waiter wakes with
 * what it asked for and meets the error or the end of file in its own call. That is what Ruby does
 * without a scheduler (thread.c: "all requested events are ready if there is an error"), and a
 * level-triggered backend would otherwise report the same condition again at once, for ever. */
static inline int
evt_backend_events(unsigned revents)
{
    if (revents & (POLLERR | POLLHUP | POLLNVAL)) return EVT_EVENTS;
    int events = 0;
    if (revents & (POLLIN | EVT_POLLRDHUP)) events |= EVT_READABLE;
    if (revents & POLLPRI) events |= EVT_PRIORITY;
    if (revents & POLLOUT) events |= EVT_WRITABLE;
    return events;
}

/* ---- what passes between them ------------------------------------------------------------------ */

/* One event a readiness backend's wait collected: `generation` is the registration's when it was
 * armed, so an event for an older file that had the same number is recognised and dropped. */
struct evt_fired {
    int fd;
    uint32_t generation;
    int events;
};

/* A backend's own state for one descriptor, kept in the core's registration (struct evt_watch). The
 * core never reads it; it empties it (evt_backend_slot_clear) when the kernel objects are made anew. */
struct evt_backend_slot {
    uint32_t generation;  /* set by arm: the registration's generation the kernel watches for; 0: none */
    int interest;         /* events the kernel was last asked for */
    int index;            /* a slot in the backend's own table (poll); -1: none */
    uint32_t read_generation;  /* read_now: the registration's generation the score below is for; 0: none */
    unsigned char read_score;  /* read_now: how often a read's try at once found data lately */
    unsigned char read_skips;  /* read_now: reads left that go to the backend without that try */
};

/* Whether fd can be waited on, looked at once per IO on the descriptor (the slot then holds the
 * registration's generation): 0; -EPERM for a regular file, directory or block device, which epoll
 * refuses with EPERM and which poll, select and kqueue would call ready (kqueue: not past a file's
 * end), so that every backend wakes their waiters alike (a PRIORITY wait on a file included); or
 * -errno (EBADF: the descriptor is not open). */
static inline int
evt_backend_slot_check(struct evt_backend_slot *slot, int fd, uint32_t generation)
{
    if (slot->generation == generation) return 0;
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode)) return -EPERM;
    slot->generation = generation;
    return 0;
}

static inline void
evt_backend_slot_clear(struct evt_backend_slot *slot)
{
    slot->generation = 0;
    slot->interest = 0;
    slot->index = -1;
    slot->read_generation = 0;
}

/* What a backend sees of a descriptor's registration: what its waiters want, the generation that
 * tags the kernel's reports of it (it changes with the IO on the number, so an event for an older
 * file is dropped), and the backend's own slot. The core keeps one per descriptor; a backend may
 * keep pointers to it while the descriptor is armed. */
struct evt_watch {
    uint32_t generation;
    int events;
    struct evt_backend_slot slot;
};

/* A transfer a backend does itself (io_uring): read into or write from [base, base + size) on fd,
 * at `position` when it is not negative, waiting for the descriptor to be ready if it must. Lives on
 * the stack of the waiting fiber; the backend calls evt_waiter_done() when the kernel reports the
 * result, and not after cancel() has returned. */
enum evt_op_kind {
    EVT_OP_TRANSFER,   /* read or write, as below */
    EVT_OP_WAITID,     /* until child process `fd` (a pid) exits; base: a siginfo_t (io_uring's). -ENOTSUP if unsupported */
};

struct evt_op {
    struct evt_waiter *waiter;
    enum evt_op_kind kind;
    int fd;
    int events;        /* EVT_READABLE: read; EVT_WRITABLE: write */
    void *base;
    size_t size;
    int64_t position;  /* -1: none */
    int socket;        /* use recv/send */
    int nowait;        /* socket: MSG_DONTWAIT, -EAGAIN rather than waiting for room or data */
    int pending;       /* submitted, result not reaped yet */
    int cancelled;     /* the backend's: turned into a no-op before the kernel took it (reaped as -ECANCELED) */
    long result;       /* bytes, or -errno */
    /* The core's: the IO buffer [base, base + size) lies in, taken from an IO that another thread
     * closed while the kernel had it (see evt_close_io); freed by the core once reaped. */
    struct evt_orphan *orphan;
};

struct evt_backend;

/* The loop's kernel side, all a backend sees of the loop (the core embeds it in struct evt_loop). */
struct evt_kernel {
    const struct evt_backend *backend;
    void *data;               /* the backend's kernel objects; NULL while closed */
    struct evt_wakeup wakeup; /* open with the backend's kernel objects */
    struct evt_fired *fired;  /* what a readiness backend's wait collected, for the core to dispatch */
    int fired_capacity;
    volatile int blocked;     /* inside the backend's wait without the GVL: wakeups must go to the kernel */
    /* A completion backend's counts (Evt::Loop#stats), only added to: */
    uint64_t submitted;       /* requests handed to the kernel */
    uint64_t completed;       /* completions reaped */
    uint64_t overflowed;      /* reaps that found completions the kernel held back for want of room */
    /* The core's own, below: */
    int woken;                /* a wakeup went to the kernel during this wait: more would be wasted */
    size_t ops;               /* transfers submitted to the kernel and not reaped: it may still use their
                                 memory, so the loop stays alive and drains them on close (object.c) */
    int64_t wake_late_ns;     /* how late a timed kernel wait ends, on average (loop.c's wait_out_timer) */
    int interrupted;          /* driven: the tag of an exception that ended the kernel wait, to raise
                                 once its events are dispatched */
};

/* The reports, the one way a backend reaches the core (waiter.c), with the GVL: */
/* `events` (EVT_* bits, by evt_backend_events) fired on fd, watched as `generation`. */
void evt_waiter_fired(struct evt_kernel *kernel, int fd, uint32_t generation, int events);
/* A transfer the backend does (struct evt_op) completed with `result`. */
void evt_waiter_done(struct evt_kernel *kernel, struct evt_op *op, long result);

struct evt_backend {
    const char *name;
    /* Its watch on a descriptor ends with each report (io_uring's one-shot polls): after
     * evt_waiter_fired the core arms it again while waiters for the descriptor remain. */
    int oneshot;
    /* What stands in for the mechanism where the kernel has none (libkqueue for kqueue on Linux),
     * else NULL: such a backend is there to be tested, and comes after the others. */
    const char *emulation;
    /* NULL when this backend can run on this machine, else why not (said once, then remembered). */
    const char *(*probe)(void);
    /* Creates the kernel objects and sets kernel->data; kernel->wakeup is open already. 0, or
     * -errno. */
    int (*open)(struct evt_kernel *kernel);
    /* Releases them. Also called in a forked child, for the copies it inherited. */
    void (*close)(struct evt_kernel *kernel);
    /* The kernel must report watch->events on fd, tagged with watch->generation. Called when a waiter
     * comes and watch->events grew or the registration is new to the backend (another IO on the
     * number, new kernel objects); also when it shrank but is not empty. 0, or -errno; -EPERM means
     * fd cannot be polled (a regular file) and counts as always ready. */
    int (*arm)(struct evt_kernel *kernel, int fd, struct evt_watch *watch);
    /* Nobody waits on fd any more (watch->events is 0). */
    void (*disarm)(struct evt_kernel *kernel, int fd, struct evt_watch *watch);
    /* Waits up to timeout_ns (-1: no limit; 0: only a look) without the GVL: it must touch no Ruby
     * object. Writes at most kernel->fired_capacity events into kernel->fired (a level-triggered backend
     * reports the rest on the next wait, an edge-triggered one leaves them queued in the kernel) and
     * returns how many, or -errno. Reading the wakeup descriptor readable, it drains it
     * (evt_wakeup_drain) and reports nothing for it. */
    int (*wait)(struct evt_kernel *kernel, int64_t timeout_ns);

    /* Optional, for a completion backend: with the GVL, after each wait, reports the completions
     * the kernel has (evt_waiter_fired, evt_waiter_done), all of them: the timers fire next. */
    void (*complete)(struct evt_kernel *kernel);
    /* Optional: transfers done by the backend. Submits op: 0, or -errno when it cannot (the core
     * then does the transfer itself). */
    int (*transfer)(struct evt_kernel *kernel, struct evt_op *op);
    /* Optional: watches child process op->fd (a pid, EVT_OP_WAITID) until it exits, reported as a
     * transfer is (evt_waiter_done, with 0) and stopped by cancel. 0, or -errno: -ESRCH when there
     * is no such process, -ENOTSUP when the backend cannot watch it (the caller waits another way). */
    int (*wait_exit)(struct evt_kernel *kernel, struct evt_op *op);
    /* Stops a pending op (a transfer or a wait_exit) and returns once its completion is reaped: the
     * kernel is done with the memory. May report other completions meanwhile. */
    void (*cancel)(struct evt_kernel *kernel, struct evt_op *op);
    /* Optional, with transfer: a read from fd (recv(2) when `socket`) that the backend would wait
     * for, tried at once first when the backend finds that worth it; with the GVL. Returns the bytes
     * read, -errno, or -EAGAIN: the read goes to transfer. */
    long (*read_now)(struct evt_kernel *kernel, int fd, struct evt_watch *watch, int socket, void *base, size_t size);

    /* Optional: fd is about to be closed on the loop's thread and nobody waits on it any more:
     * whatever the kernel still holds for it (a poll in flight) goes before this returns, so the
     * file is released by the close itself. */
    void (*release)(struct evt_kernel *kernel, int fd, struct evt_watch *watch);
    /* Optional: another thread (holding the GVL) is about to close fd, which the loop's fibers
     * wait on. No request naming the descriptor may reach the kernel after the close: the number
     * could belong to another file by then. The loop's thread may be waiting in the kernel. */
    void (*closed_elsewhere)(struct evt_kernel *kernel, int fd);

    /* Optional: closes the kernel objects the backend keeps between loops for reuse (libkqueue's
     * kqueues, backend_kqueue.c); the number closed. */
    int (*close_kept)(void);
};

/* Whether a failure to make a kernel object says nothing about the mechanism: the process or the
 * system is out of descriptors for now. A probe that meets one reports the backend available (it is),
 * and opening it raises the errno, as Ruby does for any call that needs a descriptor. */
static inline int
evt_backend_out_of_descriptors(int err)
{
    return err == EMFILE || err == ENFILE;
}

/* The backends (evt.c lists those this build has, fastest first). */

extern const struct evt_backend evt_backend_epoll;
extern const struct evt_backend evt_backend_kqueue;
extern const struct evt_backend evt_backend_poll;
extern const struct evt_backend evt_backend_select;
extern const struct evt_backend evt_backend_uring;

#endif
