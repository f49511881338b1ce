/* The IO hooks: io_wait, io_read, io_write, io_pread, io_pwrite.
 *
 * Every transfer is made of one primitive, transfer_single: one read or write of at most a given
 * number of bytes, or -EAGAIN (-errno for any other failure). That is Ruby 4.1's interface
 * (scheduler interface 4, ruby/ruby#18483: io_read(io, buffer, offset, length)); Ruby 3.3 to 4.0's
 * hooks (io_read(io, buffer, length, offset): at least `length` bytes, waiting as needed) are built
 * on it. Which of the two Ruby gets as io_read and friends is chosen at compile time from
 * RUBY_FIBER_SCHEDULER_VERSION, as io-event does; the other is defined too, as private methods
 * named *_single or *_minimum, so that both are tested on any Ruby. */
#include "core.h"
#include "registration.h"
#include "object.h"
#include "close.h"
#include "wait.h"
#include "io.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ruby/debug.h>
#include <ruby/fiber/scheduler.h>
#include <ruby/io/buffer.h>
#include <ruby/version.h>

#ifndef RUBY_FIBER_SCHEDULER_VERSION
#define RUBY_FIBER_SCHEDULER_VERSION 1
#endif

static VALUE cBasicSocket = Qundef; /* once `socket` is loaded */

/* nil -> -1 (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives for bad values. */
int64_t
evt_io_timeout_ns(VALUE timeout)
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
    struct pollfd pfd = {.fd = fd, .events = (short)evt_backend_poll_mask(events)};
    int n;
    do n = poll(&pfd, 1, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) rb_sys_fail("poll");
    if (n == 0) return 0;
    if (pfd.revents & POLLNVAL) rb_syserr_fail(EBADF, "poll");
    return evt_backend_events((unsigned short)pfd.revents) & events;
}

/* A wait's outcome as the fiber resumes: made ready by an event, but closed by a fiber that ran
 * before it (a close wakes only the waiters it finds waiting), the IO counts as closed under the
 * wait, as for a thread, whose wait the close interrupts: its descriptor may be another file's now. */
static enum evt_outcome
outcome_on_resume(VALUE io, enum evt_outcome outcome)
{
    if (outcome != EVT_IO_READY || !RB_TYPE_P(io, T_FILE)) return outcome;
    return evt_rubyio_closed(io) ? EVT_CLOSED : outcome;
}

/* Waits until fd has one of `events`: returns them, or 0 when the time ran out; raises IOError when
 * the IO is closed meanwhile. */
