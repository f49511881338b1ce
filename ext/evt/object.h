/* The loop object (object.c): memory, GC, kernel objects, fork, owner thread, the list of loops. */
#ifndef EVT_OBJECT_H
#define EVT_OBJECT_H

#include "core.h"

/* Forks of this process so far: a loop made before the last one is the parent's. */
extern volatile unsigned evt_object_forks;
/* Evt::Loop. */
extern VALUE evt_object_class;
/* The calling Ractor's serial number (1 for the first one to ask, ...): never the same for two. */
unsigned long evt_object_ractor_serial(void);
/* Calls visit(loop, arg) for each loop of the calling Ractor that wanted(loop, arg) accepts, one at a
 * time. `wanted` runs under the list's lock: plain C, no Ruby. During a visit the loop stays in
 * memory even if the GC sweeps its object meanwhile (on any thread); `visit` is not called for a
 * loop swept before its turn. */
void evt_object_each_in_ractor(int (*wanted)(struct evt_loop *, void *), void (*visit)(struct evt_loop *, void *), void *arg);
VALUE evt_object_alloc(VALUE klass);
struct evt_loop *evt_object_of(VALUE self);
/* The loop for `self`, after any fork (kernel objects may still be closed). */
struct evt_loop *evt_object_check(VALUE self);
/* The loop for its own thread (an idle one moves to the calling thread). */
struct evt_loop *evt_object_owned(VALUE self);
/* The loop for `self`, used from its own thread, kernel objects open. */
struct evt_loop *evt_object_get(VALUE self);
/* Calls visit(waiter, arg) for every waiter the loop holds (once per structure it is in) until a
 * visit returns non-zero: whether one did. */
int evt_object_each_waiter(struct evt_loop *loop, int (*visit)(struct evt_waiter *, void *), void *arg);
void evt_object_open(struct evt_loop *loop);
void evt_object_close_backend(struct evt_loop *loop);
/* Lets go of every suspended fiber (after the backend is closed): a forked child, a closed selector. */
void evt_object_forget(struct evt_loop *loop);
/* Defines Evt::Loop (its methods are evt.c's); the list of loops; the fork handlers. */
void evt_object_init(VALUE mEvt);

#endif
