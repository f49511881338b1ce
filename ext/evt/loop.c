/* The core of evt: waiters, the ready queue, fiber switching, the run loop and the hooks that block.
 * See loop.h for the model; backend.h for what a backend does. */
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

VALUE evt_cLoop;

static ID id_blocking_p;
static VALUE eFiberError;
static VALUE cBasicSocket = Qundef; /* once `socket` is loaded */

/* What a finished wait reports besides events (> 0) and "unblocked" (1). */
enum { EVT_SPURIOUS = 0, EVT_TIMED_OUT = -1 };

/* Registration flags, learnt once per IO object on a descriptor. */
enum {
    EVT_REG_CHECKED = 1,   /* O_NONBLOCK and file type looked at */
    EVT_REG_BLOCKING = 2,  /* a descriptor in blocking mode, not a socket: poll before every transfer */
    EVT_REG_SOCKET = 4,    /* a socket: transfer with MSG_DONTWAIT (recv, send) */
    EVT_REG_FILE = 8,      /* a regular file or block device: never waits for readiness */
};

/* Counts forks: every child increments it at once, so a loop can tell it was inherited. */
static volatile unsigned evt_forks;

static void
evt_atfork_child(void)
{
    evt_forks++;
}

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* nil -> -1 (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives for bad values. */
static int64_t
timeout_ns(VALUE timeout)
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

static int
mark_key(st_data_t key, st_data_t value, st_data_t arg)
{
    rb_gc_mark((VALUE)key);
    return ST_CONTINUE;
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
    loop->loop_fiber = rb_gc_location(loop->loop_fiber);
    loop->current = rb_gc_location(loop->current);
    loop->thread = rb_gc_location(loop->thread);
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg) reg->io = rb_gc_location(reg->io);
    }
}

static void
loop_close_backend(struct evt_loop *loop)
{
    if (!loop->backend_data) return;
    loop->backend->close(loop);
    loop->backend_data = NULL;
    /* Whatever the kernel knew is gone with its objects. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg) reg->interest = reg->trusted = 0, reg->index = -1;
    }
}

static void
loop_free(void *ptr)
{
    struct evt_loop *loop = ptr;
    loop_close_backend(loop);
    /* Only the heap waiters: the others live on fiber stacks that may already be gone. */
    EACH_WAITER(&loop->allocated, io_link, w) ruby_xfree(w);
    for (int fd = 0; fd < loop->registrations_size; fd++) ruby_xfree(loop->registrations[fd]);
    ruby_xfree(loop->registrations);
    evt_timers_free(&loop->timers);
    if (loop->unblockable) st_free_table(loop->unblockable);
    ruby_xfree(loop);
}

static size_t
loop_memsize(const void *ptr)
{
    const struct evt_loop *loop = ptr;
    size_t size = sizeof(*loop) + loop->timers.capacity * sizeof(struct evt_timer *);
    size += loop->registrations_size * sizeof(struct evt_registration *);
    for (int fd = 0; fd < loop->registrations_size; fd++)
        if (loop->registrations[fd]) size += sizeof(struct evt_registration);
    if (loop->unblockable) size += st_memsize(loop->unblockable);
    return size;
}

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
    loop->loop_fiber = Qnil;
    loop->current = Qnil;
    loop->thread = Qnil;
    evt_list_init(&loop->ready);
    evt_list_init(&loop->allocated);
    evt_list_init(&loop->operations);
    evt_timers_init(&loop->timers);
    loop->unblockable = st_init_numtable();
    loop->forks = evt_forks;
    return self;
}

static void
loop_open(struct evt_loop *loop)
{
    int err = loop->backend->open(loop);
    if (err < 0) rb_syserr_fail_str(-err, rb_sprintf("evt: opening the %s backend", loop->backend->name));
    loop->forks = evt_forks;
    /* After a close with fibers still waiting, the new kernel objects must watch for them too. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg && reg->events) loop->backend->arm(loop, fd, reg);
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
    evt_list_init(&loop->ready);
    loop->ready_count = 0;
    evt_timers_clear(&loop->timers);
    st_clear(loop->unblockable);
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        evt_list_init(&reg->waiters);
        reg->io = Qnil;
        reg->events = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
    }
    loop->waiting = 0;
    loop->blocked = 0;
    loop->running = 0;
    loop->loop_fiber = loop->current = rb_fiber_current();
    loop->thread = rb_thread_current();
    loop->forks = evt_forks;
}

/* The loop, after any fork; the kernel objects may still be closed. */
static struct evt_loop *
loop_check(VALUE self)
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
    struct evt_loop *loop = loop_check(self);
    VALUE thread = rb_thread_current();
    if (RB_UNLIKELY(thread != loop->thread)) {
        if (loop->waiting || loop->running)
            rb_raise(rb_eThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it");
        loop->thread = thread;
        loop->loop_fiber = loop->current = rb_fiber_current();
        loop_close_backend(loop); /* reopened by the new thread: a ring may take one submitter only */
    }
    return loop;
}

/* The loop, ready to use by its thread: a closed one opens again. */
static inline struct evt_loop *
loop_get(VALUE self)
{
    struct evt_loop *loop = loop_owned(self);
    if (RB_UNLIKELY(!loop->backend_data)) loop_open(loop);
    return loop;
}

/* ---- registrations -------------------------------------------------------------------------- */

static struct evt_registration *
registration_get(struct evt_loop *loop, int fd, VALUE io)
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
        evt_list_init(&reg->waiters);
        reg->generation = 0;
        reg->events = reg->interest = reg->trusted = reg->flags = reg->exhausted = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
        reg->index = -1;
        loop->registrations[fd] = reg;
    }
    if (reg->io != io) {
        /* Another IO on this number (or one forgotten at GC): what the kernel and we knew was for
         * the old one. Waiters of another IO sharing the descriptor stay. */
        reg->io = io;
        reg->generation = ++loop->generation;
        reg->trusted = 0;
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
    if (events) loop->backend->arm(loop, w->fd, reg); /* fewer events than before: cannot fail usefully */
    else loop->backend->disarm(loop, w->fd, reg);
}