static int
evt_loop_wait_io(struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout)
{
    int64_t deadline = timeout >= 0 ? evt_timers_now() + timeout : -1;
    for (;;) {
        struct evt_wait wait;
        evt_wait_io(&wait, loop, io, fd, events, timeout);
        switch (outcome_on_resume(io, evt_wait_suspend(&wait))) {
        case EVT_IO_READY: return wait.waiter.ready;
        case EVT_TIMED_OUT: return 0;
        case EVT_CLOSED: evt_close_raise();
        default: break; /* resumed for nothing: wait again for what is left of the time */
        }
        if (deadline >= 0 && (timeout = deadline - evt_timers_now()) < 0) timeout = 0;
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
    if (!evt_loop_wait_io(loop, io, fd, events, evt_io_timeout_ns(rb_io_timeout(io))))
        rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
}

/* The events of io ready right now (poll(2)), unless they are known not to be: after io_read or
 * io_write met EAGAIN, Ruby calls io_wait at once, and the next readiness will come as an event. */
static int
look_now(struct evt_loop *loop, VALUE io, int fd, int events)
{
    struct evt_registration *reg = evt_registration_get(loop, fd, io);
    return (events & ~reg->exhausted) ? evt_poll_now(fd, events) : 0;
}

/* Evt::Loop#io_wait (documented in lib/evt.rb): nil timeout is the IO's own #timeout, as Ruby does
 * without a scheduler. */
static VALUE
loop_io_wait(VALUE self, VALUE io, VALUE events_value, VALUE timeout_value)
{
    struct evt_loop *loop = evt_object_get(self);
    io = rb_io_get_io(io);
    int fd = rb_io_descriptor(io);
    int events = NUM2INT(events_value) & EVT_EVENTS;
    if (NIL_P(timeout_value)) timeout_value = rb_io_timeout(io);
    int64_t timeout = evt_io_timeout_ns(timeout_value);
    int ready = look_now(loop, io, fd, events);
    if (ready) return INT2FIX(ready);
    if (timeout == 0 || events == 0) return Qfalse;
    ready = evt_loop_wait_io(loop, io, fd, events, timeout);
    return ready ? INT2FIX(ready) : Qfalse;
}


/* One transfer done by the backend (io_uring): submits it and waits for its completion under the
 * IO's timeout. Returns bytes or -errno; *timed_out when the time ran out with nothing done. */
static long
transfer_by_backend(struct evt_loop *loop, VALUE io, VALUE buffer, struct evt_op *op, int *timed_out)
{
    struct evt_wait wait;
    evt_wait_op(&wait, loop, io, op, buffer, evt_io_timeout_ns(rb_io_timeout(io)));
    enum evt_outcome outcome = evt_wait_suspend(&wait);
    /* op->orphan: another thread closed the IO and took the buffer this transfer was aimed into
     * from it (evt_close_io; freed by now): Ruby must not go on with that buffer. */
    if (outcome == EVT_CLOSED || op->orphan) evt_close_raise();
    *timed_out = outcome == EVT_TIMED_OUT && op->result <= 0;
    /* Resumed by some other fiber's transfer, not by the loop: leaving, it cancelled its own
     * transfer, which never ran. Nothing happened: try again (as after EINTR). */
    if (outcome == EVT_INTERRUPTED && op->result == -ECANCELED) return -EINTR;
    return op->result;
}

/* ---- the route of a transfer -------------------------------------------------------------------
 *
 * Each try of a transfer takes one route, decided in one place (route_of) from the backend and what
 * the core learnt of the descriptor (its registration's flags), the first row that fits:
 *
 *   the try                                                a backend without transfer   io_uring
 *   a write to a socket that a selector may not wait for   NOW                          RING_NOWAIT
 *   a write to anything but a socket, until it met EAGAIN  NOW                          NOW
 *   on a regular file (or block device), any position      NOW                          RING
 *   positioned, on anything else                           NOW                          NOW
 *   one that may not wait (read_nonblock, a length 0)      NOW                          NOW
 *   a read that may wait, not on a blocking descriptor     NOW                          READ_NOW, then RING
 *   any other that may wait                                NOW                          RING
 *
 * NOW: one system call here (transfer_once); on EAGAIN the caller waits for readiness. RING: the
 * backend does it and the kernel waits, with the loop's own wait (a socket's write: no system call
 * of its own, cheaper than trying first). RING_NOWAIT: a selector's one try at writing to a socket
 * (length 0, as Ruby's IO#write asks) goes to the ring told not to wait: a whole turn's sends reach
 * the kernel in one system call (sent one by one, each would wake the peer on its own). READ_NOW:
 * the backend's read_now tries it at once while that tends to find data (then no trip through the
 * ring and no fiber switch). A write to anything but a socket (a log file, a pipe, $stdout) is
 * tried at once first, as on the other backends: a fiber suspended in the ring would hold Ruby's
 * write lock on the IO all the while, and the thread's own writes to it (its puts) would raise
 * ThreadError; once it meets EAGAIN, the ring waits for room. A positioned try on anything but a
 * file goes to pread(2)/pwrite(2), which fail as Ruby expects. */
enum route { ROUTE_NOW, ROUTE_RING, ROUTE_RING_NOWAIT, ROUTE_READ_NOW };

static inline enum route
route_of(struct evt_loop *loop, struct evt_registration *reg, off_t position, int may_wait, int events)
{
    if (!loop->kernel.backend->transfer) return ROUTE_NOW;
    int socket = reg->flags & EVT_REG_SOCKET;
    if (events == EVT_WRITABLE) {
        if (socket && position < 0 && !may_wait && loop->selector.driven) return ROUTE_RING_NOWAIT;
        if (!socket && !(reg->exhausted & EVT_WRITABLE)) return ROUTE_NOW;
    }
    if (reg->flags & EVT_REG_FILE) return ROUTE_RING;
    if (position >= 0 || !may_wait) return ROUTE_NOW;
    if (events == EVT_READABLE && !(reg->flags & EVT_REG_BLOCKING) && loop->kernel.backend->read_now) return ROUTE_READ_NOW;
    return ROUTE_RING;
}

/* Who made a read of length 0 (Ruby 3.3 to 4.0 make all theirs so), by the method that called this
 * hook (Ruby's own frames name the same arguments alike). */
enum reader {
    READER_WAITS,     /* sysread, and any caller not named below: waits here for at least a byte */
    READER_RETRIES,   /* readpartial (and io_fillbuf, told by its buffer): waits and tries again itself
                         after EAGAIN */
    READER_READ,      /* read: tries again itself too, from the deepest of Ruby's read paths */
    READER_NONBLOCK   /* read_nonblock: must not wait */
};

static enum reader
reader_calling(void)
{
    VALUE frames[2];
    int lines[2];
    /* Frame 0 is this hook. (Ruby 3.3's `start` does not count C frames: ask from the top.) */
    if (rb_profile_frames(0, 2, frames, lines) < 2) return READER_WAITS;
    VALUE name = rb_profile_frame_method_name(frames[1]);
    if (!RB_TYPE_P(name, T_STRING)) return READER_WAITS;
    const char *s = RSTRING_PTR(name);
    long n = RSTRING_LEN(name);
    if (n == 13 && memcmp(s, "read_nonblock", 13) == 0) return READER_NONBLOCK;
    if (n == 4 && memcmp(s, "read", 4) == 0) return READER_READ;
    if (n == 11 && memcmp(s, "readpartial", 11) == 0) return READER_RETRIES;
    return READER_WAITS;
}

/* ---- the primitive ------------------------------------------------------------------------------ */

/* One transfer in progress on io: what the primitive needs between tries. */
struct transfer {
    struct evt_loop *loop;
    VALUE io;
    VALUE buffer;
    int fd;
    int events;                   /* EVT_READABLE: a read into buffer; EVT_WRITABLE: a write from it */
    off_t position;               /* -1: at the file's own position; else pread/pwrite's */
    struct evt_registration *reg;
    int waited;                   /* the last try waited (in the ring): fd and reg need a fresh look */
};

static void
transfer_open(struct transfer *t, VALUE self, VALUE io, VALUE buffer, off_t position, int events)
{
    t->loop = evt_object_get(self);
    t->io = rb_io_get_io(io); /* IO::Buffer#read and friends pass on whatever they were given (a Tempfile) */
    t->buffer = buffer;
    t->fd = rb_io_descriptor(t->io);
    t->events = events;
    t->position = position;
    t->reg = transfer_registration(t->loop, t->io, t->fd);
    t->waited = 0;
}

/* After a wait: the IO may have been closed meanwhile, and its number given to another file. Raise as
 * Ruby does for a closed stream rather than transfer on someone else's descriptor. */
static void
transfer_reopen(struct transfer *t)
{
    t->fd = rb_io_descriptor(t->io);
    t->reg = transfer_registration(t->loop, t->io, t->fd);
    t->waited = 0;
}

/* The running fiber has read EVT_READS_NOW_MAX times without waiting since the loop resumed it, and
 * would read at once again: the other ready fibers, and those whose events the loop has yet to
 * collect, go first (as after sleep(0)). Then the IO is looked at afresh: it may have been closed
 * meanwhile. A selector's loop (async's) keeps its own order. Never inlined: its wait record would
 * sit in transfer_single's frame beside the ring's, on the stack of every fiber waiting in a read
 * (64 bytes more; bench/tools/wait_stack_depth.rb). */
static NOINLINE(void let_others_run(struct transfer *t));
static void
let_others_run(struct transfer *t)
{
    struct evt_loop *loop = t->loop;
    loop->reads_now = 0;
    if (loop->selector.driven || rb_fiber_current() == loop->loop_fiber) return;
    struct evt_wait wait;
    evt_wait_yield(&wait, loop);
    evt_wait_suspend(&wait);
    transfer_reopen(t);
}

/* One read or write between the buffer at `offset` and the IO: at most `max` bytes, or up to the end
 * of the buffer when `max` is SIZE_MAX. Returns the bytes moved (0: end of file), or -errno: -EAGAIN
 * when the descriptor is not ready and the transfer may not wait for it, -EINTR to try again, -EINVAL
 * when the range is not inside the buffer. `may_wait`: the backend may wait for readiness in the
 * kernel (io_uring), which is still one transfer. */
static long
transfer_single(struct transfer *t, size_t offset, size_t max, int may_wait)
{
    enum route route = route_of(t->loop, t->reg, t->position, may_wait, t->events);
    if (t->events == EVT_READABLE && (route == ROUTE_NOW || route == ROUTE_READ_NOW) &&
        RB_UNLIKELY(++t->loop->reads_now > EVT_READS_NOW_MAX)) {
        let_others_run(t);
        route = route_of(t->loop, t->reg, t->position, may_wait, t->events);
    }
    void *base;
    size_t size;
    /* Fetched before every try: another fiber may have resized the buffer meanwhile. */
    if (t->events == EVT_READABLE) rb_io_buffer_get_bytes_for_writing(t->buffer, &base, &size);
    else rb_io_buffer_get_bytes_for_reading(t->buffer, (const void **)&base, &size);
    if (max == SIZE_MAX) {
        if (offset > size)
            rb_raise(rb_eArgError, "offset %" PRIuSIZE " is past the end of the buffer (%" PRIuSIZE " bytes)",
                     offset, size);
        max = size - offset;
    }
    else if (offset > size || max > size - offset) {
        return -EINVAL;
    }
    char *at = (char *)base + offset;
    struct evt_loop *loop = t->loop;
    struct evt_registration *reg = t->reg;
    if (route == ROUTE_READ_NOW) {
        long n = loop->kernel.backend->read_now(&loop->kernel, t->fd, &reg->watch, (reg->flags & EVT_REG_SOCKET) != 0, at, max);
        if (n != -EAGAIN) return n;
    }
    if (route != ROUTE_NOW) {
        struct evt_op op = {
            .kind = EVT_OP_TRANSFER, .fd = t->fd, .events = t->events, .base = at, .size = max,
            .position = t->position < 0 ? -1 : t->position,
            .socket = (reg->flags & EVT_REG_SOCKET) && t->position < 0,
            .nowait = route == ROUTE_RING_NOWAIT,
        };
        int timed_out;
        long result = transfer_by_backend(loop, t->io, t->buffer, &op, &timed_out);
        /* Closed while the kernel had it: the result belongs to no one (the epoll backend raises
         * the same when it looks again after waiting). */
        evt_rubyio_check_closed(t->io);
        if (timed_out) rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
        t->waited = 1; /* the IO may have been closed or reopened meanwhile: see transfer_reopen */
        if (result > 0) reg->exhausted &= ~t->events; /* it went through: ready again, as far as we know */
        else if (result == -EAGAIN) reg->exhausted |= t->events;
        return result;
    }
    ssize_t n = transfer_once(reg, t->fd, t->events, at, max, t->position);
    if (n >= 0) return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        reg->exhausted |= t->events;
        return -EAGAIN;
    }
    return -errno;
}

