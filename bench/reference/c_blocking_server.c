/* bin/bench's limit for http-close: one thread, blocking calls, one connection at a time.
 *
 * With `Connection: close` every connection carries one request, so nothing waits on anything but
 * the next connection: accept, read the request, write the answer, close, with no readiness
 * interface at all. Ruby's own blocking server beat the epoll server on this load, so this is the
 * C floor the close rows compare against. (On keep-alive it would serve one connection until it
 * ends while the others wait: bin/bench does not run it there.)
 * Prints "listening on PORT" once it accepts connections on 127.0.0.1 at a port the kernel chose. */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "reference.h"

/* Writes all of it, as the blocking socket allows: 0 when the client went away. */
static int
write_all(int fd, const char *data, size_t size)
{
    while (size) {
        ssize_t n = write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        data += n;
        size -= (size_t)n;
    }
    return 1;
}

/* Answers the connection's requests until it ends or asks to close. */
static void
serve(int fd)
{
    char buffer[8192];
    size_t length = 0;
    for (;;) {
        char *end;
        while (!(end = memmem(buffer, length, "\r\n\r\n", 4))) {
            if (length == sizeof(buffer)) return; /* a request larger than the buffer: dropped */
            ssize_t got = read(fd, buffer + length, sizeof(buffer) - length);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) return;
            length += (size_t)got;
        }
        size_t request = (size_t)(end - buffer) + 4;
        int close_after = memmem(buffer, request, "onnection: close", 16) != NULL;
        if (!(close_after ? write_all(fd, CLOSE_RESPONSE, sizeof(CLOSE_RESPONSE) - 1)
                          : write_all(fd, RESPONSE, sizeof(RESPONSE) - 1)))
            return;
        memmove(buffer, buffer + request, length - request);
        length -= request;
        if (close_after) return;
    }
}

int
main(void)
{
    int listener = listen_on_loopback(0);

    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            die("accept4");
        }
        serve(fd);
        if (close(fd) < 0) perror("close");
    }
}
