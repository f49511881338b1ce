/* The timer heap: a binary min-heap of deadlines. Timers are embedded in the structures that own
 * them and remember their position in the heap, so removal is O(log n) without a search. Equal
 * deadlines fire in the order they were added. */
#ifndef EVT_TIMERS_H
#define EVT_TIMERS_H

#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>

#define EVT_TIMER_INACTIVE ((size_t)-1)

struct evt_timer {
    int64_t deadline;   /* monotonic clock, nanoseconds */
    uint64_t sequence;  /* insertion order, breaks ties between equal deadlines */
    size_t index;       /* position in the heap, EVT_TIMER_INACTIVE when not in it */
    int kind;           /* what it belongs to: for its owner to tell (the heap does not look) */
};

struct evt_timers {
    struct evt_timer **heap;
    size_t size, capacity;
    uint64_t next_sequence;
    int slack_saved;          /* the thread's timer slack is tightened (saved_slack is what it was); -1: refused */
    int saved_slack;
    pthread_t slack_thread;
};

void evt_timers_init(struct evt_timers *timers);
void evt_timers_free(struct evt_timers *timers);
void evt_timers_clear(struct evt_timers *timers);
/* Adds an inactive timer; grows the heap (raising NoMemoryError) only when it is full. */
void evt_timers_add(struct evt_timers *timers, struct evt_timer *timer, int64_t deadline);
void evt_timers_remove(struct evt_timers *timers, struct evt_timer *timer);

/* A kernel wait with a timeout ends up to the thread's timer slack late (50 µs by default, which
 * epoll and poll add to every timeout). The loop tightens its thread's slack to `ns` while it
 * waits on timers, and gives it back when its kernel objects close; not from another thread (a
 * loop freed by the GC, or moving to a new thread), whose slack it is not. */
void evt_timers_tighten_slack(struct evt_timers *timers, int ns);
void evt_timers_restore_slack(struct evt_timers *timers);

/* The monotonic clock, in nanoseconds: the timers' deadlines are on it. */
static inline int64_t
evt_timers_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void
evt_timer_init(struct evt_timer *timer, int kind)
{
    timer->index = EVT_TIMER_INACTIVE;
    timer->kind = kind;
}

static inline int
evt_timer_active(const struct evt_timer *timer)
{
    return timer->index != EVT_TIMER_INACTIVE;
}

/* The earliest timer, or NULL. */
static inline struct evt_timer *
evt_timers_first(const struct evt_timers *timers)
{
    return timers->size ? timers->heap[0] : NULL;
}

#endif