/* ---- Ruby 4.1's hooks: one transfer of at most `length` bytes ------------------------------------- */

static VALUE
transfer_single_hook(VALUE self, VALUE io, VALUE buffer, VALUE offset_value, VALUE length_value, off_t position,
                     int events)
{
    size_t offset = NUM2SIZET(offset_value), length = NUM2SIZET(length_value);
    struct transfer t;
    transfer_open(&t, self, io, buffer, position, events);
    if (length == 0) {
        /* Nothing to move: no system call, once the range is known to be inside the buffer. */
        const void *base;
        size_t size;
        rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
        return INT2FIX(offset > size ? -EINVAL : 0);
    }
    for (;;) {
        if (t.waited) transfer_reopen(&t);
        long n = transfer_single(&t, offset, length, 0);
        if (n != -EINTR) return LONG2NUM(n);
    }
}

/*
 * io_read_single(io, buffer, offset, length) -> Integer
 *
 * Ruby 4.1's io_read: one read into +buffer+ at +offset+ of at most +length+ bytes. Returns the bytes
 * read (0: end of file) or -errno: -EAGAIN when nothing is ready (Ruby then calls io_wait), -EINVAL
 * when the range is not inside the buffer.
 */
static VALUE
loop_io_read_single(VALUE self, VALUE io, VALUE buffer, VALUE offset, VALUE length)
{
    return transfer_single_hook(self, io, buffer, offset, length, -1, EVT_READABLE);
}

