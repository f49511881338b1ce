/* BasicSocket#write under an evt scheduler: one send(2) from the strings themselves, at once.
 *
 * Two reasons, one path:
 *
 * - Several strings. Ruby writes `io.write(head, body)` (and `puts`, which writes a line and its
 *   newline) with one writev(2) of every string; under a scheduler it hands the scheduler's io_write
 *   one string at a time instead (io.c: rb_writev_internal passes only the first iovec). On a TCP
 *   socket with Nagle's algorithm on, the second segment then waits for the peer's ACK of the first,
 *   which a peer that delays its ACKs sends some 40 ms later: every request-response round trip
 *   then takes those 40 ms.
 * - One string, the common case (a response). Ruby's way to the scheduler takes the IO's write lock
 *   (a Mutex; unlocking one walks every mutex the thread holds, and thousands of fibers suspended in
 *   writes each hold one), wraps the string in an IO::Buffer (an object per write, for the GC), and
 *   calls io_write, which on io_uring suspends the fiber until the ring's completion. A socket with
 *   room takes the bytes at once: one send(2) with MSG_DONTWAIT here does the same work in one
 *   system call.
 *
 * Evt::SocketWrite is prepended to BasicSocket (lib/evt/socket_write.rb). Its #write, for up to
 * SOCKET_WRITE_MAX Strings on a synchronous socket with no write conversion and no write under way,
 * under an evt scheduler, sends them all at once with MSG_DONTWAIT, as Ruby without a scheduler
 * would. Only what that one send did not take (a full socket buffer) goes on through Ruby's own
 * IO#write, which waits through the scheduler under the IO's write lock and raises its errors; an
 * error goes there too, to be met again and raised as Ruby raises it. Anything else is Ruby's
 * IO#write untouched. Nothing here waits, so no other fiber can write in between. */
#include "core.h"
#include "socket_write.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <ruby/encoding.h>
#include <ruby/fiber/scheduler.h>

/* More strings than this go to Ruby's path: a write of that many pieces is rare. */
#define SOCKET_WRITE_MAX 16

/* Evt::Scheduling, which both of evt's schedulers (on the C loop and on the pure-Ruby one) include:
 * defined here, reopened by lib/evt/scheduler.rb. */
static VALUE mScheduling = Qnil;

/*
 * write(*objects) -> Integer
 *
 * IO#write, with its strings sent in one sendmsg(2) under an evt scheduler (see above).
 */
static VALUE
socket_write(int argc, VALUE *argv, VALUE self)
{
    if (argc < 1 || argc > SOCKET_WRITE_MAX) return rb_call_super(argc, argv);
    VALUE scheduler = rb_fiber_scheduler_current();
    if (NIL_P(scheduler) || !RTEST(rb_obj_is_kind_of(scheduler, mScheduling))) return rb_call_super(argc, argv);
    for (int i = 0; i < argc; i++) {
        /* Anything else would have #to_s called twice should the rest go through Ruby's path. */
        if (!RB_TYPE_P(argv[i], T_STRING)) return rb_call_super(argc, argv);
    }
    rb_io_t *fptr;
    RB_IO_POINTER(self, fptr);
    rb_io_check_writable(fptr);
    if (!evt_rubyio_writes_as_is(self)) return rb_call_super(argc, argv);
    rb_thread_check_ints(); /* as Ruby's write: nothing is written with an interrupt pending */

    struct iovec iov[SOCKET_WRITE_MAX];
    size_t total = 0;
    for (int i = 0; i < argc; i++) {
        iov[i].iov_base = RSTRING_PTR(argv[i]);
        iov[i].iov_len = (size_t)RSTRING_LEN(argv[i]);
        total += iov[i].iov_len;
    }
    if (total == 0) return rb_call_super(argc, argv); /* Ruby sends nothing at all, not an empty datagram */
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)argc};
    ssize_t sent;
    do {
        sent = sendmsg(rb_io_descriptor(self), &msg, MSG_DONTWAIT);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) {
        /* EAGAIN: all of it goes Ruby's way. Any other error: Ruby's write meets it again and
         * raises it as Ruby does. */
        return rb_call_super(argc, argv);
    }
    if ((size_t)sent == total) return SIZET2NUM(total);

    /* The rest: from the string the send stopped in. */
    int first = 0;
    size_t skip = (size_t)sent;
    while (skip >= iov[first].iov_len) skip -= iov[first++].iov_len;
    VALUE rest[SOCKET_WRITE_MAX];
    int count = argc - first;
    for (int i = 0; i < count; i++) rest[i] = argv[first + i];
    rest[0] = rb_str_subseq(rest[0], (long)skip, RSTRING_LEN(rest[0]) - (long)skip);
    VALUE written = rb_call_super(count, rest);
    RB_GC_GUARD(rest[0]);
    return SIZET2NUM((size_t)sent + NUM2SIZET(written));
}

void
evt_socket_write_init(VALUE mEvt)
{
    mScheduling = rb_define_module_under(mEvt, "Scheduling");
    rb_gc_register_address(&mScheduling);
    VALUE mSocketWrite = rb_define_module_under(mEvt, "SocketWrite");
    rb_define_method(mSocketWrite, "write", socket_write, -1);
}
