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
#if defined(__linux__) && defined(HAVE_SYS_SELECT_H) && defined(HAVE_SYS_EVENTFD_H)
    &evt_backend_select, /* slowest: a wait costs in proportion to the highest descriptor */
#endif
    NULL,
};

RUBY_FUNC_EXPORTED void
Init_evt(void)
{
    VALUE mEvt = rb_define_module("Evt");
    evt_loop_init(mEvt);
}
