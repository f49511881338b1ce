/* The core's structures, which every layer above the backends shares: the loop, the registration
 * of a descriptor, the waiter a suspended fiber leaves in the loop, the kinds of wait. Data and
 * one-line helpers only: each C file declares what it gives in a header of its own (the order of
 * the layers is in the README's Layout, and bin/test checks it).
 *
 * Every fiber suspended in evt is described by one evt_waiter living on that fiber's own stack
 * (nothing is allocated per operation). A waiter is in the ready queue, or waits on a descriptor's
 * registration, a timer, an unblock, or several of these at once; waking it takes it out of all of
 * them. The loop runs on the loop fiber (the blocking fiber that drives the scheduler) and switches
 * with rb_fiber_transfer only. */
#ifndef EVT_CORE_H
#define EVT_CORE_H

#include <ruby.h>
#include <ruby/io.h>
#include <pthread.h>
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

/* What ended a wait (evt_loop_suspend's result). */
enum evt_outcome {
    EVT_INTERRUPTED, /* resumed by something other than the loop, or a yield: nothing happened (as EINTR) */
    EVT_IO_READY,    /* the descriptor is ready: waiter.ready holds which of its events */
    EVT_UNBLOCKED,   /* unblock (block, kernel_sleep, an empty IO.select) */
    EVT_DONE,        /* the backend's transfer completed: op->result holds what it gave */
    EVT_TIMED_OUT,
    EVT_CLOSED,      /* the IO was closed under it */
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
    int ready;                   /* EVT_IO_READY: the events that arrived */
    unsigned char outcome;       /* enum evt_outcome */
    unsigned char state;
    unsigned char unblockable;   /* in loop->unblockable: block and kernel_sleep */
    unsigned char allocated;     /* EVT_HEAP_*: on the heap, not a stack (the loop frees or reuses it) */
};

/* A waiter on the heap: for a fiber that switched away (freed when resumed), or a selector's push
 * (kept for the next push: pushing allocates nothing once the loop has run a while). */
enum { EVT_HEAP_SWITCHER = 1, EVT_HEAP_PUSHED = 2 };

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

/* loop->kernel.fired: entries to start with, and at most (a wait reports no more; the rest wait for the next). */
enum { EVT_FIRED_INITIAL = 64, EVT_FIRED_MAX = 4096 };

/* Starters that may go to the head of the ready queue in a turn, at the least. */
#define EVT_FIRST_MIN 64

struct evt_loop {
    VALUE self;
    /* The kernel side: the backend, its objects, and what its waits collect. */
    struct {
        const struct evt_backend *backend;
        void *data;               /* the backend's kernel objects; NULL while closed */
        struct evt_wakeup wakeup; /* open with the backend's kernel objects */
        struct evt_fired *fired;  /* what a readiness backend's wait collected, for the core to dispatch */
        int fired_capacity;
        volatile int blocked;     /* inside the backend's wait without the GVL: wakeups must go to the kernel */
        int woken;                /* a wakeup went to the kernel during this wait: more would be wasted */
        size_t ops;               /* transfers submitted to the kernel and not reaped: it may still use their
                                     memory, so the loop stays alive (see loop_registry) and drains them on close */
        int64_t wake_late_ns;     /* how late a timed kernel wait ends, on average: such waits end that
                                     much early, and the loop spins the rest (wait_out_timer in loop.c) */
        int interrupted;          /* driven: the tag of an exception that ended the kernel wait, to raise
                                     once its events are dispatched */
    } kernel;
    /* The fibers: who runs, who is ready, who waits. */
    VALUE loop_fiber;
    VALUE current;            /* the fiber the loop last switched to (loop_fiber when it has control) */
    VALUE thread;
    struct evt_list ready;
    size_t ready_count;       /* in ready and in dispatched */
    struct evt_list dispatched; /* EVT_RUN_ONCE: woken by this turn's events, resumed before it returns */
    int dispatching;          /* EVT_RUN_ONCE: evt_waiter_ready puts waiters in dispatched, not ready */
    size_t first_budget;      /* this turn: how many more starters may go to the head of ready (at
                                 least EVT_FIRST_MIN a turn, evt_waiter_ready_first) */
    size_t first_pending;     /* this turn: starters at the head of ready, not among the turn's count */
    size_t waiting;           /* fibers suspended in evt */
    int running;              /* inside evt_loop_run (nested when the loop fiber itself waits) */
    struct evt_list spare;    /* pushed waiters to reuse (evt_loop_push), by io_link */
    size_t spare_count;
    struct evt_list allocated; /* waiters on the heap (for fibers that switched away), by io_link */
    struct evt_list operations; /* waiters of transfers the backend does, by io_link */
    st_table *unblockable;    /* fiber -> waiter, for unblock */
    /* An unblock that came for the fiber running right now (`current`), before it reached block:
     * its next block or sleep ends at once; any other wait of it drops the unblock. */
    VALUE early_unblock;
    /* Starting new fibers for the loop fiber (see launch in loop.c); nil until first needed. */
    struct {
        VALUE fiber;          /* the fiber that starts them */
        VALUE caller;         /* the fiber a launch returns to when the new fiber cannot start */
        VALUE error;          /* that FiberError */
    } launch;
    /* What it waits on: timers and descriptors. */
    struct evt_timers timers;
    struct evt_registration **registrations;  /* by descriptor, allocated on first use */
    int registrations_size;
    uint32_t generation;
    /* How it is driven, and its life. */
    unsigned char driven;     /* turned by someone else's loop (a selector's, async's): its loop fiber
                                 waits alone, and its kernel waits leave interrupts pending */
    unsigned char finished;   /* closed for good: nothing opens its kernel objects again */
    unsigned forks;           /* evt_object_forks when the kernel objects were made */
    unsigned epoch;           /* changes when the loop forgets its waiters (evt_object_forget) */
    /* From other threads: [io, fd] closed, [fiber, exception] to raise. */
    struct {
        VALUE list;
        int pending;
    } requests;
    /* Its place in the process's list of loops, which IO#close looks through (object.c). */
    struct {
        struct evt_list link;
        unsigned long ractor;  /* the Ractor that made it (evt_object_ractor_serial): the only one that uses it */
        unsigned long visited; /* the last evt_object_each_in_ractor that looked at it; these three under */
        int pins;              /* its lock: visits under way (the GC's free waits for them), and */
        int swept;             /* whether the GC freed the object meanwhile (the last visit frees it) */
    } listing;
};

