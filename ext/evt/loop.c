/* The loop: suspending a fiber, and the run loop that resumes it.
 *
 * A fiber suspended in evt is described by one evt_wait on its own stack (nothing is allocated per
 * operation), made by a constructor (evt_wait_io, evt_wait_block...) and run by evt_loop_suspend. Its
 * waiter is in the ready queue, or waits on a descriptor's registration, a timer, an unblock, or
 * several of these at once; waking it takes it out of all of them (waiter.c). The loop runs on the
 * loop fiber (the blocking fiber that drives the scheduler) and switches with rb_fiber_transfer only.
 *
 * One turn of the run loop, each phase one call, in this order (libuv's, for the parts it shares):
 *
 *   serve_requests   what other threads asked: IOs they closed, fibers to interrupt
 *   resume_ready     the fibers that were ready when the turn began
 *   poll_timeout     how long the kernel may block: 0 with fibers ready or a timer due, else until
 *                    the next timer
 *   wait_in_kernel   the backend's wait, without the GVL
 *   serve_closes     IOs other threads closed meanwhile: their waiters learn it before any event
 *   dispatch         fired events and completions wake their waiters
 *   check_interrupts signals, Thread#raise and Thread#kill, once the events are safely dispatched
 *   fire_timers      due timers: their waiters time out, a timeout_after raises
 *
 * The four from wait_in_kernel to check_interrupts are collect(), the one step every mode of
 * evt_loop_run shares (a selector's select leaves the interrupts to async). That is a turn of
 * EVT_RUN_DEFAULT and EVT_RUN_UNTIL; EVT_RUN_ONCE and EVT_RUN_ALONE are shorter (see each).
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
#include "registration.h"
#include "waiter.h"
#include "object.h"
#include "close.h"
#include "loop.h"

#include <ruby/io/buffer.h>
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
    loop->current = fiber;
    rb_fiber_transfer(fiber, 0, NULL);
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
    loop->current = fiber;
    rb_fiber_raise(fiber, 1, &exception);
    loop->current = loop->loop_fiber;
}

/* A fiber left evt without the loop resuming it: some other fiber switched to it (Fiber#raise,
 * Fiber#kill), and that fiber is itself suspended in no queue. When the unwound fiber waits again or
 * ends, control goes to the loop fiber, so the one that switched must wait in the ready queue or it
 * would never run again. Rare: the waiter for it is allocated. */
static void
ready_the_switcher(struct evt_loop *loop, VALUE unwound)
{
    VALUE switcher = loop->current;
    loop->current = unwound;
    if (switcher == unwound || switcher == loop->loop_fiber || NIL_P(switcher)) return;
    if (st_lookup(loop->unblockable, (st_data_t)switcher, NULL)) return;
    if (!RTEST(rb_fiber_alive_p(switcher))) return;
    struct evt_waiter *w = ALLOC(struct evt_waiter);
    evt_waiter_init(w, switcher);
    w->allocated = 1;
    evt_list_append(&loop->allocated, &w->io_link);
    loop->waiting++;
    evt_waiter_ready(loop, w);
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
        rb_funcall(interrupt->fiber, rb_intern("raise"), 1, interrupt->exception);
        interrupt->loop->current = interrupt->loop->loop_fiber;
    }
    return Qnil;
}

