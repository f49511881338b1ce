/* The loop's driver: the turn that resumes the ready fibers, waits in the kernel and fires the
 * timers, run in the modes its callers need (loop.h). Suspending a fiber is wait.c's, above. The loop
 * runs on the loop fiber (the blocking fiber that drives the scheduler) and switches with
 * rb_fiber_transfer only.
 *
 * One turn, each phase one call, in this order (libuv's, for the parts it shares):
 *
 *   serve_requests   what other threads asked: IOs they closed, fibers to interrupt
 *   resume_ready     the fibers that were ready when the turn began
 *   poll_timeout     how long the kernel may block: 0 with fibers ready or requests waiting, else
 *                    until the next timer
 *   wait_in_kernel   the backend's wait, without the GVL
 *   serve_closes     IOs other threads closed meanwhile: their waiters learn it before any event
 *   dispatch         fired events and completions wake their waiters
 *   check_interrupts signals, Thread#raise and Thread#kill, once the events are safely dispatched
 *   fire_timers      due timers: their waiters time out, a timeout_after raises
 *
 * The four from wait_in_kernel to check_interrupts are collect() (a selector's select leaves the
 * interrupts to async). turn() is the one body every mode of evt_loop_run shares; the modes differ
 * in how many turns they take and which phases they ask for.
 *
 * A turn that waits for a timer asks the kernel to end the wait a little early, by how late such
 * waits have been ending on average, and spins the rest (at most EVT_SPIN_MAX_NS): see
 * wait_out_timer.
 *
 * The kernel is asked before the timers fire: an event that came before a waiter's deadline wakes
 * it as ready, however long the fibers of the turn kept the loop from looking (else a busy loop
 * would time out readers whose data had long arrived).
 */
#include "core.h"
#include "waiter.h"
#include "object.h"
#include "requests.h"
#include "close.h"
#include "loop.h"

#include <ruby/thread.h>

static VALUE eFiberError;
static ID id_alive_p, id_transfer, id_raise, id_handle_interrupt;
static VALUE signal_exception_never = Qnil;

/* ---- switching fibers ------------------------------------------------------------------------- */

/* Switches from the loop fiber to another; control comes back when that fiber waits or ends.
 * `current` is what the loop believes runs. (A new fiber starts through launch, in evt.c.) */
static inline void
switch_to(struct evt_loop *loop, VALUE fiber)
{
    evt_core_beat(loop, loop->loop_fiber);
    evt_requests_resumed(loop, fiber);
    loop->current = fiber;
    loop->reads_now = 0;
    rb_fiber_transfer(fiber, 0, NULL);
    evt_core_beat(loop, NIL_P(loop->current) ? fiber : loop->current);
    loop->current = loop->loop_fiber;
    if (RB_UNLIKELY(loop->early_unblock == fiber)) loop->early_unblock = Qnil; /* it ended without waiting */
}

/* Raises exception in fiber from the loop fiber: a switch to it, as switch_to's, so `current` names
 * it until it waits again or ends (when control comes back here). Else the fiber's unwinding would
 * take whichever fiber `current` named last for the one that switched to it, and ready that one in
 * the middle of its own wait. */
static void
raise_into(struct evt_loop *loop, VALUE fiber, VALUE exception)
{
    evt_core_beat(loop, loop->loop_fiber);
    evt_requests_resumed(loop, fiber);
    loop->current = fiber;
    rb_fiber_raise(fiber, 1, &exception);
    evt_core_beat(loop, NIL_P(loop->current) ? fiber : loop->current);
    loop->current = loop->loop_fiber;
}

/* ---- the run loop: its phases, in order ---------------------------------------------------------- */

struct interrupt {
    struct evt_loop *loop;
    VALUE fiber;
    VALUE exception;
};

static VALUE
interrupt_fiber(VALUE ptr)
{
    struct interrupt *interrupt = (struct interrupt *)ptr;
    if (rb_obj_is_fiber(interrupt->fiber)) {
        raise_into(interrupt->loop, interrupt->fiber, interrupt->exception);
    }
    else {
        /* A stand-in for a fiber (fiber_interrupt): its raise switches to the fiber inside, which the
         * loop cannot name; `current` stays nil meanwhile, so that fiber's unwinding readies no one. */
        interrupt->loop->current = Qnil;
        rb_funcall(interrupt->fiber, id_raise, 1, interrupt->exception);
        interrupt->loop->current = interrupt->loop->loop_fiber;
    }
    return Qnil;
}

