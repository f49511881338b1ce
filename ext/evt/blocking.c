/* Ruby 4.0's BlockingOperation, for Evt::BlockingPool (lib/evt/blocking_pool.rb): the C function Ruby
 * hands blocking_operation_wait, run on a worker thread without the GVL, and cancelled from the loop's
 * thread through Ruby's own C API (extract, execute, cancel), whose atomic state says at once
 * whether the operation ran, runs or never will. Ruby 3.4 hands a Proc instead, which the pool calls.
 * Nothing here knows the loop. */
#include <ruby.h>
#include <ruby/thread.h>

#ifdef HAVE_RB_FIBER_SCHEDULER_BLOCKING_OPERATION_EXTRACT
#include <ruby/fiber/scheduler.h>

static void *
execute_without_gvl(void *operation)
{
    return (void *)(intptr_t)rb_fiber_scheduler_blocking_operation_execute(operation);
}

/* An interrupt of the worker thread (the pool closing, the process ending) cancels the operation:
 * Ruby calls its own unblock function, and the function returns early. */
static void
cancel_from_interrupt(void *operation)
{
    rb_fiber_scheduler_blocking_operation_cancel(operation);
}

/*
 * Evt::BlockingOperation.execute(operation) -> true or false
 *
 * Runs +operation+ (a Fiber::Scheduler::BlockingOperation) here, without the GVL: true when it ran
 * to its end, false when it was cancelled before it started or while it ran.
 */
static VALUE
blocking_execute(VALUE self, VALUE operation)
{
    rb_fiber_scheduler_blocking_operation_t *op = rb_fiber_scheduler_blocking_operation_extract(operation);
    intptr_t result = (intptr_t)rb_thread_call_without_gvl(execute_without_gvl, op, cancel_from_interrupt, op);
    RB_GC_GUARD(operation);
    return result == 0 ? Qtrue : Qfalse;
}

/*
 * Evt::BlockingOperation.cancel(operation) -> true or false
 *
 * From any thread: +operation+ will not start if it has not, and is told to stop (its unblock
 * function) if it runs; true in that last case, when whoever runs it must still be waited for.
 */
static VALUE
blocking_cancel(VALUE self, VALUE operation)
{
    return rb_fiber_scheduler_blocking_operation_cancel(rb_fiber_scheduler_blocking_operation_extract(operation)) == 1
               ? Qtrue
               : Qfalse;
}
#endif

void
evt_blocking_init(VALUE mEvt)
{
#ifdef HAVE_RB_FIBER_SCHEDULER_BLOCKING_OPERATION_EXTRACT
    VALUE mBlocking = rb_define_module_under(mEvt, "BlockingOperation");
    rb_define_singleton_method(mBlocking, "execute", blocking_execute, 1);
    rb_define_singleton_method(mBlocking, "cancel", blocking_cancel, 1);
#endif
}
