/* bin/bench's practical limit: a single-threaded HTTP server on epoll, in plain C.
 *
 * It does what the Ruby servers do (read the request until the blank line, answer with a fixed
 * response, keep the connection unless the client asked to close) with no runtime around it.
 * Prints "listening on PORT" once it accepts connections on 127.0.0.1 at a port the kernel chose. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "reference.h"

struct connection {
    int fd;
    size_t length;
    char buffer[8192];
};

static void
finish(int epfd, struct connection *c)
{
    if (epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL) < 0 && errno != EBADF) perror("epoll_ctl(DEL)");
    if (close(c->fd) < 0) perror("close");
    free(c);
}

/* Answers every complete request in the buffer; returns 0 when the connection is done. */
static int
serve(struct connection *c)
{
    for (;;) {
        char *end = memmem(c->buffer, c->length, "\r\n\r\n", 4);
        if (!end) return c->length < sizeof(c->buffer);
        size_t request = (size_t)(end - c->buffer) + 4;
        int close_after = memmem(c->buffer, request, "onnection: close", 16) != NULL;
        const char *response = close_after ? CLOSE_RESPONSE : RESPONSE;
        size_t size = close_after ? sizeof(CLOSE_RESPONSE) - 1 : sizeof(RESPONSE) - 1;
        if (write(c->fd, response, size) != (ssize_t)size) return 0; /* tiny response: all or error */
        memmove(c->buffer, c->buffer + request, c->length - request);
        c->length -= request;
        if (close_after) return 0;
    }
}

int
main(void)
{
    int listener = listen_on_loopback(SOCK_NONBLOCK);

    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_create1");
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &event) < 0) die("epoll_ctl(ADD)");

    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(epfd, events, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct connection *c = events[i].data.ptr;
            if (!c) {
                for (;;) {
                    int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) {
                        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                            perror("accept4");
                        break;
                    }
                    struct connection *connection = calloc(1, sizeof(*connection));
                    if (!connection) die("calloc");
                    connection->fd = fd;
                    struct epoll_event add = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = connection};
                    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &add) < 0) die("epoll_ctl(ADD)");
                }
                continue;
            }
            ssize_t got = read(c->fd, c->buffer + c->length, sizeof(c->buffer) - c->length);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (got <= 0) {
                finish(epfd, c);
                continue;
            }
            c->length += (size_t)got;
            if (!serve(c)) finish(epfd, c);
        }
    }
}