/* Whether the target of an interrupt (a Fiber, or a stand-in for one) still runs. */
static int
interruptible(VALUE fiber)
{
    return RTEST(rb_obj_is_fiber(fiber) ? rb_fiber_alive_p(fiber) : rb_funcall(fiber, id_alive_p, 0));
}

static VALUE
fiber_gone(VALUE ptr, VALUE error)
{
    struct evt_loop *loop = ((struct interrupt *)ptr)->loop;
    loop->current = loop->loop_fiber;
    return Qnil; /* it is not suspended any more (resumed by another fiber): nothing to interrupt */
}

/* One interrupt, unless its fiber has ended; a FiberError means it is not suspended any more. */
static VALUE
interrupt_one(VALUE ptr)
{
    struct interrupt *interrupt = (struct interrupt *)ptr;
    if (interruptible(interrupt->fiber))
        rb_rescue2(interrupt_fiber, ptr, fiber_gone, ptr, eFiberError, 0);
    return Qnil;
}

/* Whether the interrupted fiber waits on the IO (or one of the IOs) the interrupt is for. */
static int
waits_again_visit(struct evt_waiter *w, void *arg)
{
    const struct evt_request *request = arg;
    if (w->fiber != request->subject || NIL_P(w->io)) return 0;
    if (!RB_TYPE_P(request->io, T_ARRAY)) return w->io == request->io;
    for (long i = 0; i < RARRAY_LEN(request->io); i++)
        if (RARRAY_AREF(request->io, i) == w->io) return 1;
    return 0;
}

/* An interrupt that came before the loop resumed its fiber once more is for a wait that may be
 * over (an event had made the fiber ready) and is dropped, unless the fiber waits again on an IO
 * it is for (those the close notes, requests.c), which Ruby's IO#close may still be waiting for
 * it to leave (the closer's flush let it run before the IO was marked closed). A wait on another
 * IO is not the one the close meant. */
static int
interrupt_outdated(struct evt_loop *loop, const struct evt_request *request)
{
    return evt_requests_stale(loop, request) &&
           (NIL_P(request->io) || !evt_object_each_waiter(loop, waits_again_visit, (void *)request));
}

/* The other threads' requests (requests.c): the closes first (close.c: the kernel lets go of those
 * files at once), then, when `interrupts` is set, the fiber interrupts, which switch fibers (not
 * while the backend holds undispatched events: then they are kept for the next turn). */
static void
serve_requests(struct evt_loop *loop, int interrupts)
{
    if (!loop->requests.pending) return;
    VALUE taken = evt_requests_take(loop);
    if (NIL_P(taken)) return;
    long count = evt_requests_count(taken);
    loop->stats.requests += (uint64_t)count;
    for (long i = 0; i < count; i++) {
        struct evt_request request = evt_requests_at(taken, i);
        if (request.kind == EVT_REQUEST_CLOSE) evt_close_heard(loop, request.subject, FIX2INT(request.argument));
    }
    if (!interrupts) {
        if (!evt_requests_keep(loop, taken, EVT_REQUEST_INTERRUPT, 0)) evt_requests_recycle(loop, taken);
        return;
    }
    VALUE own = Qnil; /* an exception for the loop fiber itself, raised once the rest is done */
    for (long i = 0; i < count; i++) {
        struct evt_request request = evt_requests_at(taken, i);
        if (request.kind != EVT_REQUEST_INTERRUPT) continue;
        if (request.subject == rb_fiber_current()) {
            own = request.argument;
            continue;
        }
        if (interrupt_outdated(loop, &request)) continue;
        /* As timeout_after does: control comes back when that fiber waits again or ends. A stand-in
         * runs code of its own (alive?, raise): if that raises, the interrupts after it wait for the
         * next turn rather than being lost. */
        struct interrupt interrupt = {loop, request.subject, request.argument};
        int state = 0;
        rb_protect(interrupt_one, (VALUE)&interrupt, &state);
        if (state) {
            evt_requests_keep(loop, taken, EVT_REQUEST_INTERRUPT, i + 1);
            rb_jump_tag(state);
        }
    }
    evt_requests_recycle(loop, taken);
    evt_requests_settle(loop);
    if (!NIL_P(own)) rb_exc_raise(own);
}

