/* The loop object: its memory and what the GC sees of it, its kernel objects (opened, closed,
 * inherited by a fork), the thread it belongs to, and the process's list of loops. The run loop is
 * in loop.c; what Ruby calls on Evt::Loop, in evt.c (the hooks in hooks.c). */
#include "core.h"
#include "registration.h"
#include "object.h"

#include <pthread.h>
#include <string.h>

#include <ruby/ractor.h>
#include <ruby/version.h>

/* Every loop of the process, for IO#close to look through (one per thread that has a scheduler).
 * Each Ractor has its own GVL, and the GC frees a loop on whichever thread sweeps, so the list is
 * changed and read under its own lock, and nothing done under it calls Ruby or allocates from
 * Ruby's heap (a GC there could wait for the lock this thread holds). Only a loop's own Ractor
 * reads the rest of it: a Ractor's IOs and fibers are its own. */
static struct evt_list evt_loops = {&evt_loops, &evt_loops};
static pthread_mutex_t loops_lock = PTHREAD_MUTEX_INITIALIZER;

static void
loops_enter(void)
{
    int err = pthread_mutex_lock(&loops_lock);
    if (err) rb_bug("evt: locking the list of loops: %s", strerror(err));
}

static void
loops_leave(void)
{
    int err = pthread_mutex_unlock(&loops_lock);
    if (err) rb_bug("evt: unlocking the list of loops: %s", strerror(err));
}

/* Each Ractor's serial number, in its local storage (as the pointer itself: nothing to free). */
static const struct rb_ractor_local_storage_type ractor_serial_type = {NULL, NULL};
static rb_ractor_local_key_t ractor_serial_key;
static unsigned long ractor_serials; /* under loops_lock */

unsigned long
evt_object_ractor_serial(void)
{
    unsigned long serial = (unsigned long)(uintptr_t)rb_ractor_local_storage_ptr(ractor_serial_key);
    if (RB_LIKELY(serial)) return serial;
    loops_enter();
    serial = ++ractor_serials;
    loops_leave();
    rb_ractor_local_storage_ptr_set(ractor_serial_key, (void *)(uintptr_t)serial);
    return serial;
}

#if RUBY_API_VERSION_MAJOR < 4
/* Ruby 3.3 and 3.4 crash when fibers run in two Ractors at once (ruby/ruby#13466, fixed in Ruby
 * 4.0): only one Ractor at a time may have open loops. Which one, and how many it has open (under
 * loops_lock); a loop of another Ractor that opens meanwhile raises Evt::RactorError instead. */
static unsigned long claim_ractor;
static long claim_open;
static VALUE eRactorError;

static void
claim(void)
{
    unsigned long ractor = evt_object_ractor_serial();
    loops_enter();
    int refused = claim_open > 0 && claim_ractor != ractor;
    if (!refused) {
        claim_ractor = ractor;
        claim_open++;
    }
    loops_leave();
    if (refused)
        rb_raise(eRactorError, "evt: a loop of another Ractor is open, and Ruby %d.%d crashes when fibers run in two Ractors "
                               "at once (ruby/ruby#13466, fixed in Ruby 4.0): one Ractor at a time runs evt here; "
                               "this one may once the other's loops are closed", RUBY_API_VERSION_MAJOR, RUBY_API_VERSION_MINOR);
}

static void
unclaim(void)
{
    loops_enter();
    claim_open--;
    loops_leave();
}
#else
static void claim(void) {}
static void unclaim(void) {}
#endif

static unsigned long visits; /* under loops_lock */

struct visit {
    struct evt_loop *loop;
    void (*visit)(struct evt_loop *, void *);
    void *arg;
};

static void loop_release(struct evt_loop *loop);

static VALUE
visit_body(VALUE ptr)
{
    struct visit *v = (struct visit *)ptr;
    if (!v->loop->listing.swept) v->visit(v->loop, v->arg);
    return Qnil;
}

static VALUE
visit_end(VALUE ptr)
{
    struct evt_loop *loop = ((struct visit *)ptr)->loop;
    loops_enter();
    int release = --loop->listing.pins == 0 && loop->listing.swept;
    loops_leave();
    if (release) loop_release(loop);
    return Qnil;
}

