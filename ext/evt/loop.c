/* The core of evt: the loop object, registrations, waiters, the ready queue, fiber switching, the
 * run loop and suspension. The hooks built on them are in hooks.c. See loop.h for the model;
 * backend.h for what a backend does. */
#include "loop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ruby/debug.h>
#include <ruby/fiber/scheduler.h>
#include <ruby/io.h>
#include <ruby/io/buffer.h>
#include <ruby/thread.h>
#include <ruby/version.h>

VALUE evt_cLoop;

/* Every loop of the process, for IO#close to look through (one per thread that has a scheduler).
 * Changed and read with the GVL held. */
static struct evt_list evt_loops = {&evt_loops, &evt_loops};

static ID id_blocking_p;
static VALUE eFiberError;

/* Counts forks: every child increments it at once, so a loop can tell it was inherited. */
static volatile unsigned evt_forks;

static void
evt_atfork_child(void)
{
    evt_forks++;
}

/* nil -> -1 (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives for bad values. */
int64_t
evt_timeout_ns(VALUE timeout)
{
    if (NIL_P(timeout)) return -1;
    struct timespec ts = rb_time_timespec_interval(timeout);
    if (ts.tv_sec >= INT64_MAX / 1000000000 / 4) return INT64_MAX / 4; /* practically forever */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the loop object ---------------------------------------------------------------------- */

#define EACH_WAITER(head, member, w)                                                           \
    for (struct evt_list *node_ = (head)->next, *next_ = node_->next; node_ != (head);          \
         node_ = next_, next_ = node_->next)                                                   \
        for (struct evt_waiter *w = evt_container_of(node_, struct evt_waiter, member); w; w = NULL)

/* The IO's own buffer that a transfer of another thread's loop is aimed into, once the IO, closed by
 * another thread, no longer owns it (see hand_over); freed when the last of those transfers is reaped. */
struct evt_orphan {
    void *memory;
    int transfers;
};

static void
orphan_release(struct evt_orphan *orphan)
{
    if (--orphan->transfers > 0) return;
    ruby_xfree(orphan->memory);
    ruby_xfree(orphan);
}

static int
mark_key(st_data_t key, st_data_t value, st_data_t arg)
{
    rb_gc_mark((VALUE)key);
    return ST_CONTINUE;
}

/* Whether Ruby has marked io closed. */
static int
io_closed(VALUE io)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fd, public in 3.3 and 3.4 */
    return !RB_TYPE_P(io, T_FILE) || !RFILE(io)->fptr || RFILE(io)->fptr->fd < 0;
#pragma GCC diagnostic pop
}

/* Suspended fibers are reachable only through the loop: their waiters live on their own stacks.
 * Fibers are pinned (their stacks hold their own VALUE anyway); registrations' IOs may move.
 * A registration nobody waits on forgets its IO here, so an IO dropped without #close can still be
 * collected (and closed); the next wait on that descriptor registers it with the kernel again. */
static void
loop_mark(void *ptr)
{
    struct evt_loop *loop = ptr;
    rb_gc_mark_movable(loop->loop_fiber);
    rb_gc_mark_movable(loop->current);
    rb_gc_mark_movable(loop->thread);
    rb_gc_mark_movable(loop->requests);
    rb_gc_mark(loop->early_unblock);
    rb_gc_mark(loop->launcher);
    rb_gc_mark(loop->launch_caller);
    rb_gc_mark(loop->launch_error);
    EACH_WAITER(&loop->ready, ready_link, w) rb_gc_mark(w->fiber);
    EACH_WAITER(&loop->operations, io_link, w) rb_gc_mark(w->fiber);
    for (size_t i = 0; i < loop->timers.size; i++) {
        struct evt_timer *timer = loop->timers.heap[i];
        if (timer->kind == EVT_TIMER_WAITER) {
            rb_gc_mark(evt_container_of(timer, struct evt_waiter, timer)->fiber);
        }
        else {
            struct evt_timeout *timeout = evt_container_of(timer, struct evt_timeout, timer);
            rb_gc_mark(timeout->fiber);
            rb_gc_mark(timeout->exception);
        }
    }
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        if (!NIL_P(reg->closing)) {
            if (io_closed(reg->closing)) reg->closing = Qnil; /* Ruby's own checks see it now */
            else rb_gc_mark_movable(reg->closing);
        }
        if (evt_list_empty(&reg->waiters)) {
            reg->io = Qnil;
            continue;
        }
        rb_gc_mark_movable(reg->io);
        EACH_WAITER(&reg->waiters, io_link, w) rb_gc_mark(w->fiber);
    }
    if (loop->unblockable) st_foreach(loop->unblockable, mark_key, 0);
}

static void
loop_compact(void *ptr)
{
    struct evt_loop *loop = ptr;
    loop->self = rb_gc_location(loop->self);
    loop->loop_fiber = rb_gc_location(loop->loop_fiber);
    loop->current = rb_gc_location(loop->current);
    loop->thread = rb_gc_location(loop->thread);
    loop->requests = rb_gc_location(loop->requests);
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        reg->io = rb_gc_location(reg->io);
        reg->closing = rb_gc_location(reg->closing);
    }
}

/* A transfer still in the kernel, or NULL. */
static struct evt_op *
pending_op(struct evt_loop *loop)
{
    EACH_WAITER(&loop->operations, io_link, w) {
        if (w->op && w->op->pending) return w->op;
    }
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        if (!loop->registrations[fd]) continue;
        EACH_WAITER(&loop->registrations[fd]->waiters, io_link, w) {
            if (w->op && w->op->pending) return w->op;
        }
    }
    return NULL;
}

static void
loop_close_backend(struct evt_loop *loop)
{
    if (!loop->backend_data) return;
    /* Closing a ring does not wait for what is in it: every transfer still there is cancelled and
     * reaped first (its fiber wakes), so nothing is written into its memory afterwards. Not in a
     * forked child, where they are the parent's, in the parent's memory. */
    struct evt_op *op;
    while (loop->kernel_ops && loop->forks == evt_forks && (op = pending_op(loop))) loop->backend->cancel(loop, op);
    loop->backend->close(loop);
    loop->backend_data = NULL;
    evt_wakeup_close(&loop->wakeup);
    /* Whatever the kernel knew is gone with its objects. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        reg->armed = 0;
        evt_backend_slot_clear(&reg->slot);
    }
}

static void
loop_free(void *ptr)
{
    struct evt_loop *loop = ptr;
    evt_list_remove(&loop->link);
    loop_close_backend(loop);
    /* Only the heap waiters: the others live on fiber stacks that may already be gone. */
    EACH_WAITER(&loop->allocated, io_link, w) ruby_xfree(w);
    for (int fd = 0; fd < loop->registrations_size; fd++) ruby_xfree(loop->registrations[fd]);
    ruby_xfree(loop->registrations);
    evt_timers_free(&loop->timers);
    if (loop->unblockable) st_free_table(loop->unblockable);
    ruby_xfree(loop->fired);
    ruby_xfree(loop);
}

