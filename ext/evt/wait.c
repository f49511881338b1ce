/* Waits: one constructor per kind of suspension, each filling a struct evt_wait that loop.c's
 * evt_loop_suspend runs. */
#include "core.h"
#include "wait.h"

#include <string.h>

static void
wait_init(struct evt_wait *wait, struct evt_loop *loop, enum evt_wait_kind kind, int64_t timeout)
{
    evt_waiter_init(&wait->waiter, rb_fiber_current());
    wait->loop = loop;
    wait->kind = kind;
    wait->timeout = timeout;
    wait->forks = loop->forks;
    wait->epoch = loop->epoch;
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
