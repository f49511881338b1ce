/* Closing an IO that fibers wait on.
 *
 * Ruby 3.3 and 3.4 call no scheduler hook when an IO is closed (Ruby Bug #18455; io.c's call to
 * io_close is commented out), so a fiber waiting in evt on an IO that another fiber or thread
 * closes would wait forever. evt prepends IO#close (and #close_read, #close_write, which may close
 * the descriptor) with a check that costs an IO nobody waits on a walk over the process's loops
 * (one per thread with a scheduler) and a look at one registration: no system call, no allocation.
 * Where fibers do wait on that IO object (not merely on its descriptor number), they are woken
 * before the descriptor closes and raise IOError, "stream closed in another thread", as Ruby
 * threads do (evt_io_closing in loop.c).
 *
 * Ruby 4.0 interrupts waiting fibers itself, through the scheduler's fiber_interrupt hook, and asks
 * the scheduler to close the descriptor with io_close: there evt defines those hooks and leaves
 * IO#close alone. */
#include "loop.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ruby/io.h>
#include <ruby/version.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fields, public in 3.3 and 3.4 */

void
evt_raise_closed(void)
{
    rb_raise(rb_eIOError, "stream closed in another thread");
}

#if RUBY_API_VERSION_MAJOR < 4

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

/* IO#close: the waiters on this IO, and on the IO its writes go to (IO.popen's), first. Ruby 3.4
 * then hands close(2) to the scheduler's blocking_operation_wait; on a worker thread that would
 * cost two thread switches per close for a call that returns at once (sockets, pipes), so a
 * fiber-local flag asks Evt::Scheduling#blocking_operation_wait to run it here. */
static VALUE
io_close(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr;
    int fd = open_descriptor(io, &fptr);
    if (fd >= 0) {
        evt_io_closing(io, fd);
        VALUE write_io = fptr->tied_io_for_writing;
        rb_io_t *write_fptr;
        int write_fd = write_io ? open_descriptor(write_io, &write_fptr) : -1;
        if (write_fd >= 0) evt_io_closing(write_io, write_fd);
    }
    struct super_call call = {argc, argv};
    rb_thread_local_aset(rb_thread_current(), id_inline_offload, Qtrue);
    return rb_ensure(call_super, (VALUE)&call, inline_offload_end, Qnil);
}

/* IO#close_read closes the descriptor unless it is a socket (shut down instead, which wakes the
 * readers with end of file) or an IO only for writing (IOError). */
static VALUE
io_close_read(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr;
    int fd = open_descriptor(io, &fptr);
    if (fd >= 0 && (fptr->mode & (FMODE_DUPLEX | FMODE_WRITABLE)) != FMODE_WRITABLE && !is_socket(fd))
        evt_io_closing(io, fd);
    return rb_call_super(argc, argv);
}

/* IO#close_write: the same for the IO writes go to. */
static VALUE
io_close_write(int argc, VALUE *argv, VALUE io)
{
    rb_io_t *fptr = RB_TYPE_P(io, T_FILE) ? RFILE(io)->fptr : NULL;
    VALUE write_io = fptr && fptr->tied_io_for_writing ? fptr->tied_io_for_writing : io;
    rb_io_t *write_fptr;
    int fd = open_descriptor(write_io, &write_fptr);
    if (fd >= 0 && (write_fptr->mode & (FMODE_DUPLEX | FMODE_READABLE)) != FMODE_READABLE && !is_socket(fd))
        evt_io_closing(write_io, fd);
    return rb_call_super(argc, argv);
}

#endif

/*
 * io_close(fd) -> true or false
 *
 * Ruby 4.0 asks the scheduler to close a descriptor (after interrupting the fibers that waited on
 * its IO). With io_uring the close goes through the ring while the fiber waits; elsewhere close(2).
 * true: closed (Ruby does nothing more); false: it was not open, and Ruby's own close says so.
 */
static VALUE
loop_io_close(VALUE self, VALUE fd_value)
{
    struct evt_loop *loop = evt_loop_get(self);
    int fd = NUM2INT(fd_value);
    if (fd < 0) return Qfalse;
    /* The waiters are gone (Ruby interrupted them): what the kernel still holds for fd goes too. */
    struct evt_registration *reg = fd < loop->registrations_size ? loop->registrations[fd] : NULL;
    if (reg && !reg->events && loop->backend->release) loop->backend->release(loop, fd, reg);
    long result = -ENOTSUP;
    if (loop->backend->transfer) {
        struct evt_op op = {.kind = EVT_OP_CLOSE, .fd = fd, .position = -1};
        struct evt_waiter w;
        evt_waiter_init(&w, rb_fiber_current());
        struct evt_wait wait = {loop, &w, EVT_WAIT_OP, Qnil, Qnil, NULL, -1, loop->forks, &op, Qnil, 0};
        evt_loop_wait_for(&wait);
        result = op.result;
    }
    if (result == -ENOTSUP) result = close(fd) < 0 ? -errno : 0;
    /* Any other error still released the descriptor (Linux): closing it again could hit another file. */
    return result == -EBADF ? Qfalse : Qtrue;
}

/*
 * fiber_interrupt(fiber, exception) -> nil
 *
 * Ruby 4.0: raises +exception+ in +fiber+, which waits in this scheduler (IO#close uses it for the
 * fibers waiting on the IO it closes). From any thread: the loop raises it on its next turn.
 */
static VALUE
loop_fiber_interrupt(VALUE self, VALUE fiber, VALUE exception)
{
    if (!rb_obj_is_fiber(fiber)) rb_raise(rb_eTypeError, "evt: fiber_interrupt needs a Fiber, not %" PRIsVALUE, rb_obj_class(fiber));
    evt_loop_interrupt(evt_loop_check(self), fiber, exception);
    return Qnil;
}

void
evt_close_init(VALUE mEvt, VALUE cLoop)
{
    rb_define_method(cLoop, "io_close", loop_io_close, 1);
    rb_define_method(cLoop, "fiber_interrupt", loop_fiber_interrupt, 2);
#if RUBY_API_VERSION_MAJOR < 4
    /* Evt::CloseWakesWaiters, prepended to IO once evt is loaded. */
    id_inline_offload = rb_intern("__evt_inline_offload");
    VALUE mClose = rb_define_module_under(mEvt, "CloseWakesWaiters");
    rb_define_method(mClose, "close", io_close, -1);
    rb_define_method(mClose, "close_read", io_close_read, -1);
    rb_define_method(mClose, "close_write", io_close_write, -1);
    rb_prepend_module(rb_cIO, mClose);
#endif
}

#pragma GCC diagnostic pop
