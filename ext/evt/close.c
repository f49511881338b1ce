/* Closing an IO that fibers wait on, and the other requests that come from other threads.
 *
 * Ruby 3.3 and 3.4 call no scheduler hook when an IO is closed (Ruby Bug #18455; io.c's call to
 * io_close is commented out), so a fiber waiting in evt on an IO that another fiber or thread
 * closes would wait forever. evt prepends IO#close (and #close_read, #close_write, which may close
 * the descriptor) with a check that costs an IO nobody waits on a walk over the process's loops
 * (one per thread with a scheduler) and a look at one registration: no system call, no allocation.
 * Where fibers do wait on that IO object (not merely on its descriptor number), they are woken
 * before the descriptor closes and raise IOError, "stream closed in another thread", as Ruby
 * threads do (evt_close_io).
 *
 * Another thread holding the GVL cannot touch a loop's kernel objects or fibers: what it asks of the
 * loop (wake the waiters of an IO it closes, raise in a fiber: fiber_interrupt) is queued on
 * loop->requests.list, and the loop's thread serves it on its next turn (loop.c).
 *
 * Ruby 4.0 interrupts waiting fibers itself, through the scheduler's fiber_interrupt hook, and asks
 * the scheduler to close the descriptor with io_close (hooks.c). What it leaves undone is done here
 * still, from the same IO#close: see evt_close_io. */
#include "core.h"
#include "registration.h"
#include "waiter.h"
#include "object.h"
#include "close.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ruby/io.h>
#include <ruby/fiber/scheduler.h>
#include <ruby/version.h>

void
evt_close_raise(void)
{
    rb_raise(rb_eIOError, "stream closed in another thread");
}

struct evt_orphan {
    void *memory;
    int transfers;
};

void
evt_close_orphan_release(struct evt_orphan *orphan)
{
    if (--orphan->transfers > 0) return;
    ruby_xfree(orphan->memory);
    ruby_xfree(orphan);
}

/* Whether a fiber waits in the loop on io (by descriptor fd). */
static int
waited_on(struct evt_loop *loop, VALUE io, int fd)
{
    struct evt_registration *reg = evt_registration_find(loop, fd);
    if (!reg) return 0;
    EACH_WAITER(&reg->waiters, io_link, w) {
        if (w->io == io) return 1;
    }
    return 0;
}

/* Whether the loop has met io on fd: a fiber waits on it, or waited on it last, or may have: the
 * descriptor's registration forgot its IO at a GC (it keeps none alive that nobody waits on).
 * (Another thread closing io tells the loop even when no fiber waits right now: one may be about
 * to, and must then raise at once.) */
static int
knows(struct evt_loop *loop, VALUE io, int fd)
{
    struct evt_registration *reg = evt_registration_find(loop, fd);
    if (!reg) return 0;
    VALUE known = reg->io;
    return known == io || NIL_P(known) || waited_on(loop, io, fd);
}

/* Wakes the loop's waiters on io with EVT_CLOSED, on the loop's own thread: the kernel lets go of
 * the file before this returns. `elsewhere`: for another thread, which may not have marked io closed
 * yet: until it has, a new wait on io ends at once too. */
static void
loop_close_io(struct evt_loop *loop, VALUE io, int fd, int elsewhere)
{
    struct evt_registration *reg = evt_registration_find(loop, fd);
    if (elsewhere && reg && !evt_io_closed(io)) reg->closing = io;
    if (!waited_on(loop, io, fd)) return;
again:
    EACH_WAITER(&reg->waiters, io_link, w) {
        if (w->io != io) continue;
        struct evt_waiter *target = w;
        if (w->owner) {
            /* One of an io_select's IOs: the select raises. */
            evt_list_remove(&w->io_link);
            evt_registration_leave(loop, w);
            target = w->owner;
        }
        if (target->state == EVT_WAITING) evt_waiter_wake(loop, target, EVT_CLOSED, 0);
        if (w->op && w->op->pending && loop->kernel.data) {
            /* A transfer in the kernel holds the file: take it back now. Cancelling may dispatch
             * other completions, which changes the list: look again from the start. */
            loop->kernel.backend->cancel(loop, w->op);
            goto again;
        }
    }
    if (reg->io == io && !reg->events && loop->kernel.backend->release && loop->kernel.data)
        loop->kernel.backend->release(loop, fd, reg);
}

/* Ruby 4.0's io_close(fd), on the closing thread: Ruby has marked the IO closed and interrupted the
 * fibers whose reads, writes and waits it tracks (fiber_interrupt), and waited for them. What still
 * waits on fd for an IO now closed is woken here, before the descriptor closes: an IO.select (which
 * Ruby does not track), or a wait that began while the close flushed. */