void
evt_object_each_in_ractor(int (*wanted)(struct evt_loop *, void *), void (*visit)(struct evt_loop *, void *), void *arg)
{
    unsigned long ractor = evt_object_ractor_serial(), round = 0;
    for (;;) {
        /* From the start each time: the visit may let the list change (other threads run, the GC
         * sweeps); `visited` says which loops this call has looked at. */
        struct visit v = {NULL, visit, arg};
        loops_enter();
        if (!round) round = ++visits;
        for (struct evt_list *node = evt_loops.next; node != &evt_loops; node = node->next) {
            struct evt_loop *loop = evt_container_of(node, struct evt_loop, listing.link);
            if (loop->listing.ractor != ractor || loop->listing.visited == round) continue;
            loop->listing.visited = round;
            if (!wanted(loop, arg)) continue;
            loop->listing.pins++;
            v.loop = loop;
            break;
        }
        loops_leave();
        if (!v.loop) return;
        rb_ensure(visit_body, (VALUE)&v, visit_end, (VALUE)&v);
    }
}

/* Counts forks: every child increments it at once, so a loop can tell it was inherited. */
volatile unsigned evt_object_forks;
VALUE evt_object_class;

/* The list's lock is held across fork(2), so the child's is never left locked by a thread the
 * child does not have. */
static void
evt_atfork_prepare(void)
{
    loops_enter();
}

static void
evt_atfork_parent(void)
{
    loops_leave();
}

static void
evt_atfork_child(void)
{
    evt_object_forks++;
    loops_leave();
}

/* ---- every waiter -------------------------------------------------------------------------------
 *
 * The one walk over every waiter the loop holds, wherever it is: the ready queue and this turn's
 * dispatched list, the transfers the backend does, the timers, the descriptors' registrations and
 * the unblockable table. A waiter in several of them (a registration and a timer) is visited once
 * for each: `visit` must not mind. The GC's mark, the list of suspended fibers and the search for
 * a transfer still in the kernel all walk it. */

struct each_waiter {
    int (*visit)(struct evt_waiter *, void *);
    void *arg;
    int stopped;
};

static int
visit_unblockable(st_data_t key, st_data_t value, st_data_t ptr)
{
    struct each_waiter *each = (struct each_waiter *)ptr;
    if (each->visit((struct evt_waiter *)value, each->arg)) {
        each->stopped = 1;
        return ST_STOP;
    }
    return ST_CONTINUE;
}

int
evt_object_each_waiter(struct evt_loop *loop, int (*visit)(struct evt_waiter *, void *), void *arg)
{
#define VISIT(w)                                                                                   \
    do {                                                                                           \
        if (visit((w), arg)) return 1;                                                             \
    } while (0)
    EACH_WAITER(&loop->ready, ready_link, w) VISIT(w);
    EACH_WAITER(&loop->selector.dispatched, ready_link, w) VISIT(w);
    EACH_WAITER(&loop->operations, io_link, w) VISIT(w);
    for (size_t i = 0; i < loop->timers.size; i++) {
        struct evt_timer *timer = loop->timers.heap[i];
        if (timer->kind == EVT_TIMER_WAITER) VISIT(evt_container_of(timer, struct evt_waiter, timer));
    }
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg) EACH_WAITER(&reg->waiters, io_link, w) VISIT(w);
    }
#undef VISIT
    if (!loop->unblockable) return 0;
    struct each_waiter each = {visit, arg, 0};
    st_foreach(loop->unblockable, visit_unblockable, (st_data_t)&each);
    return each.stopped;
}