static size_t
loop_memsize(const void *ptr)
{
    const struct evt_loop *loop = ptr;
    size_t size = sizeof(*loop) + loop->timers.capacity * sizeof(struct evt_timer *);
    size += (size_t)loop->fired_capacity * sizeof(struct evt_fired);
    size += loop->registrations_size * sizeof(struct evt_registration *);
    for (int fd = 0; fd < loop->registrations_size; fd++)
        if (loop->registrations[fd]) size += sizeof(struct evt_registration);
    if (loop->unblockable) size += st_memsize(loop->unblockable);
    return size;
}

/* A loop with transfers in the kernel must not be collected: its fibers' stacks and IOs (which the
 * loop keeps marked) hold the memory the kernel writes into, and freeing the loop would close the
 * ring without waiting for them. A loop abandoned in that state (never run again, never closed)
 * stays, with what it holds: a leak, never a write into freed memory. */
static void
loop_registry_mark(void *unused)
{
    for (struct evt_list *node = evt_loops.next; node != &evt_loops; node = node->next) {
        struct evt_loop *loop = evt_container_of(node, struct evt_loop, link);
        if (loop->kernel_ops) rb_gc_mark(loop->self);
    }
}

static const rb_data_type_t loop_registry_type = {
    .wrap_struct_name = "Evt::Loop registry",
    .function = {.dmark = loop_registry_mark},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE loop_registry = Qnil;

static const rb_data_type_t loop_type = {
    .wrap_struct_name = "Evt::Loop",
    .function = {
        .dmark = loop_mark,
        .dfree = loop_free,
        .dsize = loop_memsize,
        .dcompact = loop_compact,
    },
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE
loop_alloc(VALUE klass)
{
    struct evt_loop *loop;
    VALUE self = TypedData_Make_Struct(klass, struct evt_loop, &loop_type, loop);
    loop->self = self;
    loop->loop_fiber = Qnil;
    loop->current = Qnil;
    loop->thread = Qnil;
    loop->requests = Qnil;
    loop->early_unblock = Qnil;
    loop->launcher = loop->launch_caller = loop->launch_error = Qnil;
    evt_list_append(&evt_loops, &loop->link);
    evt_list_init(&loop->ready);
    evt_list_init(&loop->allocated);
    evt_list_init(&loop->operations);
    evt_timers_init(&loop->timers);
    loop->unblockable = st_init_numtable();
    loop->wakeup.read_fd = loop->wakeup.write_fd = -1;
    loop->fired_capacity = EVT_FIRED_INITIAL;
    loop->fired = ALLOC_N(struct evt_fired, loop->fired_capacity);
    loop->forks = evt_forks;
    return self;
}

/* Has the backend watch what reg's waiters want. 0, or -errno. */
static int
registration_arm(struct evt_loop *loop, int fd, struct evt_registration *reg)
{
    int err = loop->backend->arm(loop, fd, reg);
    reg->armed = err == 0;
    return err;
}

static void
loop_open(struct evt_loop *loop)
{
    int err = evt_wakeup_open(&loop->wakeup);
    if (err == 0 && (err = loop->backend->open(loop)) < 0) evt_wakeup_close(&loop->wakeup);
    if (err < 0) rb_syserr_fail_str(-err, rb_sprintf("evt: opening the %s backend", loop->backend->name));
    loop->forks = evt_forks;
    /* After a close with fibers still waiting, the new kernel objects must watch for them too. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg && reg->events) registration_arm(loop, fd, reg);
    }
}

/* In a forked child: the kernel objects are the parent's, and so are the fibers waiting in them.
 * Like the parent's other threads, those fibers do not go on in the child; the forking fiber,
 * which Ruby made the child's root fiber, now drives the loop. */
static void
loop_after_fork(struct evt_loop *loop)
{
    loop_close_backend(loop);
    EACH_WAITER(&loop->allocated, io_link, w) ruby_xfree(w);
    evt_list_init(&loop->allocated);
    evt_list_init(&loop->operations);
    loop->kernel_ops = 0; /* the parent's, in the parent's ring */
    evt_list_init(&loop->ready);
    loop->ready_count = 0;
    evt_timers_clear(&loop->timers);
    st_clear(loop->unblockable);
    loop->requests = Qnil; /* the other threads are not in the child */
    loop->has_requests = 0;
    loop->early_unblock = Qnil;
    loop->launcher = Qnil; /* perhaps another thread's, which the child has not */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        evt_list_init(&reg->waiters);
        reg->io = Qnil;
        reg->closing = Qnil;
        reg->events = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
    }
    loop->waiting = 0;
    loop->blocked = 0;
    loop->woken = 0;
    loop->running = 0;
    loop->loop_fiber = loop->current = rb_fiber_current();
    loop->thread = rb_thread_current();
    loop->forks = evt_forks;
}

/* The loop, after any fork; the kernel objects may still be closed. */
struct evt_loop *
evt_loop_check(VALUE self)
{
    struct evt_loop *loop = rb_check_typeddata(self, &loop_type);
    if (RB_UNLIKELY(!loop->backend)) rb_raise(rb_eRuntimeError, "evt: the scheduler is not initialized");
    if (RB_UNLIKELY(loop->forks != evt_forks)) loop_after_fork(loop);
    return loop;
}

/* The loop, for its own thread. A scheduler belongs to one thread; an idle one (no fiber waits in
 * it) moves to the thread that uses it next, as when it is made in one thread and set in another. */
static struct evt_loop *
loop_owned(VALUE self)
{
    struct evt_loop *loop = evt_loop_check(self);
    VALUE thread = rb_thread_current();
    if (RB_UNLIKELY(thread != loop->thread)) {
        if (loop->waiting || loop->running)
            rb_raise(rb_eThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it");
        loop->thread = thread;
        loop->loop_fiber = loop->current = rb_fiber_current();
        loop->launcher = Qnil; /* a fiber belongs to its thread */
        loop_close_backend(loop); /* reopened by the new thread: a ring may take one submitter only */
    }
    return loop;
}

/* The loop, ready to use by its thread: a closed one opens again. */
struct evt_loop *
evt_loop_get(VALUE self)
{
    struct evt_loop *loop = loop_owned(self);
    if (RB_UNLIKELY(!loop->backend_data)) loop_open(loop);
    return loop;
}

/* ---- registrations -------------------------------------------------------------------------- */

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

/* A waiter left: keeps the kernel's interest equal to what the remaining waiters want. */
static void
registration_leave(struct evt_loop *loop, struct evt_waiter *w)
{
    struct evt_registration *reg = loop->registrations[w->fd];
    int events = registration_count(reg, w->events, -1);
    if (events == reg->events) return;
    reg->events = events;
    if (events) registration_arm(loop, w->fd, reg); /* fewer events than before: cannot fail usefully */
    else loop->backend->disarm(loop, w->fd, reg);
}

/* ---- waiters ----------------------------------------------------------------------------------- */

/* Takes the waiter out of everything it waits on (not out of the ready queue). */
static void
waiter_detach(struct evt_loop *loop, struct evt_waiter *w)
{
    if (evt_list_linked(&w->io_link)) {
        evt_list_remove(&w->io_link);
        if (w->fd >= 0) registration_leave(loop, w); /* else it was in loop->operations */
    }
    if (evt_timer_active(&w->timer)) evt_timers_remove(&loop->timers, &w->timer);
    if (w->unblockable) {
        st_data_t key = (st_data_t)w->fiber;
        st_delete(loop->unblockable, &key, NULL);
        w->unblockable = 0;
    }
}

static inline void
waiter_ready(struct evt_loop *loop, struct evt_waiter *w)
{
    w->state = EVT_READY;
    evt_list_append(&loop->ready, &w->ready_link);
    loop->ready_count++;
}

void
evt_waiter_wake(struct evt_loop *loop, struct evt_waiter *w, int result)
{
    if (w->state != EVT_WAITING) return;
    waiter_detach(loop, w);
    w->result = result;
    waiter_ready(loop, w);
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
            registration_leave(loop, w);
            evt_waiter_wake(loop, w->owner, ready);
        }
        else {
            evt_waiter_wake(loop, w, ready);
        }
    }
}

void
evt_loop_op_done(struct evt_loop *loop, struct evt_op *op, long result)
{
    op->result = result;
    if (op->pending) loop->kernel_ops--;
    op->pending = 0;
    evt_waiter_wake(loop, op->waiter, 1); /* nothing when its fiber is already on its way out */
}

/* ---- running ---------------------------------------------------------------------------------- */

/* Switches from the loop fiber to another; control comes back when that fiber waits or ends.
 * `current` is what the loop believes runs. (A new fiber starts through launch.) */
static inline void
switch_to(struct evt_loop *loop, VALUE fiber)
{
    loop->current = fiber;
    rb_fiber_transfer(fiber, 0, NULL);
    loop->current = loop->loop_fiber;
    if (RB_UNLIKELY(loop->early_unblock == fiber)) loop->early_unblock = Qnil; /* it ended without waiting */
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
    waiter_ready(loop, w);
}

/* Resumes the fibers that were ready when it started. Returns 1 if `until` (the loop fiber's own
 * waiter, when the loop fiber itself waits) came up: the loop fiber then just carries on. */
static int
loop_resume_ready(struct evt_loop *loop, struct evt_waiter *until)
{
    size_t count = loop->ready_count;
    while (count-- > 0 && !evt_list_empty(&loop->ready)) {
        struct evt_waiter *w = evt_container_of(loop->ready.next, struct evt_waiter, ready_link);
        evt_list_remove(&w->ready_link);
        loop->ready_count--;
        w->state = EVT_IDLE;
        if (w == until) return 1;
        VALUE fiber = w->fiber;
        if (w->allocated) {
            evt_list_remove(&w->io_link);
            ruby_xfree(w);
            loop->waiting--;
            if (!RTEST(rb_fiber_alive_p(fiber))) continue; /* ended meanwhile (killed) */
        }
        switch_to(loop, fiber);
    }
    return 0;
}

/* ---- closing and interrupting ------------------------------------------------------------------- */

/* Whether a fiber waits in the loop on io (by descriptor fd). */
static int
waited_on(struct evt_loop *loop, VALUE io, int fd)
{
    if (fd < 0 || fd >= loop->registrations_size || !loop->registrations[fd]) return 0;
    EACH_WAITER(&loop->registrations[fd]->waiters, io_link, w) {
        if (w->io == io) return 1;
    }
    return 0;
}

/* Whether the loop has met io on fd: a fiber waits on it, or waited on it last. (Another thread
 * closing it tells the loop even when no fiber waits right now: one may be about to.) */
static int
knows(struct evt_loop *loop, VALUE io, int fd)
{
    if (fd < 0 || fd >= loop->registrations_size || !loop->registrations[fd]) return 0;
    return loop->registrations[fd]->io == io || waited_on(loop, io, fd);
}

/* Wakes the loop's waiters on io with EVT_CLOSED, on the loop's own thread: the kernel lets go of
 * the file before this returns. `elsewhere`: for another thread, which may not have marked io closed
 * yet: until it has, a new wait on io ends at once too. */
static void
loop_close_io(struct evt_loop *loop, VALUE io, int fd, int elsewhere)
{
    struct evt_registration *reg = fd >= 0 && fd < loop->registrations_size ? loop->registrations[fd] : NULL;
    if (elsewhere && reg && !io_closed(io)) reg->closing = io;
    if (!waited_on(loop, io, fd)) return;
again:
    EACH_WAITER(&reg->waiters, io_link, w) {
        if (w->io != io) continue;
        struct evt_waiter *target = w;
        if (w->owner) {
            /* One of an io_select's IOs: the select raises. */
            evt_list_remove(&w->io_link);
            registration_leave(loop, w);
            target = w->owner;
        }
        if (target->state == EVT_WAITING) evt_waiter_wake(loop, target, EVT_CLOSED);
        if (w->op && w->op->pending && loop->backend_data) {
            /* A transfer in the kernel holds the file: take it back now. Cancelling may dispatch
             * other completions, which changes the list: look again from the start. */
            loop->backend->cancel(loop, w->op);
            goto again;
        }
    }
    if (reg->io == io && !reg->events && loop->backend->release && loop->backend_data)
        loop->backend->release(loop, fd, reg);
}

/* A request from another thread, which holds the GVL and cannot touch the kernel objects. */
static void
loop_request(struct evt_loop *loop, VALUE first, VALUE second)
{
    if (NIL_P(loop->requests)) loop->requests = rb_ary_new();
    rb_ary_push(loop->requests, rb_assoc_new(first, second));
    loop->has_requests = 1;
    evt_loop_wake(loop);
}

#if RUBY_API_VERSION_MAJOR < 4
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's buffers, public in 3.3 and 3.4 */

/* Another thread closes io while transfers of this loop may have the kernel read into or write from
 * the IO's own buffer (io_fillbuf reads into rbuf, io_fflush writes from wbuf). The close frees the
 * buffer at once, and the loop's thread cancels the transfers only once it has the GVL again: the
 * kernel could write into freed memory meanwhile. So the buffer moves from the IO to those transfers
 * (the IO gets none; Ruby makes a new one if it ever needs one, which a closed IO does not), and the
 * loop frees it once the kernel is done (wait_ensure). A transfer that lost its buffer this way
 * always raises IOError, so Ruby never goes on with the IO's buffer it no longer has. */
static void
hand_over(struct evt_registration *reg, VALUE io, rb_io_buffer_t *buffer)
{
    char *start = buffer->ptr;
    if (!start) return;
    struct evt_orphan *orphan = NULL;
    EACH_WAITER(&reg->waiters, io_link, w) {
        struct evt_op *op = w->op;
        if (w->io != io || !op || !op->pending || op->orphan) continue;
        if ((char *)op->base < start || (char *)op->base >= start + buffer->capa) continue;
        if (!orphan) {
            orphan = ALLOC(struct evt_orphan);
            orphan->memory = start;
            orphan->transfers = 0;
        }
        op->orphan = orphan;
        orphan->transfers++;
    }
    if (!orphan) return;
    buffer->ptr = NULL;
    buffer->off = buffer->len = buffer->capa = 0;
}

/* IO#close from any thread of this process (Ruby 3.3 and 3.4: see close.c), before the descriptor
 * closes. */
void
evt_io_closing(VALUE io, int fd)
{
    VALUE thread = Qundef;
    for (struct evt_list *node = evt_loops.next; node != &evt_loops; node = node->next) {
        struct evt_loop *loop = evt_container_of(node, struct evt_loop, link);
        if (loop->forks != evt_forks || !knows(loop, io, fd)) continue;
        if (RB_UNDEF_P(thread)) thread = rb_thread_current();
        if (loop->thread == thread) {
            loop_close_io(loop, io, fd, 0);
            continue;
        }
        /* Another thread's loop: it wakes its fibers itself, as soon as it gets the GVL. First, its
         * transfers on fd must not reach the kernel under a number that is free again; that may let
         * other threads run, so it comes before the rest, which must happen in one go with the close
         * (no other thread running until Ruby marks io closed, or a fiber could start a transfer on
         * io after the loop served the request, and be left in the kernel). */
        VALUE keep = loop->self; /* the loop stays meanwhile */
        if (loop->backend->closed_elsewhere && loop->backend_data) loop->backend->closed_elsewhere(loop, fd);
        RB_GC_GUARD(keep);
        if (loop->kernel_ops && waited_on(loop, io, fd)) {
            rb_io_t *fptr = RFILE(io)->fptr;
            hand_over(loop->registrations[fd], io, &fptr->rbuf);
            hand_over(loop->registrations[fd], io, &fptr->wbuf);
        }
        loop_request(loop, io, INT2FIX(fd));
    }
}

#pragma GCC diagnostic pop
#endif

void
evt_loop_interrupt(struct evt_loop *loop, VALUE fiber, VALUE exception)
{
    loop_request(loop, fiber, exception);
}

/* Raises exception in fiber from the loop fiber: a switch to it, as switch_to's, so `current` names
 * it until it waits again or ends (when control comes back here). Else the fiber's unwinding would
 * take whichever fiber `current` named last for the one that switched to it, and ready that one in
 * the middle of its own wait (seen: an io_uring read cancelled by its own fiber, Errno::ECANCELED). */
static void
raise_into(struct evt_loop *loop, VALUE fiber, VALUE exception)
{
    loop->current = fiber;
    rb_fiber_raise(fiber, 1, &exception);
    loop->current = loop->loop_fiber;
}

struct interrupt {
    struct evt_loop *loop;
    VALUE fiber;
    VALUE exception;
};

static VALUE
interrupt_fiber(VALUE ptr)
{
    struct interrupt *interrupt = (struct interrupt *)ptr;
    raise_into(interrupt->loop, interrupt->fiber, interrupt->exception);
    return Qnil;
}

static VALUE
fiber_gone(VALUE ptr, VALUE error)
{
    struct evt_loop *loop = ((struct interrupt *)ptr)->loop;
    loop->current = loop->loop_fiber;
    return Qnil; /* it is not suspended any more (resumed by another fiber): nothing to interrupt */
}

/* Serves the other threads' requests, on the loop fiber: the closes, and when `interrupts` is set
 * the fiber interrupts too (which switch fibers: not while the backend holds undispatched events). */
static void
loop_take_requests(struct evt_loop *loop, int interrupts)
{
    VALUE requests = loop->requests;
    loop->requests = Qnil;
    loop->has_requests = 0;
    if (NIL_P(requests)) return;
    VALUE own = Qnil; /* an exception for the loop fiber itself, raised once the rest is done */
    for (long i = 0; i < RARRAY_LEN(requests); i++) {
        VALUE request = RARRAY_AREF(requests, i);
        VALUE first = RARRAY_AREF(request, 0), second = RARRAY_AREF(request, 1);
        if (FIXNUM_P(second)) loop_close_io(loop, first, FIX2INT(second), 1);
        else if (!interrupts) loop_request(loop, first, second); /* kept for later, without a wakeup */
        else if (first == rb_fiber_current()) own = second;
        /* As timeout_after does: control comes back when that fiber waits again or ends. */
        else if (RTEST(rb_fiber_alive_p(first))) {
            struct interrupt interrupt = {loop, first, second};
            rb_rescue2(interrupt_fiber, (VALUE)&interrupt, fiber_gone, (VALUE)&interrupt, eFiberError, 0);
        }
    }
    if (!NIL_P(own)) rb_exc_raise(own);
}

static void
loop_fire_timers(struct evt_loop *loop, int64_t now)
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
        if (w->state == EVT_WAITING) evt_waiter_wake(loop, w, EVT_TIMED_OUT);
        else evt_timers_remove(&loop->timers, timer);
    }
}

