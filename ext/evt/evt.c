/* Init_evt: defines Evt::Loop and lists the backends this build has. */
#include "loop.h"

const struct evt_backend *const evt_backends[] = {
#ifdef HAVE_LIBURING_H
    &evt_backend_uring,
#endif
#ifdef HAVE_SYS_EPOLL_H
    &evt_backend_epoll,
#endif
#ifdef HAVE_POLL_H
    &evt_backend_poll,
#endif
    NULL,
};

RUBY_FUNC_EXPORTED void
Init_evt(void)
{
    VALUE mEvt = rb_define_module("Evt");
    evt_loop_init(mEvt);
}
