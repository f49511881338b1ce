/* Evt::Loop as Ruby sees it, besides the hooks (hooks.c): making one, running it, closing it,
 * starting fibers, and what it tells about itself; the backends this build has; Init_evt.
 *
 * The API documentation (YARD) of Evt::Loop's public methods, these and io.c's and hooks.c's, is
 * the @!parse block for Evt::Loop in lib/evt.rb: a public method added, renamed or removed here
 * goes there too (test/yard_test.rb compares the two). */
#include "core.h"
#include "object.h"
#include "requests.h"
#include "loop.h"
#include "wait.h"
#include "hooks.h"
#include "insight.h"
#include "closers.h"
#include "selector.h"
#include "socket_write.h"
#include "blocking.h"

static ID id_blocking_p;
static VALUE eFiberError;

static const struct evt_backend *const evt_backends[] = {
#if defined(HAVE_KQUEUE) && !defined(__linux__)
    &evt_backend_kqueue, /* macOS, the BSDs: the kernel's own */
#endif
#ifdef HAVE_LIBURING_H
    &evt_backend_uring,
#endif
#ifdef HAVE_SYS_EPOLL_H
    &evt_backend_epoll,
#endif
#ifdef HAVE_POLL_H
    &evt_backend_poll,
#endif
#if defined(__linux__) && defined(HAVE_SYS_SELECT_H)
    &evt_backend_select, /* slowest: a wait costs in proportion to the highest descriptor */
#endif
#if defined(HAVE_KQUEUE) && defined(__linux__)
    &evt_backend_kqueue, /* libkqueue, an emulation over epoll: there to test the backend, never the default */
#endif
    NULL,
};

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
    struct evt_loop *loop = evt_object_of(loop_value);
    loop->launch.error = error;
    return rb_fiber_transfer(loop->launch.caller, 0, NULL);
}

static VALUE
launcher_body(RB_BLOCK_CALL_FUNC_ARGLIST(unused, loop_value))
{
    struct evt_loop *loop = evt_object_of(loop_value);
    VALUE target = rb_fiber_transfer(loop->launch.caller, 0, NULL); /* made: wait for the first launch */
    for (;;) target = rb_rescue2(launcher_switch, target, launcher_failed, loop_value, eFiberError, 0);
    UNREACHABLE_RETURN(Qnil);
}

/* Starts fiber from the loop fiber; raises the FiberError of a fiber that cannot start. Control
 * comes back when the new fiber waits or ends. */
