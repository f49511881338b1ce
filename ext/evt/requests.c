/* Requests from other threads: a queue on the loop (loop->requests, a Ruby Array the GC sees
 * through the loop), each request an Array [kind, subject, argument, resumed, io]. Made rarely (another
 * thread's IO#close of an IO this loop's fibers wait on, Ruby 4.0's fiber_interrupt), so allocating
 * is fine. */
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
        resumed = rb_hash_lookup2(loop->requests.resumes, request->subject, INT2FIX(0));
        rb_hash_aset(loop->requests.resumes, request->subject, resumed);
    }
    if (NIL_P(loop->requests.list)) loop->requests.list = rb_ary_new();
    rb_ary_push(loop->requests.list,
                rb_ary_new_from_args(5, INT2FIX(request->kind), request->subject, request->argument, resumed, waited.io));
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

struct evt_request
evt_requests_at(VALUE taken, long index)
{
    VALUE request = RARRAY_AREF(taken, index);
    return (struct evt_request){
        .kind = (enum evt_request_kind)FIX2INT(RARRAY_AREF(request, 0)),
        .subject = RARRAY_AREF(request, 1),
        .argument = RARRAY_AREF(request, 2),
        .resumed = RARRAY_AREF(request, 3),
        .io = RARRAY_AREF(request, 4),
    };
}

int
evt_requests_stale(struct evt_loop *loop, const struct evt_request *request)
{
    if (NIL_P(request->resumed) || NIL_P(loop->requests.resumes)) return 0;
    return rb_hash_lookup2(loop->requests.resumes, request->subject, request->resumed) != request->resumed;
}

void
evt_requests_settle(struct evt_loop *loop)
{
    if (NIL_P(loop->requests.list)) loop->requests.resumes = Qnil;
}

void
evt_requests_keep(struct evt_loop *loop, VALUE taken, enum evt_request_kind kind, long index)
{
    VALUE kept = rb_ary_new();
    for (long i = index; i < RARRAY_LEN(taken); i++)
        if (evt_requests_at(taken, i).kind == kind) rb_ary_push(kept, RARRAY_AREF(taken, i));
    if (RARRAY_LEN(kept) == 0) return;
    if (!NIL_P(loop->requests.list)) rb_ary_concat(kept, loop->requests.list);
    loop->requests.list = kept;
    loop->requests.pending = 1;
}
