#include "timers.h"

#include <ruby.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static inline int
earlier(const struct evt_timer *a, const struct evt_timer *b)
{
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->sequence < b->sequence);
}

static inline void
place(struct evt_timers *timers, size_t index, struct evt_timer *timer)
{
    timers->heap[index] = timer;
    timer->index = index;
}

static void
sift_up(struct evt_timers *timers, size_t index)
{
    struct evt_timer *timer = timers->heap[index];
    while (index > 0) {
        size_t parent = (index - 1) / 2;
        if (!earlier(timer, timers->heap[parent])) break;
        place(timers, index, timers->heap[parent]);
        index = parent;
    }
    place(timers, index, timer);
}

static void
sift_down(struct evt_timers *timers, size_t index)
{
    struct evt_timer *timer = timers->heap[index];
    for (;;) {
        size_t child = 2 * index + 1;
        if (child >= timers->size) break;
        if (child + 1 < timers->size && earlier(timers->heap[child + 1], timers->heap[child])) child++;
        if (!earlier(timers->heap[child], timer)) break;
        place(timers, index, timers->heap[child]);
        index = child;
    }
    place(timers, index, timer);
}

void
evt_timers_init(struct evt_timers *timers)
{
    timers->heap = NULL;
    timers->size = timers->capacity = 0;
    timers->next_sequence = 0;
    timers->slack_saved = 0;
    timers->saved_slack = 0;
}

void
evt_timers_free(struct evt_timers *timers)
{
    ruby_xfree(timers->heap);
    evt_timers_init(timers);
}

void
evt_timers_clear(struct evt_timers *timers)
{
    for (size_t i = 0; i < timers->size; i++) timers->heap[i]->index = EVT_TIMER_INACTIVE;
    timers->size = 0;
}

void
evt_timers_add(struct evt_timers *timers, struct evt_timer *timer, int64_t deadline)
{
    if (timers->size == timers->capacity) {
        size_t capacity = timers->capacity ? timers->capacity * 2 : 64;
        REALLOC_N(timers->heap, struct evt_timer *, capacity);
        timers->capacity = capacity;
    }
    timer->deadline = deadline;
    timer->sequence = timers->next_sequence++;
    place(timers, timers->size++, timer);
    sift_up(timers, timer->index);
}

void
evt_timers_remove(struct evt_timers *timers, struct evt_timer *timer)
{
    size_t index = timer->index;
    if (index == EVT_TIMER_INACTIVE) return;
    timer->index = EVT_TIMER_INACTIVE;
    struct evt_timer *last = timers->heap[--timers->size];
    if (index == timers->size) return;
    place(timers, index, last);
    if (index > 0 && earlier(last, timers->heap[(index - 1) / 2])) sift_up(timers, index);
    else sift_down(timers, index);
}

void
evt_timers_tighten_slack(struct evt_timers *timers, int ns)
{
#ifdef PR_SET_TIMERSLACK
    if (RB_LIKELY(timers->slack_saved)) return;
    int previous = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (previous < 0 || prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) < 0) {
        timers->slack_saved = -1; /* refused (a seccomp filter): waits keep the default slack */
        return;
    }
    timers->saved_slack = previous;
    timers->slack_thread = pthread_self();
    timers->slack_saved = 1;
#else
    (void)timers;
    (void)ns;
#endif
}

void
evt_timers_restore_slack(struct evt_timers *timers)
{
#ifdef PR_SET_TIMERSLACK
    if (timers->slack_saved == 1 && pthread_equal(timers->slack_thread, pthread_self())) {
        /* Nothing to do if refused: the thread keeps a tighter slack, which only costs wakeups. */
        (void)prctl(PR_SET_TIMERSLACK, timers->saved_slack, 0, 0, 0);
    }
#endif
    timers->slack_saved = 0;
}