/* What other threads closed while the loop waited, before any event for those IOs (the interrupts
 * wait for the next turn). */
static inline void
serve_closes(struct evt_loop *loop)
{
    serve_requests(loop, 0);
}

/* A selector's pushed entry: a Fiber is transferred to unless it has ended; anything else is asked
 * alive? and then sent transfer, as io-event does. The waiter goes back to the spare list first. */
static void
run_pushed(struct evt_loop *loop, struct evt_waiter *w)
{
    VALUE object = w->fiber;
    w->fiber = Qnil;
    evt_list_remove(&w->io_link);
    if (loop->selector.spare_count < 64) {
        evt_list_append(&loop->selector.spare, &w->io_link);
        loop->selector.spare_count++;
    }
    else {
        ruby_xfree(w);
    }
    if (rb_obj_is_fiber(object)) {
        if (RTEST(rb_fiber_alive_p(object)) && object != rb_fiber_current()) switch_to(loop, object);
        return;
    }
    if (RTEST(rb_funcall(object, id_alive_p, 0))) {
        loop->current = Qnil;
        rb_funcall(object, id_transfer, 0);
        loop->current = loop->loop_fiber;
    }
}

/* Resumes the fibers that were ready when it started. Returns 1 if `until` (the loop fiber's own
 * waiter, when the loop fiber itself waits) came up: the loop fiber then just carries on. */
static int
resume_ready(struct evt_loop *loop, struct evt_waiter *until)
{
    size_t count = loop->ready_count;
    loop->first_budget = count > EVT_FIRST_MIN ? count : EVT_FIRST_MIN;
    loop->first_pending = 0;
    while (!evt_list_empty(&loop->ready)) {
        if (loop->first_pending) loop->first_pending--; /* a starter gone first: not one of the count */
        else if (count == 0) break;
        else count--;
        struct evt_waiter *w = evt_container_of(loop->ready.next, struct evt_waiter, ready_link);
        evt_list_remove(&w->ready_link);
        loop->ready_count--;
        w->state = EVT_IDLE;
        if (w == until) return 1;
        VALUE fiber = w->fiber;
        if (w->allocated == EVT_HEAP_PUSHED) {
            run_pushed(loop, w);
            continue;
        }
        if (w->allocated) {
            evt_list_remove(&w->io_link);
            ruby_xfree(w);
            loop->waiting--;
            if (!RTEST(rb_fiber_alive_p(fiber))) continue; /* ended meanwhile (killed) */
        }
        if (RB_UNLIKELY(loop->selector.driven && fiber == rb_fiber_current())) continue; /* its own resume's entry */
        switch_to(loop, fiber);
    }
    return 0;
}

/* A timer fires `late` ns after its deadline: counted, by the power of two of its µs. */
static inline void
count_late(struct evt_stats *stats, int64_t late)
{
    uint64_t us = late > 0 ? (uint64_t)late / 1000 : 0;
    int bucket = us ? 64 - __builtin_clzll(us) : 0;
    stats->late[bucket < EVT_LATE_BUCKETS ? bucket : EVT_LATE_BUCKETS - 1]++;
    stats->timers_fired++;
}

static void
fire_timers(struct evt_loop *loop, int64_t now)
{
    struct evt_timer *timer;
    while ((timer = evt_timers_first(&loop->timers)) && timer->deadline <= now) {
        count_late(&loop->stats, now - timer->deadline);
        if (timer->kind == EVT_TIMER_TIMEOUT) {
            /* timeout_after: raise in the fiber, wherever it waits; control comes back here when it
             * waits again or ends. */
            struct evt_timeout *timeout = evt_container_of(timer, struct evt_timeout, timer);
            evt_timers_remove(&loop->timers, timer);
            raise_into(loop, timeout->fiber, timeout->exception);
            continue;
        }
        struct evt_waiter *w = evt_container_of(timer, struct evt_waiter, timer);
        if (w->state == EVT_WAITING) evt_waiter_wake(loop, w, EVT_TIMED_OUT, 0);
        else evt_timers_remove(&loop->timers, timer);
    }
}

