/* The select backend (Linux): select(2) under the C loop, so that `:select` runs the same core,
 * hooks and subclasses of Evt::Loop as every other backend. The slowest of them: each wait costs
 * time in proportion to the highest descriptor watched, in the kernel and here.
 *
 * Three interest bit sets (read, write, except) live across waits and are kept by arm and disarm,
 * one bit at a time; each wait copies them into three result sets, which select overwrites. The
 * sets are arrays of unsigned long as the Linux kernel reads them, sized for any descriptor number
 * (Linux's select takes nfds above FD_SETSIZE), grown by arm with malloc under the GVL; the bits
 * are set by hand, since glibc's FD_SET aborts for descriptors >= FD_SETSIZE. Bit layout and large
 * sets are what Linux promises, hence Linux only.
 *
 * select(2) is level-triggered, like poll(2). It has no POLLERR, POLLHUP or POLLNVAL: an error or
 * hang-up shows as readable (and an error as writable) in the sets the descriptor is in, and a
 * descriptor closed behind the loop's back fails the whole call with EBADF; wait() then finds the
 * closed ones and reports them as POLLNVAL (every event, by backend.h's rule), so their waiters meet
 * EBADF themselves and stop waiting. The sets read as POLLIN, POLLOUT and POLLPRI; the except set is
 * POLLPRI only, so a wait for IO::PRIORITY alone is not woken by a hang-up here. */
#include "backend.h"

#if defined(__linux__) && defined(HAVE_SYS_SELECT_H)

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

/* The kernel's fd_set word (include/uapi/linux/posix_types.h: an array of unsigned long). */
typedef unsigned long select_word;
#define WORD_BITS (sizeof(select_word) * CHAR_BIT)
#define WORD_OF(fd) ((size_t)(fd) / WORD_BITS)
#define BIT_OF(fd) ((select_word)1 << ((size_t)(fd) % WORD_BITS))
#define BIT_SET(set, fd) ((set)[WORD_OF(fd)] |= BIT_OF(fd))
#define BIT_CLEAR(set, fd) ((set)[WORD_OF(fd)] &= ~BIT_OF(fd))
#define BIT_TEST(set, fd) (((set)[WORD_OF(fd)] & BIT_OF(fd)) != 0)

#define INITIAL_WORDS (1024 / WORD_BITS)
/* select(2) again after EBADF, at most: each time, a descriptor closed since the last look. */
#define MAX_ATTEMPTS 8

enum { SET_READ, SET_WRITE, SET_EXCEPT, SETS };

struct select_backend {
    int nfds;                         /* highest descriptor in the interest sets, plus one */
    int armed;                        /* registrations with a bit in the interest sets */
    size_t words;                     /* of each set: room for descriptors below words * WORD_BITS */
    select_word *bits;                /* one block: the interest sets, then the result sets */
    select_word *interest[SETS];      /* kept by arm and disarm */
    select_word *result[SETS];        /* copies of interest[] handed to select, which overwrites them */
    struct evt_watch **watches;   /* by descriptor (words * WORD_BITS): the armed registration */
};

static const char *
select_probe(void)
{
    return NULL; /* select(2) is always there on Linux */
}

static void
select_point(struct select_backend *backend)
{
    for (int s = 0; s < SETS; s++) {
        backend->interest[s] = backend->bits + (size_t)s * backend->words;
        backend->result[s] = backend->bits + (size_t)(SETS + s) * backend->words;
    }
}

/* Makes room for descriptor fd in the sets and watches: 0, or -ENOMEM with nothing changed. Memory
 * from malloc, not ruby_xmalloc: running short is an -ENOMEM the core raises, not an exception
 * from inside arm with the sets half made. */