void
evt_close_descriptor(struct evt_loop *loop, int fd)
{
    struct evt_registration *reg = evt_registration_find(loop, fd);
    if (!reg) return;
    VALUE last = Qnil;
    for (;;) {
        VALUE closed = Qnil;
        EACH_WAITER(&reg->waiters, io_link, w) {
            if (NIL_P(closed) && RB_TYPE_P(w->io, T_FILE) && evt_io_closed(w->io)) closed = w->io;
        }
        /* loop_close_io takes every waiter of that IO out of the list: each turn has one IO fewer. */
        if (NIL_P(closed) || closed == last) return;
        loop_close_io(loop, closed, fd, 0);
        last = closed;
    }
}

/* A request from another thread, which holds the GVL and cannot touch the kernel objects. */
void
evt_close_request(struct evt_loop *loop, VALUE first, VALUE second)
{
    if (NIL_P(loop->requests.list)) loop->requests.list = rb_ary_new();
    rb_ary_push(loop->requests.list, rb_assoc_new(first, second));
    loop->requests.pending = 1;
    evt_loop_wake(loop);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's buffers (deprecated in 4.0, still there) */

/* Another thread closes io while transfers of this loop may have the kernel read into or write from
 * the IO's own buffer (io_fillbuf reads into rbuf, io_fflush writes from wbuf). The close frees the
 * buffer at once, and the loop's thread cancels the transfers only once it has the GVL again: the
 * kernel could write into freed memory meanwhile. So the buffer moves from the IO to those transfers
 * (the IO gets none; Ruby makes a new one if it ever needs one, which a closed IO does not), and the
 * loop frees it once the kernel is done (wait_ensure). A transfer that lost its buffer this way
 * always raises IOError, so Ruby never goes on with the IO's buffer it no longer has. */
static void
hand_over(struct evt_registration *reg, VALUE io, rb_io_buffer_t *buffer)
{
    char *start = buffer->ptr;
    if (!start) return;
    struct evt_orphan *orphan = NULL;
    EACH_WAITER(&reg->waiters, io_link, w) {
        struct evt_op *op = w->op;
        if (w->io != io || !op || !op->pending || op->orphan) continue;
        if ((char *)op->base < start || (char *)op->base >= start + buffer->capa) continue;
        if (!orphan) {
            orphan = ALLOC(struct evt_orphan);
            orphan->memory = start;
            orphan->transfers = 0;
        }
        op->orphan = orphan;
        orphan->transfers++;
    }
    if (!orphan) return;
    buffer->ptr = NULL;
    buffer->off = buffer->len = buffer->capa = 0;
}

/* What the closing thread's own loops do (the other threads' loops always hear of it). */
enum own_loops {
    OWN_WAKE,      /* wake the waiters on io */
    OWN_NONE,      /* nothing: Ruby 4.0 tells them itself */
    OWN_WAKE_RUN,  /* Ruby 4.0, a blocking closer: wake them and let them run (the scheduler only) */
};

struct closing {
    VALUE io;
    int fd;
    VALUE thread;
    enum own_loops own;
    VALUE scheduler; /* the thread's */
    VALUE yield_to;  /* OWN_WAKE_RUN: the thread's scheduler, whose woken fibers must leave now */
};

/* Under the list's lock (plain C): whether the loop has to hear of the close. */
static int
must_hear(struct evt_loop *loop, void *ptr)
{
    struct closing *c = ptr;
    /* A closed selector has forgotten its waiters (and may be garbage not yet swept). */
    if (loop->forks != evt_object_forks || loop->finished || !knows(loop, c->io, c->fd)) return 0;
    if (loop->thread == c->thread) return c->own != OWN_NONE;
    /* Another thread's loop, closed: no fiber waits in it and the kernel holds nothing of it. It is
     * also what a loop left behind by its thread is (Ruby closes a thread's scheduler when the
     * thread ends): garbage, perhaps, that the GC has not swept yet while the Ruby objects it holds
     * may be (its requests array): it must not be touched. */
    return loop->kernel.data != NULL;
}

/* Ruby 4.0: whether the current fiber can let the loop run and come back (the loop's own fiber, or
 * a fiber the loop runs, inside Fiber.blocking). */
static int
can_yield_to(struct evt_loop *loop)
{
    VALUE fiber = rb_fiber_current();
    return !loop->driven && (fiber == loop->loop_fiber || (loop->running && fiber == loop->current));
}

static void
hear(struct evt_loop *loop, void *ptr)
{
    struct closing *c = ptr;
    VALUE io = c->io;
    int fd = c->fd;
    if (loop->thread == c->thread) {
        if (c->own == OWN_WAKE) {
            loop_close_io(loop, io, fd, 0);
        }
        else if (loop->self == c->scheduler && can_yield_to(loop)) {
            /* OWN_WAKE_RUN: Ruby will wait, blocking the thread, for the fibers that wait on io to
             * leave their waits, which they can do only if the loop runs. They are woken now and run
             * before Ruby's close (evt_close_io); a wait on io begun meanwhile ends at once (as for
             * another thread's close, until Ruby has marked io closed). */
            loop_close_io(loop, io, fd, 1);
            c->yield_to = loop->self;
        }
        return;
    }
    /* Another thread's loop: it wakes its fibers itself, as soon as it gets the GVL. First, its
     * transfers on fd must not reach the kernel under a number that is free again; that may let
     * other threads run, so it comes before the rest, which must happen in one go with the close
     * (no other thread running until Ruby marks io closed, or a fiber could start a transfer on io
     * after the loop served the request, and be left in the kernel). */
    VALUE keep = loop->self; /* the loop stays meanwhile */
    if (loop->kernel.backend->closed_elsewhere) loop->kernel.backend->closed_elsewhere(loop, fd);
    RB_GC_GUARD(keep);
    if (loop->kernel.ops && waited_on(loop, io, fd)) {
        rb_io_t *fptr = RFILE(io)->fptr;
        hand_over(loop->registrations[fd], io, &fptr->rbuf);
        hand_over(loop->registrations[fd], io, &fptr->wbuf);
    }
    evt_close_request(loop, io, INT2FIX(fd));
}

/* IO#close from any thread of this process, before the descriptor closes. Only this Ractor's loops:
 * another Ractor's cannot know io, which is this Ractor's.
 *
 * Ruby 3.3 and 3.4 tell no scheduler: every loop that knows io hears of it here. Ruby 4.0 interrupts
 * the fibers waiting on io through their own thread's scheduler (fiber_interrupt) and then waits for
 * them, and calls io_close where the closer is a non-blocking fiber, whose loop wakes the rest there
 * (evt_close_descriptor). Other threads' loops still hear of it here: a fiber of theirs may
 * begin a wait on io while the close flushes, after Ruby has looked for waiters, which Ruby would
 * leave in the kernel on a descriptor number soon reused (and, on io_uring, reading into the IO's
 * buffer, which the close frees). So does the closer's own loop when the closer is a blocking fiber,
 * for which Ruby's wait for the interrupted fibers blocks the whole thread: they could never run. */
void
evt_close_io(VALUE io, int fd)
{
    struct closing c = {io, fd, rb_thread_current(), OWN_WAKE, rb_fiber_scheduler_get(), Qnil};
#if RUBY_API_VERSION_MAJOR >= 4
    /* With a scheduler, Ruby interrupts the thread's waiting fibers through it (none without: the
     * loop is a selector driven by hand, or not the thread's scheduler, and Ruby knows of no wait in
     * it), unless the closer is a blocking fiber, whose wait for them would never end. */
    if (!NIL_P(c.scheduler)) c.own = NIL_P(rb_fiber_scheduler_current()) ? OWN_WAKE_RUN : OWN_NONE;
#endif
    evt_object_each_in_ractor(must_hear, hear, &c);
    /* The thread's scheduler, which Ruby's close would block: its woken fibers leave their waits now
     * (the loop's turn ends with this fiber, which it readies last). */
    if (!NIL_P(c.yield_to)) rb_funcall(c.yield_to, rb_intern("kernel_sleep"), 1, INT2FIX(0));
}

#pragma GCC diagnostic pop

/* Serves the requests from other threads: the closes here, on the loop's thread, where the kernel
 * lets go of the file before the closer goes on; returns the rest (interrupts, which switch fibers:
 * the loop raises them when it may), or nil. */
VALUE
evt_close_serve(struct evt_loop *loop)
{
    VALUE requests = loop->requests.list;
    loop->requests.list = Qnil;
    loop->requests.pending = 0;
    if (NIL_P(requests)) return Qnil;
    VALUE rest = Qnil;
    for (long i = 0; i < RARRAY_LEN(requests); i++) {
        VALUE request = RARRAY_AREF(requests, i);
        VALUE first = RARRAY_AREF(request, 0), second = RARRAY_AREF(request, 1);
        if (FIXNUM_P(second)) {
            loop_close_io(loop, first, FIX2INT(second), 1);
            continue;
        }
        if (NIL_P(rest)) rest = rb_ary_new();
        rb_ary_push(rest, request);
    }
    return rest;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fields (deprecated in 4.0, still there) */

/* The descriptor of an open IO, or -1. */
static int
open_descriptor(VALUE io, rb_io_t **fptr)
{
    *fptr = RB_TYPE_P(io, T_FILE) ? RFILE(io)->fptr : NULL;
    return *fptr ? (*fptr)->fd : -1;
}

static int
is_socket(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

#if RUBY_API_VERSION_MAJOR < 4
static ID id_inline_offload;

struct super_call {
    int argc;
    VALUE *argv;
};

static VALUE
call_super(VALUE ptr)
{
    struct super_call *call = (struct super_call *)ptr;
    return rb_call_super(call->argc, call->argv);
}

static VALUE
inline_offload_end(VALUE unused)
{
    rb_thread_local_aset(rb_thread_current(), id_inline_offload, Qnil);
    return Qnil;
}
#endif

/* IO#close: the waiters on this IO, and on the IO its writes go to (IO.popen's), first. Ruby 3.4
 * then hands close(2) to the scheduler's blocking_operation_wait; on a worker thread that would
 * cost two thread switches per close for a call that returns at once (sockets, pipes), so a
 * fiber-local flag asks Evt::Scheduling#blocking_operation_wait to run it here. (Ruby 4.0 closes
 * through io_close instead.) */
static VALUE
io_close(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr;
    int fd = open_descriptor(io, &fptr);
    if (fd >= 0) {
        evt_close_io(io, fd);
        VALUE write_io = fptr->tied_io_for_writing;
        rb_io_t *write_fptr;
        int write_fd = write_io ? open_descriptor(write_io, &write_fptr) : -1;
        if (write_fd >= 0) evt_close_io(write_io, write_fd);
    }
#if RUBY_API_VERSION_MAJOR >= 4
    return rb_call_super(argc, argv);
#else
    struct super_call call = {argc, argv};
    rb_thread_local_aset(rb_thread_current(), id_inline_offload, Qtrue);
    return rb_ensure(call_super, (VALUE)&call, inline_offload_end, Qnil);
#endif
}

/* IO#close_read (and BasicSocket's): a socket is shut down, which wakes its readers with end of
 * file, and closed only once it is not writable either (its write side shut down before); any other
 * IO is closed, unless it is only for writing (IOError). */
static VALUE
io_close_read(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr;
    int fd = open_descriptor(io, &fptr);
    if (fd >= 0 && (is_socket(fd) ? !(fptr->mode & FMODE_WRITABLE)
                                   : (fptr->mode & (FMODE_DUPLEX | FMODE_WRITABLE)) != FMODE_WRITABLE))
        evt_close_io(io, fd);
    return rb_call_super(argc, argv);
}

/* IO#close_write (and BasicSocket's): the same for the IO writes go to. */
static VALUE
io_close_write(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr = RB_TYPE_P(io, T_FILE) ? RFILE(io)->fptr : NULL;
    VALUE write_io = fptr && fptr->tied_io_for_writing ? fptr->tied_io_for_writing : io;
    rb_io_t *write_fptr;
    int fd = open_descriptor(write_io, &write_fptr);
    if (fd >= 0 && (is_socket(fd) ? !(write_fptr->mode & FMODE_READABLE)
                                   : (write_fptr->mode & (FMODE_DUPLEX | FMODE_READABLE)) != FMODE_READABLE))
        evt_close_io(write_io, fd);
    return rb_call_super(argc, argv);
}

#pragma GCC diagnostic pop

void
evt_close_init(VALUE mEvt)
{
    /* Evt::CloseWakesWaiters, prepended to IO once evt is loaded. */
#if RUBY_API_VERSION_MAJOR < 4
    id_inline_offload = rb_intern("__evt_inline_offload");
#endif
    VALUE mClose = rb_define_module_under(mEvt, "CloseWakesWaiters");
    rb_define_method(mClose, "close", io_close, -1);
    rb_define_method(mClose, "close_read", io_close_read, -1);
    rb_define_method(mClose, "close_write", io_close_write, -1);
    rb_prepend_module(rb_cIO, mClose);
    /* Evt::SocketShutdownWakesWaiters: BasicSocket's own close_read and close_write, which lib/evt.rb
     * prepends it to (its #close is IO's, already covered: the whole module twice would run the
     * close hook twice per socket). */
    VALUE mShutdown = rb_define_module_under(mEvt, "SocketShutdownWakesWaiters");
    rb_define_method(mShutdown, "close_read", io_close_read, -1);
    rb_define_method(mShutdown, "close_write", io_close_write, -1);
}