/* ---- waiters ----------------------------------------------------------------------------------- */

static inline void
waiter_init(struct evt_waiter *w, VALUE fiber)
{
    w->fiber = fiber;
    evt_list_init(&w->ready_link);
    evt_list_init(&w->io_link);
    evt_timer_init(&w->timer, EVT_TIMER_WAITER);
    w->owner = NULL;
    w->fd = -1;
    w->events = 0;
    w->result = EVT_SPURIOUS;
    w->state = EVT_IDLE;
    w->unblockable = 0;
    w->allocated = 0;
}

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

static void
waiter_wake(struct evt_loop *loop, struct evt_waiter *w, int result)
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
            waiter_wake(loop, w->owner, ready);
        }
        else {
            waiter_wake(loop, w, ready);
        }
    }
}

void
evt_loop_op_done(struct evt_loop *loop, struct evt_op *op, long result)
{
    op->result = result;
    op->pending = 0;
    waiter_wake(loop, op->waiter, 1); /* nothing when its fiber is already on its way out */
}

/* ---- running ---------------------------------------------------------------------------------- */

/* Switches from the loop fiber to another; control comes back when that fiber waits or ends.
 * `current` is what the loop believes runs; a fiber being started is not known to run until it
 * says so (loop_started), since starting can fail before it does (FiberError: no stack). */
static inline void
switch_to(struct evt_loop *loop, VALUE fiber, int start)
{
    loop->current = start ? Qnil : fiber;
    rb_fiber_transfer(fiber, 0, NULL);
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
    waiter_init(w, switcher);
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
        switch_to(loop, fiber, 0);
    }
    return 0;
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
            rb_fiber_raise(timeout->fiber, 1, &timeout->exception);
            continue;
        }
        struct evt_waiter *w = evt_container_of(timer, struct evt_waiter, timer);
        if (w->state == EVT_WAITING) waiter_wake(loop, w, EVT_TIMED_OUT);
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
    loop->backend->wakeup(loop);
}

