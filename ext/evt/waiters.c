/* Registrations and waiters: what the loop knows about each descriptor, the fibers waiting on it,
 * and waking them, which is what the backends' reports (fired events, completions) come down to; and
 * the constructors of the waits that loop.c's evt_suspend runs. */
#include "loop.h"

/* Never 0, which a backend slot takes for none. */
static uint32_t
next_generation(struct evt_loop *loop)
{
    if (RB_UNLIKELY(++loop->generation == 0)) loop->generation = 1;
    return loop->generation;
}

struct evt_registration *
evt_registration_get(struct evt_loop *loop, int fd, VALUE io)
{
    if (fd >= loop->registrations_size) {
        int size = loop->registrations_size ? loop->registrations_size : 64;
        while (size <= fd) size *= 2;
        REALLOC_N(loop->registrations, struct evt_registration *, size);
        for (int i = loop->registrations_size; i < size; i++) loop->registrations[i] = NULL;
        loop->registrations_size = size;
    }
    struct evt_registration *reg = loop->registrations[fd];
    if (!reg) {
        reg = ALLOC(struct evt_registration);
        reg->io = Qnil;
        reg->closing = Qnil;
        evt_list_init(&reg->waiters);
        reg->generation = next_generation(loop);
        reg->events = reg->armed = reg->flags = reg->exhausted = 0;
        reg->read_score = 1;
        reg->read_skips = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
        evt_backend_slot_clear(&reg->slot);
        reg->slot.serial = 0;
        loop->registrations[fd] = reg;
    }
    if (reg->io != io) {
        /* Another IO on this number (or one forgotten at GC): what the kernel and we knew was for
         * the old one. Waiters of another IO sharing the descriptor stay. */
        reg->io = io;
        reg->generation = next_generation(loop);
        reg->armed = 0;
        reg->flags = 0;
        reg->exhausted = 0;
        reg->read_score = 1; /* a new connection's first request is usually there already */
        reg->read_skips = 0;
    }
    return reg;
}

/* Counts a waiter's events in or out (delta 1 or -1); returns the union of what the waiters want. */
static int
registration_count(struct evt_registration *reg, int events, int delta)
{
    static const int bits[3] = {EVT_READABLE, EVT_PRIORITY, EVT_WRITABLE};
    int wanted = 0;
    for (int i = 0; i < 3; i++) {
        if (events & bits[i]) reg->counts[i] += delta;
        if (reg->counts[i]) wanted |= bits[i];
    }
    return wanted;
}

/* Has the backend watch what reg's waiters want. 0, or -errno. */
int
evt_registration_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    int err = loop->backend->arm(loop, fd, reg);
    reg->armed = err == 0;
    return err;
}

/* A waiter left: keeps the kernel's interest equal to what the remaining waiters want. */
void
evt_registration_leave(struct evt_loop *loop, struct evt_waiter *w)
{
    struct evt_registration *reg = loop->registrations[w->fd];
    int events = registration_count(reg, w->events, -1);
    if (events == reg->events) return;
    reg->events = events;
    if (events) evt_registration_arm(loop, w->fd, reg); /* fewer events than before: cannot fail usefully */
    else loop->backend->disarm(loop, w->fd, reg);
}

/* Hangs a waiter on its descriptor's registration, arming the backend when the interest grows.
 * A descriptor the kernel cannot poll (a regular file) is always ready: the waiter wakes at once. */
void
evt_waiter_attach(struct evt_loop *loop, struct evt_waiter *w, VALUE io)
{
    struct evt_registration *reg = evt_registration_get(loop, w->fd, io);
    w->io = io;
    if (RB_UNLIKELY(reg->closing == io)) {
        evt_waiter_wake(loop, w->owner ? w->owner : w, EVT_CLOSED, 0);
        return;
    }
    int previous = reg->events;
    reg->events = registration_count(reg, w->events, 1);
    if (reg->events != previous || !reg->armed) {
        int err = evt_registration_arm(loop, w->fd, reg);
        if (err < 0) {
            reg->events = registration_count(reg, w->events, -1);
            if (err != -EPERM) rb_syserr_fail_str(-err, rb_sprintf("evt: watching descriptor %d", w->fd));
            evt_waiter_wake(loop, w->owner ? w->owner : w, EVT_IO_READY, w->events);
            return;
        }
    }
    evt_list_append(&reg->waiters, &w->io_link);
}