/*
 * io_write_single(io, buffer, offset, length) -> Integer
 *
 * Ruby 4.1's io_write: one write from +buffer+ at +offset+ of at most +length+ bytes, as io_read_single.
 */
static VALUE
loop_io_write_single(VALUE self, VALUE io, VALUE buffer, VALUE offset, VALUE length)
{
    return transfer_single_hook(self, io, buffer, offset, length, -1, EVT_WRITABLE);
}

/*
 * io_pread_single(io, buffer, from, offset, length) -> Integer
 *
 * Ruby 4.1's io_pread: as io_read_single, at file position +from+ (which does not move).
 */
static VALUE
loop_io_pread_single(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE offset, VALUE length)
{
    off_t position = NUM2OFFT(from);
    if (position < 0) return INT2FIX(-EINVAL); /* as pread(2) says; Ruby names the file */
    return transfer_single_hook(self, io, buffer, offset, length, position, EVT_READABLE);
}

/* pwrite(2) until `length` bytes (at least one pwrite; `length` 0: one), at `position`, touching
 * nothing that needs the GVL: Ruby 3.3 and 3.4 call io_pwrite without it (inside the blocking region
 * of io.c's internal_pwrite_func), so it must not suspend the fiber, raise, allocate, or touch the
 * loop. It writes at once, as Ruby does without a scheduler (a file write may wait for the disk).
 * `single`: at most `length` bytes, in one pwrite (Ruby 4.1). */