/* ---- timers on time --------------------------------------------------------------------------
 *
 * A kernel wait with a timeout ends late: the thread's timer slack (50 µs by default, which epoll and
 * poll add to every timeout) and the time the kernel takes to wake an idle CPU (tens of µs in a VM).
 * The loop tightens its thread's slack to EVT_TIMER_SLACK_NS while it uses it (restored when its
 * kernel objects close), learns how late its timed waits end (a running average, capped), asks the
 * kernel for that much less, and spins the remainder on the clock: a few tens of µs per timer, never
 * more than EVT_SPIN_MAX_NS, and nothing while no timer is near, so an idle sleeper costs no CPU. */
#define EVT_TIMER_SLACK_NS 1000
#define EVT_SPIN_MAX_NS 100000

/* After a wait of `timeout` from `start` that asked the kernel for `early` less and woke nobody:
 * learns how late the kernel's wait ended, if it ran out, then spins to the deadline unless it is
 * further than EVT_SPIN_MAX_NS (the wait ended for something else, a wakeup that woke no fiber). */
static void
wait_out_timer(struct evt_loop *loop, int64_t start, int64_t timeout, int64_t early)
{
    int64_t deadline = start + timeout;
    int64_t asked_end = deadline - early;
    int64_t woke = evt_timers_now();
    if (early < timeout && woke >= asked_end) {
        int64_t late = woke - asked_end;
        if (late > EVT_SPIN_MAX_NS) late = EVT_SPIN_MAX_NS;
        loop->kernel.wake_late_ns += (late - loop->kernel.wake_late_ns) / 8;
    }
    if (deadline - woke > EVT_SPIN_MAX_NS) return;
    while (woke < deadline) woke = evt_timers_now();
}

/* Nanoseconds until the first timer is due (0: due now), or -1: no timer. */
static int64_t
until_first_timer(struct evt_loop *loop, int64_t now)
{
    struct evt_timer *first = evt_timers_first(&loop->timers);
    if (!first) return -1;
    return first->deadline > now ? first->deadline - now : 0;
}

/* Nanoseconds the kernel may block in a turn: none while fibers are ready or requests wait (a
 * request made while the fibers ran saw no wait to end: take it now rather than after one), else
 * until the first timer, else no limit (-1). */
static int64_t
poll_timeout(struct evt_loop *loop, int64_t now)
{
    if (loop->ready_count || loop->requests.pending) return 0;
    return until_first_timer(loop, now);
}

struct kernel_wait {
    struct evt_loop *loop;
    int64_t timeout;
    int result;
};

static void *
wait_without_gvl(void *ptr)
{
    struct kernel_wait *wait = ptr;
    wait->result = wait->loop->kernel.backend->wait(&wait->loop->kernel, wait->timeout);
    return NULL;
}

static void
end_kernel_wait(void *ptr)
{
    evt_wakeup_signal(&((struct evt_loop *)ptr)->kernel.wakeup);
}

#ifndef RB_NOGVL_PENDING_INTR_FAIL
static VALUE
wait_masked(RB_BLOCK_CALL_FUNC_ARGLIST(yielded, ptr))
{
    struct kernel_wait *wait = (struct kernel_wait *)ptr;
    rb_thread_call_without_gvl2(wait_without_gvl, wait, end_kernel_wait, wait->loop);
    return Qnil;
}
#endif

/* A selector's blocking wait. async runs its loop with signals masked (Thread.handle_interrupt) and
 * looks at Thread.pending_interrupt? between selects: an interrupt already pending must end the wait
 * before it starts, not after the timeout, and none may be raised out of it (select returns 0). Ruby
 * with RB_NOGVL_PENDING_INTR_FAIL says so itself; before it (3.3, 3.4), entering
 * Thread.handle_interrupt raises the thread's interrupt flag again when interrupts are pending, and the
 * GVL-free call right inside it sees that flag or installs its unblock function first (io-event's way). */
