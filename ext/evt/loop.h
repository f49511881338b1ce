/* The core: waiters, the ready queue, fiber switching, the run loop, the GVL-free wait, wakeup.
 *
 * Every fiber suspended in evt is described by one evt_waiter living on that fiber's own stack
 * (nothing is allocated per operation). A waiter is in the ready queue, or waits on a descriptor's
 * registration, a timer, an unblock, or several of these at once; waking it takes it out of all of
 * them. The loop runs on the loop fiber (the blocking fiber that drives the scheduler) and switches
 * with rb_fiber_transfer only. */
#ifndef EVT_LOOP_H
#define EVT_LOOP_H

#include <ruby.h>
#include <ruby/st.h>
#include <stdint.h>
#include <time.h>

#include "backend.h"
#include "list.h"
#include "timers.h"
#include "wakeup.h"

enum evt_waiter_state {
    EVT_IDLE,     /* not suspended in evt */
    EVT_WAITING,  /* suspended, waiting for an event, a timer or an unblock */
    EVT_READY,    /* in the ready queue, to be resumed by the loop */
};

/* Timer kinds: a waiter's deadline, or a timeout_after that raises in its fiber. */
enum { EVT_TIMER_WAITER, EVT_TIMER_TIMEOUT };

struct evt_waiter {
    VALUE fiber;
    VALUE io;                    /* the IO object it waits on (Qnil: none): closing that IO wakes it */
    struct evt_op *op;           /* the transfer the backend does for it, if any */
    struct evt_waiter *owner;    /* io_select: a waiter per IO wakes this one instead of itself */
    struct evt_list ready_link;  /* in loop->ready while EVT_READY */
    struct evt_list io_link;     /* in registration->waiters while waiting on a descriptor, or in
                                    loop->operations while a transfer by the backend is pending */
    struct evt_timer timer;      /* in loop->timers while it has a deadline */
    int fd;
    int events;                  /* what it waits for on fd */
    int result;                  /* events that arrived; for block/sleep 1 = unblocked; 0 = timed out */
    unsigned char state;
    unsigned char unblockable;   /* in loop->unblockable: block and kernel_sleep */
    unsigned char allocated;     /* on the heap, not a stack: the loop frees it when it resumes it */
};

/* A timeout_after in progress, on its fiber's stack below the block it guards. */
struct evt_timeout {
    struct evt_timer timer;
    VALUE fiber;
    VALUE exception;          /* raised in fiber when the timer fires */
    VALUE duration;
};

/* What the loop knows about one descriptor number, reused from one IO on it to the next. */
struct evt_registration {
    VALUE io;                 /* the IO object the kernel registration was made for; Qnil when unknown */
    struct evt_list waiters;
    uint32_t generation;      /* changes with io, so the kernel's events for an older file are ignored */
    int events;               /* union of the waiters' events */
    unsigned counts[3];       /* waiters per event (readable, priority, writable) */
    int flags;                /* EVT_REG_*: what the core learnt about the descriptor */
    int exhausted;            /* events a transfer found not ready (EAGAIN) since the last event came */
    VALUE closing;            /* an IO on fd that another thread is closing, once the loop has served
                                 that thread's request: a new wait on it ends at once (EVT_CLOSED) until
                                 Ruby has marked it closed (the closer may let other threads run first) */
    int armed;                /* the backend was armed for this IO since its kernel objects were made */
    struct evt_backend_slot slot; /* the backend's own (backend.h) */
};

/* loop->fired: entries to start with, and at most (a wait reports no more; the rest wait for the next). */
enum { EVT_FIRED_INITIAL = 64, EVT_FIRED_MAX = 4096 };

struct evt_loop {
    VALUE self;
    const struct evt_backend *backend;
    void *backend_data;       /* NULL while closed */
    struct evt_wakeup wakeup; /* open with the backend's kernel objects */
    struct evt_fired *fired;  /* what a readiness backend's wait collected, for the core to dispatch */
    int fired_capacity;
    VALUE loop_fiber;
    VALUE current;            /* the fiber the loop last switched to (loop_fiber when it has control) */
    VALUE thread;
    struct evt_list ready;
    size_t ready_count;
    struct evt_list allocated; /* waiters on the heap (for fibers that switched away), by io_link */
    struct evt_list operations; /* waiters of transfers the backend does, by io_link */
    size_t kernel_ops;        /* transfers submitted to the kernel and not reaped: it may still use their
                                 memory, so the loop stays alive (see loop_registry) and drains them on close */
    struct evt_timers timers;
    st_table *unblockable;    /* fiber -> waiter, for unblock */
    struct evt_registration **registrations;  /* by descriptor, allocated on first use */
    int registrations_size;
    uint32_t generation;
    size_t waiting;           /* fibers suspended in evt */
    volatile int blocked;     /* inside the backend's wait without the GVL: wakeups must go to the kernel */
    int woken;                /* a wakeup went to the kernel during this wait: more would be wasted */
    int running;              /* inside loop_run */
    unsigned forks;           /* evt_forks when the kernel objects were made */
    struct evt_list link;     /* in the process's list of loops, which IO#close looks through */
    VALUE requests;           /* from other threads: [io, fd] closed, [fiber, exception] to raise */
    int has_requests;
    /* An unblock that came for the fiber running right now (`current`), before it reached block:
     * its next block or sleep ends at once; any other wait of it drops the unblock. */
    VALUE early_unblock;
    /* Starts new fibers for the loop fiber (see launch in loop.c); nil until first needed. */
    VALUE launcher;
    VALUE launch_caller;      /* the fiber a launch returns to when the new fiber cannot start */
    VALUE launch_error;       /* that FiberError */
};

