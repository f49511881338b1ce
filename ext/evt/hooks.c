/* The scheduler hooks Ruby calls on the hot path, built on the core (loop.c): io_wait, io_read,
 * io_write, io_pread, io_pwrite, io_select, kernel_sleep, block, unblock, timeout_after, and the
 * helpers of process_wait. lib/evt/scheduler.rb lists them all. */
#include "loop.h"

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

static VALUE cBasicSocket = Qundef; /* once `socket` is loaded */

/* nil -> -1 (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives for bad values. */
static int64_t
evt_timeout_ns(VALUE timeout)
{
    if (NIL_P(timeout)) return -1;
    struct timespec ts = rb_time_timespec_interval(timeout);
    if (ts.tv_sec >= INT64_MAX / 1000000000 / 4) return INT64_MAX / 4; /* practically forever */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Readiness right now, without waiting: poll(2) with a zero timeout, as IO#wait would see it (by
 * backend.h's rule: an error or hang-up is every event). */
static int
evt_poll_now(int fd, int events)
{
    struct pollfd pfd = {.fd = fd, .events = (short)evt_poll_mask(events)};
    int n;
    do n = poll(&pfd, 1, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) rb_sys_fail("poll");
    if (n == 0) return 0;
    if (pfd.revents & POLLNVAL) rb_syserr_fail(EBADF, "poll");
    return evt_events_from_poll((unsigned short)pfd.revents) & events;
}

/* Waits until fd has one of `events`: returns them, or 0 when the time ran out; raises IOError when
 * the IO is closed meanwhile. */
static int
evt_loop_wait_io(struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout)
{
    int64_t deadline = timeout >= 0 ? evt_now_ns() + timeout : -1;
    for (;;) {
        struct evt_wait wait;
        evt_wait_io(&wait, loop, io, fd, events, timeout);
        switch (evt_suspend(&wait)) {
        case EVT_IO_READY: return wait.waiter.ready;
        case EVT_TIMED_OUT: return 0;
        case EVT_CLOSED: evt_raise_closed();
        default: break; /* resumed for nothing: wait again for what is left of the time */
        }
        if (deadline >= 0 && (timeout = deadline - evt_now_ns()) < 0) timeout = 0;
    }
}

/* The registration for a transfer on io. Learns once per IO whether its descriptor is in blocking
 * mode: a socket (any BasicSocket, or a descriptor in blocking mode that fstat says is one) is read
 * and written with MSG_DONTWAIT; anything else in blocking mode (a pipe, a FIFO, a tty)
 * is polled before each transfer, and written at most PIPE_BUF bytes at a time, which a writable
 * pipe takes without blocking. Regular files never wait. */
static struct evt_registration *
transfer_registration(struct evt_loop *loop, VALUE io, int fd)
{
    struct evt_registration *reg = evt_registration_get(loop, fd, io);
    if (!(reg->flags & EVT_REG_CHECKED)) {
        if (RB_UNDEF_P(cBasicSocket) && rb_const_defined(rb_cObject, rb_intern("BasicSocket")))
            cBasicSocket = rb_const_get(rb_cObject, rb_intern("BasicSocket"));
        if (!RB_UNDEF_P(cBasicSocket) && RTEST(rb_obj_is_kind_of(io, cBasicSocket))) {
            /* MSG_DONTWAIT never blocks, whatever the mode: no need to ask the kernel. */
            reg->flags = EVT_REG_CHECKED | EVT_REG_SOCKET;
            return reg;
        }
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0) rb_sys_fail("fcntl(F_GETFL)");
        reg->flags = EVT_REG_CHECKED;
        if (!(flags & O_NONBLOCK)) {
            struct stat st;
            if (fstat(fd, &st) < 0) rb_sys_fail("fstat");
            if (S_ISSOCK(st.st_mode)) reg->flags |= EVT_REG_SOCKET;
            else if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) reg->flags |= EVT_REG_FILE;
            else reg->flags |= EVT_REG_BLOCKING;
        }
    }
    return reg;
}

/* One read(2) or write(2) (pread/pwrite at `position` when it is not negative) that cannot block
 * the thread, or -1 with errno EAGAIN. */
