/* The core's structures, which every layer above the backends shares: the loop, the registration
 * of a descriptor, the waiter a suspended fiber leaves in the loop, the kinds of wait. Data and
 * one-line helpers only: each C file declares what it gives in a header of its own (the order of
 * the layers is in docs/development.md's Layout, and bin/test checks it).
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
#include "rubyio.h"
#include "timers.h"
#include "wakeup.h"

enum evt_waiter_state {
    EVT_IDLE,     /* not suspended in evt */
    EVT_WAITING,  /* suspended, waiting for an event, a timer or an unblock */
    EVT_READY,    /* in the ready queue, to be resumed by the loop */
};

/* What ended a wait (evt_wait_suspend's result). */
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
    struct evt_watch watch;   /* what the backend sees: the union of the waiters' events, the generation
                                 (it changes with io, so the kernel's events for an older file are
                                 ignored), the backend's slot */
    unsigned counts[3];       /* waiters per event (readable, priority, writable) */
    int flags;                /* EVT_REG_*: what the core learnt about the descriptor */
    int exhausted;            /* events a transfer found not ready (EAGAIN) since the last event came */
    VALUE closing;            /* an IO on fd that another thread is closing, once the loop has served
                                 that thread's request: a new wait on it ends at once (EVT_CLOSED) until
                                 Ruby has marked it closed (the closer may let other threads run first) */
    int armed;                /* the backend was armed for this IO since its kernel objects were made */
};

/* loop->kernel.fired: entries to start with, and at most (a wait reports no more; the rest wait for the next). */
enum { EVT_FIRED_INITIAL = 64, EVT_FIRED_MAX = 4096 };

/* Starters that may go to the head of the ready queue in a turn, at the least. */
#define EVT_FIRST_MIN 64

/* Reads a fiber may do at once (data already there, no wait) after the loop resumed it; the next one
 * lets the other ready fibers run first (io.c). Without it, a connection whose peer always answers
 * before the server reads again keeps its fiber running request after request, and every other
 * connection waits the whole time: a turn long enough to multiply the tail latency. */
#define EVT_READS_NOW_MAX 4

/* Timers fired, by how late: bucket i counts those less than 2^i µs late (the last: the rest). */
enum { EVT_LATE_BUCKETS = 24 };

/* What the loop has done since it was made (Evt::Loop#stats, insight.c): counters, only added to,
 * each a store on a path that runs anyway. */
struct evt_stats {
    uint64_t turns;
    uint64_t kernel_waits;    /* the backend's waits, blocking or a look */
    uint64_t events;          /* readiness events and completions handed to waiters */
    uint64_t timers_fired;
    uint64_t timers_cleared;  /* timers armed before the heap was last cleared (a fork) */
    uint64_t requests;        /* from other threads, served */
    size_t ready_max;         /* fibers ready as a turn began, at most */
    int64_t made_ns;          /* when the loop was made (monotonic clock) */
    int64_t kernel_ns;        /* blocked in the kernel, in all */
    int64_t clock_ns;         /* the loop's last reading of the clock: when a wait began, to the turn */
    uint64_t late[EVT_LATE_BUCKETS];
};

/* Stall reports (insight.c): how long the thread has been away from the loop, read by a watchdog
 * thread. Off (threshold 0), a switch costs one test. */
struct evt_stall {
    int64_t threshold_ns;     /* 0: off */
    int64_t beat_ns;          /* when the thread last passed through the loop */
    uint64_t ended;           /* holds of the thread past the threshold, over */
    int64_t ended_ns;         /* how long the last one lasted */
    VALUE ended_fiber;        /* and which fiber held the thread (the loop fiber: the thread's own code) */
};

