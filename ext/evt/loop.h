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

#include "backend.h"
#include "list.h"
#include "timers.h"

enum evt_waiter_state {
    EVT_IDLE,     /* not suspended in evt */
    EVT_WAITING,  /* suspended, waiting for an event, a timer or an unblock */
    EVT_READY,    /* in the ready queue, to be resumed by the loop */
};

/* Timer kinds: a waiter's deadline, or a timeout_after that raises in its fiber. */
enum { EVT_TIMER_WAITER, EVT_TIMER_TIMEOUT };

struct evt_waiter {
    VALUE fiber;
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
    int interest;             /* backend: events the kernel was last asked for */
    int trusted;              /* backend: the kernel registration belongs to io and generation */
    int index;                /* backend: slot of its own (poll) */
    uint32_t serial;          /* backend: which of its requests for this descriptor is current */
};

struct evt_loop {
    const struct evt_backend *backend;
    void *backend_data;       /* NULL while closed */
    VALUE loop_fiber;
    VALUE current;            /* the fiber the loop last switched to (loop_fiber when it has control) */
    VALUE thread;
    struct evt_list ready;
    size_t ready_count;
    struct evt_list allocated; /* waiters on the heap (for fibers that switched away), by io_link */
    struct evt_list operations; /* waiters of transfers the backend does, by io_link */
    struct evt_timers timers;
    st_table *unblockable;    /* fiber -> waiter, for unblock */
    struct evt_registration **registrations;  /* by descriptor, allocated on first use */
    int registrations_size;
    uint32_t generation;
    size_t waiting;           /* fibers suspended in evt */
    volatile int blocked;     /* inside the backend's wait without the GVL: wakeups must go to the kernel */
    int running;              /* inside loop_run */
    unsigned forks;           /* evt_forks when the kernel objects were made */
};

extern VALUE evt_cLoop;

/* Called by backends from dispatch() for each descriptor event (EVT_* bits, plus both directions on
 * errors and hang-ups). */
void evt_loop_io_ready(struct evt_loop *loop, int fd, uint32_t generation, int events);

/* Called by backends when a direct transfer (struct evt_op) completed with `result`. */
void evt_loop_op_done(struct evt_loop *loop, struct evt_op *op, long result);

void evt_loop_init(VALUE mEvt);

#endif