static void
wait_for_selector(struct kernel_wait *wait)
{
#ifdef RB_NOGVL_PENDING_INTR_FAIL
    rb_nogvl(wait_without_gvl, wait, end_kernel_wait, wait->loop, RB_NOGVL_INTR_FAIL | RB_NOGVL_PENDING_INTR_FAIL);
#else
    rb_block_call(rb_cThread, id_handle_interrupt, 1, &signal_exception_never, wait_masked, (VALUE)wait);
#endif
}

static VALUE
wait_for_selector_protected(VALUE ptr)
{
    wait_for_selector((struct kernel_wait *)ptr);
    return Qnil;
}

/* The backend's wait: the number of events it fired into loop->kernel.fired. A look (timeout 0) keeps the
 * GVL, which is not worth giving up for it. */
static int
wait_in_kernel(struct evt_loop *loop, int64_t timeout)
{
    struct kernel_wait wait = {loop, timeout, 0};
    loop->stats.kernel_waits++;
    if (timeout == 0) {
        wait.result = loop->kernel.backend->wait(&loop->kernel, 0);
    }
    else {
        evt_core_beat(loop, loop->loop_fiber);
        int64_t start = loop->stats.clock_ns; /* the turn's: read just before (turn) */
        loop->kernel.woken = 0; /* under the GVL, as every evt_core_wake */
        __atomic_store_n(&loop->kernel.blocked, 1, __ATOMIC_SEQ_CST);
        /* RB_NOGVL_INTR_FAIL: no interrupt check on the way out, where an exception would lose the
         * events just taken from the kernel; check_interrupts comes after dispatch. */
        int state = 0;
        if (loop->selector.driven) rb_protect((VALUE(*)(VALUE))wait_for_selector_protected, (VALUE)&wait, &state);
        else rb_nogvl(wait_without_gvl, &wait, end_kernel_wait, loop, RB_NOGVL_INTR_FAIL);
        __atomic_store_n(&loop->kernel.blocked, 0, __ATOMIC_SEQ_CST);
        loop->stats.clock_ns = evt_timers_now();
        loop->stats.kernel_ns += loop->stats.clock_ns - start;
        evt_core_beat(loop, Qnil);
        loop->kernel.interrupted = state; /* raised once the events are dispatched (raise_interrupted) */
    }
    return wait.result; /* -errno: raised by dispatch, once the closes are served */
}

/* A selector's wait that an exception ended (Thread#raise; signals are held back): the events it
 * took are in the ready queue by now, for the next select; the exception goes on. */
static void
raise_interrupted(struct evt_loop *loop)
{
    int state = loop->kernel.interrupted;
    if (RB_LIKELY(!state)) return;
    loop->kernel.interrupted = 0;
    while (!evt_list_empty(&loop->selector.dispatched)) {
        struct evt_list *node = loop->selector.dispatched.next;
        evt_list_remove(node);
        evt_list_append(&loop->ready, node);
    }
    rb_jump_tag(state);
}

/* Hands what the wait collected to the waiters: the fired events of a readiness backend, then the
 * completions of a completion backend. A full array grows for the next wait. A wait that failed
 * (-errno) raises here. */
static void
dispatch(struct evt_loop *loop, int fired)
{
    if (fired < 0) rb_syserr_fail_str(-fired, rb_sprintf("evt: waiting on the %s backend", loop->kernel.backend->name));
    for (int i = 0; i < fired; i++) {
        struct evt_fired event = loop->kernel.fired[i];
        evt_waiter_fired(&loop->kernel, event.fd, event.generation, event.events);
    }
    if (loop->kernel.backend->complete) loop->kernel.backend->complete(&loop->kernel);
    if (fired == loop->kernel.fired_capacity && loop->kernel.fired_capacity < EVT_FIRED_MAX) {
        REALLOC_N(loop->kernel.fired, struct evt_fired, loop->kernel.fired_capacity * 2);
        loop->kernel.fired_capacity *= 2;
    }
}

/* Signals, Thread#raise and Thread#kill arrive here, after the events are safely dispatched. */
static inline void
check_interrupts(void)
{
    rb_thread_check_ints();
}

/* ---- the collect step, the same in every mode ----------------------------------------------- */