struct evt_loop {
    VALUE self;
    struct evt_kernel kernel; /* the backend, its objects, and what its waits collect (backend.h) */
    /* The fibers: who runs, who is ready, who waits. */
    VALUE loop_fiber;
    VALUE current;            /* the fiber the loop last switched to (loop_fiber when it has control) */
    VALUE thread;
    struct evt_list ready;
    size_t ready_count;       /* in ready and in selector.dispatched */
    size_t first_budget;      /* this turn: how many more starters may go to the head of ready (at
                                 least EVT_FIRST_MIN a turn, evt_waiter_ready_first) */
    size_t first_pending;     /* this turn: starters at the head of ready, not among the turn's count */
    size_t waiting;           /* fibers suspended in evt */
    unsigned reads_now;       /* reads done at once by the running fiber since the loop resumed it
                                 (switch_to), up to EVT_READS_NOW_MAX */
    int running;              /* inside evt_loop_run (nested when the loop fiber itself waits) */
    struct evt_list allocated; /* waiters on the heap (for fibers that switched away, pushes), by io_link */
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
    /* A selector's (selector.c): turned by someone else's loop, async's, one select at a time. */
    struct {
        unsigned char driven; /* its loop fiber waits alone, and its kernel waits leave interrupts pending */
        unsigned char dispatching; /* in a select: evt_waiter_ready puts waiters in dispatched, not ready */
        struct evt_list dispatched; /* woken by a select's events, resumed before it returns */
        struct evt_list spare;    /* pushed waiters to reuse (evt_loop_push), by io_link */
        size_t spare_count;
    } selector;
    /* Its life. */
    unsigned char finished;   /* closed for good: nothing opens its kernel objects again */
    unsigned forks;           /* evt_object_forks when the kernel objects were made */
    unsigned epoch;           /* changes when the loop forgets its waiters (evt_object_forget) */
    /* From other threads (requests.c): the queued requests (a Ruby Array, or nil), an emptied Array
     * for the next queue (or nil), and, while fiber interrupts are queued (`counting`), how often the
     * loop has resumed each of their fibers (a Hash kept between uses, else nil). */
    struct {
        VALUE list;
        VALUE spare;
        VALUE resumes;
        int pending;
        int counting;
    } requests;
    struct evt_stats stats;
    struct evt_stall stall;
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

/* Ends the loop's wait in the kernel, if it is in one, from another thread holding the GVL: whether
 * it was in one. The first wakeup of a wait is enough: a batch of unblocks from a worker costs one
 * system call. */
static inline int
evt_core_wake(struct evt_loop *loop)
{
    if (!__atomic_load_n(&loop->kernel.blocked, __ATOMIC_SEQ_CST) || !loop->kernel.data) return 0;
    if (!__atomic_exchange_n(&loop->kernel.woken, 1, __ATOMIC_SEQ_CST)) evt_wakeup_signal(&loop->kernel.wakeup);
    return 1;
}

/* The thread passes through the loop (a switch to or from a fiber, a kernel wait's edges): with
 * stall reports on, a hold of the thread by `holder` since the last pass that lasted past the
 * threshold is recorded as over: a fiber's, or the thread's own code's (the loop fiber's) while
 * fibers waited. `holder` nil: the time was the kernel's. */
static inline void
evt_core_beat(struct evt_loop *loop, VALUE holder)
{
    if (RB_LIKELY(!loop->stall.threshold_ns)) return;
    int64_t now = evt_timers_now(), held = now - loop->stall.beat_ns;
    if (!NIL_P(holder) && held >= loop->stall.threshold_ns && (holder != loop->loop_fiber || loop->waiting)) {
        loop->stall.ended++;
        loop->stall.ended_ns = held;
        loop->stall.ended_fiber = holder;
    }
    loop->stall.beat_ns = now;
}

/* Registration flags, learnt once per IO object on a descriptor. */
enum {
    EVT_REG_CHECKED = 1,   /* O_NONBLOCK and file type looked at */
    EVT_REG_BLOCKING = 2,  /* a descriptor in blocking mode, not a socket: poll before every transfer */
    EVT_REG_SOCKET = 4,    /* a socket: transfer with MSG_DONTWAIT (recv, send) */
    EVT_REG_FILE = 8,      /* a regular file or block device: never waits for readiness */
};

#endif
