/* Evt::Selector: evt's loop driven by someone else's loop, through the interface io-event's selectors
 * give async (IO::Event::Selector::Evt, lib/evt/async.rb; the contract, with io-event's and async's
 * own tests, is described in README "async and Falcon on evt").
 *
 * A face over an Evt::Loop it makes and holds (not a subclass): the loop object, its backends,
 * registrations, waiters and transfers are the loop's; the face owns only what async's interface
 * needs besides (the last select's idle time), and what differs is who turns the loop (the loop is
 * `driven`). async keeps its own timers and calls select
 * once per turn of its run loop; fibers go to the loop fiber with transfer and come back when an
 * event, a push or a resume readies them. So here:
 *   - select(duration) is evt_loop_run's EVT_RUN_ONCE (loop.c): the fibers ready when it starts, then the
 *     events (waiting only when there was nothing to do), whose fibers run before it returns;
 *   - io_wait returns false when its fiber is resumed without its events (async's timeouts);
 *   - yield, resume and raise put the calling fiber in the ready queue as a stack waiter that
 *     leaves it however the fiber comes back (evt_wait_yield/evt_wait_start), push puts any object
 *     answering alive? and transfer there;
 *   - a wait made by the loop fiber itself blocks it, as without a scheduler.
 *
 * YARD documents Evt::Selector from this file (.yardopts): each public method's comment below is a
 * `call-seq:` block, in Markdown, with YARD tags where they help. */
#include "core.h"
#include "object.h"
#include "loop.h"
#include "wait.h"
#include "io.h"
#include "selector.h"

#include <ruby/fiber/scheduler.h>
#include <ruby/io/buffer.h>

#ifndef RUBY_FIBER_SCHEDULER_VERSION
#define RUBY_FIBER_SCHEDULER_VERSION 1
#endif

static VALUE cSelector;

/* The face's own state: the loop it drives, and what the last select measured. */
struct selector {
    VALUE loop;      /* an Evt::Loop, driven (Qnil until initialize) */
    int64_t idle_ns; /* the last select's time blocked in the kernel */
};

static void
selector_mark(void *ptr)
{
    rb_gc_mark_movable(((struct selector *)ptr)->loop);
}

static void
selector_compact(void *ptr)
{
    struct selector *s = ptr;
    s->loop = rb_gc_location(s->loop);
}

static size_t
selector_memsize(const void *ptr)
{
    return sizeof(struct selector);
}

static const rb_data_type_t selector_type = {
    "Evt::Selector",
    {selector_mark, RUBY_TYPED_DEFAULT_FREE, selector_memsize, selector_compact},
    0, 0, RUBY_TYPED_FREE_IMMEDIATELY | RUBY_TYPED_WB_PROTECTED,
};

static VALUE
selector_alloc(VALUE klass)
{
    struct selector *s;
    VALUE self = TypedData_Make_Struct(klass, struct selector, &selector_type, s);
    s->loop = Qnil;
    return self;
}

static struct selector *
selector_of(VALUE self)
{
    struct selector *s = rb_check_typeddata(self, &selector_type);
    if (RB_UNLIKELY(NIL_P(s->loop))) rb_raise(rb_eRuntimeError, "evt: the selector is not initialized");
    return s;
}

/* The selector's loop object (Evt::Loop). */
static VALUE
loop_object(VALUE self)
{
    return selector_of(self)->loop;
}

/* The selector's loop, after any fork. */
static struct evt_loop *
selector_get(VALUE self)
{
    return evt_object_check(loop_object(self));
}

/* The selector's loop object, to wait in: IOError once it is closed (the waits would open it again). */
static VALUE
selector_open(VALUE self)
{
    VALUE loop = loop_object(self);
    if (RB_UNLIKELY(evt_object_check(loop)->finished)) rb_raise(rb_eIOError, "evt: the selector is closed");
    return loop;
}

/* attach(loop, loop_fiber): called by initialize with a new Evt::Loop, which this selector drives
 * from now on, for the fiber that calls #select. */
static VALUE
selector_attach(VALUE self, VALUE loop_value, VALUE loop_fiber)
{
    struct selector *s = rb_check_typeddata(self, &selector_type);
    if (!NIL_P(s->loop)) rb_raise(rb_eRuntimeError, "evt: the selector is initialized already");
    if (!rb_obj_is_fiber(loop_fiber))
        rb_raise(rb_eTypeError, "evt: a selector's loop must be a Fiber, not %" PRIsVALUE, rb_obj_class(loop_fiber));
    struct evt_loop *loop = evt_object_of(loop_value);
    loop->selector.driven = 1;
    loop->loop_fiber = loop->current = loop_fiber;
    RB_OBJ_WRITE(self, &s->loop, loop_value);
    return self;
}