static void
launch(struct evt_loop *loop, VALUE fiber)
{
    loop->launch.caller = rb_fiber_current();
    if (NIL_P(loop->launch.fiber)) {
        VALUE launcher = rb_fiber_new(launcher_body, loop->self);
        rb_fiber_transfer(launcher, 0, NULL); /* it comes straight back, ready */
        loop->launch.fiber = launcher;
    }
    loop->launch.error = Qnil;
    /* Not known to run until it says so (started): starting can fail before it does. */
    loop->current = Qnil;
    evt_core_beat(loop, loop->loop_fiber);
    rb_fiber_transfer(loop->launch.fiber, 1, &fiber);
    evt_core_beat(loop, NIL_P(loop->current) ? fiber : loop->current);
    loop->current = loop->loop_fiber;
    loop->launch.caller = Qnil;
    if (RB_UNLIKELY(loop->early_unblock == fiber)) loop->early_unblock = Qnil; /* it ended without waiting */
    VALUE error = loop->launch.error;
    loop->launch.error = Qnil;
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
    struct evt_loop *loop = evt_object_get(self);
    VALUE current = rb_fiber_current();
    if (current == loop->loop_fiber) {
        launch(loop, fiber);
    }
    else {
        struct evt_wait wait;
        evt_wait_start(&wait, loop, fiber);
        evt_wait_suspend(&wait);
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
    evt_object_check(self)->current = rb_fiber_current();
    return Qnil;
}

/* Evt::Loop#run (documented in lib/evt.rb). */
static VALUE
loop_run_m(VALUE self)
{
    struct evt_loop *loop = evt_object_get(self);
    VALUE current = rb_fiber_current();
    if (current != loop->loop_fiber) {
        if (loop->running) rb_raise(eFiberError, "evt: the loop is already running on another fiber");
        if (!fiber_blocking_p(current))
            rb_raise(eFiberError, "evt: the loop runs on a blocking fiber (the one that drives the scheduler), "
                                     "not inside a scheduled fiber");
        loop->loop_fiber = current;
    }
    struct evt_run run = {.mode = EVT_RUN_DEFAULT, .timeout = -1};
    evt_loop_run(loop, &run);
    return self;
}

/* Evt::Loop#scheduler_close (documented in lib/evt.rb): keeps $! as it found it: the exception ending
 * a thread must not be lost. */
static VALUE
loop_scheduler_close(VALUE self)
{
    struct evt_loop *loop = evt_object_owned(self);
    VALUE current = rb_fiber_current();
    if (current != loop->loop_fiber && (loop->running || !fiber_blocking_p(current)))
        rb_raise(eFiberError, "evt: a scheduler is closed from the blocking fiber that drives it, "
                              "not from inside a scheduled fiber");
    VALUE errinfo = rb_errinfo();
    int state = 0;
    rb_protect(loop_run_m, self, &state);
    evt_object_close_backend(loop);
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
    struct evt_loop *loop = evt_object_owned(self);
    if (loop->running) rb_raise(eFiberError, "evt: the loop is running: it closes when it is done");
    evt_object_close_backend(loop);
    return Qnil;
}

/* Evt::Loop#wakeup (documented in lib/evt.rb). */
static VALUE
loop_wakeup(VALUE self)
{
    struct evt_loop *loop = evt_object_check(self);
    evt_core_wake(loop);
    return Qnil;
}

/* Evt::Loop#backend (documented in lib/evt.rb). */
static VALUE
loop_backend(VALUE self)
{
    return ID2SYM(rb_intern(evt_object_check(self)->kernel.backend->name));
}

/* Evt::Loop#closed? (documented in lib/evt.rb). */
static VALUE
loop_closed_p(VALUE self)
{
    return evt_object_check(self)->kernel.data ? Qfalse : Qtrue;
}

/* Evt::Loop#waiting (documented in lib/evt.rb). */
static VALUE
loop_waiting(VALUE self)
{
    return SIZET2NUM(evt_object_check(self)->waiting);
}

static int
collect_fiber(struct evt_waiter *w, void *set)
{
    rb_hash_aset((VALUE)set, w->fiber, Qtrue);
    return 0;
}

/* The fibers suspended in the loop, for tearing it down. */
static VALUE
loop_fibers(VALUE self)
{
    struct evt_loop *loop = evt_object_check(self);
    VALUE set = rb_hash_new();
    evt_object_each_waiter(loop, collect_fiber, (void *)set);
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

/* Evt::Loop#initialize (documented in lib/evt.rb). */
static VALUE
loop_initialize(VALUE self, VALUE name)
{
    struct evt_loop *loop = evt_object_of(self);
    if (loop->kernel.backend) rb_raise(rb_eRuntimeError, "evt: loop already initialized");
    const struct evt_backend *backend = backend_named(name);
    if (!backend) rb_raise(rb_eArgError, "evt: unknown backend %" PRIsVALUE, rb_inspect(name));
    const char *reason = backend->probe();
    if (reason) rb_raise(rb_eArgError, "evt: the %s backend cannot run here: %s", backend->name, reason);
    loop->kernel.backend = backend;
    loop->loop_fiber = loop->current = rb_fiber_current();
    loop->thread = rb_thread_current();
    evt_object_open(loop);
    return self;
}

/* Evt::Loop.backends (documented in lib/evt.rb). */
static VALUE
loop_s_backends(VALUE klass)
{
    VALUE names = rb_ary_new();
    for (const struct evt_backend *const *b = evt_backends; *b; b++) rb_ary_push(names, ID2SYM(rb_intern((*b)->name)));
    return names;
}

/* Evt::Loop.probe (documented in lib/evt.rb). */
static VALUE
loop_s_probe(VALUE klass, VALUE name)
{
    const struct evt_backend *backend = backend_named(name);
    if (!backend) return rb_str_new_cstr("unknown backend");
    const char *reason = backend->probe();
    return reason ? rb_str_new_cstr(reason) : Qnil;
}

/* Evt::Loop.emulation (documented in lib/evt.rb). */
static VALUE
loop_s_emulation(VALUE klass, VALUE name)
{
    const struct evt_backend *backend = backend_named(name);
    return backend && backend->emulation ? rb_str_new_cstr(backend->emulation) : Qnil;
}

/*
 * Evt::Loop.close_kept -> Integer (private)
 *
 * Closes the kernel objects backends keep between loops for reuse (the kqueue backend's on Linux:
 * libkqueue cannot close kqueues safely while other threads open them): the number closed. For a
 * caller that knows no other thread is opening a loop meanwhile (the tests' descriptor counts).
 */
static VALUE
loop_s_close_kept(VALUE klass)
{
    int closed = 0;
    for (const struct evt_backend *const *b = evt_backends; *b; b++)
        if ((*b)->close_kept) closed += (*b)->close_kept();
    return INT2NUM(closed);
}

RUBY_FUNC_EXPORTED void
Init_evt(void)
{
    /* Every Ractor may call what follows (see object.c for the state Ractors share). */
    rb_ext_ractor_safe(true);
    id_blocking_p = rb_intern("blocking?");
    eFiberError = rb_const_get(rb_cObject, rb_intern("FiberError"));
    VALUE mEvt = rb_define_module("Evt");
    evt_object_init(mEvt);
    evt_requests_init();
    evt_loop_init();
    evt_wait_init();

    rb_define_singleton_method(evt_object_class, "backends", loop_s_backends, 0);
    rb_define_singleton_method(evt_object_class, "probe", loop_s_probe, 1);
    rb_define_singleton_method(evt_object_class, "emulation", loop_s_emulation, 1);
    rb_define_private_method(rb_singleton_class(evt_object_class), "close_kept", loop_s_close_kept, 0);
    rb_define_method(evt_object_class, "initialize", loop_initialize, 1);
    rb_define_method(evt_object_class, "run", loop_run_m, 0);
    rb_define_method(evt_object_class, "scheduler_close", loop_scheduler_close, 0);
    rb_define_method(evt_object_class, "wakeup", loop_wakeup, 0);
    rb_define_method(evt_object_class, "backend", loop_backend, 0);
    rb_define_method(evt_object_class, "closed?", loop_closed_p, 0);
    rb_define_method(evt_object_class, "waiting", loop_waiting, 0);
    rb_define_private_method(evt_object_class, "start", loop_start, 1);
    rb_define_private_method(evt_object_class, "started", loop_started, 0);
    rb_define_private_method(evt_object_class, "close_backend", loop_close_backend_m, 0);
    rb_define_private_method(evt_object_class, "suspended_fibers", loop_fibers, 0);

    evt_hooks_init(evt_object_class);
    evt_insight_init(evt_object_class);
    evt_closers_init(mEvt);
    evt_selector_init(mEvt);
    evt_socket_write_init(mEvt);
    evt_blocking_init(mEvt);
}