struct wait_arguments {
    struct evt_loop *loop;
    int64_t timeout;
    int result;
};

static void *
wait_without_gvl(void *ptr)
{
    struct wait_arguments *arguments = ptr;
    arguments->result = arguments->loop->backend->wait(arguments->loop, arguments->timeout);
    return NULL;
}

static void
wait_unblock(void *ptr)
{
    struct evt_loop *loop = ptr;
    evt_wakeup_signal(&loop->wakeup);
}

/* Hands what the wait collected to the waiters: the fired events of a readiness backend, then the
 * completions of a completion backend. A full array grows for the next wait. */
static void
loop_dispatch(struct evt_loop *loop, int fired)
{
    for (int i = 0; i < fired; i++) {
        struct evt_fired event = loop->fired[i];
        evt_loop_io_ready(loop, event.fd, event.generation, event.events);
    }
    if (loop->backend->complete) loop->backend->complete(loop);
    if (fired == loop->fired_capacity && loop->fired_capacity < EVT_FIRED_MAX) {
        REALLOC_N(loop->fired, struct evt_fired, loop->fired_capacity * 2);
        loop->fired_capacity *= 2;
    }
}

static void
loop_wait(struct evt_loop *loop, int64_t timeout)
{
    struct wait_arguments arguments = {loop, timeout, 0};
    /* A request made while the fibers ran (another thread got the GVL then) saw no wait to end:
     * take it now rather than after the wait. Later ones see `blocked` and wake the wait. */
    if (loop->has_requests) arguments.timeout = timeout = 0;
    if (timeout == 0) {
        arguments.result = loop->backend->wait(loop, 0); /* a poll: not worth giving up the GVL */
    }
    else {
        loop->woken = 0; /* under the GVL, as every evt_loop_wake */
        __atomic_store_n(&loop->blocked, 1, __ATOMIC_SEQ_CST);
        /* RB_NOGVL_INTR_FAIL: no interrupt check on the way out, where an exception would lose the
         * events just taken from the kernel; they are checked below, after dispatch. */
        rb_nogvl(wait_without_gvl, &arguments, wait_unblock, loop, RB_NOGVL_INTR_FAIL);
        __atomic_store_n(&loop->blocked, 0, __ATOMIC_SEQ_CST);
    }
    if (arguments.result < 0)
        rb_syserr_fail_str(-arguments.result, rb_sprintf("evt: waiting on the %s backend", loop->backend->name));
    /* IOs closed by other threads meanwhile: their waiters learn it before any event for them. */
    if (loop->has_requests) loop_take_requests(loop, 0);
    loop_dispatch(loop, arguments.result);
    /* Signals, Thread#raise and Thread#kill arrive here, after the events are safely dispatched. */
    rb_thread_check_ints();
}

