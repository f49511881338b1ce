/* bin/bench's limit on io_uring: a single-threaded HTTP server in plain C over liburing.
 *
 * The same work as c_epoll_server.c (read a request to its blank line, answer with a fixed response,
 * keep the connection unless the client asked to close), with every system call made by the ring:
 * a multishot accept, and per connection one operation at a time, a receive, or the answer's send
 * linked to the next receive (or to the close). One io_uring_submit_and_wait per batch of
 * completions. The ring is set up with the fastest flags the kernel takes.
 * Prints "listening on PORT" once it accepts connections on 127.0.0.1 at a port the kernel chose. */
#define _GNU_SOURCE
#include <liburing.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "reference.h"

enum { ENTRIES = 4096, MAX_ANSWERS = 64 };

/* What a completion is for: the low two bits of its user_data (a connection is 8-byte aligned). */
enum tag { TAG_ACCEPT = 0, TAG_RECV = 1, TAG_SEND = 2, TAG_CLOSE = 3 };

struct connection {
    int fd;
    int inflight;             /* operations the kernel still has: freed only at 0 */
    int closing;
    size_t length;
    char buffer[8192];
    char out[MAX_ANSWERS * sizeof(RESPONSE)]; /* the answers of one receive, sent in one send */
};

static struct io_uring ring;
static int multishot = 1;

/* die() for liburing's calls, which return -errno. */
static void
die_with(const char *what, int error)
{
    errno = error;
    die(what);
}

/* A free submission entry, submitting what is queued when the ring is full. */
static struct io_uring_sqe *
sqe(void)
{
    struct io_uring_sqe *entry = io_uring_get_sqe(&ring);
    while (!entry) {
        int n = io_uring_submit(&ring);
        if (n < 0 && n != -EINTR && n != -EAGAIN && n != -EBUSY) die_with("io_uring_submit", -n);
        entry = io_uring_get_sqe(&ring);
    }
    return entry;
}

