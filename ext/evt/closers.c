/* IO#close, #close_read and #close_write, prepended to IO (Evt::CloseWakesWaiters), and BasicSocket's
 * own close_read and close_write (Evt::SocketShutdownWakesWaiters): before the descriptor closes,
 * the fibers waiting on the IO in every evt loop wake and raise IOError (close.c); where they must
 * leave their waits before Ruby's close goes on (Ruby 4.0, a blocking closer), the loop runs them
 * first, through a yield of the closer (wait.c). */
#include "core.h"
#include "object.h"
#include "close.h"
#include "requests.h"
#include "wait.h"
#include "closers.h"

#include <sys/stat.h>

#include <ruby/io.h>
#include <ruby/version.h>

/* Wakes the waiters on io (open on fd), and lets them leave their waits if they must. */
static void
wake_waiters(VALUE io, int fd)
{
    struct evt_loop *loop = evt_close_io(io, fd);
    if (!loop) return;
    /* The loop's turn ends with this fiber, which it readies last. */
    struct evt_wait wait;
    evt_wait_yield(&wait, evt_object_get(loop->self));
    wait.subject = io; /* Evt::Loop#waits: a close under way */
    evt_wait_suspend(&wait);
}

static int
is_socket(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Whether close_read (`direction` FMODE_READABLE) or close_write of io, open on fd, closes the
 * descriptor: a socket is shut down instead, which wakes its readers with end of file, and closed
 * only once it is not open the other way either (shut down before); any other IO is closed, unless
 * it is open the other way only (IOError). */
static int
closes_descriptor(VALUE io, int fd, int direction)
{
    int other = direction == FMODE_READABLE ? FMODE_WRITABLE : FMODE_READABLE;
    int mode = evt_rubyio_mode(io);
    return is_socket(fd) ? !(mode & other) : (mode & (FMODE_DUPLEX | other)) != other;
}

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

#if RUBY_API_VERSION_MAJOR < 4
static ID id_inline_offload;

static VALUE
inline_offload_end(VALUE unused)
{
    rb_thread_local_aset(rb_thread_current(), id_inline_offload, Qnil);
    return Qnil;
}
#else
static VALUE
closing_end(VALUE before)
{
    evt_requests_closing(before);
    return Qnil;
}
#endif

/* Ruby's own close of `ios` (an IO, or an Array of them). Ruby 4.0 interrupts the fibers in a read,
 * write or wait of them through fiber_interrupt, which learns which IOs from the note (requests.c):
 * an interrupt is for a wait on them. */
static VALUE
close_super(int argc, VALUE *argv, VALUE ios)
{
#if RUBY_API_VERSION_MAJOR >= 4
    struct super_call call = {argc, argv};
    VALUE before = evt_requests_closing(ios);
    if (RB_UNDEF_P(before)) return rb_call_super(argc, argv);
    return rb_ensure(call_super, (VALUE)&call, closing_end, before);
#else
    (void)ios;
    return rb_call_super(argc, argv);
#endif
}

/* IO#close: the waiters on this IO, and on the IO its writes go to (IO.popen's), first. Ruby 3.4
 * then hands close(2) to the scheduler's blocking_operation_wait; on a worker thread that would
 * cost two thread switches per close for a call that returns at once (sockets, pipes), so a
 * fiber-local flag asks Evt::Scheduling#blocking_operation_wait to run it here. (Ruby 4.0 closes
 * through io_close instead.) */
static VALUE
io_close(int argc, VALUE *argv, VALUE io)
{
    int fd = evt_rubyio_fd(io);
    if (fd >= 0) {
        VALUE write_io = evt_rubyio_write_io(io);
        wake_waiters(io, fd);
        int write_fd = NIL_P(write_io) ? -1 : evt_rubyio_fd(write_io);
        if (write_fd >= 0) wake_waiters(write_io, write_fd);
    }
#if RUBY_API_VERSION_MAJOR >= 4
    VALUE write_io = evt_rubyio_write_io(io);
    return close_super(argc, argv, NIL_P(write_io) ? io : rb_ary_new_from_args(2, io, write_io));
#else
    struct super_call call = {argc, argv};
    if (OBJ_FROZEN(rb_thread_current())) return rb_call_super(argc, argv); /* no flag: a worker closes */
    rb_thread_local_aset(rb_thread_current(), id_inline_offload, Qtrue);
    return rb_ensure(call_super, (VALUE)&call, inline_offload_end, Qnil);
#endif
}

static VALUE
io_close_read(int argc, VALUE *argv, VALUE io)
{
    int fd = evt_rubyio_fd(io);
    if (fd >= 0 && closes_descriptor(io, fd, FMODE_READABLE)) wake_waiters(io, fd);
    return close_super(argc, argv, io);
}

/* The same for the IO writes go to. */
static VALUE
io_close_write(int argc, VALUE *argv, VALUE io)
{
    VALUE write_io = evt_rubyio_write_io(io);
    if (NIL_P(write_io)) write_io = io;
    int fd = evt_rubyio_fd(write_io);
    if (fd >= 0 && closes_descriptor(write_io, fd, FMODE_WRITABLE)) wake_waiters(write_io, fd);
    return close_super(argc, argv, write_io);
}

void
evt_closers_init(VALUE mEvt)
{
#if RUBY_API_VERSION_MAJOR < 4
    id_inline_offload = rb_intern("__evt_inline_offload");
#endif
    VALUE mClose = rb_define_module_under(mEvt, "CloseWakesWaiters");
    rb_define_method(mClose, "close", io_close, -1);
    rb_define_method(mClose, "close_read", io_close_read, -1);
    rb_define_method(mClose, "close_write", io_close_write, -1);
    rb_prepend_module(rb_cIO, mClose);
    /* BasicSocket's own close_read and close_write, which lib/evt.rb prepends it to (its #close is
     * IO's, already covered: the whole module twice would run the close hook twice per socket). */
    VALUE mShutdown = rb_define_module_under(mEvt, "SocketShutdownWakesWaiters");
    rb_define_method(mShutdown, "close_read", io_close_read, -1);
    rb_define_method(mShutdown, "close_write", io_close_write, -1);
}