/*
 * call-seq:
 *   loop -> Fiber
 *
 * The fiber that calls #select, given to ::new.
 */
static VALUE
selector_loop(VALUE self)
{
    return selector_get(self)->loop_fiber;
}

/*
 * call-seq:
 *   transfer -> Object
 *
 * Switches to the loop fiber; the current fiber goes on when something transfers back to it (a push,
 * an event, a resume), with what was transferred. On the loop fiber itself: returns nil at once.
 */
static VALUE
selector_transfer(VALUE self)
{
    struct evt_loop *loop = selector_get(self);
    if (rb_fiber_current() == loop->loop_fiber) return Qnil;
    return rb_fiber_transfer(loop->loop_fiber, 0, NULL);
}

/*
 * call-seq:
 *   yield -> nil
 *
 * Lets the loop run the others: the current fiber goes on in the next #select.
 *
 * @raise [IOError] the selector is closed
 */
static VALUE
selector_yield(VALUE self)
{
    struct evt_loop *loop = evt_object_get(selector_open(self));
    struct evt_wait wait;
    evt_wait_yield(&wait, loop);
    evt_wait_suspend(&wait);
    return Qnil;
}

static VALUE
start(int argc, VALUE *argv, VALUE self, int raise)
{
    rb_check_arity(argc, raise ? 2 : 1, UNLIMITED_ARGUMENTS);
    struct evt_loop *loop = evt_object_get(selector_open(self));
    struct evt_wait wait;
    evt_wait_start(&wait, loop, argv[0]);
    wait.as.start.argc = argc - 1;
    wait.as.start.argv = argv + 1;
    wait.as.start.raise = raise;
    wait.as.start.kw_splat = rb_keyword_given_p() ? RB_PASS_KEYWORDS : RB_NO_KEYWORDS;
    evt_wait_suspend(&wait);
    return wait.as.start.value;
}

/*
 * call-seq:
 *   resume(fiber, *arguments) -> Object
 *
 * Transfers to `fiber` with `arguments` now; the current fiber waits in the ready queue and goes on
 * in a later #select, unless something transfers to it first. Returns what is transferred back.
 *
 * @raise [IOError] the selector is closed
 */
static VALUE
selector_resume(int argc, VALUE *argv, VALUE self)
{
    return start(argc, argv, self, 0);
}

/*
 * call-seq:
 *   raise(fiber, *arguments, **options) -> Object
 *
 * As #resume, raising in `fiber` (Fiber#raise with the same arguments and keywords, `cause:`
 * included).
 *
 * @raise [IOError] the selector is closed
 */
static VALUE
selector_raise(int argc, VALUE *argv, VALUE self)
{
    return start(argc, argv, self, 1);
}

/*
 * call-seq:
 *   push(fiber) -> nil
 *
 * Transfers to `fiber` in the next #select, unless it has ended by then; `fiber` may be any object
 * answering `alive?` and `transfer`. From any thread (then call #wakeup).
 */
static VALUE
selector_push(VALUE self, VALUE fiber)
{
    /* From another thread too; a forked child's loop is reset by evt_object_check. */
    evt_loop_push(selector_get(self), fiber);
    return Qnil;
}

/*
 * call-seq:
 *   ready? -> true or false
 *
 * Whether fibers wait in the ready queue.
 */
static VALUE
selector_ready_p(VALUE self)
{
    return selector_get(self)->ready_count ? Qtrue : Qfalse;
}

/*
 * call-seq:
 *   select(duration) -> Integer
 *
 * One turn: the fibers that were ready, then the events, waiting for them up to `duration` seconds
 * (nil: no limit, 0: not at all) only when there was nothing else to do. Returns the number of
 * fibers the events resumed; 0 when the wait was interrupted (the interrupt stays pending).
 *
 * @raise [IOError] the selector is closed
 * @raise [TypeError] `duration` is neither nil nor Numeric
 */
static VALUE
selector_select(VALUE self, VALUE duration)
{
    struct evt_loop *loop = evt_object_get(selector_open(self));
    if (!NIL_P(duration) && !rb_obj_is_kind_of(duration, rb_cNumeric))
        rb_raise(rb_eTypeError, "evt: select duration must be nil or Numeric, not %" PRIsVALUE, rb_obj_class(duration));
    int64_t timeout = evt_io_timeout_ns(duration);
    struct selector *s = selector_of(self);
    s->idle_ns = 0; /* a select that raises waited for nothing it reports */
    struct evt_run run = {.mode = EVT_RUN_ONCE, .timeout = timeout};
    evt_loop_run(loop, &run);
    s->idle_ns = run.idle_ns;
    return INT2FIX(run.woke);
}

/*
 * call-seq:
 *   idle_duration -> Float
 *
 * Seconds the last #select spent waiting in the kernel (0.0 when it did not wait).
 */