static void
loop_wait(struct evt_loop *loop, int64_t timeout)
{
    struct wait_arguments arguments = {loop, timeout, 0};
    if (timeout == 0) {
        arguments.result = loop->backend->wait(loop, 0); /* a poll: not worth giving up the GVL */
    }
    else {
        __atomic_store_n(&loop->blocked, 1, __ATOMIC_SEQ_CST);
        /* RB_NOGVL_INTR_FAIL: no interrupt check on the way out, where an exception would lose the
         * events just taken from the kernel; they are checked below, after dispatch. */
        rb_nogvl(wait_without_gvl, &arguments, wait_unblock, loop, RB_NOGVL_INTR_FAIL);
        __atomic_store_n(&loop->blocked, 0, __ATOMIC_SEQ_CST);
    }
    if (arguments.result > 0) loop->backend->dispatch(loop);
    else if (arguments.result < 0)
        rb_syserr_fail_str(-arguments.result, rb_sprintf("evt: waiting on the %s backend", loop->backend->name));
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
        if (loop_resume_ready(loop, until)) return Qnil;
        if (!until && loop->waiting == 0) return Qnil;
        if (!loop->backend_data) loop_open(loop);

        int64_t now = now_ns();
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

enum evt_wait_kind { EVT_WAIT_IO, EVT_WAIT_BLOCK, EVT_WAIT_YIELD, EVT_WAIT_START, EVT_WAIT_SELECT, EVT_WAIT_OP };

/* io_select's IOs: a waiter each, all waking the select's own waiter. */
struct evt_selection {
    long count;
    VALUE *ios;
    int *fds;
    int *events;
    struct evt_waiter *waiters;
};

/* One suspension of the current fiber. The whole of it (linking the waiter into the loop's
 * structures, switching away, unlinking) runs under rb_ensure, so however the fiber is unwound the
 * waiter has left every structure before its stack frame goes away. */
struct evt_wait {
    struct evt_loop *loop;
    struct evt_waiter *waiter;
    enum evt_wait_kind kind;
    VALUE io;          /* EVT_WAIT_IO */
    VALUE target;      /* EVT_WAIT_START: the new fiber */
    struct evt_selection *selection; /* EVT_WAIT_SELECT */
    int64_t timeout;   /* -1: none */
    unsigned forks;
    struct evt_op *op; /* EVT_WAIT_OP */
    VALUE buffer;      /* EVT_WAIT_OP: the IO::Buffer, locked by us while the kernel may write to it */
    int locked;
};

/* Hangs a waiter on its descriptor's registration, arming the backend when the interest grows.
 * A descriptor the kernel cannot poll (a regular file) is always ready: the waiter wakes at once. */
static void
waiter_attach(struct evt_loop *loop, struct evt_waiter *w, VALUE io)
{
    struct evt_registration *reg = registration_get(loop, w->fd, io);
    int previous = reg->events;
    reg->events = registration_count(reg, w->events, 1);
    if (reg->events != previous || !reg->trusted) {
        int err = loop->backend->arm(loop, w->fd, reg);
        if (err < 0) {
            reg->events = registration_count(reg, w->events, -1);
            if (err != -EPERM) rb_syserr_fail_str(-err, rb_sprintf("evt: watching descriptor %d", w->fd));
            waiter_wake(loop, w->owner ? w->owner : w, w->events);
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

    if (wait->timeout >= 0) evt_timers_add(&loop->timers, &w->timer, now_ns() + wait->timeout);

    switch (wait->kind) {
    case EVT_WAIT_IO:
        waiter_attach(loop, w, wait->io);
        break;
    case EVT_WAIT_SELECT: {
        struct evt_selection *selection = wait->selection;
        for (long i = 0; i < selection->count && w->state == EVT_WAITING; i++) {
            struct evt_waiter *secondary = &selection->waiters[i];
            waiter_init(secondary, w->fiber);
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
        break;
    case EVT_WAIT_OP: {
        void *base;
        size_t size;
        if (!NIL_P(wait->buffer) && !(rb_io_buffer_get_bytes(wait->buffer, &base, &size) & RB_IO_BUFFER_LOCKED)) {
            rb_io_buffer_lock(wait->buffer); /* no resize or free while the kernel holds it */
            wait->locked = 1;
        }
        wait->op->waiter = w;
        /* In no other structure: the list keeps the fiber (and its stack, which the kernel may be
         * writing to) alive for the GC. */
        evt_list_append(&loop->operations, &w->io_link);
        int err = loop->backend->transfer(loop, wait->op);
        if (err < 0) evt_loop_op_done(loop, wait->op, err);
        break;
    }
    case EVT_WAIT_YIELD:
    case EVT_WAIT_START:
        waiter_wake(loop, w, EVT_SPURIOUS);
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

static int
loop_suspend(struct evt_loop *loop, struct evt_waiter *w, enum evt_wait_kind kind, VALUE io, VALUE target,
             int64_t timeout)
{
    struct evt_wait wait = {loop, w, kind, io, target, NULL, timeout, loop->forks, NULL, Qnil, 0};
    rb_ensure(wait_body, (VALUE)&wait, wait_ensure, (VALUE)&wait);
    return w->result;
}

/* Waits until fd has one of `events`: returns them, or EVT_TIMED_OUT. */
static int
loop_wait_io(struct evt_loop *loop, VALUE io, int fd, int events, int64_t timeout)
{
    struct evt_waiter w;
    waiter_init(&w, rb_fiber_current());
    w.fd = fd;
    w.events = events;
    int result;
    int64_t deadline = timeout >= 0 ? now_ns() + timeout : -1;
    for (;;) {
        result = loop_suspend(loop, &w, EVT_WAIT_IO, io, Qnil, timeout);
        if (result != EVT_SPURIOUS) return result;
        if (deadline >= 0 && (timeout = deadline - now_ns()) < 0) timeout = 0;
    }
}

/* Readiness right now, without waiting: poll(2) with a zero timeout, as IO#wait would see it. */
static int
poll_now(int fd, int events)
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

/* ---- hooks -------------------------------------------------------------------------------------- */

/* The registration for a transfer on io. Learns once per IO whether its descriptor is in blocking
 * mode: a socket (any BasicSocket, or a descriptor in blocking mode that fstat says is one) is read
 * and written with MSG_DONTWAIT; anything else in blocking mode (a pipe, a FIFO, a tty)
 * is polled before each transfer, and written at most PIPE_BUF bytes at a time, which a writable
 * pipe takes without blocking. Regular files never wait. */
static struct evt_registration *
transfer_registration(struct evt_loop *loop, VALUE io, int fd)
{
    struct evt_registration *reg = registration_get(loop, fd, io);
    if (!(reg->flags & EVT_REG_CHECKED)) {
        if (RB_UNDEF_P(cBasicSocket) && rb_const_defined(rb_cObject, rb_intern("BasicSocket")))
            cBasicSocket = rb_const_get(rb_cObject, rb_intern("BasicSocket"));
        if (!RB_UNDEF_P(cBasicSocket) && RTEST(rb_obj_is_kind_of(io, cBasicSocket))) {
            /* MSG_DONTWAIT never blocks, whatever the mode: no need to ask the kernel. */
            reg->flags = EVT_REG_CHECKED | EVT_REG_SOCKET;
            return reg;
        }
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0) rb_sys_fail("fcntl(F_GETFL)");
        reg->flags = EVT_REG_CHECKED;
        if (!(flags & O_NONBLOCK)) {
            struct stat st;
            if (fstat(fd, &st) < 0) rb_sys_fail("fstat");
            if (S_ISSOCK(st.st_mode)) reg->flags |= EVT_REG_SOCKET;
            else if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) reg->flags |= EVT_REG_FILE;
            else reg->flags |= EVT_REG_BLOCKING;
        }
    }
    return reg;
}

/* One read(2) or write(2) (pread/pwrite at `position` when it is not negative) that cannot block
 * the thread, or -1 with errno EAGAIN. */
static ssize_t
transfer_once(struct evt_registration *reg, int fd, int events, char *base, size_t size, off_t position)
{
    if ((reg->flags & EVT_REG_SOCKET) && position < 0)
        return events == EVT_READABLE ? recv(fd, base, size, MSG_DONTWAIT) : send(fd, base, size, MSG_DONTWAIT);
    if (reg->flags & EVT_REG_BLOCKING) {
        if (!poll_now(fd, events)) {
            errno = EAGAIN;
            return -1;
        }
        if (events == EVT_WRITABLE && size > PIPE_BUF) size = PIPE_BUF;
    }
    if (position >= 0)
        return events == EVT_READABLE ? pread(fd, base, size, position) : pwrite(fd, base, size, position);
    return events == EVT_READABLE ? read(fd, base, size) : write(fd, base, size);
}

/* Waits for the IO as a read or write would, under the IO's own #timeout. */
static void
wait_for_transfer(struct evt_loop *loop, VALUE io, int fd, int events)
{
    if (loop_wait_io(loop, io, fd, events, timeout_ns(rb_io_timeout(io))) == EVT_TIMED_OUT)
        rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
}


/*
 * io_wait(io, events, timeout) -> Integer or false
 *
 * The events of +events+ that are ready, waiting up to +timeout+ seconds (nil: the IO's own
 * #timeout, as Ruby does without a scheduler); false when the time is up first.
 */
static VALUE
loop_io_wait(VALUE self, VALUE io, VALUE events_value, VALUE timeout_value)
{
    struct evt_loop *loop = loop_get(self);
    int fd = rb_io_descriptor(io);
    int events = NUM2INT(events_value) & EVT_EVENTS;
    if (NIL_P(timeout_value) && RB_TYPE_P(io, T_FILE)) timeout_value = rb_io_timeout(io);
    int64_t timeout = timeout_ns(timeout_value);
    /* After io_read or io_write met EAGAIN, Ruby calls here at once: those events are known not to
     * be ready, and the next readiness will come as an event. Otherwise look first. */
    struct evt_registration *reg = registration_get(loop, fd, io);
    if (events & ~reg->exhausted) {
        int ready = poll_now(fd, events);
        if (ready) return INT2FIX(ready);
    }
    if (timeout == 0 || events == 0) return Qfalse;
    int result = loop_wait_io(loop, io, fd, events, timeout);
    return result > 0 ? INT2FIX(result) : Qfalse;
}

/* Transfers with read(2) or write(2) until at least `length` bytes (0: one successful transfer),
 * end of file or an error. When nothing could be transferred and `length` is 0, returns -EAGAIN
 * rather than waiting: Ruby's blocking reads and writes then call io_wait and try again, while
 * read_nonblock and write_nonblock (which come here too) must not wait. */
/* Whether `base` is the IO's own read buffer. Ruby fills it only from io_fillbuf (gets, read,
 * each_line, eof?...), which waits and tries again after EAGAIN whatever happens: such a read may
 * wait here, saving the round trip through io_wait. read_nonblock and readpartial read into the
 * caller's string instead, and must not wait. */
static int
internal_read_buffer(VALUE io, const void *base)
{
    if (!RB_TYPE_P(io, T_FILE) || !RFILE(io)->fptr) return 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return RFILE(io)->fptr->rbuf.ptr == base;
#pragma GCC diagnostic pop
}

/* One transfer done by the backend (io_uring): submits it and waits for its completion under the
 * IO's timeout. Returns bytes or -errno; *timed_out when the time ran out with nothing done. */
static long
transfer_by_backend(struct evt_loop *loop, VALUE io, VALUE buffer, struct evt_op *op, int *timed_out)
{
    struct evt_waiter w;
    waiter_init(&w, rb_fiber_current());
    struct evt_wait wait = {loop, &w, EVT_WAIT_OP, io, Qnil, NULL, timeout_ns(rb_io_timeout(io)), loop->forks,
                            op, buffer, 0};
    rb_ensure(wait_body, (VALUE)&wait, wait_ensure, (VALUE)&wait);
    *timed_out = w.result == EVT_TIMED_OUT && op->result <= 0;
    return op->result;
}

/* Whether the backend does this transfer itself (io_uring): one that may wait for the descriptor,
 * so the kernel does the waiting too; a file's at any position. A try that must not wait
 * (read_nonblock) is one system call, cheaper than a trip through the loop; positioned transfers
 * on anything but a file go to pread(2) and pwrite(2), which fail as Ruby expects. */
static inline int
by_backend_transfer(struct evt_loop *loop, struct evt_registration *reg, off_t position, int may_wait)
{
    if (!loop->backend->transfer) return 0;
    if (reg->flags & EVT_REG_FILE) return 1;
    return position < 0 && may_wait;
}

/* Whether read_nonblock called this hook: the one reader that must not wait. sysread comes with the
 * same arguments and must wait (it does not try again after EAGAIN), so the stack says which. */
static int
called_by_read_nonblock(void)
{
    VALUE frames[2];
    int lines[2];
    /* Frame 0 is this hook. (Ruby 3.3's `start` does not count C frames: ask from the top.) */
    if (rb_profile_frames(0, 2, frames, lines) < 2) return 0;
    VALUE name = rb_profile_frame_method_name(frames[1]);
    return RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) == 13 && memcmp(RSTRING_PTR(name), "read_nonblock", 13) == 0;
}

static VALUE
io_transfer(VALUE self, VALUE io, VALUE buffer, VALUE length_value, VALUE offset_value, off_t position, int events)
{
    struct evt_loop *loop = loop_get(self);
    int fd = rb_io_descriptor(io);
    size_t length = NUM2SIZET(length_value), offset = NUM2SIZET(offset_value), total = 0;
    struct evt_registration *reg = transfer_registration(loop, io, fd);
    /* Length 0 asks for one transfer and allows -EAGAIN. Only read_nonblock needs that: Ruby's
     * other readers and writers either wait and try again after -EAGAIN (so waiting here saves the
     * round trip) or, like sysread and syswrite, count on the wait (write_nonblock does not come
     * here at all). */
    if (length == 0 && position < 0) {
        if (events == EVT_WRITABLE) {
            length = 1;
        }
        else {
            const void *base;
            size_t size;
            rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
            if (internal_read_buffer(io, base) || !called_by_read_nonblock()) length = 1;
        }
    }
    for (;;) {
        void *base;
        size_t size;
        /* Fetched before every try: another fiber may have resized the buffer meanwhile. */
        if (events == EVT_READABLE) rb_io_buffer_get_bytes_for_writing(buffer, &base, &size);
        else rb_io_buffer_get_bytes_for_reading(buffer, (const void **)&base, &size);
        if (offset > size)
            rb_raise(rb_eArgError, "offset %" PRIuSIZE " is past the end of the buffer (%" PRIuSIZE " bytes)",
                     offset, size);
        ssize_t n;
        int by_backend = by_backend_transfer(loop, reg, position, total < length);
        if (by_backend) {
            struct evt_op op = {
                .kind = EVT_OP_TRANSFER, .fd = fd, .events = events, .base = (char *)base + offset,
                .size = size - offset, .position = position < 0 ? -1 : position + (off_t)total,
                .socket = (reg->flags & EVT_REG_SOCKET) && position < 0,
            };
            int timed_out;
            long result = transfer_by_backend(loop, io, buffer, &op, &timed_out);
            /* Closed while the kernel had it: the result belongs to no one (the epoll backend raises
             * the same when it looks again after waiting). */
            if (RB_TYPE_P(io, T_FILE)) rb_io_check_closed(RFILE(io)->fptr);
            if (timed_out) rb_raise(rb_eIOTimeoutError, "Blocking operation timed out!");
            if (result < 0) {
                errno = (int)-result;
                n = -1;
            }
            else {
                n = result;
            }
        }
        else {
            n = transfer_once(reg, fd, events, (char *)base + offset, size - offset,
                              position < 0 ? -1 : position + (off_t)total);
        }
        if (n > 0) {
            total += n;
            offset += n;
            if (total >= length) break;
            if (by_backend) {
                fd = rb_io_descriptor(io); /* it waited: the IO may have been closed meanwhile */
                reg = transfer_registration(loop, io, fd);
            }
            continue;
        }
        if (n == 0) break; /* end of file, or a full buffer */
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            reg->exhausted |= events;
            if (total >= length) {
                if (total) break;
                return INT2FIX(-EAGAIN);
            }
            wait_for_transfer(loop, io, fd, events);
            /* The IO may have been closed meanwhile, and its number given to another file: raise
             * as Ruby does for a closed stream rather than transfer on someone else's descriptor. */
            fd = rb_io_descriptor(io);
            reg = transfer_registration(loop, io, fd);
            continue;
        }
        if (total) break; /* the error shows on the next call */
        return INT2FIX(-errno);
    }
    return SIZET2NUM(total);
}

/*
 * io_read(io, buffer, length, offset) -> Integer
 *
 * Reads into +buffer+ from +offset+: at least +length+ bytes, end of file or an error (+length+ 0:
 * whatever one read gives). Returns the bytes read, or -errno (-EAGAIN when nothing was ready and
 * +length+ is 0).
 */
static VALUE
loop_io_read(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return io_transfer(self, io, buffer, length, offset, -1, EVT_READABLE);
}

/*
 * io_write(io, buffer, length, offset) -> Integer
 *
 * Writes from +buffer+ at +offset+: at least +length+ bytes or an error (+length+ 0: whatever one
 * write takes). Returns the bytes written, or -errno (-EAGAIN when nothing could be written and
 * +length+ is 0).
 */
static VALUE
loop_io_write(VALUE self, VALUE io, VALUE buffer, VALUE length, VALUE offset)
{
    return io_transfer(self, io, buffer, length, offset, -1, EVT_WRITABLE);
}

/*
 * io_pread(io, buffer, from, length, offset) -> Integer
 *
 * As io_read, at file position +from+ (which does not move). Returns the bytes read, or -errno
 * (-ESPIPE for a pipe or socket, as pread(2) says).
 */
static VALUE
loop_io_pread(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length, VALUE offset)
{
    off_t position = NUM2OFFT(from);
    if (position < 0) return INT2FIX(-EINVAL); /* as pread(2) says; Ruby names the file */
    return io_transfer(self, io, buffer, length, offset, position, EVT_READABLE);
}

/*
 * io_pwrite(io, buffer, from, length, offset) -> Integer
 *
 * pwrite(2) at file position +from+ (which does not move). Returns the bytes written, or -errno.
 *
 * Ruby 3.3 and 3.4 call this hook from IO#pwrite without the GVL: inside the blocking region of
 * io.c's internal_pwrite_func. So it must not suspend the fiber, raise, allocate, or touch the
 * loop: it writes at once, as Ruby does without a scheduler (a file write may wait for the disk).
 */
static VALUE
loop_io_pwrite(VALUE self, VALUE io, VALUE buffer, VALUE from, VALUE length_value, VALUE offset_value)
{
    off_t position = NUM2OFFT(from);
    size_t length = NUM2SIZET(length_value), offset = NUM2SIZET(offset_value), total = 0;
    if (position < 0) return INT2FIX(-EINVAL);
    if (!RB_TYPE_P(io, T_FILE) || !RFILE(io)->fptr) return INT2FIX(-EBADF);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    int fd = RFILE(io)->fptr->fd; /* rb_io_descriptor raises, which needs the GVL */
#pragma GCC diagnostic pop
    if (fd < 0) return INT2FIX(-EBADF);
    const void *base;
    size_t size;
    rb_io_buffer_get_bytes_for_reading(buffer, &base, &size);
    if (offset > size) return INT2FIX(-EINVAL);
    do {
        ssize_t n = pwrite(fd, (const char *)base + offset + total, size - offset - total, position + (off_t)total);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (total) break;
            return INT2FIX(-errno);
        }
        if (n == 0) break;
        total += n;
    } while (total < length && offset + total < size);
    return SIZET2NUM(total);
}

/* ---- io_select ---------------------------------------------------------------------------------- */

struct select_call {
    VALUE sets[3];                 /* the arrays given, or nil */
    struct pollfd *pollfds;
    struct evt_selection selection;
};

static const int select_events[3] = {EVT_READABLE, EVT_WRITABLE, EVT_PRIORITY};

/* Polls every IO at once without waiting: the [readable, writable, exceptional] arrays of the
 * objects given, or nil when none is ready. Data already in an IO's read buffer counts as
 * readable, as IO.select has it. */
static VALUE
select_now(struct select_call *call)
{
    long count = call->selection.count;
    int n = 0;
    if (count) {
        do n = poll(call->pollfds, (nfds_t)count, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0) rb_sys_fail("poll");
    }
    for (long i = 0; i < count; i++) {
        if (call->selection.events[i] == EVT_READABLE && !(call->pollfds[i].revents & POLLIN) &&
            rb_io_read_pending(RFILE(call->selection.ios[i])->fptr)) {
            call->pollfds[i].revents |= POLLIN;
            n++;
        }
    }
    if (n == 0) return Qnil;

    VALUE result = rb_ary_new_capa(3);
    long i = 0;
    for (int set = 0; set < 3; set++) {
        VALUE ready = rb_ary_new();
        long length = NIL_P(call->sets[set]) ? 0 : RARRAY_LEN(call->sets[set]);
        for (long j = 0; j < length; j++, i++) {
            short revents = call->pollfds[i].revents;
            if (revents & POLLNVAL) rb_syserr_fail(EBADF, "select");
            int hit = set == 0 ? revents & (POLLIN | POLLHUP | POLLERR)
                    : set == 1 ? revents & (POLLOUT | POLLERR)
                               : revents & POLLPRI;
            if (hit) rb_ary_push(ready, RARRAY_AREF(call->sets[set], j));
        }
        rb_ary_push(result, ready);
    }
    return result;
}

/*
 * io_select(readables, writables = nil, exceptables = nil, timeout = nil) -> Array or nil
 *
 * IO.select without a thread: every IO is watched by the loop at once, the fiber wakes on the first
 * readiness or the timeout, and gets what IO.select gives: the ready objects of each array, or nil
 * when the time ran out.
 */
static VALUE
loop_io_select(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 1, 4);
    struct select_call call = {{argv[0], argc > 1 ? argv[1] : Qnil, argc > 2 ? argv[2] : Qnil}};
    long count = 0;
    for (int set = 0; set < 3; set++) {
        if (NIL_P(call.sets[set])) continue;
        Check_Type(call.sets[set], T_ARRAY);
        count += RARRAY_LEN(call.sets[set]);
    }
    int64_t timeout = timeout_ns(argc > 3 ? argv[3] : Qnil);
    struct evt_loop *loop = loop_get(self);

    VALUE buffers[5] = {0};
    call.selection.count = count;
    call.pollfds = ALLOCV_N(struct pollfd, buffers[0], count);
    call.selection.ios = ALLOCV_N(VALUE, buffers[1], count);
    call.selection.fds = ALLOCV_N(int, buffers[2], count);
    call.selection.events = ALLOCV_N(int, buffers[3], count);
    call.selection.waiters = ALLOCV_N(struct evt_waiter, buffers[4], count);
    memset(call.selection.waiters, 0, sizeof(struct evt_waiter) * (size_t)count);
    long i = 0;
    for (int set = 0; set < 3; set++) {
        long length = NIL_P(call.sets[set]) ? 0 : RARRAY_LEN(call.sets[set]);
        for (long j = 0; j < length; j++, i++) {
            VALUE io = rb_io_get_io(RARRAY_AREF(call.sets[set], j));
            call.selection.ios[i] = io;
            call.selection.fds[i] = rb_io_descriptor(io);
            call.selection.events[i] = select_events[set];
            call.pollfds[i] = (struct pollfd){.fd = call.selection.fds[i], .events = (short)select_events[set]};
        }
    }

    VALUE result = select_now(&call);
    int64_t deadline = timeout > 0 ? now_ns() + timeout : timeout;
    while (NIL_P(result) && timeout != 0) {
        struct evt_waiter w;
        waiter_init(&w, rb_fiber_current());
        struct evt_wait wait = {loop, &w, EVT_WAIT_SELECT, Qnil, Qnil, &call.selection, timeout, loop->forks, NULL, Qnil, 0};
        rb_ensure(wait_body, (VALUE)&wait, wait_ensure, (VALUE)&wait);
        result = select_now(&call);
        if (w.result == EVT_TIMED_OUT) break;
        if (deadline > 0 && (timeout = deadline - now_ns()) < 0) timeout = 0;
    }
    for (int b = 0; b < 5; b++) ALLOCV_END(buffers[b]);
    return result;
}

/* ---- timeout_after --------------------------------------------------------------------------- */

struct timeout_call {
    struct evt_loop *loop;
    struct evt_timeout timeout;
};

static VALUE
timeout_yield(VALUE ptr)
{
    return rb_yield(((struct timeout_call *)ptr)->timeout.duration);
}

static VALUE
timeout_cancel(VALUE ptr)
{
    struct timeout_call *call = (struct timeout_call *)ptr;
    evt_timers_remove(&call->loop->timers, &call->timeout.timer); /* nothing when it fired */
    return Qnil;
}

/*
 * timeout_after(duration, exception_class, *arguments) { |duration| ... } -> the block's value
 *
 * Runs the block; if it still runs after +duration+ seconds, raises exception_class.new(*arguments)
 * in the fiber, wherever it waits. A timer on the loop's heap: the block finishing first removes
 * it. Timeouts nest. A negative duration has expired already: the block's first wait raises.
 */
static VALUE
loop_timeout_after(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 2, UNLIMITED_ARGUMENTS);
    rb_need_block();
    /* A negative duration has already expired (the timeout gem of Ruby 3.3 says so without a
     * scheduler; 3.4's refuses it before calling here): the first wait raises. */
    int expired = rb_obj_is_kind_of(argv[0], rb_cNumeric) && RTEST(rb_funcall(argv[0], rb_intern("negative?"), 0));
    int64_t duration = expired ? 0 : timeout_ns(argv[0]);
    struct evt_loop *loop = loop_get(self);
    if (duration < 0) return rb_yield(argv[0]); /* nil: no limit */
    struct timeout_call call = {loop};
    evt_timer_init(&call.timeout.timer, EVT_TIMER_TIMEOUT);
    call.timeout.fiber = rb_fiber_current();
    /* Made now, so a bad class fails here, in the caller, not in the loop when the time is up. */
    call.timeout.exception = rb_make_exception(argc - 1, argv + 1);
    call.timeout.duration = argv[0];
    evt_timers_add(&loop->timers, &call.timeout.timer, now_ns() + duration);
    VALUE result = rb_ensure(timeout_yield, (VALUE)&call, timeout_cancel, (VALUE)&call);
    RB_GC_GUARD(call.timeout.exception);
    return result;
}

