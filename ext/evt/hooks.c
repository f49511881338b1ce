/* The scheduler hooks besides the IO transfers (io.c), built on the core (loop.c): io_select,
 * kernel_sleep, block, unblock, timeout_after, the helpers of process_wait, and Ruby 4.0's io_close and
 * fiber_interrupt. Evt::HOOKS (lib/evt/hook_table.rb) lists every hook and where it lives. */
#include "core.h"
#include "registration.h"
#include "waiter.h"
#include "object.h"
#include "requests.h"
#include "close.h"
#include "wait.h"
#include "io.h"
#include "hooks.h"

#include <math.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ruby/debug.h>
#include <ruby/io.h>
#include <ruby/io/buffer.h>


/* ---- io_select ---------------------------------------------------------------------------------- */

struct select_call {
    VALUE sets[3];                 /* the arrays given, or nil */
    struct pollfd *pollfds;
    struct evt_selection selection;
};

static const int select_events[3] = {EVT_READABLE, EVT_WRITABLE, EVT_PRIORITY};

/* Polls every IO at once without waiting: the [readable, writable, exceptional] arrays of the
 * objects given, or nil when none is ready. Data already in an IO's read buffer counts as
 * readable, as IO.select has it. */
static VALUE
select_now(struct select_call *call)
{
    long count = call->selection.count;
    int n = 0;
    if (count) {
        do n = poll(call->pollfds, (nfds_t)count, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0) rb_sys_fail("poll");
    }
    for (long i = 0; i < count; i++) {
        if (call->selection.events[i] == EVT_READABLE && !(call->pollfds[i].revents & POLLIN) &&
            evt_rubyio_read_pending(call->selection.ios[i])) {
            call->pollfds[i].revents |= POLLIN;
            n++;
        }
    }
    if (n == 0) return Qnil;

    VALUE result = rb_ary_new_capa(3);
    long i = 0;
    for (int set = 0; set < 3; set++) {
        VALUE ready = rb_ary_new();
        long length = NIL_P(call->sets[set]) ? 0 : RARRAY_LEN(call->sets[set]);
        for (long j = 0; j < length; j++, i++) {
            short revents = call->pollfds[i].revents;
            if (revents & POLLNVAL) rb_syserr_fail(EBADF, "select");
            int hit = set == 0 ? revents & (POLLIN | POLLHUP | POLLERR)
                    : set == 1 ? revents & (POLLOUT | POLLERR)
                               : revents & POLLPRI;
            if (hit) rb_ary_push(ready, RARRAY_AREF(call->sets[set], j));
        }
        rb_ary_push(result, ready);
    }
    return result;
}

/* Whether an IO of the selection was closed while the fiber waited. A close wakes the waiters it
 * finds waiting; one the same event had made ready already is not among them, and its descriptor
 * number, polled again, may be another file's by now. */
static int
selection_closed(const struct evt_selection *selection)
{
    for (long i = 0; i < selection->count; i++)
        if (evt_rubyio_closed(selection->ios[i])) return 1;
    return 0;
}

/* Evt::Loop#io_select (documented in lib/evt.rb): every IO watched by the loop at once: no thread per
 * call. */