static VALUE
selector_idle_duration(VALUE self)
{
    return DBL2NUM((double)selector_of(self)->idle_ns / 1e9);
}

/*
 * call-seq:
 *   wakeup -> true or false
 *
 * From any thread: ends the wait of a #select in progress (true), else does nothing (false).
 */
static VALUE
selector_wakeup(VALUE self)
{
    return evt_core_wake(evt_object_of(loop_object(self))) ? Qtrue : Qfalse;
}

/*
 * call-seq:
 *   close -> nil
 *
 * Releases the kernel objects (in a forked child, only its own copies of them). The fibers still
 * suspended in the selector are not resumed by it any more. Closing again does nothing.
 *
 * @raise [ThreadError] called from another thread than the loop fiber's
 */
static VALUE
selector_close(VALUE self)
{
    struct evt_loop *loop = selector_get(self);
    if (loop->finished) return Qnil;
    if (loop->thread != rb_thread_current())
        rb_raise(rb_eThreadError, "evt: a selector is closed by its own thread (its loop fiber's)");
    evt_object_close_backend(loop);
    /* The fibers still suspended in it are not resumed by it any more: it forgets them now, while
     * their stacks are known to be there (dropped with the selector, they may be freed before it). */
    evt_object_forget(loop);
    loop->finished = 1; /* select and the waits do not open it again */
    return Qnil;
}

/*
 * call-seq:
 *   closed? -> true or false
 *
 * True after #close, and in a forked child (the kernel objects are the parent's).
 */
static VALUE
selector_closed_p(VALUE self)
{
    struct evt_loop *loop = evt_object_of(loop_object(self));
    return loop->finished || loop->forks != evt_object_forks ? Qtrue : Qfalse;
}

/*
 * call-seq:
 *   io_wait(fiber, io, events) -> Integer or false
 *
 * Waits until `io` has one of `events` (IO::READABLE, IO::PRIORITY, IO::WRITABLE): returns those that
 * are ready, or false when the fiber was resumed for something else.
 *
 * @raise [IOError] the selector is closed, or `io` was closed while the fiber waited
 */
static VALUE
selector_io_wait(VALUE self, VALUE fiber, VALUE io, VALUE events)
{
    return evt_io_wait_once(selector_open(self), io, events);
}

/* io-event's rule for a range starting at or past the end of the buffer: -EINVAL past it, 0 at it
 * (nothing to transfer); Qundef when the range starts inside. */
static VALUE
outside(VALUE buffer, VALUE offset)
{
    const void *base;
    size_t size, at = NUM2SIZET(offset);
    rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
    if (at > size) return INT2FIX(-EINVAL);
    if (at == size) return INT2FIX(0);
    return Qundef;
}

/* Ruby 4.1 (scheduler interface 4): io_read(fiber, io, buffer, offset, length), one transfer of at
 * most length bytes (-EAGAIN when nothing is ready: Ruby waits with io_wait and tries again). */
static VALUE
selector_io_read_single(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE offset, VALUE length)
{
    return evt_io_transfer_single(selector_open(self), io, buffer, offset, length, Qnil, EVT_READABLE);
}

static VALUE
selector_io_write_single(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE offset, VALUE length)
{
    return evt_io_transfer_single(selector_open(self), io, buffer, offset, length, Qnil, EVT_WRITABLE);
}

static VALUE
selector_io_pread_single(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE from, VALUE offset, VALUE length)
{
    return evt_io_transfer_single(selector_open(self), io, buffer, offset, length, from, EVT_READABLE);
}

static VALUE
selector_io_pwrite_single(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE from, VALUE offset, VALUE length)
{
    return evt_io_transfer_single(selector_open(self), io, buffer, offset, length, from, EVT_WRITABLE);
}

/* Ruby 3.3 to 4.0's transfers: at least length bytes, at file position from unless it is nil. */
static VALUE
minimum(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset, VALUE from, int events)
{
    VALUE loop = selector_open(self);
    VALUE early = outside(buffer, offset);
    if (!RB_UNDEF_P(early)) return early;
    return evt_io_transfer_minimum(loop, io, buffer, length, offset, from, events);
}

/* io_read(fiber, io, buffer, length, offset = 0) and io_write: offset optional. */
static VALUE
transfer_minimum(int argc, VALUE *argv, VALUE self, int events)
{
    rb_check_arity(argc, 4, 5);
    return minimum(self, argv[1], argv[2], argv[3], argc == 5 ? argv[4] : INT2FIX(0), Qnil, events);
}

