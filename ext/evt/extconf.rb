# frozen_string_literal: true

# Where the extension cannot be built (another Ruby than CRuby, Windows, no working C compiler, no
# POSIX poll.h), gem install still succeeds: the Makefile builds nothing, and `require "evt"` runs
# on the pure-Ruby select backend (with one warning).
def evt_without_extension(reason, makefile = "all install static install-so install-rb clean distclean:\n\t@:\n")
  puts "evt: #{reason}: installing without the C extension; evt will run on its pure-Ruby select backend"
  File.write("Makefile", makefile)
  exit
end

unless RUBY_ENGINE == "ruby" && !Gem.win_platform?
  evt_without_extension("#{RUBY_ENGINE} on #{RUBY_PLATFORM} cannot load it")
end

require "mkmf"

compiles = begin
  try_compile("int main(void) { return 0; }")
rescue RuntimeError # mkmf's "The compiler failed to generate an executable file"
  false
end
unless compiles
  evt_without_extension("no C compiler works here (see mkmf.log)", dummy_makefile($srcdir).join)
end
unless have_header("poll.h")
  evt_without_extension("no poll.h (the loop needs POSIX)", dummy_makefile($srcdir).join)
end

$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fvisibility=hidden"

# A build for the precompiled gem (EVT_NATIVE=1, rake native): it must load into any CRuby of its
# series on any glibc Linux without a compiler or liburing. So: no link to libruby (the process
# that loads it has Ruby's symbols, whether its Ruby is built shared or static), liburing linked
# statically with its symbols kept inside, only the libraries actually used, no libkqueue, and
# epoll_pwait2 as a system call.
native = ENV["EVT_NATIVE"] == "1"

# The wakeup descriptor every backend watches: an eventfd (Linux), else a self-pipe.
have_header("sys/eventfd.h")

# epoll (Linux): the backend and its nanosecond wait (kernel 5.11, glibc 2.35).
# The precompiled gem's build makes the system call itself (glibc's wrapper needs 2.35).
if have_header("sys/epoll.h")
  if native
    $defs << "-DEVT_EPOLL_PWAIT2_SYSCALL" if have_const("SYS_epoll_pwait2", "sys/syscall.h")
  else
    have_func("epoll_pwait2", "sys/epoll.h")
  end
end

# poll (POSIX): the portable backend, with ppoll's nanosecond wait where there is one (Linux, the
# BSDs; glibc declares it under _GNU_SOURCE, which ruby.h defines), and pipe2 for the self-pipe where
# there is no eventfd.
have_func("ppoll", "poll.h")
have_func("pipe2", "unistd.h")

# Ruby 4.0's C API for blocking_operation_wait's operations (ext/evt/blocking.c).
have_func("rb_fiber_scheduler_blocking_operation_extract", "ruby/fiber/scheduler.h")

# (The precompiled gem's build: see `native` above.)
if native
  $LIBRUBYARG = ""
  $LDFLAGS << " -Wl,--as-needed -Wl,--exclude-libs,ALL" if RUBY_PLATFORM.include?("linux") # GNU ld's
  ENV.delete("EVT_LIBKQUEUE")
end

# io_uring through liburing (whatever the headers say, the kernel is probed at run time).
uring = have_library("uring", "io_uring_queue_init_params", "liburing.h") && have_header("liburing.h")
if native && RUBY_PLATFORM.include?("linux")
  # A precompiled gem without io_uring would be a quiet loss: its build needs liburing.
  abort "evt: EVT_NATIVE=1 needs liburing's headers and library (Debian's liburing-dev)" unless uring
  static = `pkg-config --variable=libdir liburing 2>/dev/null`.strip.then { |dir| File.join(dir, "liburing.a") }
  abort "evt: EVT_NATIVE=1 needs liburing's static library (#{static}): Debian's liburing-dev has it" unless File.exist?(static)
  $libs = $libs.sub("-luring", static)
end

# kqueue: the kernel's own on macOS and the BSDs. On Linux, only when EVT_LIBKQUEUE asks for it:
# libkqueue (an emulation over epoll), 2.6 or later, under the prefix it names ("pkg-config": where
# pkg-config finds one). The backend is then built for testing, and never chosen by default; the
# whole extension then needs that library to load, which is why a libkqueue that happens to be
# installed is not enough. Its library directory goes into the extension's run path, so that a
# libkqueue outside the linker's own directories is found at run time. The backend's code is
# compiled where HAVE_KQUEUE is defined.
if RUBY_PLATFORM.include?("linux")
  prefix = ENV.fetch("EVT_LIBKQUEUE", "")
  unless prefix.empty? || prefix == "pkg-config"
    ENV["PKG_CONFIG_PATH"] = [File.join(prefix, "lib", "pkgconfig"), ENV.fetch("PKG_CONFIG_PATH", nil)].compact.join(":")
  end
  saved = [$CFLAGS, $INCFLAGS, $LDFLAGS, $libs].map(&:dup)
  found = !prefix.empty? && pkg_config("libkqueue") && begin
    includedir = `pkg-config --variable=includedir libkqueue`.strip
    libdir = `pkg-config --variable=libdir libkqueue`.strip
    # Older pkg-config files name include/kqueue where the library put include/sys/event.h.
    $INCFLAGS << " -I#{includedir}" unless includedir.empty?
    $LDFLAGS << " -L#{libdir} -Wl,-rpath,#{libdir}" unless libdir.empty?
    # Before 2.6, libkqueue cannot watch an eventfd (the loop's wakeup), keeps kqueues in a forked
    # child, and has no EVFILT_PROC on Linux: NOTE_FORK_CLEANUP came with 2.6.
    have_header("sys/event.h", ["sys/types.h"]) &&
      (have_macro("NOTE_FORK_CLEANUP", ["sys/types.h", "sys/event.h"]) ||
       (puts("evt: libkqueue #{`pkg-config --modversion libkqueue`.strip} is older than 2.6: no kqueue backend"); false)) &&
      have_func("kqueue", ["sys/types.h", "sys/event.h"])
  end
  $CFLAGS, $INCFLAGS, $LDFLAGS, $libs = saved unless found
else
  # The BSDs want sys/types.h first.
  have_header("sys/event.h", ["sys/types.h"]) && have_func("kqueue", ["sys/types.h", "sys/event.h"])
end

create_makefile("evt/evt")