/* One iteration at a time, in the order libuv documents for its loop: resume what is ready, fire
 * the timers that are due, compute how long to block, wait without the GVL, mark what arrived
 * ready. Runs until no fiber waits, or, when `until` is given, until that waiter is resumed. */
static VALUE
loop_run_iterations(VALUE ptr)
{
    struct evt_loop *loop = ((struct evt_loop **)ptr)[0];
    struct evt_waiter *until = ((struct evt_waiter **)ptr)[1];
    for (;;) {
        if (loop->has_requests) loop_take_requests(loop, 1);
        if (loop_resume_ready(loop, until)) return Qnil;
        if (!until && loop->waiting == 0) return Qnil;
        if (!loop->backend_data) loop_open(loop);

        int64_t now = evt_now_ns();
        loop_fire_timers(loop, now);
        /* A timeout_after raised in a fiber here, and that fiber may have finished the work. */
        if (!until && loop->waiting == 0 && !loop->ready_count) return Qnil;

        int64_t timeout = -1;
        struct evt_timer *first = evt_timers_first(&loop->timers);
        if (loop->ready_count) timeout = 0;
        else if (first) timeout = first->deadline > now ? first->deadline - now : 0;

        loop_wait(loop, timeout);
    }
}

static VALUE
loop_run_done(VALUE ptr)
{
    struct evt_loop *loop = ((struct evt_loop **)ptr)[0];
    loop->running--;
    loop->current = loop->loop_fiber;
    return Qnil;
}

