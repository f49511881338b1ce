/* Requests from other threads: a queue on the loop (loop->requests, a Ruby Array the GC sees
 * through the loop), each request SLOTS values in a row: kind, subject, argument, resumed, io. On
 * Ruby 4.0 every IO#close of an IO a fiber waits on queues an interrupt, so a request allocates
 * nothing: the queue's Array is emptied and used again, and so is the Hash of resume counts. With
 * thousands of fibers alive a minor GC marks every one of them, so each object made per close
 * costs that close more than the rest of its work. */
#include "core.h"
#include "object.h"
#include "requests.h"

static ID id_closing;

void
evt_requests_init(void)
{
    id_closing = rb_intern("__evt_closing");
}

VALUE
evt_requests_closing(VALUE ios)
{
    VALUE thread = rb_thread_current();
    if (OBJ_FROZEN(thread)) return Qundef;
    VALUE before = rb_thread_local_aref(thread, id_closing);
    rb_thread_local_aset(thread, id_closing, ios);
    return before;
}

struct waited_io {
    VALUE fiber;
    VALUE io;
};

static int
waited_io_visit(struct evt_waiter *w, void *arg)
{
    struct waited_io *found = arg;
    if (w->fiber != found->fiber || NIL_P(w->io)) return 0;
    found->io = w->io;
    return 1;
}

enum { SLOT_KIND, SLOT_SUBJECT, SLOT_ARGUMENT, SLOT_RESUMED, SLOT_IO, SLOTS };

void
evt_requests_push(struct evt_loop *loop, const struct evt_request *request)
{
    VALUE resumed = Qnil;
    struct waited_io waited = {request->subject, Qnil};
    if (request->kind == EVT_REQUEST_INTERRUPT && rb_obj_is_fiber(request->subject)) {
        /* What the close calling this closes (closers.c notes it); else its wait's, even one an event
         * has ended already (the waiter is in the ready queue until the fiber runs): a walk over
         * every wait, which a close must not pay for each of its waiters. Another thread may look
         * too: whenever Ruby code runs, the GC may walk these lists, so they are whole then. */
        waited.io = rb_thread_local_aref(rb_thread_current(), id_closing);
        if (NIL_P(waited.io)) evt_object_each_waiter(loop, waited_io_visit, &waited);
        if (NIL_P(loop->requests.resumes)) {
            /* (The call may let another thread in, whose push made one meanwhile: that one stays.) */
            VALUE resumes = rb_funcall(rb_hash_new(), rb_intern("compare_by_identity"), 0);
            if (NIL_P(loop->requests.resumes)) loop->requests.resumes = resumes;
        }
        loop->requests.counting = 1;
        resumed = rb_hash_lookup2(loop->requests.resumes, request->subject, INT2FIX(0));
        rb_hash_aset(loop->requests.resumes, request->subject, resumed);
    }
    if (NIL_P(loop->requests.list)) {
        loop->requests.list = NIL_P(loop->requests.spare) ? rb_ary_new_capa(SLOTS) : loop->requests.spare;
        loop->requests.spare = Qnil;
    }
    const VALUE slots[SLOTS] = {INT2FIX(request->kind), request->subject, request->argument, resumed, waited.io};
    rb_ary_cat(loop->requests.list, slots, SLOTS);
    loop->requests.pending = 1;
    evt_core_wake(loop);
}

VALUE
evt_requests_take(struct evt_loop *loop)
{
    VALUE taken = loop->requests.list;
    loop->requests.list = Qnil;
    loop->requests.pending = 0;
    return taken;
}

long
evt_requests_count(VALUE taken)
{
    return RARRAY_LEN(taken) / SLOTS;
}

struct evt_request
evt_requests_at(VALUE taken, long index)
{
    const long at = index * SLOTS;
    return (struct evt_request){
        .kind = (enum evt_request_kind)FIX2INT(RARRAY_AREF(taken, at + SLOT_KIND)),
        .subject = RARRAY_AREF(taken, at + SLOT_SUBJECT),
        .argument = RARRAY_AREF(taken, at + SLOT_ARGUMENT),
        .resumed = RARRAY_AREF(taken, at + SLOT_RESUMED),
        .io = RARRAY_AREF(taken, at + SLOT_IO),
    };
}

int
evt_requests_stale(struct evt_loop *loop, const struct evt_request *request)
{
    if (NIL_P(request->resumed) || !loop->requests.counting) return 0;
    return rb_hash_lookup2(loop->requests.resumes, request->subject, request->resumed) != request->resumed;
}

void
evt_requests_settle(struct evt_loop *loop)
{
    if (!NIL_P(loop->requests.list) || !loop->requests.counting) return;
    loop->requests.counting = 0;
    rb_hash_clear(loop->requests.resumes);
}

void
evt_requests_recycle(struct evt_loop *loop, VALUE taken)
{
    if (!NIL_P(loop->requests.spare)) return;
    rb_ary_clear(taken);
    loop->requests.spare = taken;
}

int
evt_requests_keep(struct evt_loop *loop, VALUE taken, enum evt_request_kind kind, long index)
{
    /* In place, so that an interrupt held over a turn makes no object: those of `kind` move to the
     * front of taken, which then becomes the queue, with what was queued since after them. */
    long kept = 0;
    for (long i = index; i < evt_requests_count(taken); i++) {
        if (evt_requests_at(taken, i).kind != kind) continue;
        for (int slot = 0; slot < SLOTS; slot++)
            rb_ary_store(taken, kept * SLOTS + slot, RARRAY_AREF(taken, i * SLOTS + slot));
        kept++;
    }
    if (kept == 0) return 0;
    rb_ary_resize(taken, kept * SLOTS);
    VALUE since = loop->requests.list;
    if (!NIL_P(since)) {
        rb_ary_concat(taken, since);
        evt_requests_recycle(loop, since);
    }
    loop->requests.list = taken;
    loop->requests.pending = 1;
    return 1;
}