static int
mark_waiter(struct evt_waiter *w, void *arg)
{
    (void)arg;
    rb_gc_mark(w->fiber);
    return 0;
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
    rb_gc_mark_movable(loop->requests.list);
    rb_gc_mark_movable(loop->requests.spare);
    rb_gc_mark_movable(loop->requests.resumes);
    rb_gc_mark(loop->early_unblock);
    rb_gc_mark(loop->launch.fiber);
    rb_gc_mark(loop->launch.caller);
    rb_gc_mark(loop->launch.error);
    rb_gc_mark(loop->stall.ended_fiber);
    evt_object_each_waiter(loop, mark_waiter, NULL);
    for (size_t i = 0; i < loop->timers.size; i++) {
        struct evt_timer *timer = loop->timers.heap[i];
        if (timer->kind != EVT_TIMER_TIMEOUT) continue;
        struct evt_timeout *timeout = evt_container_of(timer, struct evt_timeout, timer);
        rb_gc_mark(timeout->fiber);
        rb_gc_mark(timeout->exception);
    }
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        if (!NIL_P(reg->closing)) {
            if (evt_rubyio_closed(reg->closing)) reg->closing = Qnil; /* Ruby's own checks see it now */
            else rb_gc_mark_movable(reg->closing);
        }
        if (evt_list_empty(&reg->waiters)) {
            reg->io = Qnil;
            continue;
        }
        rb_gc_mark_movable(reg->io);
    }
}

static void
loop_compact(void *ptr)
{
    struct evt_loop *loop = ptr;
    loop->self = rb_gc_location(loop->self);
    loop->loop_fiber = rb_gc_location(loop->loop_fiber);
    loop->current = rb_gc_location(loop->current);
    loop->thread = rb_gc_location(loop->thread);
    loop->requests.list = rb_gc_location(loop->requests.list);
    loop->requests.spare = rb_gc_location(loop->requests.spare);
    loop->requests.resumes = rb_gc_location(loop->requests.resumes);
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        reg->io = rb_gc_location(reg->io);
        reg->closing = rb_gc_location(reg->closing);
    }
}

static int
find_pending_op(struct evt_waiter *w, void *found)
{
    if (!w->op || !w->op->pending) return 0;
    *(struct evt_op **)found = w->op;
    return 1;
}

/* A transfer still in the kernel, or NULL. */
static struct evt_op *
pending_op(struct evt_loop *loop)
{
    struct evt_op *op = NULL;
    evt_object_each_waiter(loop, find_pending_op, &op);
    return op;
}