static void
loop_run(struct evt_loop *loop, struct evt_waiter *until)
{
    void *arguments[2] = {loop, until};
    loop->running++;
    rb_ensure(loop_run_iterations, (VALUE)arguments, loop_run_done, (VALUE)arguments);
}

/* ---- suspending ---------------------------------------------------------------------------------- */

/* Hangs a waiter on its descriptor's registration, arming the backend when the interest grows.
 * A descriptor the kernel cannot poll (a regular file) is always ready: the waiter wakes at once. */
static void
waiter_attach(struct evt_loop *loop, struct evt_waiter *w, VALUE io)
{
    struct evt_registration *reg = evt_registration_get(loop, w->fd, io);
    w->io = io;
    if (RB_UNLIKELY(reg->closing == io)) {
        evt_waiter_wake(loop, w->owner ? w->owner : w, EVT_CLOSED);
        return;
    }
    int previous = reg->events;
    reg->events = registration_count(reg, w->events, 1);
    if (reg->events != previous || !reg->armed) {
        int err = registration_arm(loop, w->fd, reg);
        if (err < 0) {
            reg->events = registration_count(reg, w->events, -1);
            if (err != -EPERM) rb_syserr_fail_str(-err, rb_sprintf("evt: watching descriptor %d", w->fd));
            evt_waiter_wake(loop, w->owner ? w->owner : w, w->events);
            return;
        }
    }
    evt_list_append(&reg->waiters, &w->io_link);
}

