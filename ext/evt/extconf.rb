# frozen_string_literal: true

require "mkmf"

$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fvisibility=hidden"

# epoll (Linux): the backend and its nanosecond wait (kernel 5.11, glibc 2.35).
if have_header("sys/epoll.h") && have_header("sys/eventfd.h")
  have_func("epoll_pwait2", "sys/epoll.h")
end

# io_uring through liburing (whatever the headers say, the kernel is probed at run time).
have_library("uring", "io_uring_queue_init_params", "liburing.h") && have_header("liburing.h")

create_makefile("evt/evt")