static void
arm_accept(int listener)
{
    struct io_uring_sqe *entry = sqe();
    if (multishot) io_uring_prep_multishot_accept(entry, listener, NULL, NULL, SOCK_CLOEXEC);
    else io_uring_prep_accept(entry, listener, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(entry, TAG_ACCEPT);
}

static void
arm_recv(struct connection *c)
{
    struct io_uring_sqe *entry = sqe();
    io_uring_prep_recv(entry, c->fd, c->buffer + c->length, sizeof(c->buffer) - c->length, 0);
    io_uring_sqe_set_data64(entry, (uint64_t)(uintptr_t)c | TAG_RECV);
    c->inflight++;
}

static void
finish(struct connection *c)
{
    if (close(c->fd) < 0) perror("close");
    c->closing = 1;
    c->fd = -1;
}

static void
release(struct connection *c)
{
    if (c->closing && c->inflight == 0) free(c);
}

/* The requests complete in the buffer: their answers in one send, linked to the next receive, or
 * to the close when the last one asked for it. Nothing complete yet: receive more. */
static void
serve(struct connection *c)
{
    size_t out = 0, answers = 0;
    int close_after = 0;
    char *end;
    while (!close_after && answers < MAX_ANSWERS && (end = memmem(c->buffer, c->length, "\r\n\r\n", 4))) {
        size_t request = (size_t)(end - c->buffer) + 4;
        close_after = memmem(c->buffer, request, "onnection: close", 16) != NULL;
        const char *response = close_after ? CLOSE_RESPONSE : RESPONSE;
        size_t size = close_after ? sizeof(CLOSE_RESPONSE) - 1 : sizeof(RESPONSE) - 1;
        memcpy(c->out + out, response, size);
        out += size;
        answers++;
        memmove(c->buffer, c->buffer + request, c->length - request);
        c->length -= request;
    }
    if (!answers) {
        if (c->length == sizeof(c->buffer)) { /* a request larger than the buffer: dropped */
            finish(c);
            release(c);
            return;
        }
        arm_recv(c);
        return;
    }
    struct io_uring_sqe *entry = sqe();
    io_uring_prep_send(entry, c->fd, c->out, out, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(entry, (uint64_t)(uintptr_t)c | TAG_SEND);
    entry->flags |= IOSQE_IO_LINK;
    c->inflight++;
    if (close_after) {
        entry = sqe();
        io_uring_prep_close(entry, c->fd);
        io_uring_sqe_set_data64(entry, (uint64_t)(uintptr_t)c | TAG_CLOSE);
        c->inflight++;
        c->closing = 1;
    }
    else {
        arm_recv(c);
    }
}

static void
complete(int listener, struct io_uring_cqe *cqe)
{
    uint64_t data = io_uring_cqe_get_data64(cqe);
    enum tag tag = (enum tag)(data & 3);
    struct connection *c = (struct connection *)(uintptr_t)(data & ~(uint64_t)3);
    int res = cqe->res;
    if (tag == TAG_ACCEPT) {
        if (res >= 0) {
            c = calloc(1, sizeof(*c));
            if (!c) die_with("calloc", ENOMEM);
            c->fd = res;
            arm_recv(c);
        }
        else if (res != -EINTR && res != -ECONNABORTED && res != -EAGAIN) {
            fprintf(stderr, "accept: %s\n", strerror(-res));
        }
        if (!(cqe->flags & IORING_CQE_F_MORE)) arm_accept(listener);
        return;
    }
    c->inflight--;
    switch (tag) {
    case TAG_RECV:
        if (c->closing) break;                /* the link's send failed and cancelled it: closed already */
        if (res <= 0) {
            finish(c);
            break;
        }
        c->length += (size_t)res;
        serve(c);
        break;
    case TAG_SEND:
        /* Failed: the linked receive comes back cancelled (a linked close: see TAG_CLOSE). */
        if (res < 0 && c->fd >= 0 && !c->closing) finish(c);
        break;
    case TAG_CLOSE:
        if (res == -ECANCELED) { /* the send before it failed: closed here */
            if (close(c->fd) < 0) perror("close");
        }
        else if (res < 0) {
            fprintf(stderr, "close: %s\n", strerror(-res));
        }
        c->fd = -1;
        break;
    default:
        break;
    }
    release(c);
}

int
main(void)
{
    int listener = listen_on_loopback(0);

    /* The fastest setup the kernel takes, then less. */
    unsigned flags[] = {
#if defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
#endif
#ifdef IORING_SETUP_COOP_TASKRUN
        IORING_SETUP_COOP_TASKRUN,
#endif
        0,
    };
    int error = 0;
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        struct io_uring_params params = {.flags = flags[i] | IORING_SETUP_CQSIZE, .cq_entries = ENTRIES * 4};
        if ((error = io_uring_queue_init_params(ENTRIES, &ring, &params)) == 0) break;
    }
    if (error) die_with("io_uring_queue_init_params", -error);

    /* A multishot accept needs Linux 5.19: where the kernel refuses it (-EINVAL), a single one is
     * re-armed after each connection. */
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    if (!probe) die_with("io_uring_get_probe_ring", ENOMEM);
    if (!io_uring_opcode_supported(probe, IORING_OP_SEND) || !io_uring_opcode_supported(probe, IORING_OP_RECV))
        die_with("io_uring: no send or recv", ENOSYS);
    io_uring_free_probe(probe);
    arm_accept(listener);

    for (;;) {
        int n = io_uring_submit_and_wait(&ring, 1);
        if (n < 0 && n != -EINTR && n != -EAGAIN && n != -EBUSY) die_with("io_uring_submit_and_wait", -n);
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            if (multishot && io_uring_cqe_get_data64(cqe) == TAG_ACCEPT && cqe->res == -EINVAL) {
                multishot = 0; /* the kernel has no multishot accept */
                seen++;
                arm_accept(listener);
                continue;
            }
            complete(listener, cqe);
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
    }
}