void
evt_object_close_backend(struct evt_loop *loop)
{
    if (!loop->kernel.data) return;
    /* Closing a ring does not wait for what is in it: every transfer still there is cancelled and
     * reaped first (its fiber wakes), so nothing is written into its memory afterwards. Not in a
     * forked child, where they are the parent's, in the parent's memory. */
    struct evt_op *op;
    while (loop->kernel.ops && loop->forks == evt_object_forks && (op = pending_op(loop))) loop->kernel.backend->cancel(&loop->kernel, op);
    loop->kernel.backend->close(&loop->kernel);
    loop->kernel.data = NULL;
    unclaim();
    evt_timers_restore_slack(&loop->timers);
    evt_wakeup_close(&loop->kernel.wakeup);
    /* Whatever the kernel knew is gone with its objects. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        reg->armed = 0;
        evt_backend_slot_clear(&reg->watch.slot);
    }
}

/* The GC frees the loop; a visit under way (evt_object_each_in_ractor) frees it when it is over. */
static void
loop_free(void *ptr)
{
    struct evt_loop *loop = ptr;
    loops_enter();
    evt_list_remove(&loop->listing.link);
    int visited = loop->listing.pins > 0;
    if (visited) loop->listing.swept = 1;
    loops_leave();
    if (!visited) loop_release(loop);
}

static void
loop_release(struct evt_loop *loop)
{
    evt_object_close_backend(loop);
    /* Only the heap waiters: the others live on fiber stacks that may already be gone. */
    EACH_WAITER(&loop->allocated, io_link, w) ruby_xfree(w);
    EACH_WAITER(&loop->selector.spare, io_link, w) ruby_xfree(w);
    for (int fd = 0; fd < loop->registrations_size; fd++) ruby_xfree(loop->registrations[fd]);
    ruby_xfree(loop->registrations);
    evt_timers_free(&loop->timers);
    if (loop->unblockable) st_free_table(loop->unblockable);
    ruby_xfree(loop->kernel.fired);
    ruby_xfree(loop);
}

static size_t
loop_memsize(const void *ptr)
{
    const struct evt_loop *loop = ptr;
    size_t size = sizeof(*loop) + loop->timers.capacity * sizeof(struct evt_timer *);
    size += (size_t)loop->kernel.fired_capacity * sizeof(struct evt_fired);
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
    loops_enter();
    for (struct evt_list *node = evt_loops.next; node != &evt_loops; node = node->next) {
        struct evt_loop *loop = evt_container_of(node, struct evt_loop, listing.link);
        if (loop->kernel.ops) rb_gc_mark(loop->self);
    }
    loops_leave();
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

VALUE
evt_object_alloc(VALUE klass)
{
    struct evt_loop *loop;
    VALUE self = TypedData_Make_Struct(klass, struct evt_loop, &loop_type, loop);
    loop->self = self;
    loop->loop_fiber = Qnil;
    loop->current = Qnil;
    loop->thread = Qnil;
    loop->requests.list = loop->requests.spare = loop->requests.resumes = Qnil;
    loop->early_unblock = Qnil;
    loop->launch.fiber = loop->launch.caller = loop->launch.error = Qnil;
    loop->listing.ractor = evt_object_ractor_serial();
    loops_enter();
    evt_list_append(&evt_loops, &loop->listing.link);
    loops_leave();
    evt_list_init(&loop->ready);
    evt_list_init(&loop->selector.dispatched);
    loop->first_budget = EVT_FIRST_MIN;
    evt_list_init(&loop->selector.spare);
    evt_list_init(&loop->allocated);
    evt_list_init(&loop->operations);
    evt_timers_init(&loop->timers);
    loop->unblockable = st_init_numtable();
    loop->kernel.wakeup.read_fd = loop->kernel.wakeup.write_fd = -1;
    loop->kernel.fired_capacity = EVT_FIRED_INITIAL;
    loop->kernel.fired = ALLOC_N(struct evt_fired, loop->kernel.fired_capacity);
    loop->forks = evt_object_forks;
    loop->stats.made_ns = loop->stats.clock_ns = evt_timers_now();
    loop->stall.ended_fiber = Qnil;
    return self;
}

void
evt_object_open(struct evt_loop *loop)
{
    claim();
    int err = evt_wakeup_open(&loop->kernel.wakeup);
    if (err == 0 && (err = loop->kernel.backend->open(&loop->kernel)) < 0) evt_wakeup_close(&loop->kernel.wakeup);
    if (err < 0) {
        unclaim();
        rb_syserr_fail_str(-err, rb_sprintf("evt: opening the %s backend", loop->kernel.backend->name));
    }
    loop->forks = evt_object_forks;
    /* After a close with fibers still waiting, the new kernel objects must watch for them too. */
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (reg && reg->watch.events) evt_registration_arm(loop, fd, reg);
    }
}

/* Lets go of every fiber suspended in the loop: none of them will be resumed by it (a forked child,
 * where they are the parent's; a selector closed under them). Their waiters, on their stacks, stay
 * as they are: the epoch tells their ensure the loop has forgotten them, so nothing here or there
 * touches the other. The kernel objects must be closed first (their operations reaped). */
void
evt_object_forget(struct evt_loop *loop)
{
    EACH_WAITER(&loop->allocated, io_link, w) ruby_xfree(w);
    evt_list_init(&loop->allocated);
    evt_list_init(&loop->operations);
    evt_list_init(&loop->ready);
    evt_list_init(&loop->selector.dispatched);
    loop->first_budget = EVT_FIRST_MIN;
    loop->ready_count = 0;
    loop->selector.dispatching = 0;
    loop->stats.timers_cleared += loop->timers.next_sequence;
    evt_timers_clear(&loop->timers);
    st_clear(loop->unblockable);
    loop->early_unblock = Qnil;
    for (int fd = 0; fd < loop->registrations_size; fd++) {
        struct evt_registration *reg = loop->registrations[fd];
        if (!reg) continue;
        evt_list_init(&reg->waiters);
        reg->io = Qnil;
        reg->closing = Qnil;
        reg->watch.events = 0;
        reg->counts[0] = reg->counts[1] = reg->counts[2] = 0;
    }
    loop->waiting = 0;
    loop->epoch++;
}

/* In a forked child: the kernel objects are the parent's, and so are the fibers waiting in them.
 * Like the parent's other threads, those fibers do not go on in the child; the forking fiber,
 * which Ruby made the child's root fiber, now drives the loop. */
static void
loop_after_fork(struct evt_loop *loop)
{
    evt_object_close_backend(loop);
    loop->kernel.ops = 0; /* the parent's, in the parent's ring */
    evt_object_forget(loop);
    loop->requests.list = loop->requests.resumes = Qnil; /* the other threads are not in the child */
    loop->requests.pending = loop->requests.counting = 0;
    loop->launch.fiber = Qnil; /* perhaps another thread's, which the child has not */
    loop->kernel.blocked = 0;
    loop->kernel.woken = 0;
    loop->running = 0;
    loop->loop_fiber = loop->current = rb_fiber_current();
    loop->thread = rb_thread_current();
    loop->forks = evt_object_forks;
    if (loop->selector.driven) loop->finished = 1; /* driven by its loop fiber's loop, which the child has not */
}

/* The loop, after any fork; the kernel objects may still be closed. */
struct evt_loop *
evt_object_check(VALUE self)
{
    struct evt_loop *loop = evt_object_of(self);
    if (RB_UNLIKELY(!loop->kernel.backend)) rb_raise(rb_eRuntimeError, "evt: the scheduler is not initialized");
    if (RB_UNLIKELY(loop->forks != evt_object_forks)) loop_after_fork(loop);
    return loop;
}

/* The loop, for its own thread. A scheduler belongs to one thread; an idle one (no fiber waits in
 * it) moves to the thread that uses it next, as when it is made in one thread and set in another. */
struct evt_loop *
evt_object_owned(VALUE self)
{
    struct evt_loop *loop = evt_object_check(self);
    VALUE thread = rb_thread_current();
    if (RB_UNLIKELY(thread != loop->thread)) {
        if (loop->selector.driven) rb_raise(rb_eThreadError, "evt: this selector belongs to another thread (its loop fiber's)");
        if (loop->waiting || loop->running)
            rb_raise(rb_eThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it");
        loop->thread = thread;
        loop->loop_fiber = loop->current = rb_fiber_current();
        loop->launch.fiber = Qnil; /* a fiber belongs to its thread */
        evt_object_close_backend(loop); /* reopened by the new thread: a ring may take one submitter only */
    }
    return loop;
}

/* The loop, ready to use by its thread: a closed one opens again. */
struct evt_loop *
evt_object_get(VALUE self)
{
    struct evt_loop *loop = evt_object_owned(self);
    if (RB_UNLIKELY(!loop->kernel.data)) evt_object_open(loop);
    return loop;
}

/* The loop of an Evt::Loop, as it is (not initialized, or inherited by a fork). */
struct evt_loop *
evt_object_of(VALUE self)
{
    return rb_check_typeddata(self, &loop_type);
}

void
evt_object_init(VALUE mEvt)
{
    evt_object_class = rb_define_class_under(mEvt, "Loop", rb_cObject);
    rb_define_alloc_func(evt_object_class, evt_object_alloc);
    ractor_serial_key = rb_ractor_local_storage_ptr_newkey(&ractor_serial_type);
#if RUBY_API_VERSION_MAJOR < 4
    eRactorError = rb_define_class_under(mEvt, "RactorError", rb_eRuntimeError);
    rb_gc_register_address(&eRactorError);
#endif
    rb_gc_register_address(&loop_registry);
    loop_registry = TypedData_Wrap_Struct(0, &loop_registry_type, NULL);
    int err = pthread_atfork(evt_atfork_prepare, evt_atfork_parent, evt_atfork_child);
    if (err) rb_syserr_fail(err, "evt: pthread_atfork");
}
