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
};

/* Queues a request and ends the loop's wait in the kernel. From any thread of the loop's Ractor. */
void evt_requests_push(struct evt_loop *loop, const struct evt_request *request);
/* The requests queued so far, oldest first, taken out of the queue (nil: none), for
 * evt_requests_at. The loop's own thread. */
VALUE evt_requests_take(struct evt_loop *loop);
/* The request at `index` of what evt_requests_take gave. */
struct evt_request evt_requests_at(VALUE taken, long index);
/* Puts the requests of `kind` from `index` on of what evt_requests_take gave back in the queue, ahead
 * of those made since, for the loop's next turn. */
void evt_requests_keep(struct evt_loop *loop, VALUE taken, enum evt_request_kind kind, long index);

#endif