static ssize_t
transfer_once(struct evt_registration *reg, int fd, int events, char *base, size_t size, off_t position)
{
    if ((reg->flags & EVT_REG_SOCKET) && position < 0)
        return events == EVT_READABLE ? recv(fd, base, size, MSG_DONTWAIT) : send(fd, base, size, MSG_DONTWAIT);
    if (reg->flags & EVT_REG_BLOCKING) {
        if (!evt_poll_now(fd, events)) {
            errno = EAGAIN;
            return -1;
        }
        if (events == EVT_WRITABLE && size > PIPE_BUF) size = PIPE_BUF;
    }
    if (position >= 0)
        return events == EVT_READABLE ? pread(fd, base, size, position) : pwrite(fd, base, size, position);
    return events == EVT_READABLE ? read(fd, base, size) : write(fd, base, size);
}

/* Waits for the IO as a read or write would, under the IO's own #timeout. */
static void
wait_for_transfer(struct evt_loop *loop, VALUE io, int fd, int events)
{
    if (!evt_loop_wait_io(loop, io, fd, events, evt_timeout_ns(rb_io_timeout(io))))
        rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
}


/*
 * io_wait(io, events, timeout) -> Integer or false
 *
 * The events of +events+ that are ready, waiting up to +timeout+ seconds (nil: the IO's own
 * #timeout, as Ruby does without a scheduler); false when the time is up first.
 */
static VALUE
loop_io_wait(VALUE self, VALUE io, VALUE events_value, VALUE timeout_value)
{
    struct evt_loop *loop = evt_loop_get(self);
    io = rb_io_get_io(io);
    int fd = rb_io_descriptor(io);
    int events = NUM2INT(events_value) & EVT_EVENTS;
    if (NIL_P(timeout_value)) timeout_value = rb_io_timeout(io);
    int64_t timeout = evt_timeout_ns(timeout_value);
    /* After io_read or io_write met EAGAIN, Ruby calls here at once: those events are known not to
     * be ready, and the next readiness will come as an event. Otherwise look first. */
    struct evt_registration *reg = evt_registration_get(loop, fd, io);
    if (events & ~reg->exhausted) {
        int ready = evt_poll_now(fd, events);
        if (ready) return INT2FIX(ready);
    }
    if (timeout == 0 || events == 0) return Qfalse;
    int ready = evt_loop_wait_io(loop, io, fd, events, timeout);
    return ready ? INT2FIX(ready) : Qfalse;
}

/* Transfers with read(2) or write(2) until at least `length` bytes (0: one successful transfer),
 * end of file or an error. When nothing could be transferred and `length` is 0, returns -EAGAIN
 * rather than waiting: Ruby's blocking reads and writes then call io_wait and try again, while
 * read_nonblock and write_nonblock (which come here too) must not wait. */
/* Whether `base` is the IO's own read buffer. Ruby fills it only from io_fillbuf (gets, read,
 * each_line, eof?...), which waits and tries again after EAGAIN whatever happens: such a read may
 * wait here, saving the round trip through io_wait. read_nonblock and readpartial read into the
 * caller's string instead, and must not wait. */
static int
internal_read_buffer(VALUE io, const void *base)
{
    if (!RB_TYPE_P(io, T_FILE) || !RFILE(io)->fptr) return 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return RFILE(io)->fptr->rbuf.ptr == base;
#pragma GCC diagnostic pop
}

/* One transfer done by the backend (io_uring): submits it and waits for its completion under the
 * IO's timeout. Returns bytes or -errno; *timed_out when the time ran out with nothing done. */
static long
transfer_by_backend(struct evt_loop *loop, VALUE io, VALUE buffer, struct evt_op *op, int *timed_out)
{
    struct evt_wait wait;
    evt_wait_op(&wait, loop, io, op, buffer, evt_timeout_ns(rb_io_timeout(io)));
    enum evt_outcome outcome = evt_suspend(&wait);
    /* op->orphan: another thread closed the IO and took the buffer this transfer was aimed into
     * from it (evt_io_closing; freed by now): Ruby must not go on with that buffer. */
    if (outcome == EVT_CLOSED || op->orphan) evt_raise_closed();
    *timed_out = outcome == EVT_TIMED_OUT && op->result <= 0;
    /* Resumed by some other fiber's transfer, not by the loop: leaving, it cancelled its own
     * transfer, which never ran. Nothing happened: try again (as after EINTR). */
    if (outcome == EVT_INTERRUPTED && op->result == -ECANCELED) return -EINTR;
    return op->result;
}

