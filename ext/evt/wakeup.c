/* The wakeup descriptor (wakeup.h), shared by every backend. */
#include "wakeup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#ifdef HAVE_SYS_EVENTFD_H
#include <sys/eventfd.h>
#endif

int
evt_wakeup_open(struct evt_wakeup *wakeup)
{
#ifdef HAVE_SYS_EVENTFD_H
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return -errno;
    wakeup->read_fd = wakeup->write_fd = fd;
    return 0;
#else
    int fds[2];
#ifdef HAVE_PIPE2
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
#else
    if (pipe(fds) < 0) return -errno;
    for (int i = 0; i < 2; i++) {
        int flags = fcntl(fds[i], F_GETFL);
        if (flags < 0 || fcntl(fds[i], F_SETFL, flags | O_NONBLOCK) < 0 || fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0) {
            int err = errno;
            (void)close(fds[0]);
            (void)close(fds[1]);
            return -err;
        }
    }
#endif
    wakeup->read_fd = fds[0];
    wakeup->write_fd = fds[1];
    return 0;
#endif
}

void
evt_wakeup_close(struct evt_wakeup *wakeup)
{
    /* close(2) errors leave nothing to do: the descriptor is released either way. */
    if (wakeup->read_fd >= 0) (void)close(wakeup->read_fd);
    if (wakeup->write_fd >= 0 && wakeup->write_fd != wakeup->read_fd) (void)close(wakeup->write_fd);
    wakeup->read_fd = wakeup->write_fd = -1;
}

void
evt_wakeup_signal(const struct evt_wakeup *wakeup)
{
#ifdef HAVE_SYS_EVENTFD_H
    uint64_t one = 1;
#else
    char one = 1;
#endif
    /* EAGAIN: the counter is non-zero, or the pipe full; the wait ends anyway. */
    (void)!write(wakeup->write_fd, &one, sizeof(one));
}

void
evt_wakeup_drain(const struct evt_wakeup *wakeup)
{
#ifdef HAVE_SYS_EVENTFD_H
    uint64_t value;
    (void)!read(wakeup->read_fd, &value, sizeof(value)); /* EAGAIN: another wait drained it already */
#else
    char buffer[64];
    while (read(wakeup->read_fd, buffer, sizeof(buffer)) == (ssize_t)sizeof(buffer)) continue;
#endif
}