/* Takes the waiter out of everything it waits on (not out of the ready queue). */
void
evt_waiter_detach(struct evt_loop *loop, struct evt_waiter *w)
{
    if (evt_list_linked(&w->io_link)) {
        evt_list_remove(&w->io_link);
        if (w->fd >= 0) evt_registration_leave(loop, w); /* else it was in loop->operations */
    }
    if (evt_timer_active(&w->timer)) evt_timers_remove(&loop->timers, &w->timer);
    if (w->unblockable) {
        st_data_t key = (st_data_t)w->fiber;
        st_delete(loop->unblockable, &key, NULL);
        w->unblockable = 0;
    }
}

void
evt_waiter_ready(struct evt_loop *loop, struct evt_waiter *w)
{
    w->state = EVT_READY;
    evt_list_append(RB_UNLIKELY(loop->dispatching) ? &loop->dispatched : &loop->ready, &w->ready_link);
    loop->ready_count++;
}

void
evt_waiter_wake(struct evt_loop *loop, struct evt_waiter *w, enum evt_outcome outcome, int ready)
{
    if (w->state != EVT_WAITING) return;
    evt_waiter_detach(loop, w);
    w->outcome = (unsigned char)outcome;
    w->ready = ready;
    evt_waiter_ready(loop, w);
}

void
evt_loop_io_ready(struct evt_loop *loop, int fd, uint32_t generation, int events)
{
    if (fd < 0 || fd >= loop->registrations_size) return;
    struct evt_registration *reg = loop->registrations[fd];
    if (!reg || reg->generation != generation) return; /* an older file that had this number */
    reg->exhausted &= ~events;
    EACH_WAITER(&reg->waiters, io_link, w) {
        int ready = w->events & events;
        if (!ready) continue;
        if (w->owner) {
            /* One of an io_select's IOs: wake the select, which looks at all of them again. */
            evt_list_remove(&w->io_link);
            evt_registration_leave(loop, w);
            evt_waiter_wake(loop, w->owner, EVT_IO_READY, ready);
        }
        else {
            evt_waiter_wake(loop, w, EVT_IO_READY, ready);
        }
    }
}

void
evt_loop_op_done(struct evt_loop *loop, struct evt_op *op, long result)
{
    op->result = result;
    if (op->pending) loop->kernel_ops--;
    op->pending = 0;
    evt_waiter_wake(loop, op->waiter, EVT_DONE, 0); /* nothing when its fiber is already on its way out */
}

/* ---- waits: one constructor per kind, run by evt_suspend (loop.c) ---------------------------------- */

static void
wait_init(struct evt_wait *wait, struct evt_loop *loop, enum evt_wait_kind kind, int64_t timeout)
{
    evt_waiter_init(&wait->waiter, rb_fiber_current());
    wait->loop = loop;
    wait->kind = kind;
    wait->timeout = timeout;
    wait->forks = loop->forks;
    wait->epoch = loop->epoch;
    wait->target = Qnil;
    wait->argc = 0;
    wait->argv = NULL;
    wait->raise = 0;
    wait->kw_splat = 0;
    wait->value = Qnil;
    wait->ready_now = 0;
    wait->selection = NULL;
    wait->op = NULL;
    wait->buffer = Qnil;
    wait->locked = 0;
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
evt_wait_block(struct evt_wait *wait, struct evt_loop *loop, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_BLOCK, timeout);
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
    wait->target = fiber;
}

void
evt_wait_select(struct evt_wait *wait, struct evt_loop *loop, struct evt_selection *selection, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_SELECT, timeout);
    wait->selection = selection;
}

void
evt_wait_op(struct evt_wait *wait, struct evt_loop *loop, VALUE io, struct evt_op *op, VALUE buffer, int64_t timeout)
{
    wait_init(wait, loop, EVT_WAIT_OP, timeout);
    wait->waiter.io = io;
    wait->op = op;
    wait->buffer = buffer;
}