/*
 * wait_child_exit(pid) -> true, false or nil
 *
 * Waits in the loop until child +pid+ has exited, leaving it to be reaped: through the backend's
 * own waitid (io_uring, Linux 6.7). true when it exited, false when there is no such child, nil
 * when the backend cannot wait for processes.
 */
static VALUE
loop_wait_child_exit(VALUE self, VALUE pid)
{
    struct evt_loop *loop = loop_get(self);
    if (!loop->backend->transfer) return Qnil;
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    struct evt_op op = {.kind = EVT_OP_WAITID, .fd = NUM2PIDT(pid), .base = &info, .position = -1};
    struct evt_waiter w;
    waiter_init(&w, rb_fiber_current());
    struct evt_wait wait = {loop, &w, EVT_WAIT_OP, Qnil, Qnil, NULL, -1, loop->forks, &op, Qnil, 0};
    rb_ensure(wait_body, (VALUE)&wait, wait_ensure, (VALUE)&wait);
    if (op.result == -ENOTSUP) return Qnil;
    return op.result == 0 ? Qtrue : Qfalse;
}

/*
 * pidfd_open(pid) -> Integer or nil
 *
 * A descriptor that becomes readable when process +pid+ ends (Linux 5.3), or nil where there is none.
 */
static VALUE
loop_pidfd_open(VALUE self, VALUE pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, NUM2PIDT(pid), 0);
    if (fd >= 0) {
        rb_update_max_fd(fd);
        return INT2NUM(fd);
    }
