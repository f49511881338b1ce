/* The wakeup descriptor every backend watches: writing to it ends the loop's wait in the kernel,
 * from another thread or a signal handler. An eventfd where there is one, else a self-pipe. The
 * core opens it with the backend's kernel objects and closes it with them (core.h: loop->kernel.wakeup). */
#ifndef EVT_WAKEUP_H
#define EVT_WAKEUP_H

struct evt_wakeup {
    int read_fd;   /* watched for readability; -1 while closed */
    int write_fd;  /* the same eventfd, or the pipe's other end */
};

/* Non-blocking and close-on-exec. 0, or -errno with nothing left open. */
int evt_wakeup_open(struct evt_wakeup *wakeup);
void evt_wakeup_close(struct evt_wakeup *wakeup);
/* Any thread, async-signal-safe, no GVL needed. */
void evt_wakeup_signal(const struct evt_wakeup *wakeup);
/* Empties it, once a wait saw it readable (no GVL needed). */
void evt_wakeup_drain(const struct evt_wakeup *wakeup);

#endif