/* Waits in the kernel up to `timeout` ns (0: a look), serves the closes other threads made
 * meanwhile, hands the events to their waiters, then raises what interrupted the wait. In
 * EVT_RUN_ONCE (a selector's select) the woken waiters go to loop->selector.dispatched, for the select to
 * resume before it returns, and the thread's interrupts stay pending for async, which masks them;
 * every other mode checks them here. Returns what the backend's wait returned. */
static int
collect(struct evt_loop *loop, int64_t timeout, struct evt_run *run)
{
    enum evt_run_mode mode = run->mode;
    int64_t blocked = loop->stats.kernel_ns;
    int fired = wait_in_kernel(loop, timeout);
    if (mode == EVT_RUN_ONCE) run->idle_ns += loop->stats.kernel_ns - blocked;
    serve_closes(loop);
    if (mode != EVT_RUN_ONCE) {
        dispatch(loop, fired);
        raise_interrupted(loop);
        check_interrupts();
        return fired;
    }
    if (fired < 0) {
        raise_interrupted(loop);
        dispatch(loop, fired); /* raises */
    }
    loop->selector.dispatching = 1;
    dispatch(loop, fired);
    loop->selector.dispatching = 0;
    raise_interrupted(loop);
    return fired;
}

/* A readiness backend's wait filled the array: more events may wait in the kernel. When timers are
 * due, they are collected first (a few more looks, each with a larger array), so that no waiter
 * times out on an event the kernel already had (when thousands of readers get their data
 * together, most are not in the first array). */
static void
collect_before_timers(struct evt_loop *loop, struct evt_run *run)
{
    for (int looks = 0; looks < 8; looks++) {
        struct evt_timer *first = evt_timers_first(&loop->timers);
        if (!first || first->deadline > evt_timers_now()) return; /* no timer due */
        int capacity = loop->kernel.fired_capacity;
        if (collect(loop, 0, run) < capacity) return;
    }
}

/* ---- the driver: one turn, and the modes ------------------------------------------------------- */

/* Resumes the waiters this select's events woke (loop->selector.dispatched), in order: the number resumed. */
static int
resume_dispatched(struct evt_loop *loop)
{
    int count = 0;
    while (!evt_list_empty(&loop->selector.dispatched)) {
        struct evt_waiter *w = evt_container_of(loop->selector.dispatched.next, struct evt_waiter, ready_link);
        evt_list_remove(&w->ready_link);
        loop->ready_count--;
        w->state = EVT_IDLE;
        count++;
        if (w->fiber != rb_fiber_current()) switch_to(loop, w->fiber);
    }
    return count;
}

/* What a turn does besides collecting and firing the timers; each mode asks for its own. */
enum {
    TURN_RESUME = 1,     /* first serves the other threads' requests and resumes the ready fibers */
    TURN_ON_TIME = 2,    /* keeps timers on time: a timed kernel wait ends early and spins the rest
                            (wait_out_timer), a full array of events is looked past (collect_before_timers) */
    TURN_DISPATCHED = 4, /* resumes the waiters its events woke before it returns (a select's) */
};
/* A turn's timeout to be poll_timeout's, computed once the ready fibers have run. */
#define TURN_POLL INT64_MIN

/* One turn of the loop, each phase one call, in the order the top of this file gives. Returns 1
 * when the run is over before the kernel is asked: `until` came up, or (EVT_RUN_DEFAULT) no fiber
 * waits. */
static int
turn(struct evt_loop *loop, struct evt_run *run, int64_t timeout, int phases)
{
    if (phases & TURN_RESUME) {
        serve_requests(loop, 1);
        run->queued = loop->ready_count;
        if (loop->ready_count > loop->stats.ready_max) loop->stats.ready_max = loop->ready_count;
        if (resume_ready(loop, run->until)) return 1;
        if (run->mode == EVT_RUN_DEFAULT && loop->waiting == 0) return 1;
    }
    if (!loop->kernel.data) evt_object_open(loop);
    int64_t now = evt_timers_now(), early = 0;
    loop->stats.turns++;
    loop->stats.clock_ns = now;
    if (timeout == TURN_POLL) timeout = poll_timeout(loop, now);
    if ((phases & TURN_ON_TIME) && timeout > 0) {
        evt_timers_tighten_slack(&loop->timers, EVT_TIMER_SLACK_NS);
        early = timeout < loop->kernel.wake_late_ns ? timeout : loop->kernel.wake_late_ns;
    }
    int capacity = loop->kernel.fired_capacity;
    int fired = collect(loop, timeout - early, run);
    if (phases & TURN_ON_TIME) {
        if (timeout > 0 && !loop->ready_count) wait_out_timer(loop, now, timeout, early);
        if (fired == capacity) collect_before_timers(loop, run);
    }
    if (phases & TURN_DISPATCHED) run->woke = resume_dispatched(loop);
    fire_timers(loop, evt_timers_now());
    return 0;
}