static VALUE
wait_body(VALUE ptr)
{
    struct evt_wait *wait = (struct evt_wait *)ptr;
    struct evt_loop *loop = wait->loop;
    struct evt_waiter *w = wait->waiter;

    w->state = EVT_WAITING;
    loop->waiting++;
    int unblocked = RB_UNLIKELY(loop->early_unblock == w->fiber);
    if (unblocked) loop->early_unblock = Qnil; /* for this wait if it is a block, else for none */

    if (wait->timeout >= 0) evt_timers_add(&loop->timers, &w->timer, evt_now_ns() + wait->timeout);

    switch (wait->kind) {
    case EVT_WAIT_IO:
        waiter_attach(loop, w, wait->io);
        break;
    case EVT_WAIT_SELECT: {
        struct evt_selection *selection = wait->selection;
        for (long i = 0; i < selection->count && w->state == EVT_WAITING; i++) {
            struct evt_waiter *secondary = &selection->waiters[i];
            evt_waiter_init(secondary, w->fiber);
            secondary->owner = w;
            secondary->fd = selection->fds[i];
            secondary->events = selection->events[i];
            waiter_attach(loop, secondary, selection->ios[i]);
        }
        if (selection->count == 0 && wait->timeout < 0) {
            /* Nothing to watch and no time limit: IO.select sleeps until interrupted. */
            st_insert(loop->unblockable, (st_data_t)w->fiber, (st_data_t)w);
            w->unblockable = 1;
        }
        break;
    }
    case EVT_WAIT_BLOCK:
        st_insert(loop->unblockable, (st_data_t)w->fiber, (st_data_t)w);
        w->unblockable = 1;
        if (unblocked) evt_waiter_wake(loop, w, 1);
        break;
    case EVT_WAIT_OP: {
        void *base;
        size_t size;
        if (!NIL_P(wait->buffer) && !(rb_io_buffer_get_bytes(wait->buffer, &base, &size) & RB_IO_BUFFER_LOCKED)) {
            rb_io_buffer_lock(wait->buffer); /* no resize or free while the kernel holds it */
            wait->locked = 1;
        }
        wait->op->waiter = w;
        w->op = wait->op;
        /* In no other structure: the list keeps the fiber (and its stack, which the kernel may be
         * writing to) alive for the GC. A transfer hangs on its descriptor's registration, wanting
         * no event, where closing the IO finds it; a waitid on the loop's list. */
        if (wait->op->kind == EVT_OP_TRANSFER && !NIL_P(wait->io)) {
            w->fd = wait->op->fd;
            w->io = wait->io;
            struct evt_registration *reg = evt_registration_get(loop, w->fd, wait->io);
            if (RB_UNLIKELY(reg->closing == wait->io)) {
                evt_waiter_wake(loop, w, EVT_CLOSED); /* never submitted */
                break;
            }
            evt_list_append(&reg->waiters, &w->io_link);
        }
        else {
            evt_list_append(&loop->operations, &w->io_link);
        }
        int err = loop->backend->transfer(loop, wait->op);
        if (err < 0) evt_loop_op_done(loop, wait->op, err);
        else if (wait->op->pending) loop->kernel_ops++;
        break;
    }
    case EVT_WAIT_YIELD:
    case EVT_WAIT_START:
        evt_waiter_wake(loop, w, EVT_SPURIOUS);
        break;
    }

    if (wait->kind == EVT_WAIT_START) {
        loop->current = Qnil; /* until the new fiber says it runs */
        rb_fiber_transfer(wait->target, 0, NULL);
    }
    else if (w->fiber == loop->loop_fiber) loop_run(loop, w); /* the loop fiber waits by running the loop */
    else rb_fiber_transfer(loop->loop_fiber, 0, NULL);
    return Qnil;
}

static VALUE
wait_ensure(VALUE ptr)
{
    struct evt_wait *wait = (struct evt_wait *)ptr;
    struct evt_loop *loop = wait->loop;
    struct evt_waiter *w = wait->waiter;
    if (wait->forks != loop->forks) return Qnil; /* resumed in a child: the loop no longer knows it */
    if (wait->kind == EVT_WAIT_OP) {
        /* Left early (a timeout, Fiber#raise, kill): the kernel must be done with the buffer before
         * this frame and the buffer go. */
        if (wait->op->pending) loop->backend->cancel(loop, wait->op);
        if (wait->locked) rb_io_buffer_unlock(wait->buffer);
        if (wait->op->orphan) orphan_release(wait->op->orphan);
    }
    if (wait->kind == EVT_WAIT_SELECT) {
        for (long i = 0; i < wait->selection->count; i++) {
            struct evt_waiter *secondary = &wait->selection->waiters[i];
            if (secondary->owner && evt_list_linked(&secondary->io_link)) {
                evt_list_remove(&secondary->io_link);
                registration_leave(loop, secondary);
            }
        }
    }
    if (w->state != EVT_IDLE) {
        /* Resumed by something other than the loop: Fiber#raise or Fiber#kill from another fiber. */
        if (w->state == EVT_READY) {
            evt_list_remove(&w->ready_link);
            loop->ready_count--;
        }
        if (w->fiber != loop->loop_fiber) ready_the_switcher(loop, w->fiber);
    }
    waiter_detach(loop, w);
    w->state = EVT_IDLE;
    loop->waiting--;
    return Qnil;
}

void
evt_loop_wait_for(struct evt_wait *wait)
{
    rb_ensure(wait_body, (VALUE)wait, wait_ensure, (VALUE)wait);
}

int
evt_loop_suspend(struct evt_loop *loop, struct evt_waiter *w, enum evt_wait_kind kind, VALUE io, VALUE target,
             int64_t timeout)
{
    struct evt_wait wait = {loop, w, kind, io, target, NULL, timeout, loop->forks, NULL, Qnil, 0};
    rb_ensure(wait_body, (VALUE)&wait, wait_ensure, (VALUE)&wait);
    return w->result;
}

/* Waits until fd has one of `events`: returns them, or EVT_TIMED_OUT. */
int
evt_loop_wait_io(struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout)
{
    struct evt_waiter w;
    evt_waiter_init(&w, rb_fiber_current());
    w.fd = fd;
    w.events = events;
    int result;
    int64_t deadline = timeout >= 0 ? evt_now_ns() + timeout : -1;
    for (;;) {
        result = evt_loop_suspend(loop, &w, EVT_WAIT_IO, io, Qnil, timeout);
        if (result == EVT_CLOSED) evt_raise_closed();
        if (result != EVT_SPURIOUS) return result;
        if (deadline >= 0 && (timeout = deadline - evt_now_ns()) < 0) timeout = 0;
    }
}