static VALUE
pwrite_direct(VALUE io, VALUE buffer, off_t position, size_t offset, size_t length, int single)
{
    if (position < 0) return INT2FIX(-EINVAL);
    /* IO#pwrite (without the GVL) always passes the IO itself; IO::Buffer#pwrite (with the GVL) passes
     * whatever it was given, such as a Tempfile: only then is there something to convert. */
    if (!RB_TYPE_P(io, T_FILE)) io = rb_io_get_io(io);
    int fd = evt_rubyio_fd(io); /* rb_io_descriptor raises, which needs the GVL */
    if (fd < 0) return INT2FIX(-EBADF);
    const void *base;
    size_t size;
    rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
    if (offset > size || (single && length > size - offset)) return INT2FIX(-EINVAL);
    size_t end = single ? offset + length : size, total = 0;
    if (single && length == 0) return INT2FIX(0);
    do {
        ssize_t n = pwrite(fd, (const char *)base + offset + total, end - offset - total, position + (off_t)total);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (total) break;
            return INT2FIX(-errno);
        }
        if (n == 0) break;
        total += n;
    } while (!single && total < length && offset + total < size);
    return SIZET2NUM(total);
}

/*
 * io_pwrite_single(io, buffer, from, offset, length) -> Integer
 *
 * Ruby 4.1's io_pwrite: one pwrite(2) of at most +length+ bytes from +buffer+ at +offset+, at file
 * position +from+. Returns the bytes written, or -errno.
 */