static VALUE
loop_io_select(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 1, 4);
    struct select_call call = {{argv[0], argc > 1 ? argv[1] : Qnil, argc > 2 ? argv[2] : Qnil}};
    long count = 0;
    for (int set = 0; set < 3; set++) {
        if (NIL_P(call.sets[set])) continue;
        Check_Type(call.sets[set], T_ARRAY);
        count += RARRAY_LEN(call.sets[set]);
    }
    int64_t timeout = evt_io_timeout_ns(argc > 3 ? argv[3] : Qnil);
    struct evt_loop *loop = evt_object_get(self);

    VALUE buffers[5] = {0};
    call.selection.count = count;
    call.pollfds = ALLOCV_N(struct pollfd, buffers[0], count);
    call.selection.ios = ALLOCV_N(VALUE, buffers[1], count);
    call.selection.fds = ALLOCV_N(int, buffers[2], count);
    call.selection.events = ALLOCV_N(int, buffers[3], count);
    call.selection.waiters = ALLOCV_N(struct evt_waiter, buffers[4], count);
    memset(call.selection.waiters, 0, sizeof(struct evt_waiter) * (size_t)count);
    long i = 0;
    for (int set = 0; set < 3; set++) {
        long length = NIL_P(call.sets[set]) ? 0 : RARRAY_LEN(call.sets[set]);
        for (long j = 0; j < length; j++, i++) {
            VALUE io = rb_io_get_io(RARRAY_AREF(call.sets[set], j));
            call.selection.ios[i] = io;
            call.selection.fds[i] = rb_io_descriptor(io);
            call.selection.events[i] = select_events[set];
            call.pollfds[i] = (struct pollfd){.fd = call.selection.fds[i], .events = (short)select_events[set]};
        }
    }

    VALUE result = select_now(&call);
    int64_t deadline = timeout > 0 ? evt_timers_now() + timeout : timeout;
    while (NIL_P(result) && timeout != 0) {
        struct evt_wait wait;
        evt_wait_select(&wait, loop, &call.selection, timeout);
        enum evt_outcome outcome = evt_wait_suspend(&wait);
        int closed = outcome != EVT_CLOSED && selection_closed(&call.selection);
        if (outcome == EVT_CLOSED || closed) {
            for (int b = 0; b < 5; b++) ALLOCV_END(buffers[b]);
            if (closed) rb_raise(rb_eIOError, "closed stream"); /* as IO.select on a closed IO */
            evt_close_raise();
        }
        result = select_now(&call);
        if (outcome == EVT_TIMED_OUT) break;
        if (deadline > 0 && (timeout = deadline - evt_timers_now()) < 0) timeout = 0;
    }
    for (int b = 0; b < 5; b++) ALLOCV_END(buffers[b]);
    return result;
}

/* ---- timeout_after --------------------------------------------------------------------------- */

struct timeout_call {
    struct evt_loop *loop;
    struct evt_timeout timeout;
};

static VALUE
timeout_yield(VALUE ptr)
{
    return rb_yield(((struct timeout_call *)ptr)->timeout.duration);
}

static VALUE
timeout_cancel(VALUE ptr)
{
    struct timeout_call *call = (struct timeout_call *)ptr;
    evt_timers_remove(&call->loop->timers, &call->timeout.timer); /* nothing when it fired */
    return Qnil;
}

/* A duration Ruby hands on unchecked (Queue#pop(timeout:), SizedQueue#push(timeout:),
 * Timeout.timeout): as Ruby without a scheduler takes it, a negative one has expired, NaN never
 * ends, and one past Time's range is forever, where sleep and IO.select raise. -1: no end. */
static int64_t
unchecked_timeout_ns(VALUE value)
{
    if (NIL_P(value)) return -1;
    if (RB_FLOAT_TYPE_P(value)) {
        double seconds = RFLOAT_VALUE(value);
        if (isnan(seconds)) return -1;
        if (seconds < 0) return 0;
        if (seconds >= 9.2e18) return INT64_MAX / 4;
    }
    else if (FIXNUM_P(value)) {
        if (FIX2LONG(value) < 0) return 0;
    }
    else if (RB_TYPE_P(value, T_BIGNUM)) {
        return RBIGNUM_POSITIVE_P(value) ? INT64_MAX / 4 : 0;
    }
    else if (rb_obj_is_kind_of(value, rb_cNumeric) && RTEST(rb_funcall(value, rb_intern("negative?"), 0))) {
        return 0;
    }
    return evt_io_timeout_ns(value);
}

/* Evt::Loop#timeout_after (documented in lib/evt.rb): a timer on the loop's heap, which the block
 * finishing first removes. */