/* Whether the backend does this transfer itself (io_uring): one that may wait for the descriptor,
 * so the kernel does the waiting too; a file's at any position. A try that must not wait
 * (read_nonblock) is one system call, cheaper than a trip through the loop; positioned transfers
 * on anything but a file go to pread(2) and pwrite(2), which fail as Ruby expects. */
static inline int
by_backend_transfer(struct evt_loop *loop, struct evt_registration *reg, off_t position, int may_wait, int events)
{
    if (!loop->backend->transfer) return 0;
    /* A write to anything but a socket (a log file, a pipe, a tty: $stdout) is tried at once first,
     * as the other backends do: a fiber suspended in the ring would hold Ruby's write lock on the
     * IO all the while, and the thread's own code writing to it then (its puts) raised ThreadError.
     * Once it meets EAGAIN, the ring waits for room and writes; a regular file never says EAGAIN,
     * so its writes are made at once, as without a scheduler. A socket's write goes to the ring at
     * once, with the loop's wait (no system call of its own: ~10 % less CPU per keep-alive request
     * than trying first, bin/bench http-keepalive). */
    if (events == EVT_WRITABLE && !(reg->flags & EVT_REG_SOCKET) && !(reg->exhausted & EVT_WRITABLE)) return 0;
    if (reg->flags & EVT_REG_FILE) return 1;
    return position < 0 && may_wait;
}

/* Whether read_nonblock called this hook: the one reader that must not wait. sysread comes with the
 * same arguments and must wait (it does not try again after EAGAIN), so the stack says which. */
static int
called_by_read_nonblock(void)
{
    VALUE frames[2];
    int lines[2];
    /* Frame 0 is this hook. (Ruby 3.3's `start` does not count C frames: ask from the top.) */
    if (rb_profile_frames(0, 2, frames, lines) < 2) return 0;
    VALUE name = rb_profile_frame_method_name(frames[1]);
    return RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) == 13 && memcmp(RSTRING_PTR(name), "read_nonblock", 13) == 0;
}

static VALUE
io_transfer(VALUE self, VALUE io, VALUE buffer, VALUE length_value, VALUE offset_value, off_t position, int events)
{
    struct evt_loop *loop = evt_loop_get(self);
    io = rb_io_get_io(io); /* IO::Buffer#read and friends pass on whatever they were given (a Tempfile) */
    int fd = rb_io_descriptor(io);
    size_t length = NUM2SIZET(length_value), offset = NUM2SIZET(offset_value), total = 0;
    struct evt_registration *reg = transfer_registration(loop, io, fd);
    /* Length 0 asks for one transfer and allows -EAGAIN. Only read_nonblock needs that: Ruby's
     * other readers and writers either wait and try again after -EAGAIN (so waiting here saves the
     * round trip) or, like sysread and syswrite, count on the wait (write_nonblock does not come
     * here at all). */
    if (length == 0 && position < 0) {
        if (events == EVT_WRITABLE) {
            length = 1;
        }
        else {
            const void *base;
            size_t size;
            rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
            if (internal_read_buffer(io, base) || !called_by_read_nonblock()) length = 1;
        }
    }
    for (;;) {
        void *base;
        size_t size;
        /* Fetched before every try: another fiber may have resized the buffer meanwhile. */
        if (events == EVT_READABLE) rb_io_buffer_get_bytes_for_writing(buffer, &base, &size);
        else rb_io_buffer_get_bytes_for_reading(buffer, (const void **)&base, &size);
        if (offset > size)
            rb_raise(rb_eArgError, "offset %" PRIuSIZE " is past the end of the buffer (%" PRIuSIZE " bytes)",
                     offset, size);
        ssize_t n;
        int by_backend = by_backend_transfer(loop, reg, position, total < length, events);
        if (by_backend) {
            struct evt_op op = {
                .kind = EVT_OP_TRANSFER, .fd = fd, .events = events, .base = (char *)base + offset,
                .size = size - offset, .position = position < 0 ? -1 : position + (off_t)total,
                .socket = (reg->flags & EVT_REG_SOCKET) && position < 0,
            };
            int timed_out;
            long result = transfer_by_backend(loop, io, buffer, &op, &timed_out);
            /* Closed while the kernel had it: the result belongs to no one (the epoll backend raises
             * the same when it looks again after waiting). */
            if (RB_TYPE_P(io, T_FILE)) rb_io_check_closed(RFILE(io)->fptr);
            if (timed_out) rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
            if (result < 0) {
                errno = (int)-result;
                n = -1;
            }
            else {
                n = result;
            }
        }
        else {
            n = transfer_once(reg, fd, events, (char *)base + offset, size - offset,
                              position < 0 ? -1 : position + (off_t)total);
        }
        if (n > 0) {
            total += n;
            offset += n;
            if (by_backend) reg->exhausted &= ~events; /* it went through: ready again, as far as we know */
            if (total >= length) break;
            if (by_backend) {
                fd = rb_io_descriptor(io); /* it waited: the IO may have been closed meanwhile */
                reg = transfer_registration(loop, io, fd);
            }
            continue;
        }
        if (n == 0) break; /* end of file, or a full buffer */
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            reg->exhausted |= events;
            if (total >= length) {
                if (total) break;
                return INT2FIX(-EAGAIN);
            }
            if (by_backend_transfer(loop, reg, position, 1, events)) continue; /* the ring waits */
            wait_for_transfer(loop, io, fd, events);
            /* The IO may have been closed meanwhile, and its number given to another file: raise
             * as Ruby does for a closed stream rather than transfer on someone else's descriptor. */
            fd = rb_io_descriptor(io);
            reg = transfer_registration(loop, io, fd);
            continue;
        }
        if (total) break; /* the error shows on the next call */
        return INT2FIX(-errno);
    }
    return SIZET2NUM(total);
}