static VALUE
loop_io_pwrite_single(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE offset, VALUE length)
{
    return pwrite_direct(io, buffer, NUM2OFFT(from), NUM2SIZET(offset), NUM2SIZET(length), 1);
}

/* Whether a reader that tries again itself is handed EAGAIN, to wait through io_wait, rather than
 * waited for here. Only on Ruby 4.0: it wraps each call of io_read in frames of its own
 * (rb_thread_io_blocking_operation, an rb_ensure), and a fiber waiting at the bottom of them can
 * keep a second 4 KiB page of stack; io_wait is called from higher up Ruby's read path
 * (bench/tools/wait_stack_depth.rb). Where no ring does the read, every such reader is handed back.
 * Where the ring would (io_uring, a descriptor not in blocking mode), only IO#read, whose wait is
 * the deepest (4,280 bytes with YJIT, against 4,024 for readpartial and 4,056 for gets): the ring's
 * read saves the read(2) that follows the wakeup, for the others. Not under an IO#timeout: Ruby's
 * io_wait would raise its own IO::TimeoutError message, not the one a read gets without a scheduler.
 * Ruby 4.1's io_read_single hands back EAGAIN always. */
static int
hand_back_wait(const struct transfer *t, enum reader reader)
{
#if RUBY_API_VERSION_MAJOR >= 4
    if (!NIL_P(rb_io_timeout(t->io))) return 0;
    enum route route = route_of(t->loop, t->reg, t->position, 1, EVT_READABLE);
    return route == ROUTE_NOW || (route == ROUTE_READ_NOW && reader == READER_READ);
#else
    (void)t;
    (void)reader;
    return 0;
#endif
}

/* ---- Ruby 3.3 to 4.0's hooks: at least `length` bytes, built on the primitive ---------------------- */

static VALUE
transfer_minimum_hook(VALUE self, VALUE io, VALUE buffer, VALUE length_value, VALUE offset_value, off_t position,
                      int events, int selector)
{
    size_t length = NUM2SIZET(length_value), offset = NUM2SIZET(offset_value), total = 0;
    struct transfer t;
    transfer_open(&t, self, io, buffer, position, events);
    /* Length 0 asks for one transfer and allows -EAGAIN. Only read_nonblock needs that: Ruby's
     * other readers and writers either wait and try again after -EAGAIN (so waiting here saves the
     * round trip) or, like sysread and syswrite, count on the wait (write_nonblock does not come
     * here at all). A selector's caller may be anyone (async, a test): length 0 is one try there, as
     * io-event has it, unless it reads into the IO's own buffer, which only Ruby's io_fillbuf does. */
    if (length == 0 && position < 0) {
        if (events == EVT_WRITABLE) {
            if (!selector) length = 1;
        }
        else {
            const void *base;
            size_t size;
            rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
            /* io_fillbuf (gets, read, eof?...) tries again after EAGAIN whatever happens, so it
             * may wait here, or hand the wait back; a selector's caller gets one try, unless Ruby
             * fills the IO's buffer through it; the others as reader_calling says. */
            int fill = evt_rubyio_is_read_buffer(t.io, base);
            enum reader reader = fill ? READER_RETRIES : selector ? READER_NONBLOCK : reader_calling();
            if (reader == READER_WAITS || (reader != READER_NONBLOCK && (selector || !hand_back_wait(&t, reader))))
                length = 1;
        }
    }
    for (;;) {
        if (t.waited) transfer_reopen(&t); /* only when going on after a wait: not per finished transfer */
        long n = transfer_single(&t, offset + total, SIZE_MAX, total < length);
        if (n > 0) {
            total += n;
            if (t.position >= 0) t.position += n;
            if (total >= length) break;
            continue;
        }
        if (n == 0) break; /* end of file, or a full buffer */
        if (n == -EINTR) continue;
        if (n == -EAGAIN) {
            if (total >= length) {
                if (total) break;
                return INT2FIX(-EAGAIN);
            }
            if (route_of(t.loop, t.reg, t.position, 1, events) != ROUTE_NOW) continue; /* the ring waits */
            wait_for_transfer(t.loop, t.io, t.fd, events);
            transfer_reopen(&t);
            continue;
        }
        if (total) break; /* the error shows on the next call */
        return LONG2NUM(n);
    }
    return SIZET2NUM(total);
}