/* Readiness right now, without waiting: poll(2) with a zero timeout, as IO#wait would see it. */
int
evt_poll_now(int fd, int events)
{
    struct pollfd pfd = {.fd = fd, .events = (short)events};
    int n;
    do n = poll(&pfd, 1, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) rb_sys_fail("poll");
    if (n == 0) return 0;
    if (pfd.revents & POLLNVAL) rb_syserr_fail(EBADF, "poll");
    int ready = pfd.revents & EVT_EVENTS;
    if (pfd.revents & (POLLERR | POLLHUP)) ready |= EVT_READABLE | EVT_WRITABLE; /* let the caller meet the error */
    return ready & events;
}

static int
fiber_blocking_p(VALUE fiber)
{
    return RTEST(rb_funcall(fiber, id_blocking_p, 0));
}

/* ---- starting fibers from the loop fiber ------------------------------------------------------------
 *
 * CRuby 3.3 and 3.4 lower the thread's count of blocking fibers as a blocking fiber switches away,
 * before they make the new fiber's stack; when that fails (FiberError: no memory, vm.max_map_count)
 * the count stays lowered, and the blocking fiber's own I/O then goes through the scheduler (a hang).
 * So the loop fiber never makes that first switch itself: a non-blocking launcher fiber does, and
 * hands a FiberError back. One switch more per fiber scheduled by the thread's own code; fibers
 * scheduled by fibers are started directly. */

static VALUE
launcher_switch(VALUE target)
{
    return rb_fiber_transfer(target, 0, NULL); /* back here, with the next fiber, at the next launch */
}

static VALUE
launcher_failed(VALUE loop_value, VALUE error)
{
    struct evt_loop *loop = rb_check_typeddata(loop_value, &loop_type);
    loop->launch_error = error;
    return rb_fiber_transfer(loop->launch_caller, 0, NULL);
}

static VALUE
launcher_body(RB_BLOCK_CALL_FUNC_ARGLIST(unused, loop_value))
{
    struct evt_loop *loop = rb_check_typeddata(loop_value, &loop_type);
    VALUE target = rb_fiber_transfer(loop->launch_caller, 0, NULL); /* made: wait for the first launch */
    for (;;) target = rb_rescue2(launcher_switch, target, launcher_failed, loop_value, eFiberError, 0);
    UNREACHABLE_RETURN(Qnil);
}

/* Starts fiber from the loop fiber, through the launcher; raises the FiberError of a fiber that
 * cannot start. Control comes back when the new fiber waits or ends. */
static void
launch(struct evt_loop *loop, VALUE fiber)
{
    loop->launch_caller = rb_fiber_current();
    if (NIL_P(loop->launcher)) {
        VALUE launcher = rb_fiber_new(launcher_body, loop->self);
        rb_fiber_transfer(launcher, 0, NULL); /* it comes straight back, ready */
        loop->launcher = launcher;
    }
    loop->launch_error = Qnil;
    /* Not known to run until it says so (loop_started): starting can fail before it does. */
    loop->current = Qnil;
    rb_fiber_transfer(loop->launcher, 1, &fiber);
    loop->current = loop->loop_fiber;
    loop->launch_caller = Qnil;
    if (RB_UNLIKELY(loop->early_unblock == fiber)) loop->early_unblock = Qnil; /* it ended without waiting */
    VALUE error = loop->launch_error;
    loop->launch_error = Qnil;
    if (!NIL_P(error)) rb_exc_raise(error);
}

/*
 * start(fiber) -> fiber
 *
 * Runs a new fiber at once, until it waits or ends. Any fiber but the loop fiber (a scheduled one,
 * or a blocking one inside it) waits in the ready queue meanwhile.
 */
static VALUE
loop_start(VALUE self, VALUE fiber)
{
    struct evt_loop *loop = evt_loop_get(self);
    VALUE current = rb_fiber_current();
    if (current == loop->loop_fiber) {
        launch(loop, fiber);
    }
    else {
        struct evt_waiter w;
        evt_waiter_init(&w, current);
        evt_loop_suspend(loop, &w, EVT_WAIT_START, Qnil, fiber, -1);
    }
    return fiber;
}

/*
 * started -> nil
 *
 * Called by a new scheduled fiber as it begins: from now on it is the fiber the loop runs.
 */
static VALUE
loop_started(VALUE self)
{
    evt_loop_check(self)->current = rb_fiber_current();
    return Qnil;
}

/*
 * run -> self
 *
 * Runs the loop until no fiber waits in it. Call it from the blocking fiber that drives the
 * scheduler (usually the thread's main fiber).
 */
static VALUE
loop_run_m(VALUE self)
{
    struct evt_loop *loop = evt_loop_get(self);
    VALUE current = rb_fiber_current();
    if (current != loop->loop_fiber) {
        if (loop->running) rb_raise(eFiberError, "evt: the loop is already running on another fiber");
        if (!fiber_blocking_p(current))
            rb_raise(eFiberError, "evt: the loop runs on a blocking fiber (the one that drives the scheduler), "
                                     "not inside a scheduled fiber");
        loop->loop_fiber = current;
    }
    loop_run(loop, NULL);
    return self;
}

/*
 * scheduler_close -> nil
 *
 * Runs every fiber to completion, then releases the kernel objects (a later use opens new ones).
 * Ruby calls it when the thread ends or another scheduler is set; it keeps $! as it found it, so
 * the exception that is ending a thread is not lost.
 */
static VALUE
loop_scheduler_close(VALUE self)
{
    struct evt_loop *loop = loop_owned(self);
    VALUE current = rb_fiber_current();
    if (current != loop->loop_fiber && (loop->running || !fiber_blocking_p(current)))
        rb_raise(eFiberError, "evt: a scheduler is closed from the blocking fiber that drives it, "
                              "not from inside a scheduled fiber");
    VALUE errinfo = rb_errinfo();
    int state = 0;
    rb_protect(loop_run_m, self, &state);
    loop_close_backend(loop);
    if (state) rb_jump_tag(state);
    /* Not while Thread#kill ends the thread: $! then holds Ruby's own marker, which is no exception
     * and cannot be set back (and nothing here replaced it). */
    if (NIL_P(errinfo) || rb_obj_is_kind_of(errinfo, rb_eException)) rb_set_errinfo(errinfo);
    return Qnil;
}