static VALUE
loop_timeout_after(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 2, UNLIMITED_ARGUMENTS);
    rb_need_block();
    /* A negative duration has already expired (the timeout gem of Ruby 3.3 says so without a
     * scheduler; 3.4's refuses it before calling here): the first wait raises. NaN never ends. */
    int64_t duration = unchecked_timeout_ns(argv[0]);
    struct evt_loop *loop = evt_object_get(self);
    if (duration < 0) return rb_yield(argv[0]); /* nil, NaN: no limit */
    struct timeout_call call = {loop};
    evt_timer_init(&call.timeout.timer, EVT_TIMER_TIMEOUT);
    call.timeout.fiber = rb_fiber_current();
    /* Made now, so a bad class fails here, in the caller, not in the loop when the time is up. */
    call.timeout.exception = rb_make_exception(argc - 1, argv + 1);
    call.timeout.duration = argv[0];
    evt_timers_add(&loop->timers, &call.timeout.timer, evt_timers_now() + duration);
    VALUE result = rb_ensure(timeout_yield, (VALUE)&call, timeout_cancel, (VALUE)&call);
    RB_GC_GUARD(call.timeout.exception);
    return result;
}

/*
 * wait_child_exit(pid) -> true, false or nil
 *
 * Waits in the loop until child +pid+ has exited, leaving it to be reaped: through the backend's
 * own watch (io_uring's waitid, Linux 6.7; kqueue's EVFILT_PROC). true when it exited, false when
 * there is no such child, nil when the backend cannot wait for processes.
 */
static VALUE
loop_wait_child_exit(VALUE self, VALUE pid)
{
    struct evt_loop *loop = evt_object_get(self);
    if (!loop->kernel.backend->wait_exit) return Qnil;
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    struct evt_op op = {.kind = EVT_OP_WAITID, .fd = NUM2PIDT(pid), .base = &info, .position = -1};
    struct evt_wait wait;
    evt_wait_op(&wait, loop, Qnil, &op, Qnil, -1);
    evt_wait_suspend(&wait);
    if (op.result == -ENOTSUP) return Qnil;
    return op.result == 0 ? Qtrue : Qfalse;
}

/*
 * pidfd_open(pid) -> Integer or nil
 *
 * A descriptor that becomes readable when process +pid+ ends (Linux 5.3), or nil where there is none.
 */
static VALUE
loop_pidfd_open(VALUE self, VALUE pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, NUM2PIDT(pid), 0);
    if (fd >= 0) {
        rb_update_max_fd(fd);
        return INT2NUM(fd);
    }
#endif
    return Qnil; /* ENOSYS, ESRCH, EPERM under seccomp...: the caller waits another way */
}


/* Blocks the current fiber on `blocker` (nil: a sleep) until unblock or the timeout: 1 if
 * unblocked, 0 if the time ran out. */
static int
loop_block(struct evt_loop *loop, VALUE blocker, int64_t timeout)
{
    int64_t deadline = timeout >= 0 ? evt_timers_now() + timeout : -1;
    for (;;) {
        struct evt_wait wait;
        evt_wait_block(&wait, loop, blocker, timeout);
        enum evt_outcome outcome = evt_wait_suspend(&wait);
        if (outcome == EVT_UNBLOCKED) return 1;
        if (outcome == EVT_TIMED_OUT) return 0;
        if (deadline >= 0 && (timeout = deadline - evt_timers_now()) < 0) timeout = 0;
    }
}

/* Evt::Loop#kernel_sleep (documented in lib/evt.rb). */
static VALUE
loop_kernel_sleep(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 0, 1);
    int64_t timeout = argc ? evt_io_timeout_ns(argv[0]) : -1;
    struct evt_loop *loop = evt_object_get(self);
    if (timeout == 0) {
        struct evt_wait wait;
        evt_wait_yield(&wait, loop);
        evt_wait_suspend(&wait);
        return Qnil;
    }
    loop_block(loop, Qnil, timeout);
    return Qnil;
}

/* Evt::Loop#block (documented in lib/evt.rb). */
static VALUE
loop_block_m(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 1, 2);
    int64_t timeout = unchecked_timeout_ns(argc > 1 ? argv[1] : Qnil);
    return loop_block(evt_object_get(self), argv[0], timeout) ? Qtrue : Qfalse;
}

