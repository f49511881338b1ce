/* Waits: one suspension of a fiber, made by a constructor (one per kind), run by evt_wait_suspend
 * and undone by its ensure, whatever ends it. A waiting fiber's waiter (waiter.c) is in the ready
 * queue, or on a descriptor's registration, a timer, the unblockable table, or several of these at
 * once; the loop fiber waits by running the loop (loop.c) until its own waiter comes up. */
#include "core.h"
#include "registration.h"
#include "waiter.h"
#include "close.h"
#include "loop.h"
#include "wait.h"

#include <string.h>

#include <ruby/io/buffer.h>

static ID id_raise;

/* ---- making a wait: one constructor per kind ------------------------------------------------------ */

static void
wait_init(struct evt_wait *wait, struct evt_loop *loop, enum evt_wait_kind kind, int64_t timeout)
{
    evt_waiter_init(&wait->waiter, rb_fiber_current());
    wait->loop = loop;
    wait->kind = kind;
    wait->timeout = timeout;
    wait->forks = loop->forks;
    wait->epoch = loop->epoch;
    wait->since = loop->stats.clock_ns;
    wait->subject = Qnil;
    memset(&wait->as, 0, sizeof(wait->as));
}

void
evt_wait_io(struct evt_wait *wait, struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_IO, timeout);
    wait->waiter.io = io;
    wait->waiter.fd = fd;
    wait->waiter.events = events;
}

void
evt_wait_block(struct evt_wait *wait, struct evt_loop *loop, VALUE blocker, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_BLOCK, timeout);
    wait->subject = blocker;
}

void
evt_wait_yield(struct evt_wait *wait, struct evt_loop *loop)
{
    wait_init(wait, loop, EVT_WAIT_YIELD, -1);
}

void
evt_wait_start(struct evt_wait *wait, struct evt_loop *loop, VALUE fiber)
{
    wait_init(wait, loop, EVT_WAIT_START, -1);
    wait->as.start.target = fiber;
    wait->as.start.value = Qnil;
}

void
evt_wait_select(struct evt_wait *wait, struct evt_loop *loop, struct evt_selection *selection, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_SELECT, timeout);
    wait->as.selection = selection;
}

void
evt_wait_op(struct evt_wait *wait, struct evt_loop *loop, VALUE io, struct evt_op *op, VALUE buffer, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_OP, timeout);
    wait->waiter.io = io;
    wait->as.op.op = op;
    wait->as.op.buffer = buffer;
}

/* ---- running a wait: the one way into the loop from a hook ------------------------------------- */

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
    int err = op->kind == EVT_OP_WAITID ? backend->wait_exit(&loop->kernel, op) : backend->transfer(&loop->kernel, op);
    if (err < 0) evt_waiter_done(&loop->kernel, op, err);
    else if (op->pending) loop->kernel.ops++;
}

/* wait_body's two other ways on, out of its frame: wait_body stays on a waiting fiber's stack for as
 * long as it waits, and every waiting fiber holds as many pages of stack as its deepest frame reaches
 * (32 bytes fewer; bench/tools/wait_stack_depth.rb). */
static NOINLINE(void switch_to_started(struct evt_loop *loop, struct evt_wait *wait));
static NOINLINE(void run_until(struct evt_loop *loop, struct evt_waiter *w));

/* A starter's wait: the new fiber runs now (or is raised in, for a selector). */
static void
switch_to_started(struct evt_loop *loop, struct evt_wait *wait)
{
    if (!loop->selector.driven) loop->current = Qnil; /* until the new fiber says it runs */
    if (wait->as.start.raise) wait->as.start.value = rb_funcallv_kw(wait->as.start.target, id_raise, wait->as.start.argc, wait->as.start.argv, wait->as.start.kw_splat);
    else wait->as.start.value = rb_fiber_transfer(wait->as.start.target, wait->as.start.argc, wait->as.start.argv);
}

/* The loop fiber waits by running the loop, or (a selector's) alone: a yield is ready at once. */
static void
run_until(struct evt_loop *loop, struct evt_waiter *w)
{
    struct evt_run run = {.mode = loop->selector.driven ? EVT_RUN_ALONE : EVT_RUN_UNTIL, .until = w, .timeout = -1};
    evt_loop_run(loop, &run);
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
    if (wait->timeout >= 0) evt_timers_add(&loop->timers, &w->timer, evt_timers_now() + wait->timeout);

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

    if (wait->kind == EVT_WAIT_START) switch_to_started(loop, wait);
    else if (w->fiber == loop->loop_fiber) run_until(loop, w);
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
        if (wait->as.op.op->pending) loop->kernel.backend->cancel(&loop->kernel, wait->as.op.op);
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
        if (w->fiber != loop->loop_fiber && !loop->selector.driven) ready_the_switcher(loop, w->fiber);
    }
    evt_waiter_detach(loop, w);
    w->state = EVT_IDLE;
    loop->waiting--;
    return Qnil;
}

enum evt_outcome
evt_wait_suspend(struct evt_wait *wait)
{
    rb_ensure(wait_body, (VALUE)wait, wait_ensure, (VALUE)wait);
    return (enum evt_outcome)wait->waiter.outcome;
}

void
evt_wait_init(void)
{
    id_raise = rb_intern("raise");
}