static int
select_grow_sets(struct select_backend *backend, int fd)
{
    size_t words = backend->words;
    while (words * WORD_BITS <= (size_t)fd) words *= 2;
    select_word *bits = calloc(words * 2 * SETS, sizeof(*bits));
    struct evt_watch **watches = calloc(words * WORD_BITS, sizeof(*watches));
    if (!bits || !watches) {
        free(bits);
        free(watches);
        return -ENOMEM;
    }
    for (int s = 0; s < SETS; s++) memcpy(bits + (size_t)s * words, backend->interest[s], backend->words * sizeof(*bits));
    memcpy(watches, backend->watches, backend->words * WORD_BITS * sizeof(*watches));
    free(backend->bits);
    free(backend->watches);
    backend->bits = bits;
    backend->watches = watches;
    backend->words = words;
    select_point(backend);
    return 0;
}

static void
select_free(struct select_backend *backend)
{
    free(backend->bits);
    free(backend->watches);
    free(backend);
}

static int
select_open(struct evt_kernel *kernel)
{
    struct select_backend *backend = calloc(1, sizeof(*backend));
    if (!backend) return -ENOMEM;
    backend->words = INITIAL_WORDS;
    while (backend->words * WORD_BITS <= (size_t)kernel->wakeup.read_fd) backend->words *= 2;
    backend->bits = calloc(backend->words * 2 * SETS, sizeof(*backend->bits));
    backend->watches = calloc(backend->words * WORD_BITS, sizeof(*backend->watches));
    if (!backend->bits || !backend->watches) {
        select_free(backend);
        return -ENOMEM;
    }
    select_point(backend);
    BIT_SET(backend->interest[SET_READ], kernel->wakeup.read_fd); /* always in the read set */
    backend->nfds = kernel->wakeup.read_fd + 1;
    kernel->data = backend;
    return 0;
}

static void
select_close(struct evt_kernel *kernel)
{
    select_free(kernel->data);
}

static int
select_arm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct select_backend *backend = kernel->data;
    struct evt_backend_slot *slot = &watch->slot;
    int err = evt_backend_slot_check(slot, fd, watch->generation);
    if (err < 0) return err;
    if ((size_t)fd >= backend->words * WORD_BITS) {
        err = select_grow_sets(backend, fd);
        if (err < 0) return err;
    }
    if (slot->index < 0) {
        backend->armed++;
        backend->watches[fd] = watch;
        slot->index = fd; /* armed */
    }
    static const int events[SETS] = {EVT_READABLE, EVT_WRITABLE, EVT_PRIORITY};
    for (int s = 0; s < SETS; s++) {
        if (watch->events & events[s]) BIT_SET(backend->interest[s], fd);
        else BIT_CLEAR(backend->interest[s], fd);
    }
    if (fd >= backend->nfds) backend->nfds = fd + 1;
    slot->interest = watch->events;
    return 0;
}

static void
select_disarm(struct evt_kernel *kernel, int fd, struct evt_watch *watch)
{
    struct evt_backend_slot *slot = &watch->slot;
    if (slot->index < 0) return; /* never armed (a file), or the backend was closed since */
    struct select_backend *backend = kernel->data;
    for (int s = 0; s < SETS; s++) BIT_CLEAR(backend->interest[s], fd);
    backend->watches[fd] = NULL;
    backend->armed--;
    slot->index = -1;
    slot->interest = 0;
    if (fd + 1 == backend->nfds) {
        /* The highest one left: the wakeup descriptor's bit stays set, so the search ends. */
        size_t i = WORD_OF(fd);
        for (;;) {
            select_word any = backend->interest[SET_READ][i] | backend->interest[SET_WRITE][i] | backend->interest[SET_EXCEPT][i];
            if (any) {
                backend->nfds = (int)(i * WORD_BITS + (WORD_BITS - 1 - (size_t)__builtin_clzl(any))) + 1;
                break;
            }
            i--;
        }
    }
}

/* After EBADF: collects the descriptors in the interest sets that are not open any more (closed
 * without IO#close, or by another thread) into kernel->fired, as POLLNVAL (every event). Their count,
 * or -1 when the wakeup descriptor itself was closed behind our back. Without the GVL. */