/*
 * io_read_minimum(io, buffer, length, offset) -> Integer
 *
 * Ruby 3.3 to 4.0's io_read: reads into +buffer+ from +offset+ at least +length+ bytes, end of file
 * or an error (+length+ 0: whatever one read gives). Returns the bytes read, or -errno (-EAGAIN when
 * nothing was ready and +length+ is 0).
 */
static VALUE
loop_io_read_minimum(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return transfer_minimum_hook(self, io, buffer, length, offset, -1, EVT_READABLE, 0);
}

/*
 * io_write_minimum(io, buffer, length, offset) -> Integer
 *
 * Ruby 3.3 to 4.0's io_write: writes from +buffer+ at +offset+ at least +length+ bytes or an error
 * (+length+ 0: whatever one write takes). Returns the bytes written, or -errno.
 */
static VALUE
loop_io_write_minimum(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return transfer_minimum_hook(self, io, buffer, length, offset, -1, EVT_WRITABLE, 0);
}

/*
 * io_pread_minimum(io, buffer, from, length, offset) -> Integer
 *
 * Ruby 3.3 to 4.0's io_pread: as io_read_minimum, at file position +from+ (which does not move).
 * Returns the bytes read, or -errno (-ESPIPE for a pipe or socket, as pread(2) says).
 */
static VALUE
loop_io_pread_minimum(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    off_t position = NUM2OFFT(from);
    if (position < 0) return INT2FIX(-EINVAL); /* as pread(2) says; Ruby names the file */
    return transfer_minimum_hook(self, io, buffer, length, offset, position, EVT_READABLE, 0);
}

/*
 * io_pwrite_minimum(io, buffer, from, length, offset) -> Integer
 *
 * Ruby 3.3 to 4.0's io_pwrite: pwrite(2) at file position +from+ (which does not move), at least
 * +length+ bytes. Returns the bytes written, or -errno. Called without the GVL (see pwrite_direct).
 */
static VALUE
loop_io_pwrite_minimum(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    return pwrite_direct(io, buffer, NUM2OFFT(from), NUM2SIZET(offset), NUM2SIZET(length), 0);
}

/* ---- for the selector (selector.c): the same hooks, without a scheduler's conventions ------------ */

/*
 * One wait for io, as io-event's selectors do it: the events of +events+ that are ready, or false when
 * the fiber was resumed without them (async's timeouts transfer to it). No time limit of its own.
 */
VALUE
evt_io_wait_once(VALUE self, VALUE io, VALUE events_value)
{
    struct evt_loop *loop = evt_object_get(self);
    io = rb_io_get_io(io);
    int fd = rb_io_descriptor(io);
    int events = NUM2INT(events_value) & EVT_EVENTS;
    if (events == 0) return Qfalse;
    /* The fiber always waits for the next select, even when the IO is ready (async and io-event's
     * tests count on that order: the others run before it goes on). Ready already, as far as a look
     * says (the kernel would not report it again: epoll is edge-triggered), it waits in the ready
     * queue; unless the IO is known not to be (EAGAIN since its last event), in the backend. */
    int ready = look_now(loop, io, fd, events);
    struct evt_wait wait;
    evt_wait_io(&wait, loop, io, fd, events, -1);
    wait.as.io.ready_now = ready;
    switch (outcome_on_resume(io, evt_wait_suspend(&wait))) {
    case EVT_IO_READY: return INT2FIX(wait.waiter.ready);
    case EVT_CLOSED: evt_close_raise();
    default: return Qfalse;
    }
}