/* Whether the target of an interrupt (a Fiber, or a stand-in for one) still runs. */
static int
interruptible(VALUE fiber)
{
    return RTEST(rb_obj_is_fiber(fiber) ? rb_fiber_alive_p(fiber) : rb_funcall(fiber, rb_intern("alive?"), 0));
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

/* The other threads' requests: the closes (close.c), then, when `interrupts` is set, the fiber
 * interrupts, which switch fibers (not while the backend holds undispatched events: then they are
 * kept for the next turn). */
static void
serve_requests(struct evt_loop *loop, int interrupts)
{
    if (!loop->requests.pending) return;
    VALUE rest = evt_close_serve(loop);
    if (NIL_P(rest)) return;
    if (!interrupts) {
        if (!NIL_P(loop->requests.list)) rb_ary_concat(rest, loop->requests.list);
        loop->requests.list = rest;
        loop->requests.pending = 1;
        return;
    }
    VALUE own = Qnil; /* an exception for the loop fiber itself, raised once the rest is done */
    for (long i = 0; i < RARRAY_LEN(rest); i++) {
        VALUE request = RARRAY_AREF(rest, i);
        struct interrupt interrupt = {loop, RARRAY_AREF(request, 0), RARRAY_AREF(request, 1)};
        if (interrupt.fiber == rb_fiber_current()) {
            own = interrupt.exception;
            continue;
        }
        /* As timeout_after does: control comes back when that fiber waits again or ends. A stand-in
         * runs code of its own (alive?, raise): if that raises, the interrupts after it wait for the
         * next turn rather than being lost. */
        int state = 0;
        rb_protect(interrupt_one, (VALUE)&interrupt, &state);
        if (state) {
            for (long j = i + 1; j < RARRAY_LEN(rest); j++) {
                VALUE later = RARRAY_AREF(rest, j);
                evt_close_request(loop, RARRAY_AREF(later, 0), RARRAY_AREF(later, 1));
            }
            rb_jump_tag(state);
        }
    }
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
    if (loop->spare_count < 64) {
        evt_list_append(&loop->spare, &w->io_link);
        loop->spare_count++;
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
        if (RB_UNLIKELY(loop->driven && fiber == rb_fiber_current())) continue; /* its own resume's entry */
        switch_to(loop, fiber);
    }
    return 0;
}

static void
fire_timers(struct evt_loop *loop, int64_t now)
{
    struct evt_timer *timer;
    while ((timer = evt_timers_first(&loop->timers)) && timer->deadline <= now) {
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
    int64_t woke = evt_now_ns();
    if (early < timeout && woke >= asked_end) {
        int64_t late = woke - asked_end;
        if (late > EVT_SPIN_MAX_NS) late = EVT_SPIN_MAX_NS;
        loop->kernel.wake_late_ns += (late - loop->kernel.wake_late_ns) / 8;
    }
    if (deadline - woke > EVT_SPIN_MAX_NS) return;
    while (woke < deadline) woke = evt_now_ns();
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
    wait->result = wait->loop->kernel.backend->wait(wait->loop, wait->timeout);
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
    if (timeout == 0) {
        wait.result = loop->kernel.backend->wait(loop, 0);
    }
    else {
        loop->kernel.woken = 0; /* under the GVL, as every evt_loop_wake */
        __atomic_store_n(&loop->kernel.blocked, 1, __ATOMIC_SEQ_CST);
        /* RB_NOGVL_INTR_FAIL: no interrupt check on the way out, where an exception would lose the
         * events just taken from the kernel; check_interrupts comes after dispatch. */
        int state = 0;
        if (loop->driven) rb_protect((VALUE(*)(VALUE))wait_for_selector_protected, (VALUE)&wait, &state);
        else rb_nogvl(wait_without_gvl, &wait, end_kernel_wait, loop, RB_NOGVL_INTR_FAIL);
        __atomic_store_n(&loop->kernel.blocked, 0, __ATOMIC_SEQ_CST);
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
    while (!evt_list_empty(&loop->dispatched)) {
        struct evt_list *node = loop->dispatched.next;
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
        evt_waiter_fired(loop, event.fd, event.generation, event.events);
    }
    if (loop->kernel.backend->complete) loop->kernel.backend->complete(loop);
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
 * EVT_RUN_ONCE (a selector's select) the woken waiters go to loop->dispatched, for the select to
 * resume before it returns, and the thread's interrupts stay pending for async, which masks them;
 * every other mode checks them here. Returns what the backend's wait returned. */
static int
collect(struct evt_loop *loop, int64_t timeout, struct evt_run *run)
{
    enum evt_run_mode mode = run->mode;
    int64_t start = mode == EVT_RUN_ONCE && timeout != 0 ? evt_now_ns() : 0;
    int fired = wait_in_kernel(loop, timeout);
    if (start) run->idle_ns = evt_now_ns() - start;
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
    loop->dispatching = 1;
    dispatch(loop, fired);
    loop->dispatching = 0;
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
        if (!evt_loop_timer_due(loop)) return;
        int capacity = loop->kernel.fired_capacity;
        if (collect(loop, 0, run) < capacity) return;
    }
}

/* ---- the modes ----------------------------------------------------------------------------------- */

struct run {
    struct evt_loop *loop;
    struct evt_run *run;
};

/* EVT_RUN_DEFAULT and EVT_RUN_UNTIL: whole turns, each phase one call, in this order. */
static VALUE
run_turns(VALUE ptr)
{
    struct evt_loop *loop = ((struct run *)ptr)->loop;
    struct evt_run *run = ((struct run *)ptr)->run;
    for (;;) {
        serve_requests(loop, 1);
        if (resume_ready(loop, run->until)) return Qnil;
        if (run->mode == EVT_RUN_DEFAULT && loop->waiting == 0) return Qnil;
        if (!loop->kernel.data) evt_object_open(loop);

        int64_t now = evt_now_ns();
        int64_t timeout = poll_timeout(loop, now), early = 0;
        if (timeout > 0) {
            evt_timers_tighten_slack(&loop->timers, EVT_TIMER_SLACK_NS);
            early = timeout < loop->kernel.wake_late_ns ? timeout : loop->kernel.wake_late_ns;
        }
        int capacity = loop->kernel.fired_capacity;
        int fired = collect(loop, timeout - early, run);
        if (timeout > 0 && !loop->ready_count) wait_out_timer(loop, now, timeout, early);
        if (fired == capacity) collect_before_timers(loop, run);
        fire_timers(loop, evt_now_ns());
    }
}

static VALUE
run_done(VALUE ptr)
{
    struct evt_loop *loop = ((struct run *)ptr)->loop;
    loop->running--;
    loop->current = loop->loop_fiber;
    return Qnil;
}

/* Resumes the waiters this select's events woke (loop->dispatched), in order: the number resumed. */
static int
resume_dispatched(struct evt_loop *loop)
{
    int count = 0;
    while (!evt_list_empty(&loop->dispatched)) {
        struct evt_waiter *w = evt_container_of(loop->dispatched.next, struct evt_waiter, ready_link);
        evt_list_remove(&w->ready_link);
        loop->ready_count--;
        w->state = EVT_IDLE;
        count++;
        if (w->fiber != rb_fiber_current()) switch_to(loop, w->fiber);
    }
    return count;
}

/* EVT_RUN_ONCE, a selector's select(timeout): the fibers ready when it starts (what they push waits
 * for the next select), a look at the kernel, and the waiters it woke; only when none of that did
 * anything, one wait up to `timeout` (or the first timer) and the waiters it woke, as io-event's
 * selectors have it. evt's own timers fire after each (IO#timeout on transfers the ring waits for). */
static int
run_once(struct evt_loop *loop, struct evt_run *run)
{
    int64_t timeout = run->timeout;
    run->idle_ns = 0;
    serve_requests(loop, 1);
    size_t queued = loop->ready_count;
    resume_ready(loop, NULL);
    if (!loop->kernel.data) evt_object_open(loop);
    collect(loop, 0, run);
    int woke = resume_dispatched(loop);
    fire_timers(loop, evt_now_ns());
    if (queued || woke || loop->ready_count || loop->requests.pending || timeout == 0) return woke;

    int64_t until_timer = until_first_timer(loop, evt_now_ns());
    if (until_timer >= 0 && (timeout < 0 || until_timer < timeout)) timeout = until_timer;
    collect(loop, timeout, run);
    woke = resume_dispatched(loop);
    fire_timers(loop, evt_now_ns());
    return woke;
}

/* EVT_RUN_ALONE: a selector's loop fiber waiting itself (a read on the loop fiber, outside select):
 * nothing else may run meanwhile, as without a scheduler, so it blocks in the kernel until its own
 * waiter is woken; the events for other fibers wake them for the next select. */
static void
run_alone(struct evt_loop *loop, struct evt_run *run)
{
    while (run->until->state == EVT_WAITING) {
        if (!loop->kernel.data) evt_object_open(loop);
        collect(loop, until_first_timer(loop, evt_now_ns()), run);
        fire_timers(loop, evt_now_ns());
    }
}

void
evt_loop_run(struct evt_loop *loop, struct evt_run *run)
{
    switch (run->mode) {
    case EVT_RUN_ONCE:
        run->woke = run_once(loop, run);
        return;
    case EVT_RUN_ALONE:
        run_alone(loop, run);
        return;
    case EVT_RUN_DEFAULT:
    case EVT_RUN_UNTIL: {
        struct run turns = {loop, run};
        loop->running++;
        rb_ensure(run_turns, (VALUE)&turns, run_done, (VALUE)&turns);
        return;
    }
    }
}

void
evt_loop_push(struct evt_loop *loop, VALUE object)
{
    struct evt_waiter *w;
    if (loop->spare_count) {
        w = evt_container_of(loop->spare.next, struct evt_waiter, io_link);
        evt_list_remove(&w->io_link);
        loop->spare_count--;
    }
    else {
        w = ALLOC(struct evt_waiter);
    }
    evt_waiter_init(w, object);
    w->allocated = EVT_HEAP_PUSHED;
    evt_list_append(&loop->allocated, &w->io_link);
    evt_waiter_ready(loop, w);
}

/* ---- suspending: one way in (the waits are made by the constructors in wait.c) ---------------- */

/* Nothing to watch and no time limit: IO.select sleeps until interrupted; a block until unblock. */
static void
make_unblockable(struct evt_loop *loop, struct evt_waiter *w)
{
    st_insert(loop->unblockable, (st_data_t)w->fiber, (st_data_t)w);
    w->unblockable = 1;
}

static void
start_select(struct evt_loop *loop, struct evt_wait *wait)
{
    struct evt_waiter *w = &wait->waiter;
    struct evt_selection *selection = wait->as.selection;
    for (long i = 0; i < selection->count && w->state == EVT_WAITING; i++) {
        struct evt_waiter *secondary = &selection->waiters[i];
        evt_waiter_init(secondary, w->fiber);
        secondary->owner = w;
        secondary->fd = selection->fds[i];
        secondary->events = selection->events[i];
        evt_waiter_attach(loop, secondary, selection->ios[i]);
    }
    if (selection->count == 0 && wait->timeout < 0) make_unblockable(loop, w);
}

static void
start_op(struct evt_loop *loop, struct evt_wait *wait)
{
    struct evt_waiter *w = &wait->waiter;
    struct evt_op *op = wait->as.op.op;
    void *base;
    size_t size;
    if (!NIL_P(wait->as.op.buffer) && !(rb_io_buffer_get_bytes(wait->as.op.buffer, &base, &size) & RB_IO_BUFFER_LOCKED)) {
        rb_io_buffer_lock(wait->as.op.buffer); /* no resize or free while the kernel holds it */
        wait->as.op.locked = 1;
    }
    op->waiter = w;
    w->op = op;
    /* In no other structure: the list keeps the fiber (and its stack, which the kernel may be
     * writing to) alive for the GC. A transfer hangs on its descriptor's registration, wanting no
     * event, where closing the IO finds it; a waitid or close on the loop's list. */
    if (op->kind == EVT_OP_TRANSFER && !NIL_P(w->io)) {
        w->fd = op->fd;
        struct evt_registration *reg = evt_registration_get(loop, w->fd, w->io);
        if (RB_UNLIKELY(reg->closing == w->io)) {
            evt_waiter_wake(loop, w, EVT_CLOSED, 0); /* never submitted */
            return;
        }
        evt_list_append(&reg->waiters, &w->io_link);
    }
    else {
        evt_list_append(&loop->operations, &w->io_link);
    }
    const struct evt_backend *backend = loop->kernel.backend;
    int err = op->kind == EVT_OP_WAITID ? backend->wait_exit(loop, op) : backend->transfer(loop, op);
    if (err < 0) evt_waiter_done(loop, op, err);
    else if (op->pending) loop->kernel.ops++;
}

static VALUE
wait_body(VALUE ptr)
{
    struct evt_wait *wait = (struct evt_wait *)ptr;
    struct evt_loop *loop = wait->loop;
    struct evt_waiter *w = &wait->waiter;

    w->state = EVT_WAITING;
    loop->waiting++;
    int unblocked = RB_UNLIKELY(loop->early_unblock == w->fiber);
    if (unblocked) loop->early_unblock = Qnil; /* for this wait if it is a block, else for none */
    if (wait->timeout >= 0) evt_timers_add(&loop->timers, &w->timer, evt_now_ns() + wait->timeout);

    switch (wait->kind) {
    case EVT_WAIT_IO:
        if (wait->as.io.ready_now) evt_waiter_wake(loop, w, EVT_IO_READY, wait->as.io.ready_now);
        else evt_waiter_attach(loop, w, w->io);
        break;
    case EVT_WAIT_SELECT:
        start_select(loop, wait);
        break;
    case EVT_WAIT_BLOCK:
        make_unblockable(loop, w);
        if (unblocked) evt_waiter_wake(loop, w, EVT_UNBLOCKED, 0);
        break;
    case EVT_WAIT_OP:
        start_op(loop, wait);
        break;
    case EVT_WAIT_YIELD:
        evt_waiter_wake(loop, w, EVT_INTERRUPTED, 0); /* straight to the ready queue */
        break;
    case EVT_WAIT_START:
        w->outcome = EVT_INTERRUPTED;
        evt_waiter_ready_first(loop, w); /* resumed as soon as the new fiber waits */
        break;
    }

    if (wait->kind == EVT_WAIT_START) {
        if (!loop->driven) loop->current = Qnil; /* until the new fiber says it runs */
        if (wait->as.start.raise) wait->as.start.value = rb_funcallv_kw(wait->as.start.target, id_raise, wait->as.start.argc, wait->as.start.argv, wait->as.start.kw_splat);
        else wait->as.start.value = rb_fiber_transfer(wait->as.start.target, wait->as.start.argc, wait->as.start.argv);
    }
    else if (w->fiber == loop->loop_fiber) {
        /* The loop fiber waits by running the loop, or (a selector's) alone: a yield is ready at once. */
        struct evt_run run = {.mode = loop->driven ? EVT_RUN_ALONE : EVT_RUN_UNTIL, .until = w, .timeout = -1};
        evt_loop_run(loop, &run);
    }
    else rb_fiber_transfer(loop->loop_fiber, 0, NULL);
    return Qnil;
}

static VALUE
wait_ensure(VALUE ptr)
{
    struct evt_wait *wait = (struct evt_wait *)ptr;
    struct evt_loop *loop = wait->loop;
    struct evt_waiter *w = &wait->waiter;
    if (wait->forks != loop->forks) return Qnil; /* resumed in a child: the loop no longer knows it */
    if (wait->kind == EVT_WAIT_OP) {
        /* Left early (a timeout, Fiber#raise, kill): the kernel must be done with the buffer before
         * this frame and the buffer go. */
        if (wait->as.op.op->pending) loop->kernel.backend->cancel(loop, wait->as.op.op);
        if (wait->as.op.locked) rb_io_buffer_unlock(wait->as.op.buffer);
        if (wait->as.op.op->orphan) evt_close_orphan_release(wait->as.op.op->orphan);
    }
    if (RB_UNLIKELY(wait->epoch != loop->epoch)) return Qnil; /* forgotten: a selector closed under it */
    if (wait->kind == EVT_WAIT_SELECT) {
        for (long i = 0; i < wait->as.selection->count; i++) {
            struct evt_waiter *secondary = &wait->as.selection->waiters[i];
            if (secondary->owner && evt_list_linked(&secondary->io_link)) {
                evt_list_remove(&secondary->io_link);
                evt_registration_leave(loop, secondary);
            }
        }
    }
    if (w->state != EVT_IDLE) {
        /* Resumed by something other than the loop: Fiber#raise or Fiber#kill from another fiber. */
        if (w->state == EVT_READY) {
            evt_list_remove(&w->ready_link);
            loop->ready_count--;
        }
        if (w->fiber != loop->loop_fiber && !loop->driven) ready_the_switcher(loop, w->fiber);
    }
    evt_waiter_detach(loop, w);
    w->state = EVT_IDLE;
    loop->waiting--;
    return Qnil;
}

enum evt_outcome
evt_loop_suspend(struct evt_wait *wait)
{
    rb_ensure(wait_body, (VALUE)wait, wait_ensure, (VALUE)wait);
    return (enum evt_outcome)wait->waiter.outcome;
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
