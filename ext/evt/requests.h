/* Requests from other threads (requests.c): what another thread, which holds the GVL but may not
 * touch a loop's kernel objects or fibers, asks of it; the loop's own thread serves them (loop.c). */
#ifndef EVT_REQUESTS_H
#define EVT_REQUESTS_H

#include "core.h"

enum evt_request_kind {
    EVT_REQUEST_CLOSE,     /* subject: an IO that thread is closing; argument: its descriptor (a Fixnum) */
    EVT_REQUEST_INTERRUPT, /* subject: a fiber waiting in the loop (or a stand-in); argument: the exception */
};

/* One request: what it asks, and of what. */
struct evt_request {
    enum evt_request_kind kind;
    VALUE subject;
    VALUE argument;
    VALUE resumed; /* an interrupt of a Fiber: how often the loop had resumed it when it came; else nil */
    VALUE io;      /* an interrupt of a Fiber: the IO (or Array of IOs) it is for, nil: none known; else nil */
};

/* Notes, fiber-local, the IO (or Array of IOs) the current fiber's IO#close closes, for the
 * fiber_interrupt calls Ruby 4.0 makes inside it; returns the note it replaces, to put back
 * after (nil: none), or Qundef when it cannot note (a frozen Thread: the close goes on without). */
VALUE evt_requests_closing(VALUE ios);
/* At load: the note's key. */
void evt_requests_init(void);

/* Queues a request and ends the loop's wait in the kernel; an interrupt of a Fiber is noted with
 * `resumed` as it is now, and `io` as the IOs this fiber is closing (evt_requests_closing), else the
 * IO of the fiber's wait now (what the caller set is ignored). From any thread of the loop's
 * Ractor. */
void evt_requests_push(struct evt_loop *loop, const struct evt_request *request);
/* The requests queued so far, oldest first, taken out of the queue (nil: none), for
 * evt_requests_count and evt_requests_at, then evt_requests_recycle. The loop's own thread. */
VALUE evt_requests_take(struct evt_loop *loop);
/* How many requests what evt_requests_take gave holds. */
long evt_requests_count(VALUE taken);
/* The request at `index` of what evt_requests_take gave. */
struct evt_request evt_requests_at(VALUE taken, long index);
/* Hands what evt_requests_take gave back, served, to be emptied and used for a later queue. */
void evt_requests_recycle(struct evt_loop *loop, VALUE taken);
/* Counts a resume of `fiber` by the loop, while interrupts are queued (loop->requests.resumes). */
static inline void
evt_requests_resumed(struct evt_loop *loop, VALUE fiber)
{
    if (RB_UNLIKELY(loop->requests.counting)) {
        VALUE count = rb_hash_lookup2(loop->requests.resumes, fiber, Qundef);
        if (!RB_UNDEF_P(count)) rb_hash_aset(loop->requests.resumes, fiber, LONG2FIX(FIX2LONG(count) + 1));
    }
}
/* Whether an interrupt came before the loop resumed its fiber once more: then the wait Ruby meant
 * to interrupt may be over (an event made the fiber ready, and it left on its own), and the
 * exception would land in whatever the fiber waits for next (loop.c keeps it only for a new wait
 * on the same IO). */
int evt_requests_stale(struct evt_loop *loop, const struct evt_request *request);
/* Forgets the resume counts once no request is queued (the Hash stays, emptied, for the next). */
void evt_requests_settle(struct evt_loop *loop);
/* Puts the requests of `kind` from `index` on of what evt_requests_take gave back in the queue, ahead
 * of those made since, for the loop's next turn: taken itself becomes the queue (1), or, with none of
 * `kind` there, is left to recycle (0). */
int evt_requests_keep(struct evt_loop *loop, VALUE taken, enum evt_request_kind kind, long index);

#endif