/* Ruby 3.3 to 4.0's transfers (io_read and friends: at least +length+ bytes), at file position +from+
 * unless it is nil. */
VALUE
evt_io_transfer_minimum(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset, VALUE from, int events)
{
    if (NIL_P(from)) return transfer_minimum_hook(self, io, buffer, length, offset, -1, events, 1);
    if (events == EVT_READABLE) return loop_io_pread_minimum(self, io, buffer, from, length, offset);
    return loop_io_pwrite_minimum(self, io, buffer, from, length, offset);
}

/* Ruby 4.1's transfers (one of at most +length+ bytes), at file position +from+ unless it is nil. */
VALUE
evt_io_transfer_single(VALUE self, VALUE io, VALUE buffer, VALUE offset, VALUE length, VALUE from, int events)
{
    if (NIL_P(from)) {
        return events == EVT_READABLE ? loop_io_read_single(self, io, buffer, offset, length)
                                      : loop_io_write_single(self, io, buffer, offset, length);
    }
    if (events == EVT_READABLE) return loop_io_pread_single(self, io, buffer, from, offset, length);
    return loop_io_pwrite_single(self, io, buffer, from, offset, length);
}

void
evt_io_init(VALUE cLoop)
{
    rb_gc_register_address(&cBasicSocket);
    rb_define_method(cLoop, "io_wait", loop_io_wait, 3);
#if RUBY_FIBER_SCHEDULER_VERSION >= 4
    rb_define_method(cLoop, "io_read", loop_io_read_single, 4);
    rb_define_method(cLoop, "io_write", loop_io_write_single, 4);
    rb_define_method(cLoop, "io_pread", loop_io_pread_single, 5);
    rb_define_method(cLoop, "io_pwrite", loop_io_pwrite_single, 5);
#else
    rb_define_method(cLoop, "io_read", loop_io_read_minimum, 4);
    rb_define_method(cLoop, "io_write", loop_io_write_minimum, 4);
    rb_define_method(cLoop, "io_pread", loop_io_pread_minimum, 5);
    rb_define_method(cLoop, "io_pwrite", loop_io_pwrite_minimum, 5);
#endif
    /* Both interfaces, whichever this Ruby calls, for tests and for callers that know which they want. */
    rb_define_private_method(cLoop, "io_read_single", loop_io_read_single, 4);
    rb_define_private_method(cLoop, "io_write_single", loop_io_write_single, 4);
    rb_define_private_method(cLoop, "io_pread_single", loop_io_pread_single, 5);
    rb_define_private_method(cLoop, "io_pwrite_single", loop_io_pwrite_single, 5);
    rb_define_private_method(cLoop, "io_read_minimum", loop_io_read_minimum, 4);
    rb_define_private_method(cLoop, "io_write_minimum", loop_io_write_minimum, 4);
    rb_define_private_method(cLoop, "io_pread_minimum", loop_io_pread_minimum, 5);
    rb_define_private_method(cLoop, "io_pwrite_minimum", loop_io_pwrite_minimum, 5);
    /* The scheduler interface this build was compiled for (Ruby's RUBY_FIBER_SCHEDULER_VERSION): 4
     * and above take io_read(io, buffer, offset, length), one transfer; below, (length, offset). */
    rb_define_const(cLoop, "FIBER_SCHEDULER_VERSION", INT2FIX(RUBY_FIBER_SCHEDULER_VERSION));
}