/*
 * io_read(io, buffer, length, offset) -> Integer
 *
 * Reads into +buffer+ from +offset+: at least +length+ bytes, end of file or an error (+length+ 0:
 * whatever one read gives). Returns the bytes read, or -errno (-EAGAIN when nothing was ready and
 * +length+ is 0).
 */
static VALUE
loop_io_read(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return io_transfer(self, io, buffer, length, offset, -1, EVT_READABLE);
}

/*
 * io_write(io, buffer, length, offset) -> Integer
 *
 * Writes from +buffer+ at +offset+: at least +length+ bytes or an error (+length+ 0: whatever one
 * write takes). Returns the bytes written, or -errno (-EAGAIN when nothing could be written and
 * +length+ is 0).
 */
static VALUE
loop_io_write(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return io_transfer(self, io, buffer, length, offset, -1, EVT_WRITABLE);
}

/*
 * io_pread(io, buffer, from, length, offset) -> Integer
 *
 * As io_read, at file position +from+ (which does not move). Returns the bytes read, or -errno
 * (-ESPIPE for a pipe or socket, as pread(2) says).
 */
static VALUE
loop_io_pread(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    off_t position = NUM2OFFT(from);
    if (position < 0) return INT2FIX(-EINVAL); /* as pread(2) says; Ruby names the file */
    return io_transfer(self, io, buffer, length, offset, position, EVT_READABLE);
}

/*
 * io_pwrite(io, buffer, from, length, offset) -> Integer
 *
 * pwrite(2) at file position +from+ (which does not move). Returns the bytes written, or -errno.
 *
 * Ruby 3.3 and 3.4 call this hook from IO#pwrite without the GVL: inside the blocking region of
 * io.c's internal_pwrite_func. So it must not suspend the fiber, raise, allocate, or touch the
 * loop: it writes at once, as Ruby does without a scheduler (a file write may wait for the disk).
 */
