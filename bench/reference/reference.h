/* What bin/bench's C references share: the answers, a fatal error, and the listening socket.
 * Each server is one .c file that includes this; bin/bench builds each with `cc -O2`. */
#ifndef EVT_BENCH_REFERENCE_H
#define EVT_BENCH_REFERENCE_H

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nHello World\n";
static const char CLOSE_RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nHello World\n";

/* Ends the server, naming the call that failed and errno's meaning. */
static void
die(const char *what)
{
    perror(what);
    exit(1);
}

/* A listening socket on 127.0.0.1 at a port the kernel chose (`type_flags`: SOCK_NONBLOCK or 0,
 * beside SOCK_CLOEXEC), announced on stdout as bin/bench waits for it: "listening on PORT". */
static int
listen_on_loopback(int type_flags)
{
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
    if (listener < 0) die("socket");
    int one = 1;
    if (setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0) die("setsockopt");
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&address, sizeof(address)) < 0) die("bind");
    if (listen(listener, SOMAXCONN) < 0) die("listen");
    socklen_t length = sizeof(address);
    if (getsockname(listener, (struct sockaddr *)&address, &length) < 0) die("getsockname");
    printf("listening on %d\n", ntohs(address.sin_port));
    fflush(stdout);
    return listener;
}

#endif
