/* Waiters: a suspended fiber's place in the loop's structures (a registration's list, the timers,
 * the unblockable table, the ready queue), and waking it, which is what the backends' reports
 * (events fired on a descriptor, a transfer done) come down to. */
#include "core.h"
#include "registration.h"
#include "waiter.h"

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
    int err = evt_registration_join(loop, w->fd, reg, w->events);
    if (err < 0) {
        if (err != -EPERM) rb_syserr_fail_str(-err, rb_sprintf("evt: watching descriptor %d", w->fd));
        evt_waiter_wake(loop, w->owner ? w->owner : w, EVT_IO_READY, w->events);
        return;
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
    evt_list_append(RB_UNLIKELY(loop->selector.dispatching) ? &loop->selector.dispatched : &loop->ready, &w->ready_link);
    loop->ready_count++;
}

/* Ahead of the others: the fiber that started a new one goes on as soon as that one waits, as
 * under Ruby's reference scheduler (where the new fiber's wait yields back to its starter), and
 * without taking the place of a fiber the turn was to resume. An accept loop so takes pending
 * connections as fast as the turn's fibers run, not one per turn behind them. A turn lets as many
 * starters go first as it had fibers ready (at least EVT_FIRST_MIN); past that they wait for the
 * next turn, so a fiber that starts fibers without end cannot keep timers and events from the
 * others. In a selector's select, in order as always. */
void
evt_waiter_ready_first(struct evt_loop *loop, struct evt_waiter *w)
{
    w->state = EVT_READY;
    if (RB_UNLIKELY(loop->selector.dispatching)) evt_list_append(&loop->selector.dispatched, &w->ready_link);
    else if (loop->first_budget) {
        loop->first_budget--;
        loop->first_pending++;
        evt_list_prepend(&loop->ready, &w->ready_link);
    }
    else evt_list_append(&loop->ready, &w->ready_link);
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

/* A backend's report: `events` fired on fd, registered as `generation`. A one-shot backend's watch
 * ended with it: armed again for the waiters that remain. */
void
evt_waiter_fired(struct evt_kernel *kernel, int fd, uint32_t generation, int events)
{
    struct evt_loop *loop = evt_container_of(kernel, struct evt_loop, kernel);
    loop->stats.events++;
    if (fd < 0 || fd >= loop->registrations_size) return;
    struct evt_registration *reg = loop->registrations[fd];
    if (!reg || reg->watch.generation != generation) return; /* an older file that had this number */
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
    if (loop->kernel.backend->oneshot && reg->watch.events) evt_registration_arm(loop, fd, reg);
}

/* A completion backend's report: `op` is done, with `result`. */
void
evt_waiter_done(struct evt_kernel *kernel, struct evt_op *op, long result)
{
    struct evt_loop *loop = evt_container_of(kernel, struct evt_loop, kernel);
    loop->stats.events++;
    op->result = result;
    if (op->pending) kernel->ops--;
    op->pending = 0;
    evt_waiter_wake(loop, op->waiter, EVT_DONE, 0); /* nothing when its fiber is already on its way out */
}

