/* Closing an IO that fibers wait on.
 *
 * Ruby 3.3 and 3.4 call no scheduler hook when an IO is closed (Ruby Bug #18455; io.c's call to
 * io_close is commented out), so a fiber waiting in evt on an IO that another fiber or thread
 * closes would wait forever. evt prepends IO#close (and #close_read, #close_write, which may close
 * the descriptor: closers.c) with a check that costs an IO nobody waits on a walk over the process's
 * loops (one per thread with a scheduler) and a look at one registration: no system call, no
 * allocation. Where fibers do wait on that IO object (not merely on its descriptor number), they
 * are woken before the descriptor closes and raise IOError, "stream closed in another thread", as
 * Ruby threads do (evt_close_io). Another thread's loop is asked to (requests.c), as another thread
 * may not touch its kernel objects or fibers; it wakes them on its next turn (evt_close_heard).
 *
 * Ruby 4.0 interrupts waiting fibers itself, through the scheduler's fiber_interrupt hook, and asks
 * the scheduler to close the descriptor with io_close (hooks.c). What it leaves undone is done here
 * still, from the same IO#close: see evt_close_io. */
#include "core.h"
#include "registration.h"
#include "waiter.h"
#include "object.h"
#include "requests.h"
#include "close.h"

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
    if (elsewhere && reg && !evt_rubyio_closed(io)) reg->closing = io;
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
            loop->kernel.backend->cancel(&loop->kernel, w->op);
            goto again;
        }
    }
    if (reg->io == io && !reg->watch.events && loop->kernel.backend->release && loop->kernel.data)
        loop->kernel.backend->release(&loop->kernel, fd, &reg->watch);
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
            if (NIL_P(closed) && RB_TYPE_P(w->io, T_FILE) && evt_rubyio_closed(w->io)) closed = w->io;
        }
        /* loop_close_io takes every waiter of that IO out of the list: each turn has one IO fewer. */
        if (NIL_P(closed) || closed == last) return;
        loop_close_io(loop, closed, fd, 0);
        last = closed;
    }
}

/* Another thread closes io while transfers of this loop may have the kernel read into or write from
 * the IO's own buffer (io_fillbuf reads into rbuf, io_fflush writes from wbuf). The close frees the
 * buffer at once, and the loop's thread cancels the transfers only once it has the GVL again: the
 * kernel could write into freed memory meanwhile. So the buffer moves from the IO to those transfers
 * (evt_rubyio_drop_buffer), and the loop frees it once the kernel is done (wait.c). A transfer that
 * lost its buffer this way always raises IOError, so Ruby never goes on with the IO's buffer it no
 * longer has. */
static void
hand_over(struct evt_registration *reg, VALUE io, enum evt_rubyio_buffer which)
{
    long capacity;
    char *start = evt_rubyio_buffer(io, which, &capacity);
    if (!start) return;
    struct evt_orphan *orphan = NULL;
    EACH_WAITER(&reg->waiters, io_link, w) {
        struct evt_op *op = w->op;
        if (w->io != io || !op || !op->pending || op->orphan) continue;
        if ((char *)op->base < start || (char *)op->base >= start + capacity) continue;
        if (!orphan) {
            orphan = ALLOC(struct evt_orphan);
            orphan->memory = start;
            orphan->transfers = 0;
        }
        op->orphan = orphan;
        orphan->transfers++;
    }
    if (orphan) evt_rubyio_drop_buffer(io, which);
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
    return !loop->selector.driven && (fiber == loop->loop_fiber || (loop->running && fiber == loop->current));
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
    if (loop->kernel.backend->closed_elsewhere) loop->kernel.backend->closed_elsewhere(&loop->kernel, fd);
    RB_GC_GUARD(keep);
    if (loop->kernel.ops && waited_on(loop, io, fd)) {
        hand_over(loop->registrations[fd], io, EVT_RUBYIO_READ_BUFFER);
        hand_over(loop->registrations[fd], io, EVT_RUBYIO_WRITE_BUFFER);
    }
    struct evt_request request = {EVT_REQUEST_CLOSE, io, INT2FIX(fd), Qnil, Qnil};
    evt_requests_push(loop, &request);
}

/* IO#close from any thread of this process, before the descriptor closes; returns the thread's own
 * loop when its woken fibers must leave their waits before Ruby's close goes on (closers.c lets
 * it run), else NULL. Only this Ractor's loops:
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
struct evt_loop *
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
    return NIL_P(c.yield_to) ? NULL : evt_object_of(c.yield_to);
}


/* Another thread's close of io (on fd), which it asked of this loop (requests.c): served on the
 * loop's thread, where the kernel lets go of the file before the closer goes on. */
void
evt_close_heard(struct evt_loop *loop, VALUE io, int fd)
{
    loop_close_io(loop, io, fd, 1);
}