/*
 * call-seq:
 *   io_read(fiber, io, buffer, length, offset = 0) -> Integer
 *
 * Reads into the IO::Buffer `buffer` from `offset` at least `length` bytes (0: one read, -EAGAIN
 * when nothing is there), up to the end of the buffer, waiting as needed. Returns the bytes read
 * (0: end of file) or -errno. That is Ruby 3.3 to 4.0's io_read; built for Ruby 4.1 (scheduler
 * interface 4), io_read is `io_read(fiber, io, buffer, offset, length)`, one read of at most
 * `length` bytes, or -EAGAIN.
 */
static VALUE
selector_io_read_minimum(int argc, VALUE *argv, VALUE self)
{
    return transfer_minimum(argc, argv, self, EVT_READABLE);
}

/*
 * call-seq:
 *   io_write(fiber, io, buffer, length, offset = 0) -> Integer
 *
 * Writes from the IO::Buffer `buffer` at `offset` at least `length` bytes, waiting as needed.
 * Returns the bytes written or -errno. Built for Ruby 4.1, the arguments and the transfer are as
 * for #io_read there.
 */
static VALUE
selector_io_write_minimum(int argc, VALUE *argv, VALUE self)
{
    return transfer_minimum(argc, argv, self, EVT_WRITABLE);
}

/*
 * call-seq:
 *   io_pread(fiber, io, buffer, from, length, offset) -> Integer
 *
 * As #io_read, at file position `from` (which does not move).
 */
static VALUE
selector_io_pread_minimum(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    return minimum(self, io, buffer, length, offset, from, EVT_READABLE);
}

/*
 * call-seq:
 *   io_pwrite(fiber, io, buffer, from, length, offset) -> Integer
 *
 * As #io_write, at file position `from` (which does not move).
 */
static VALUE
selector_io_pwrite_minimum(VALUE self, VALUE fiber, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    return minimum(self, io, buffer, length, offset, from, EVT_WRITABLE);
}

void
evt_selector_init(VALUE mEvt)
{
    cSelector = rb_define_class_under(mEvt, "Selector", rb_cObject);
    rb_define_alloc_func(cSelector, selector_alloc);
    rb_define_private_method(cSelector, "attach", selector_attach, 2);
    rb_define_private_method(cSelector, "loop_object", loop_object, 0);
    rb_define_method(cSelector, "loop", selector_loop, 0);
    rb_define_method(cSelector, "transfer", selector_transfer, 0);
    rb_define_method(cSelector, "yield", selector_yield, 0);
    rb_define_method(cSelector, "resume", selector_resume, -1);
    rb_define_method(cSelector, "raise", selector_raise, -1);
    rb_define_method(cSelector, "push", selector_push, 1);
    rb_define_method(cSelector, "ready?", selector_ready_p, 0);
    rb_define_method(cSelector, "select", selector_select, 1);
    rb_define_method(cSelector, "idle_duration", selector_idle_duration, 0);
    rb_define_method(cSelector, "wakeup", selector_wakeup, 0);
    rb_define_method(cSelector, "close", selector_close, 0);
    rb_define_method(cSelector, "closed?", selector_closed_p, 0);
    rb_define_method(cSelector, "io_wait", selector_io_wait, 3);
    /* The two conventions for the integers of io_read and friends (see io.c): Ruby's own is public,
     * both are there under their own names, so that each is tested on any Ruby. */
#if RUBY_FIBER_SCHEDULER_VERSION >= 4
    rb_define_method(cSelector, "io_read", selector_io_read_single, 5);
    rb_define_method(cSelector, "io_write", selector_io_write_single, 5);
    rb_define_method(cSelector, "io_pread", selector_io_pread_single, 6);
    rb_define_method(cSelector, "io_pwrite", selector_io_pwrite_single, 6);
#else
    rb_define_method(cSelector, "io_read", selector_io_read_minimum, -1);
    rb_define_method(cSelector, "io_write", selector_io_write_minimum, -1);
    rb_define_method(cSelector, "io_pread", selector_io_pread_minimum, 6);
    rb_define_method(cSelector, "io_pwrite", selector_io_pwrite_minimum, 6);
#endif
    rb_define_private_method(cSelector, "io_read_single", selector_io_read_single, 5);
    rb_define_private_method(cSelector, "io_write_single", selector_io_write_single, 5);
    rb_define_private_method(cSelector, "io_pread_single", selector_io_pread_single, 6);
    rb_define_private_method(cSelector, "io_pwrite_single", selector_io_pwrite_single, 6);
    rb_define_private_method(cSelector, "io_read_minimum", selector_io_read_minimum, -1);
    rb_define_private_method(cSelector, "io_write_minimum", selector_io_write_minimum, -1);
    rb_define_private_method(cSelector, "io_pread_minimum", selector_io_pread_minimum, 6);
    rb_define_private_method(cSelector, "io_pwrite_minimum", selector_io_pwrite_minimum, 6);
}