#define EACH_WAITER(head, member, w)                                                           \
    for (struct evt_list *node_ = (head)->next, *next_ = node_->next; node_ != (head);          \
         node_ = next_, next_ = node_->next)                                                   \
        for (struct evt_waiter *w = evt_container_of(node_, struct evt_waiter, member); w; w = NULL)

static inline int64_t
evt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether a timer is due now: the turn fires it once the events are collected. */
static inline int
evt_loop_timer_due(struct evt_loop *loop)
{
    struct evt_timer *first = evt_timers_first(&loop->timers);
    return first && first->deadline <= evt_now_ns();
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
    w->ready = 0;
    w->outcome = EVT_INTERRUPTED;
    w->state = EVT_IDLE;
    w->unblockable = 0;
    w->allocated = 0;
}

/* Ends the loop's wait in the kernel, if it is in one, from another thread holding the GVL: whether
 * it was in one. The first wakeup of a wait is enough: a batch of unblocks from a worker costs one
 * system call. */
static inline int
evt_loop_wake(struct evt_loop *loop)
{
    if (!__atomic_load_n(&loop->kernel.blocked, __ATOMIC_SEQ_CST) || !loop->kernel.data) return 0;
    if (!__atomic_exchange_n(&loop->kernel.woken, 1, __ATOMIC_SEQ_CST)) evt_wakeup_signal(&loop->kernel.wakeup);
    return 1;
}

/* Whether Ruby has marked io closed. */
static inline int
evt_io_closed(VALUE io)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fd, public in 3.3 and 3.4 */
    return !RB_TYPE_P(io, T_FILE) || !RFILE(io)->fptr || RFILE(io)->fptr->fd < 0;
#pragma GCC diagnostic pop
}

/* Registration flags, learnt once per IO object on a descriptor. */
enum {
    EVT_REG_CHECKED = 1,   /* O_NONBLOCK and file type looked at */
    EVT_REG_BLOCKING = 2,  /* a descriptor in blocking mode, not a socket: poll before every transfer */
    EVT_REG_SOCKET = 4,    /* a socket: transfer with MSG_DONTWAIT (recv, send) */
    EVT_REG_FILE = 8,      /* a regular file or block device: never waits for readiness */
};

/* ---- waits (made in wait.c, run by loop.c's evt_loop_suspend) ----------------------------------------------------
 *
 * One suspension of the current fiber, made by one of the constructors below and run by
 * evt_loop_suspend. The whole of it (linking the waiter into the loop's structures, switching away,
 * unlinking) runs under rb_ensure, so however the fiber is unwound the waiter has left every
 * structure before its stack frame goes away. */

enum evt_wait_kind { EVT_WAIT_IO, EVT_WAIT_BLOCK, EVT_WAIT_YIELD, EVT_WAIT_START, EVT_WAIT_SELECT, EVT_WAIT_OP };

/* io_select's IOs: a waiter each, all waking the select's own waiter. */
struct evt_selection {
    long count;
    VALUE *ios;
    int *fds;
    int *events;
    struct evt_waiter *waiters;
};

struct evt_wait {
    /* The header every kind shares. */
    struct evt_waiter waiter;        /* what the loop's structures hold meanwhile */
    struct evt_loop *loop;
    enum evt_wait_kind kind;
    int64_t timeout;                 /* -1: none */
    unsigned forks;                  /* the loop's, when made: a wait resumed in a forked child is the parent's */
    unsigned epoch;                  /* the loop's, when made: a wait the loop has forgotten since is left alone */
    /* What one kind needs besides (its constructor sets it; nothing else is read). */
    union {
        struct {
            int ready_now;           /* these events are ready already: to the ready queue */
        } io;                        /* EVT_WAIT_IO */
        struct {
            VALUE target;            /* the new fiber */
            int argc;                /* what to transfer to it (the selector's resume) */
            const VALUE *argv;
            int raise;               /* Fiber#raise it with argv instead (kw_splat: keywords) */
            int kw_splat;
            VALUE value;             /* what came back to the starter */
        } start;                     /* EVT_WAIT_START */
        struct evt_selection *selection; /* EVT_WAIT_SELECT */
        struct {
            struct evt_op *op;
            VALUE buffer;            /* the IO::Buffer, locked by us while the kernel may write to it */
            int locked;
        } op;                        /* EVT_WAIT_OP */
    } as;
};

#endif
