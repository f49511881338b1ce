/* What the loop shows of itself (Evt::Loop#stats, #waits, the stall watch): read from the loop's
 * structures when asked, never kept up to date for the asking. The counters are core.h's struct
 * evt_stats, which the loop adds to as it goes; a wait's kind and start are in its struct evt_wait,
 * found through the one walk over every waiter (object.c). The lib/evt side (insight.rb) makes
 * what a user reads from these. */
#include "core.h"
#include "object.h"
#include "wait.h"
#include "insight.h"

static VALUE sym_ready, sym_suspended, sym_io, sym_sleep, sym_block, sym_yield, sym_start, sym_select,
    sym_process, sym_close, sym_switched, sym_pushed, sym_timeout;

/* ---- stats ---------------------------------------------------------------------------------- */

static void
set(VALUE hash, const char *key, VALUE value)
{
    rb_hash_aset(hash, ID2SYM(rb_intern(key)), value);
}

/* The upper bound, in seconds, of the bucket the `rank`-th late timer falls in (0: none fired). */
static double
late_at(const struct evt_stats *stats, uint64_t rank)
{
    uint64_t seen = 0;
    for (int i = 0; i < EVT_LATE_BUCKETS; i++) {
        seen += stats->late[i];
        if (seen > rank) return i == 0 ? 1e-6 : (double)(1ULL << i) / 1e6;
    }
    return 0.0;
}

/*
 * stats -> Hash
 *
 * The loop's counters (the keys are documented in lib/evt/insight.rb, which adds the fibers' and the
 * pool's): all since the loop was made.
 */
static VALUE
loop_stats(VALUE self)
{
    struct evt_loop *loop = evt_object_check(self);
    const struct evt_stats *stats = &loop->stats;
    int64_t now = evt_timers_now(), lived = now - stats->made_ns, kernel = stats->kernel_ns;
    /* A wait in the kernel under way (a dump from another thread sees one) is waiting already: it
     * began at the loop's last clock reading. */
    if (__atomic_load_n(&loop->kernel.blocked, __ATOMIC_SEQ_CST) && now > stats->clock_ns) kernel += now - stats->clock_ns;
    int64_t busy = lived > kernel ? lived - kernel : 0;
    VALUE hash = rb_hash_new();
    set(hash, "backend", ID2SYM(rb_intern(loop->kernel.backend->name)));
    set(hash, "turns", ULL2NUM(stats->turns));
    set(hash, "fibers_ready", SIZET2NUM(loop->ready_count));
    set(hash, "fibers_ready_max", SIZET2NUM(stats->ready_max));
    set(hash, "fibers_suspended", SIZET2NUM(loop->waiting));
    set(hash, "busy_seconds", DBL2NUM((double)busy / 1e9));
    set(hash, "kernel_seconds", DBL2NUM((double)kernel / 1e9));
    set(hash, "utilization", DBL2NUM(lived > 0 ? (double)busy / (double)lived : 0.0));
    set(hash, "kernel_waits", ULL2NUM(stats->kernel_waits));
    set(hash, "events", ULL2NUM(stats->events));
    set(hash, "events_per_turn", DBL2NUM(stats->turns ? (double)stats->events / (double)stats->turns : 0.0));
    set(hash, "timers_armed", ULL2NUM(stats->timers_cleared + loop->timers.next_sequence));
    set(hash, "timers_pending", SIZET2NUM(loop->timers.size));
    set(hash, "timers_fired", ULL2NUM(stats->timers_fired));
    set(hash, "timer_late_p50", DBL2NUM(late_at(stats, stats->timers_fired / 2)));
    set(hash, "timer_late_p99", DBL2NUM(late_at(stats, stats->timers_fired - (stats->timers_fired + 99) / 100)));
    set(hash, "requests", ULL2NUM(stats->requests));
    if (loop->kernel.backend->complete) {
        set(hash, "submissions", ULL2NUM(loop->kernel.submitted));
        set(hash, "completions", ULL2NUM(loop->kernel.completed));
        set(hash, "overflows", ULL2NUM(loop->kernel.overflowed));
    }
    return hash;
}

/* ---- waits ---------------------------------------------------------------------------------- */

struct listing {
    struct evt_loop *loop;
    VALUE list;
    st_table *seen;
};

static VALUE
entry(VALUE fiber, VALUE state, VALUE kind, VALUE subject, int fd, int events, int64_t since, int64_t deadline)
{
    VALUE values[8] = {fiber, state, kind, subject, fd >= 0 ? INT2NUM(fd) : Qnil, INT2NUM(events),
                       since ? LL2NUM(since) : Qnil, deadline ? LL2NUM(deadline) : Qnil};
    return rb_ary_new_from_values(8, values);
}