#endif
    return Qnil; /* ENOSYS, ESRCH, EPERM under seccomp...: the caller waits another way */
}


/* Blocks the current fiber until unblock or the timeout: 1 if unblocked, 0 if the time ran out. */
static int
loop_block(struct evt_loop *loop, int64_t timeout)
{
    struct evt_waiter w;
    waiter_init(&w, rb_fiber_current());
    int64_t deadline = timeout >= 0 ? now_ns() + timeout : -1;
    for (;;) {
        int result = loop_suspend(loop, &w, EVT_WAIT_BLOCK, Qnil, Qnil, timeout);
        if (result == 1) return 1;
        if (result == EVT_TIMED_OUT) return 0;
        if (deadline >= 0 && (timeout = deadline - now_ns()) < 0) timeout = 0;
    }
}

/*
 * kernel_sleep(duration = nil) -> nil
 *
 * Sleeps for +duration+ seconds, or until #unblock (nil: no limit). sleep(0) lets the other ready
 * fibers run first.
 */
static VALUE
loop_kernel_sleep(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 0, 1);
    int64_t timeout = argc ? timeout_ns(argv[0]) : -1;
    struct evt_loop *loop = loop_get(self);
    if (timeout == 0) {
        struct evt_waiter w;
        waiter_init(&w, rb_fiber_current());
        loop_suspend(loop, &w, EVT_WAIT_YIELD, Qnil, Qnil, -1);
        return Qnil;
    }
    loop_block(loop, timeout);
    return Qnil;
}