/* Releases the kernel objects; the loop opens new ones if it is used again. */
static VALUE
loop_close_backend_m(VALUE self)
{
    struct evt_loop *loop = loop_owned(self);
    if (loop->running) rb_raise(eFiberError, "evt: the loop is running: it closes when it is done");
    loop_close_backend(loop);
    return Qnil;
}

/*
 * wakeup -> nil
 *
 * Ends a wait in the kernel in progress, from any thread.
 */
static VALUE
loop_wakeup(VALUE self)
{
    struct evt_loop *loop = evt_loop_check(self);
    evt_loop_wake(loop);
    return Qnil;
}

static VALUE
loop_backend(VALUE self)
{
    return ID2SYM(rb_intern(evt_loop_check(self)->backend->name));
}

static VALUE
loop_closed_p(VALUE self)
{
    return evt_loop_check(self)->backend_data ? Qfalse : Qtrue;
}

/* The number of fibers suspended in the loop. */
static VALUE
loop_waiting(VALUE self)
{
    return SIZET2NUM(evt_loop_check(self)->waiting);
}

static int
collect_key(st_data_t key, st_data_t value, st_data_t set)
{
    rb_hash_aset((VALUE)set, (VALUE)key, Qtrue);
    return ST_CONTINUE;
}

/* The fibers suspended in the loop, for tearing it down. */
static VALUE
loop_fibers(VALUE self)
{
    struct evt_loop *loop = evt_loop_check(self);
    VALUE set = rb_hash_new();
    EACH_WAITER(&loop->ready, ready_link, w) rb_hash_aset(set, w->fiber, Qtrue);
    for (size_t i = 0; i < loop->timers.size; i++)
        if (loop->timers.heap[i]->kind == EVT_TIMER_WAITER)
            rb_hash_aset(set, evt_container_of(loop->timers.heap[i], struct evt_waiter, timer)->fiber, Qtrue);
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg) EACH_WAITER(&reg->waiters, io_link, w) rb_hash_aset(set, w->fiber, Qtrue);
    }
    EACH_WAITER(&loop->operations, io_link, w) rb_hash_aset(set, w->fiber, Qtrue);
    st_foreach(loop->unblockable, collect_key, (st_data_t)set);
    rb_hash_delete(set, rb_fiber_current());
    return rb_funcall(set, rb_intern("keys"), 0);
}

static const struct evt_backend *
backend_named(VALUE name)
{
    if (!SYMBOL_P(name) && !RB_TYPE_P(name, T_STRING))
        rb_raise(rb_eTypeError, "evt: backend name must be a Symbol or String, not %" PRIsVALUE, rb_obj_class(name));
    VALUE string = rb_String(name);
    for (const struct evt_backend *const *b = evt_backends; *b; b++)
        if (strcmp((*b)->name, StringValueCStr(string)) == 0) return *b;
    return NULL;
}

/*
 * Evt::Loop.new(backend) -> loop
 *
 * +backend+ names one of Evt::Loop.backends; ArgumentError when it is unknown or cannot run here.
 */
static VALUE
loop_initialize(VALUE self, VALUE name)
{
    struct evt_loop *loop = rb_check_typeddata(self, &loop_type);
    if (loop->backend) rb_raise(rb_eRuntimeError, "evt: loop already initialized");
    const struct evt_backend *backend = backend_named(name);
    if (!backend) rb_raise(rb_eArgError, "evt: unknown backend %" PRIsVALUE, rb_inspect(name));
    const char *reason = backend->probe();
    if (reason) rb_raise(rb_eArgError, "evt: the %s backend cannot run here: %s", backend->name, reason);
    loop->backend = backend;
    loop->loop_fiber = loop->current = rb_fiber_current();
    loop->thread = rb_thread_current();
    loop_open(loop);
    return self;
}

/* Evt::Loop.backends -> the names of the backends this build has, fastest first. */
static VALUE
loop_s_backends(VALUE klass)
{
    VALUE names = rb_ary_new();
    for (const struct evt_backend *const *b = evt_backends; *b; b++) rb_ary_push(names, ID2SYM(rb_intern((*b)->name)));
    return names;
}

/* Evt::Loop.probe(name) -> nil when the backend can run here, else the reason it cannot. */
static VALUE
loop_s_probe(VALUE klass, VALUE name)
{
    const struct evt_backend *backend = backend_named(name);
    if (!backend) return rb_str_new_cstr("unknown backend");
    const char *reason = backend->probe();
    return reason ? rb_str_new_cstr(reason) : Qnil;
}

void
evt_loop_init(VALUE mEvt)
{
    id_blocking_p = rb_intern("blocking?");
    rb_gc_register_address(&loop_registry);
    loop_registry = TypedData_Wrap_Struct(0, &loop_registry_type, NULL);
    eFiberError = rb_const_get(rb_cObject, rb_intern("FiberError"));
    pthread_atfork(NULL, NULL, evt_atfork_child);

    evt_cLoop = rb_define_class_under(mEvt, "Loop", rb_cObject);
    rb_define_alloc_func(evt_cLoop, loop_alloc);
    rb_define_singleton_method(evt_cLoop, "backends", loop_s_backends, 0);
    rb_define_singleton_method(evt_cLoop, "probe", loop_s_probe, 1);
    rb_define_method(evt_cLoop, "initialize", loop_initialize, 1);


    evt_hooks_init(evt_cLoop);
    evt_close_init(mEvt, evt_cLoop);

    rb_define_method(evt_cLoop, "run", loop_run_m, 0);
    rb_define_method(evt_cLoop, "scheduler_close", loop_scheduler_close, 0);
    rb_define_method(evt_cLoop, "wakeup", loop_wakeup, 0);
    rb_define_method(evt_cLoop, "backend", loop_backend, 0);
    rb_define_method(evt_cLoop, "closed?", loop_closed_p, 0);
    rb_define_method(evt_cLoop, "waiting", loop_waiting, 0);

    rb_define_private_method(evt_cLoop, "start", loop_start, 1);
    rb_define_private_method(evt_cLoop, "started", loop_started, 0);
    rb_define_private_method(evt_cLoop, "close_backend", loop_close_backend_m, 0);
    rb_define_private_method(evt_cLoop, "suspended_fibers", loop_fibers, 0);
}