static VALUE
kind_of_wait(const struct evt_wait *wait)
{
    switch (wait->kind) {
    case EVT_WAIT_IO: return sym_io;
    case EVT_WAIT_BLOCK: return NIL_P(wait->subject) ? sym_sleep : sym_block;
    case EVT_WAIT_YIELD: return NIL_P(wait->subject) ? sym_yield : sym_close;
    case EVT_WAIT_START: return sym_start;
    case EVT_WAIT_SELECT: return sym_select;
    case EVT_WAIT_OP: return wait->as.op.op->kind == EVT_OP_WAITID ? sym_process : sym_io;
    }
    return Qnil;
}

/* One waiter, once, as the wait it belongs to (a select's IOs each have one, for the select). */
static int
list_waiter(struct evt_waiter *w, void *ptr)
{
    struct listing *listing = ptr;
    if (w->owner) w = w->owner;
    if (st_lookup(listing->seen, (st_data_t)w, NULL)) return 0;
    st_insert(listing->seen, (st_data_t)w, 0);
    VALUE state = w->state == EVT_READY ? sym_ready : sym_suspended;
    if (w->allocated) {
        VALUE kind = w->allocated == EVT_HEAP_PUSHED ? sym_pushed : sym_switched;
        rb_ary_push(listing->list, entry(w->fiber, state, kind, Qnil, -1, 0, 0, 0));
        return 0;
    }
    const struct evt_wait *wait = (const struct evt_wait *)w; /* the waiter is a wait's header */
    VALUE subject = wait->subject;
    int fd = -1, events = 0;
    if (wait->kind == EVT_WAIT_IO || (wait->kind == EVT_WAIT_OP && wait->as.op.op->kind == EVT_OP_TRANSFER)) {
        subject = w->io;
        fd = wait->kind == EVT_WAIT_IO ? w->fd : wait->as.op.op->fd;
        events = wait->kind == EVT_WAIT_IO ? w->events : wait->as.op.op->events;
    }
    else if (wait->kind == EVT_WAIT_OP) {
        subject = INT2NUM(wait->as.op.op->fd); /* the pid */
    }
    else if (wait->kind == EVT_WAIT_SELECT) {
        subject = rb_ary_new_from_values(wait->as.selection->count, wait->as.selection->ios);
    }
    else if (wait->kind == EVT_WAIT_START) {
        subject = wait->as.start.target;
    }
    int64_t deadline = evt_timer_active(&w->timer) ? w->timer.deadline : 0;
    rb_ary_push(listing->list, entry(w->fiber, state, kind_of_wait(wait), subject, fd, events, wait->since, deadline));
    return 0;
}

static VALUE
list_waits(VALUE ptr)
{
    struct listing *listing = (struct listing *)ptr;
    struct evt_loop *loop = listing->loop;
    evt_object_each_waiter(loop, list_waiter, listing);
    for (size_t i = 0; i < loop->timers.size; i++) {
        struct evt_timer *timer = loop->timers.heap[i];
        if (timer->kind != EVT_TIMER_TIMEOUT) continue;
        struct evt_timeout *timeout = evt_container_of(timer, struct evt_timeout, timer);
        rb_ary_push(listing->list, entry(timeout->fiber, Qnil, sym_timeout, timeout->duration, -1, 0, 0, timer->deadline));
    }
    return listing->list;
}

static VALUE
free_seen(VALUE ptr)
{
    st_free_table(((struct listing *)ptr)->seen);
    return Qnil;
}

/*
 * waits -> Array (private)
 *
 * Every wait in the loop: [fiber, state (:ready, :suspended; nil for a timeout), kind, subject,
 * descriptor, events, since, deadline], the times on the monotonic clock in ns (nil: none). Kinds:
 * :io (subject: the IO), :sleep, :block (the blocker), :yield, :close (the IO being closed),
 * :start (the new fiber), :select (the IOs), :process (the pid), :switched, :pushed, and :timeout
 * (a timeout_after around the fiber's wait; subject: its duration).
 */
static VALUE
loop_waits(VALUE self)
{
    struct listing listing = {evt_object_check(self), rb_ary_new(), st_init_numtable()};
    return rb_ensure(list_waits, (VALUE)&listing, free_seen, (VALUE)&listing);
}

struct counting {
    struct evt_loop *loop;
    VALUE counts;  /* kind => how many */
    VALUE skipped; /* fiber => anything: not counted (nil: none) */
    st_table *seen;
};

