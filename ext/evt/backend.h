/* The one interface every backend implements (backend_<mechanism>.c), in the spirit of redis's ae.c:
 * open, close, arm and disarm a descriptor, wait without the GVL, dispatch what arrived, wake up.
 *
 * A backend knows descriptors, events and registrations; it never touches fibers or Ruby objects.
 * The core (loop.c) owns the registrations and the waiters hanging off them. */
#ifndef EVT_BACKEND_H
#define EVT_BACKEND_H

#include <errno.h>
#include <stdint.h>

struct evt_loop;
struct evt_registration;
struct evt_waiter;

/* Events, with the values of Ruby's IO::READABLE, IO::PRIORITY and IO::WRITABLE (poll(2)'s bits). */
enum {
    EVT_READABLE = 1,
    EVT_PRIORITY = 2,
    EVT_WRITABLE = 4,
    EVT_EVENTS = EVT_READABLE | EVT_PRIORITY | EVT_WRITABLE,
};

/* A transfer a backend does itself (io_uring): read into or write from [base, base + size) on fd,
 * at `position` when it is not negative, waiting for the descriptor to be ready if it must. On its own stack of the waiting fiber; the backend calls
 * evt_loop_op_done() when the kernel reports the result, and not after cancel() has returned. */
enum evt_op_kind {
    EVT_OP_TRANSFER,   /* read or write, as below */
    EVT_OP_WAITID,     /* until child process `fd` (a pid) exits; base: a siginfo_t. -ENOTSUP if unsupported */
    EVT_OP_CLOSE,      /* close(2) of fd. -ENOTSUP if unsupported */
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
    int pending;       /* submitted, result not reaped yet */
    long result;       /* bytes, or -errno */
    /* The core's: the IO buffer [base, base + size) lies in, taken from an IO that another thread
     * closed while the kernel had it (see evt_io_closing); freed by the core once reaped. */
    struct evt_orphan *orphan;
};

struct evt_backend {
    const char *name;
    /* NULL when this backend can run on this machine, else why not (said once, then remembered). */
    const char *(*probe)(void);
    /* Creates the kernel objects and sets loop->backend_data. 0, or -errno. */
    int (*open)(struct evt_loop *loop);
    /* Releases them. Also called in a forked child, for the copies it inherited. */
    void (*close)(struct evt_loop *loop);
    /* The kernel must report reg->events on fd (and errors), tagged with reg->generation.
     * Called whenever reg->events changes and is not empty. 0, or -errno; -EPERM means fd
     * cannot be polled (a regular file) and counts as always ready. */
    int (*arm)(struct evt_loop *loop, int fd, struct evt_registration *reg);
    /* Nobody waits on fd any more (reg->events is 0). */
    void (*disarm)(struct evt_loop *loop, int fd, struct evt_registration *reg);
    /* Waits up to timeout_ns (-1: no limit) and collects what arrived. Runs without the GVL:
     * it must touch no Ruby object. Returns the number of events, or -errno. */
    int (*wait)(struct evt_loop *loop, int64_t timeout_ns);
    /* With the GVL: hands each collected event to evt_loop_io_ready(). */
    void (*dispatch)(struct evt_loop *loop);
    /* Ends a wait in progress. Any thread, async-signal-safe. */
    void (*wakeup)(struct evt_loop *loop);

    /* Optional: transfers done by the backend. Submits op: 0, or -errno when it cannot (the core
     * then does the transfer itself). */
    int (*transfer)(struct evt_loop *loop, struct evt_op *op);
    /* Stops a pending op and returns once its completion is reaped: the kernel is done with the
     * memory. May dispatch other completions meanwhile. */
    void (*cancel)(struct evt_loop *loop, struct evt_op *op);

    /* Optional: fd is about to be closed on the loop's thread and nobody waits on it any more:
     * whatever the kernel still holds for it (a poll in flight) goes before this
     * returns, so the file is released by the close itself. */
    void (*release)(struct evt_loop *loop, int fd, struct evt_registration *reg);
    /* Optional: another thread (holding the GVL) is about to close fd, which the loop's fibers
     * wait on. No request naming the descriptor may reach the kernel after the close: the number
     * could belong to another file by then. The loop's thread may be waiting in the kernel. */
    void (*closed_elsewhere)(struct evt_loop *loop, int fd);
};

/* Whether a failure to make a kernel object says nothing about the mechanism: the process or the
 * system is out of descriptors for now. A probe that meets one reports the backend available (it is),
 * and opening it raises the errno, as Ruby does for any call that needs a descriptor. */
static inline int
evt_out_of_descriptors(int err)
{
    return err == EMFILE || err == ENFILE;
}

/* The backends this build has, fastest first, NULL-terminated. */
extern const struct evt_backend *const evt_backends[];

extern const struct evt_backend evt_backend_epoll;
extern const struct evt_backend evt_backend_poll;
extern const struct evt_backend evt_backend_select;
extern const struct evt_backend evt_backend_uring;

#endif