static VALUE
loop_io_pwrite(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length_value, VALUE offset_value)
{
    off_t position = NUM2OFFT(from);
    size_t length = NUM2SIZET(length_value), offset = NUM2SIZET(offset_value), total = 0;
    if (position < 0) return INT2FIX(-EINVAL);
    /* IO#pwrite (without the GVL) always passes the IO itself; IO::Buffer#pwrite (with the GVL) passes
     * whatever it was given, such as a Tempfile: only then is there something to convert. */
    if (!RB_TYPE_P(io, T_FILE)) io = rb_io_get_io(io);
    if (!RFILE(io)->fptr) return INT2FIX(-EBADF);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    int fd = RFILE(io)->fptr->fd; /* rb_io_descriptor raises, which needs the GVL */
#pragma GCC diagnostic pop
    if (fd < 0) return INT2FIX(-EBADF);
    const void *base;
    size_t size;
    rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
    if (offset > size) return INT2FIX(-EINVAL);
    do {
        ssize_t n = pwrite(fd, (const char *)base + offset + total, size - offset - total, position + (off_t)total);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (total) break;
            return INT2FIX(-errno);
        }
        if (n == 0) break;
        total += n;
    } while (total < length && offset + total < size);
    return SIZET2NUM(total);
}

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
            rb_io_read_pending(RFILE(call->selection.ios[i])->fptr)) {
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

/*
 * io_select(readables, writables = nil, exceptables = nil, timeout = nil) -> Array or nil
 *
 * IO.select without a thread: every IO is watched by the loop at once, the fiber wakes on the first
 * readiness or the timeout, and gets what IO.select gives: the ready objects of each array, or nil
 * when the time ran out.
 */
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
    int64_t timeout = evt_timeout_ns(argc > 3 ? argv[3] : Qnil);
    struct evt_loop *loop = evt_loop_get(self);

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
    int64_t deadline = timeout > 0 ? evt_now_ns() + timeout : timeout;
    while (NIL_P(result) && timeout != 0) {
        struct evt_wait wait;
        evt_wait_select(&wait, loop, &call.selection, timeout);
        enum evt_outcome outcome = evt_suspend(&wait);
        if (outcome == EVT_CLOSED) {
            for (int b = 0; b < 5; b++) ALLOCV_END(buffers[b]);
            evt_raise_closed();
        }
        result = select_now(&call);
        if (outcome == EVT_TIMED_OUT) break;
        if (deadline > 0 && (timeout = deadline - evt_now_ns()) < 0) timeout = 0;
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

/*
 * timeout_after(duration, exception_class, *arguments) { |duration| ... } -> the block's value
 *
 * Runs the block; if it still runs after +duration+ seconds, raises exception_class.new(*arguments)
 * in the fiber, wherever it waits. A timer on the loop's heap: the block finishing first removes
 * it. Timeouts nest. A negative duration has expired already: the block's first wait raises.
 */
static VALUE
loop_timeout_after(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 2, UNLIMITED_ARGUMENTS);
    rb_need_block();
    /* A negative duration has already expired (the timeout gem of Ruby 3.3 says so without a
     * scheduler; 3.4's refuses it before calling here): the first wait raises. */
    int expired = rb_obj_is_kind_of(argv[0], rb_cNumeric) && RTEST(rb_funcall(argv[0], rb_intern("negative?"), 0));
    int64_t duration = expired ? 0 : evt_timeout_ns(argv[0]);
    struct evt_loop *loop = evt_loop_get(self);
    if (duration < 0) return rb_yield(argv[0]); /* nil: no limit */
    struct timeout_call call = {loop};
    evt_timer_init(&call.timeout.timer, EVT_TIMER_TIMEOUT);
    call.timeout.fiber = rb_fiber_current();
    /* Made now, so a bad class fails here, in the caller, not in the loop when the time is up. */
    call.timeout.exception = rb_make_exception(argc - 1, argv + 1);
    call.timeout.duration = argv[0];
    evt_timers_add(&loop->timers, &call.timeout.timer, evt_now_ns() + duration);
    VALUE result = rb_ensure(timeout_yield, (VALUE)&call, timeout_cancel, (VALUE)&call);
    RB_GC_GUARD(call.timeout.exception);
    return result;
}

/*
 * wait_child_exit(pid) -> true, false or nil
 *
 * Waits in the loop until child +pid+ has exited, leaving it to be reaped: through the backend's
 * own waitid (io_uring, Linux 6.7). true when it exited, false when there is no such child, nil
 * when the backend cannot wait for processes.
 */
static VALUE
loop_wait_child_exit(VALUE self, VALUE pid)
{
    struct evt_loop *loop = evt_loop_get(self);
    if (!loop->backend->transfer) return Qnil;
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    struct evt_op op = {.kind = EVT_OP_WAITID, .fd = NUM2PIDT(pid), .base = &info, .position = -1};
    struct evt_wait wait;
    evt_wait_op(&wait, loop, Qnil, &op, Qnil, -1);
    evt_suspend(&wait);
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


/* Blocks the current fiber until unblock or the timeout: 1 if unblocked, 0 if the time ran out. */
static int
loop_block(struct evt_loop *loop, int64_t timeout)
{
    int64_t deadline = timeout >= 0 ? evt_now_ns() + timeout : -1;
    for (;;) {
        struct evt_wait wait;
        evt_wait_block(&wait, loop, timeout);
        enum evt_outcome outcome = evt_suspend(&wait);
        if (outcome == EVT_UNBLOCKED) return 1;
        if (outcome == EVT_TIMED_OUT) return 0;
        if (deadline >= 0 && (timeout = deadline - evt_now_ns()) < 0) timeout = 0;
    }
}

/*
 * kernel_sleep(duration = nil) -> nil
 *
 * Sleeps for +duration+ seconds, or until #unblock (nil: no limit). sleep(0) lets the other ready
 * fibers run first.
 */
static VALUE
loop_kernel_sleep(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 0, 1);
    int64_t timeout = argc ? evt_timeout_ns(argv[0]) : -1;
    struct evt_loop *loop = evt_loop_get(self);
    if (timeout == 0) {
        struct evt_wait wait;
        evt_wait_yield(&wait, loop);
        evt_suspend(&wait);
        return Qnil;
    }
    loop_block(loop, timeout);
    return Qnil;
}

/*
 * block(blocker, timeout = nil) -> true or false
 *
 * Blocks the current fiber until #unblock (true) or until +timeout+ seconds have passed (false).
 */
static VALUE
loop_block_m(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 1, 2);
    VALUE value = argc > 1 ? argv[1] : Qnil;
    /* Queue#pop(timeout:), Mutex#sleep and friends wait for any duration without a scheduler (Ruby
     * saturates it), where sleep and IO.select raise RangeError past Time's range. */
    int huge = (RB_FLOAT_TYPE_P(value) && RFLOAT_VALUE(value) >= 9.2e18) ||
               (RB_TYPE_P(value, T_BIGNUM) && RBIGNUM_POSITIVE_P(value));
    int64_t timeout = huge ? INT64_MAX / 4 : evt_timeout_ns(value);
    return loop_block(evt_loop_get(self), timeout) ? Qtrue : Qfalse;
}