/* Evt::Loop#unblock (documented in lib/evt.rb): safe from any thread: it wakes the loop only when the
 * loop waits in the kernel. */
static VALUE
loop_unblock(VALUE self, VALUE blocker, VALUE fiber)
{
    struct evt_loop *loop = evt_object_check(self);
    st_data_t value;
    if (st_lookup(loop->unblockable, (st_data_t)fiber, &value))
        evt_waiter_wake(loop, (struct evt_waiter *)value, EVT_UNBLOCKED, 0);
    /* Running, not blocked yet: Ruby has put it on the blocker's list (a ConditionVariable's, a
     * Queue's) and calls block next, but a kernel_sleep or block of a subclass may run code first,
     * during which another thread can get the GVL and unblock it. Kept for that block, as a
     * thread's wakeup is kept for its next sleep. (A fiber in the ready queue or in another wait is
     * not running: an unblock for it belongs to a block that is over, and is dropped.) */
    else if (fiber == loop->current && !NIL_P(fiber) && (fiber != loop->loop_fiber || !loop->running))
        loop->early_unblock = fiber; /* (the loop fiber inside the loop is the loop at work, not running code) */
    evt_core_wake(loop);
    return Qnil;
}


/* ---- Ruby 4.0: io_close, fiber_interrupt --------------------------------------------------------- */

/* Evt::Loop#io_close (documented in lib/evt.rb): close(2) at once, not through io_uring: that would
 * suspend the closer for a turn, which costs more than the call. */
static VALUE
loop_io_close(VALUE self, VALUE fd_value)
{
    struct evt_loop *loop = evt_object_get(self);
    int fd = NUM2INT(fd_value);
    if (fd < 0) return Qfalse;
    evt_close_descriptor(loop, fd);
    struct evt_registration *reg = evt_registration_find(loop, fd);
    if (reg && !reg->watch.events && loop->kernel.backend->release) loop->kernel.backend->release(&loop->kernel, fd, &reg->watch);
    /* Any error but EBADF still released the descriptor (Linux): closing it again could hit another file. */
    return close(fd) < 0 && errno == EBADF ? Qfalse : Qtrue;
}

/* Evt::Loop#fiber_interrupt (documented in lib/evt.rb): from any thread: the loop raises it on its
 * next turn. */
static VALUE
loop_fiber_interrupt(VALUE self, VALUE fiber, VALUE exception)
{
    static const char *const needed[] = {"alive?", "raise", "transfer"};
    if (!rb_obj_is_fiber(fiber)) {
        for (size_t i = 0; i < sizeof(needed) / sizeof(needed[0]); i++)
            if (!rb_respond_to(fiber, rb_intern(needed[i])))
                rb_raise(rb_eTypeError, "evt: fiber_interrupt needs a Fiber, or an object that answers alive?, "
                                        "raise and transfer; %" PRIsVALUE " does not answer %s",
                         rb_obj_class(fiber), needed[i]);
    }
    struct evt_request request = {EVT_REQUEST_INTERRUPT, fiber, exception, Qnil, Qnil};
    evt_requests_push(evt_object_check(self), &request);
    return Qnil;
}

void
evt_hooks_init(VALUE cLoop)
{
    evt_io_init(cLoop);
    rb_define_method(cLoop, "kernel_sleep", loop_kernel_sleep, -1);
    rb_define_method(cLoop, "block", loop_block_m, -1);
    rb_define_method(cLoop, "unblock", loop_unblock, 2);
    rb_define_method(cLoop, "io_select", loop_io_select, -1);
    rb_define_method(cLoop, "timeout_after", loop_timeout_after, -1);
    rb_define_private_method(cLoop, "pidfd_open", loop_pidfd_open, 1);
    rb_define_private_method(cLoop, "wait_child_exit", loop_wait_child_exit, 1);
    rb_define_method(cLoop, "io_close", loop_io_close, 1);
    rb_define_method(cLoop, "fiber_interrupt", loop_fiber_interrupt, 2);
}