static int
select_find_closed(struct evt_kernel *kernel, struct select_backend *backend, size_t words)
{
    int found = 0;
    for (size_t i = 0; i < words; i++) {
        select_word any = backend->interest[SET_READ][i] | backend->interest[SET_WRITE][i] | backend->interest[SET_EXCEPT][i];
        while (any) {
            int fd = (int)(i * WORD_BITS + (size_t)__builtin_ctzl(any));
            any &= any - 1;
            if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
            if (fd == kernel->wakeup.read_fd) return -1;
            if (found == kernel->fired_capacity) continue; /* reported by a later wait */
            kernel->fired[found++] = (struct evt_fired){
                .fd = fd,
                .generation = backend->watches[fd]->generation,
                .events = evt_backend_events(POLLNVAL),
            };
        }
    }
    return found;
}

/* Level-triggered: what does not fit in kernel->fired this time is reported again by the next wait. */
static int
select_wait(struct evt_kernel *kernel, int64_t timeout_ns)
{
    struct select_backend *backend = kernel->data;
    int nfds = backend->nfds;
    size_t words = WORD_OF(nfds - 1) + 1;
    struct timespec ts = {(time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
    struct timespec zero = {0, 0};
    int closed = 0; /* entries of descriptors found closed, at the start of kernel->fired */
    int n = -1;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        for (int s = 0; s < SETS; s++) memcpy(backend->result[s], backend->interest[s], words * sizeof(select_word));
        for (int i = 0; i < closed; i++)
            for (int s = 0; s < SETS; s++) BIT_CLEAR(backend->result[s], kernel->fired[i].fd);
        /* With closed descriptors to report, only a look at the others. */
        const struct timespec *timeout = closed ? &zero : timeout_ns < 0 ? NULL : &ts;
        n = pselect(nfds, (fd_set *)backend->result[SET_READ], (fd_set *)backend->result[SET_WRITE],
                    (fd_set *)backend->result[SET_EXCEPT], timeout, NULL);
        if (n >= 0) break;
        int err = errno;
        if (err == EINTR) break; /* the loop checks interrupts; the sets say nothing */
        if (err != EBADF) return -err;
        /* Found afresh each time: every descriptor closed by now, those of earlier attempts too. */
        closed = select_find_closed(kernel, backend, words);
        if (closed < 0) return -EBADF; /* the wakeup descriptor: no wait can work any more */
        /* None found: the number was opened again meanwhile, and a new select sees that file. */
    }
    int fired = closed;
    if (n > 0) {
        /* n counts the bits set in all three sets. */
        for (size_t i = 0; i < words && n > 0; i++) {
            select_word r = backend->result[SET_READ][i], w = backend->result[SET_WRITE][i], e = backend->result[SET_EXCEPT][i];
            select_word any = r | w | e;
            n -= __builtin_popcountl(r) + __builtin_popcountl(w) + __builtin_popcountl(e);
            while (any) {
                select_word bit = any & -any;
                int fd = (int)(i * WORD_BITS + (size_t)__builtin_ctzl(any));
                any &= any - 1;
                if (fd == kernel->wakeup.read_fd) {
                    evt_wakeup_drain(&kernel->wakeup);
                    continue;
                }
                if (fired == kernel->fired_capacity) continue;
                unsigned revents = (r & bit ? POLLIN : 0) | (w & bit ? POLLOUT : 0) | (e & bit ? POLLPRI : 0);
                kernel->fired[fired++] = (struct evt_fired){
                    .fd = fd,
                    .generation = backend->watches[fd]->generation,
                    .events = evt_backend_events(revents),
                };
            }
        }
    }
    return fired;
}

const struct evt_backend evt_backend_select = {
    .name = "select",
    .probe = select_probe,
    .open = select_open,
    .close = select_close,
    .arm = select_arm,
    .disarm = select_disarm,
    .wait = select_wait,
};

#endif