/*
 * unblock(blocker, fiber) -> nil
 *
 * Wakes +fiber+ from #block or #kernel_sleep. Safe from any thread: wakes the loop if it is
 * waiting in the kernel, and costs no system call otherwise.
 */
static VALUE
loop_unblock(VALUE self, VALUE blocker, VALUE fiber)
{
    struct evt_loop *loop = evt_loop_check(self);
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
    evt_loop_wake(loop);
    return Qnil;
}


/* ---- Ruby 4.0: io_close, fiber_interrupt --------------------------------------------------------- */

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
        struct evt_wait wait;
        evt_wait_op(&wait, loop, Qnil, &op, Qnil, -1);
        evt_suspend(&wait);
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
    evt_loop_request(evt_loop_check(self), fiber, exception);
    return Qnil;
}

void
evt_hooks_init(VALUE cLoop)
{
    rb_gc_register_address(&cBasicSocket);
    rb_define_method(cLoop, "io_wait", loop_io_wait, 3);
    rb_define_method(cLoop, "io_read", loop_io_read, 4);
    rb_define_method(cLoop, "io_write", loop_io_write, 4);
    rb_define_method(cLoop, "kernel_sleep", loop_kernel_sleep, -1);
    rb_define_method(cLoop, "block", loop_block_m, -1);
    rb_define_method(cLoop, "unblock", loop_unblock, 2);
    rb_define_method(cLoop, "io_pread", loop_io_pread, 5);
    rb_define_method(cLoop, "io_pwrite", loop_io_pwrite, 5);
    rb_define_method(cLoop, "io_select", loop_io_select, -1);
    rb_define_method(cLoop, "timeout_after", loop_timeout_after, -1);
    rb_define_private_method(cLoop, "pidfd_open", loop_pidfd_open, 1);
    rb_define_private_method(cLoop, "wait_child_exit", loop_wait_child_exit, 1);
    rb_define_method(cLoop, "io_close", loop_io_close, 1);
    rb_define_method(cLoop, "fiber_interrupt", loop_fiber_interrupt, 2);
}