/*
 * block(blocker, timeout = nil) -> true or false
 *
 * Blocks the current fiber until #unblock (true) or until +timeout+ seconds have passed (false).
 */
static VALUE
loop_block_m(int argc, VALUE *argv, VALUE self)
{
    rb_check_arity(argc, 1, 2);
    int64_t timeout = argc > 1 ? timeout_ns(argv[1]) : -1;
    return loop_block(loop_get(self), timeout) ? Qtrue : Qfalse;
}

/*
 * unblock(blocker, fiber) -> nil
 *
 * Wakes +fiber+ from #block or #kernel_sleep. Safe from any thread: wakes the loop if it is
 * waiting in the kernel, and costs no system call otherwise.
 */
static VALUE
loop_unblock(VALUE self, VALUE blocker, VALUE fiber)
{
    struct evt_loop *loop = loop_check(self);
    st_data_t value;
    if (st_lookup(loop->unblockable, (st_data_t)fiber, &value)) waiter_wake(loop, (struct evt_waiter *)value, 1);
    if (__atomic_load_n(&loop->blocked, __ATOMIC_SEQ_CST) && loop->backend_data) loop->backend->wakeup(loop);
    return Qnil;
}

static int
fiber_blocking_p(VALUE fiber)
{
    return RTEST(rb_funcall(fiber, id_blocking_p, 0));
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
    struct evt_loop *loop = loop_get(self);
    VALUE current = rb_fiber_current();
    if (current == loop->loop_fiber) {
        switch_to(loop, fiber, 1);
    }
    else {
        struct evt_waiter w;
        waiter_init(&w, current);
        loop_suspend(loop, &w, EVT_WAIT_START, Qnil, fiber, -1);
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
    loop_check(self)->current = rb_fiber_current();
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
    struct evt_loop *loop = loop_get(self);
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
    rb_set_errinfo(errinfo);
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
    struct evt_loop *loop = loop_check(self);
    if (__atomic_load_n(&loop->blocked, __ATOMIC_SEQ_CST) && loop->backend_data) loop->backend->wakeup(loop);
    return Qnil;
}

static VALUE
loop_backend(VALUE self)
{
    return ID2SYM(rb_intern(loop_check(self)->backend->name));
}

static VALUE
loop_closed_p(VALUE self)
{
    return loop_check(self)->backend_data ? Qfalse : Qtrue;
}

/* The number of fibers suspended in the loop. */
static VALUE
loop_waiting(VALUE self)
{
    return SIZET2NUM(loop_check(self)->waiting);
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
    struct evt_loop *loop = loop_check(self);
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
    eFiberError = rb_const_get(rb_cObject, rb_intern("FiberError"));
    rb_gc_register_address(&cBasicSocket);
    pthread_atfork(NULL, NULL, evt_atfork_child);

    evt_cLoop = rb_define_class_under(mEvt, "Loop", rb_cObject);
    rb_define_alloc_func(evt_cLoop, loop_alloc);
    rb_define_singleton_method(evt_cLoop, "backends", loop_s_backends, 0);
    rb_define_singleton_method(evt_cLoop, "probe", loop_s_probe, 1);
    rb_define_method(evt_cLoop, "initialize", loop_initialize, 1);

    rb_define_method(evt_cLoop, "io_wait", loop_io_wait, 3);
    rb_define_method(evt_cLoop, "io_read", loop_io_read, 4);
    rb_define_method(evt_cLoop, "io_write", loop_io_write, 4);
    rb_define_method(evt_cLoop, "kernel_sleep", loop_kernel_sleep, -1);
    rb_define_method(evt_cLoop, "block", loop_block_m, -1);
    rb_define_method(evt_cLoop, "unblock", loop_unblock, 2);
    rb_define_method(evt_cLoop, "io_pread", loop_io_pread, 5);
    rb_define_method(evt_cLoop, "io_pwrite", loop_io_pwrite, 5);
    rb_define_method(evt_cLoop, "io_select", loop_io_select, -1);
    rb_define_method(evt_cLoop, "timeout_after", loop_timeout_after, -1);

    rb_define_method(evt_cLoop, "run", loop_run_m, 0);
    rb_define_method(evt_cLoop, "scheduler_close", loop_scheduler_close, 0);
    rb_define_method(evt_cLoop, "wakeup", loop_wakeup, 0);
    rb_define_method(evt_cLoop, "backend", loop_backend, 0);
    rb_define_method(evt_cLoop, "closed?", loop_closed_p, 0);
    rb_define_method(evt_cLoop, "waiting", loop_waiting, 0);

    rb_define_private_method(evt_cLoop, "start", loop_start, 1);
    rb_define_private_method(evt_cLoop, "started", loop_started, 0);
    rb_define_private_method(evt_cLoop, "pidfd_open", loop_pidfd_open, 1);
    rb_define_private_method(evt_cLoop, "wait_child_exit", loop_wait_child_exit, 1);
    rb_define_private_method(evt_cLoop, "close_backend", loop_close_backend_m, 0);
    rb_define_private_method(evt_cLoop, "suspended_fibers", loop_fibers, 0);
}