struct run {
    struct evt_loop *loop;
    struct evt_run *run;
};

static VALUE
run_turns(VALUE ptr)
{
    struct run *turns = (struct run *)ptr;
    while (!turn(turns->loop, turns->run, TURN_POLL, TURN_RESUME | TURN_ON_TIME)) continue;
    return Qnil;
}

static VALUE
run_done(VALUE ptr)
{
    struct evt_loop *loop = ((struct run *)ptr)->loop;
    loop->running--;
    loop->current = loop->loop_fiber;
    return Qnil;
}

void
evt_loop_run(struct evt_loop *loop, struct evt_run *run)
{
    switch (run->mode) {
    case EVT_RUN_DEFAULT:
    case EVT_RUN_UNTIL: {
        /* Whole turns, until no fiber waits or `until` comes up. */
        struct run turns = {loop, run};
        loop->running++;
        rb_ensure(run_turns, (VALUE)&turns, run_done, (VALUE)&turns);
        return;
    }
    case EVT_RUN_ONCE: {
        /* A selector's select(timeout): the fibers ready when it starts (what they push waits for the
         * next select), a look at the kernel, and the waiters it woke; only when none of that did
         * anything, a wait up to `timeout` (or the first timer) and the waiters it woke, as io-event's
         * selectors have it. evt's own timers fire after each (IO#timeout on the ring's transfers). */
        run->idle_ns = 0;
        turn(loop, run, 0, TURN_RESUME | TURN_DISPATCHED);
        if (run->queued || run->woke || loop->ready_count || loop->requests.pending || run->timeout == 0) return;
        int64_t timeout = run->timeout, until_timer = until_first_timer(loop, evt_timers_now());
        if (until_timer >= 0 && (timeout < 0 || until_timer < timeout)) timeout = until_timer;
        turn(loop, run, timeout, TURN_DISPATCHED);
        return;
    }
    case EVT_RUN_ALONE:
        /* A selector's loop fiber waiting itself (a read on the loop fiber, outside select): nothing
         * else may run meanwhile, as without a scheduler, so it blocks in the kernel until its own
         * waiter is woken; the events for other fibers wake them for the next select. */
        while (run->until->state == EVT_WAITING) turn(loop, run, until_first_timer(loop, evt_timers_now()), 0);
        return;
    }
}

void
evt_loop_push(struct evt_loop *loop, VALUE object)
{
    struct evt_waiter *w;
    if (loop->selector.spare_count) {
        w = evt_container_of(loop->selector.spare.next, struct evt_waiter, io_link);
        evt_list_remove(&w->io_link);
        loop->selector.spare_count--;
    }
    else {
        w = ALLOC(struct evt_waiter);
    }
    evt_waiter_init(w, object);
    w->allocated = EVT_HEAP_PUSHED;
    evt_list_append(&loop->allocated, &w->io_link);
    evt_waiter_ready(loop, w);
}

void
evt_loop_init(void)
{
    eFiberError = rb_const_get(rb_cObject, rb_intern("FiberError"));
    id_alive_p = rb_intern("alive?");
    id_transfer = rb_intern("transfer");
    id_raise = rb_intern("raise");
    id_handle_interrupt = rb_intern("handle_interrupt");
    signal_exception_never = rb_hash_new();
    rb_hash_aset(signal_exception_never, rb_eSignal, ID2SYM(rb_intern("never")));
    rb_obj_freeze(signal_exception_never);
    rb_gc_register_mark_object(signal_exception_never);
}