extern VALUE evt_cLoop;

/* ---- inside the extension: what hooks.c takes from the core ------------------------------------ */

/* What a finished wait reports besides events (> 0) and "unblocked" (1). */
enum { EVT_SPURIOUS = 0, EVT_TIMED_OUT = -1, EVT_CLOSED = -2 /* the IO was closed under it */ };

/* Registration flags, learnt once per IO object on a descriptor. */
enum {
    EVT_REG_CHECKED = 1,   /* O_NONBLOCK and file type looked at */
    EVT_REG_BLOCKING = 2,  /* a descriptor in blocking mode, not a socket: poll before every transfer */
    EVT_REG_SOCKET = 4,    /* a socket: transfer with MSG_DONTWAIT (recv, send) */
    EVT_REG_FILE = 8,      /* a regular file or block device: never waits for readiness */
};

enum evt_wait_kind { EVT_WAIT_IO, EVT_WAIT_BLOCK, EVT_WAIT_YIELD, EVT_WAIT_START, EVT_WAIT_SELECT, EVT_WAIT_OP };

/* io_select's IOs: a waiter each, all waking the select's own waiter. */
struct evt_selection {
    long count;
    VALUE *ios;
    int *fds;
    int *events;
    struct evt_waiter *waiters;
};

/* One suspension of the current fiber. The whole of it (linking the waiter into the loop's
 * structures, switching away, unlinking) runs under rb_ensure, so however the fiber is unwound the
 * waiter has left every structure before its stack frame goes away. */
struct evt_wait {
    struct evt_loop *loop;
    struct evt_waiter *waiter;
    enum evt_wait_kind kind;
    VALUE io;          /* EVT_WAIT_IO */
    VALUE target;      /* EVT_WAIT_START: the new fiber */
    struct evt_selection *selection; /* EVT_WAIT_SELECT */
    int64_t timeout;   /* -1: none */
    unsigned forks;
    struct evt_op *op; /* EVT_WAIT_OP */
    VALUE buffer;      /* EVT_WAIT_OP: the IO::Buffer, locked by us while the kernel may write to it */
    int locked;
};

static inline int64_t
evt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void
evt_waiter_init(struct evt_waiter *w, VALUE fiber)
{
    w->fiber = fiber;
    w->io = Qnil;
    w->op = NULL;
    evt_list_init(&w->ready_link);
    evt_list_init(&w->io_link);
    evt_timer_init(&w->timer, EVT_TIMER_WAITER);
    w->owner = NULL;
    w->fd = -1;
    w->events = 0;
    w->result = EVT_SPURIOUS;
    w->state = EVT_IDLE;
    w->unblockable = 0;
    w->allocated = 0;
}

/* Ends the loop's wait in the kernel, if it is in one, from another thread holding the GVL. The
 * first wakeup of a wait is enough: a batch of unblocks from a worker costs one system call. */
static inline void
evt_loop_wake(struct evt_loop *loop)
{
    if (__atomic_load_n(&loop->blocked, __ATOMIC_SEQ_CST) && loop->backend_data &&
        !__atomic_exchange_n(&loop->woken, 1, __ATOMIC_SEQ_CST))
        evt_wakeup_signal(&loop->wakeup);
}

/* The loop for `self`, after any fork (kernel objects may still be closed). */
struct evt_loop *evt_loop_check(VALUE self);
/* The loop for `self`, used from its own thread, kernel objects open. */
struct evt_loop *evt_loop_get(VALUE self);
/* nil -> -1 (no limit); otherwise nanoseconds, with Kernel#sleep's errors for bad values. */
int64_t evt_timeout_ns(VALUE timeout);
struct evt_registration *evt_registration_get(struct evt_loop *loop, int fd, VALUE io);
void evt_waiter_wake(struct evt_loop *loop, struct evt_waiter *w, int result);
/* Suspends the current fiber on `wait` (see struct evt_wait). */
void evt_loop_wait_for(struct evt_wait *wait);
int evt_loop_suspend(struct evt_loop *loop, struct evt_waiter *w, enum evt_wait_kind kind, VALUE io, VALUE target,
                     int64_t timeout);
/* Waits until fd has one of `events`: returns them, or EVT_TIMED_OUT; raises IOError when the IO is
 * closed meanwhile. */
int evt_loop_wait_io(struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout);
/* Readiness right now, as poll(2) with a zero timeout says. */
int evt_poll_now(int fd, int events);
/* Raises the IOError of a read or write whose IO another fiber or thread closed. */
NORETURN(void evt_raise_closed(void));
void evt_hooks_init(VALUE cLoop);

/* IO#close from any thread of this process: wakes every fiber waiting on io (the object, not just
 * its descriptor) with EVT_CLOSED, before the descriptor is closed. */
void evt_io_closing(VALUE io, int fd);
/* Ruby 4.0's fiber_interrupt, from any thread: raises exception in fiber where it waits. */
void evt_loop_interrupt(struct evt_loop *loop, VALUE fiber, VALUE exception);
void evt_close_init(VALUE mEvt, VALUE cLoop);

void evt_loop_init(VALUE mEvt);

#endif