/* One waiter, once, by the kind of its wait (as list_waiter would name it). */
static int
count_waiter(struct evt_waiter *w, void *ptr)
{
    struct counting *counting = ptr;
    if (w->owner) w = w->owner;
    if (st_lookup(counting->seen, (st_data_t)w, NULL)) return 0;
    st_insert(counting->seen, (st_data_t)w, 0);
    if (!NIL_P(counting->skipped) && rb_hash_lookup2(counting->skipped, w->fiber, Qundef) != Qundef) return 0;
    VALUE kind = w->allocated ? (w->allocated == EVT_HEAP_PUSHED ? sym_pushed : sym_switched)
                              : kind_of_wait((const struct evt_wait *)w);
    VALUE count = rb_hash_lookup2(counting->counts, kind, INT2FIX(0));
    rb_hash_aset(counting->counts, kind, LONG2FIX(FIX2LONG(count) + 1));
    return 0;
}

static VALUE
count_waits(VALUE ptr)
{
    struct counting *counting = (struct counting *)ptr;
    evt_object_each_waiter(counting->loop, count_waiter, counting);
    return counting->counts;
}

static VALUE
free_counted(VALUE ptr)
{
    st_free_table(((struct counting *)ptr)->seen);
    return Qnil;
}

/*
 * wait_counts(skipped = nil) -> Hash (private)
 *
 * The waits of the loop by kind (as #waits names them, timeouts left out), without a fiber's
 * details: for stats, read often. The fibers that are keys of `skipped` are not counted.
 */
static VALUE
loop_wait_counts(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 0, 1);
    struct counting counting = {evt_object_check(self), rb_hash_new(), argc ? argv[0] : Qnil, st_init_numtable()};
    return rb_ensure(count_waits, (VALUE)&counting, free_counted, (VALUE)&counting);
}

/* ---- the stall watch ------------------------------------------------------------------------ */

/*
 * stall_threshold = ns or nil (private)
 *
 * Turns stall accounting on (a threshold in ns) or off (nil): with it on, each pass of the thread
 * through the loop reads the clock (evt_core_beat).
 */
static VALUE
loop_set_stall_threshold(VALUE self, VALUE threshold)
{
    struct evt_loop *loop = evt_object_check(self);
    int64_t ns = NIL_P(threshold) ? 0 : NUM2LL(threshold);
    if (ns < 0) rb_raise(rb_eArgError, "evt: the stall threshold must not be negative");
    loop->stall.beat_ns = evt_timers_now();
    loop->stall.threshold_ns = ns;
    return threshold;
}

/*
 * stall_state -> [beat, current, ended, ended_ns, ended_fiber, thread] (private)
 *
 * For the stall watch, from any thread of the loop's Ractor: when the thread last passed through
 * the loop (monotonic ns), or nil when it is not held (it is in the kernel's wait, or no fiber
 * waits and none runs, or the watch is off); the fiber the loop last switched to (the loop fiber:
 * the thread's own code); the holds past the threshold that are over: how many, the last one's
 * length (ns) and fiber; the loop's thread.
 */
static VALUE
loop_stall_state(VALUE self)
{
    struct evt_loop *loop = evt_object_of(self);
    VALUE beat = Qnil;
    int blocked = __atomic_load_n(&loop->kernel.blocked, __ATOMIC_SEQ_CST);
    if (loop->stall.threshold_ns && !blocked && (loop->waiting || loop->current != loop->loop_fiber))
        beat = LL2NUM(loop->stall.beat_ns);
    VALUE values[6] = {beat, loop->current, ULL2NUM(loop->stall.ended), LL2NUM(loop->stall.ended_ns),
                       loop->stall.ended_fiber, loop->thread};
    return rb_ary_new_from_values(6, values);
}

void
evt_insight_init(VALUE klass)
{
#define SYMBOL(name) (sym_##name = ID2SYM(rb_intern(#name)))
    SYMBOL(ready), SYMBOL(suspended), SYMBOL(io), SYMBOL(sleep), SYMBOL(block), SYMBOL(yield);
    SYMBOL(start), SYMBOL(select), SYMBOL(process), SYMBOL(close), SYMBOL(switched), SYMBOL(pushed);
    SYMBOL(timeout);
#undef SYMBOL
    rb_define_method(klass, "stats", loop_stats, 0);
    rb_define_private_method(klass, "waits", loop_waits, 0);
    rb_define_private_method(klass, "wait_counts", loop_wait_counts, -1);
    rb_define_private_method(klass, "stall_threshold=", loop_set_stall_threshold, 1);
    rb_define_private_method(klass, "stall_state", loop_stall_state, 0);
}
