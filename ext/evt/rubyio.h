/* Ruby's IO internals (rubyio.c, and the helpers below that every transfer asks for): what evt reads
 * of an IO object beyond Ruby's public functions. The one place that looks into rb_io_t, whose fields
 * Ruby 4.0 deprecates (they are still there). Knows no loop. */
#ifndef EVT_RUBYIO_H
#define EVT_RUBYIO_H

#include <ruby.h>
#include <ruby/io.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fields: this shim's whole job */

/* io's rb_io_t, or NULL for a closed IO or anything but an IO. */
static inline rb_io_t *
evt_rubyio_fptr(VALUE io)
{
    return RB_TYPE_P(io, T_FILE) ? RFILE(io)->fptr : NULL;
}

/* Whether Ruby has marked io closed (anything but an IO counts as closed). No GVL needed. */
static inline int
evt_rubyio_closed(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return !fptr || fptr->fd < 0;
}

/* The descriptor of an open IO, or -1: never raises, so it may run without the GVL. */
static inline int
evt_rubyio_fd(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return fptr ? fptr->fd : -1;
}

/* Whether `base` is io's own read buffer (Ruby fills it only from io_fillbuf). */
static inline int
evt_rubyio_is_read_buffer(VALUE io, const void *base)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return fptr && fptr->rbuf.ptr == base;
}

#pragma GCC diagnostic pop

/* Raises IOError, as Ruby does, when io is closed (a non-IO is left alone). */
void evt_rubyio_check_closed(VALUE io);
/* Whether io's read buffer holds data already (IO.select counts it as readable). */
int evt_rubyio_read_pending(VALUE io);
/* The IO that io's writes go to (IO.popen's "r+" has one of its own), or Qnil. */
VALUE evt_rubyio_write_io(VALUE io);
/* io's FMODE_* bits (0 for a closed IO). */
int evt_rubyio_mode(VALUE io);
/* Whether Ruby's own write of strings to io would be one writev(2) without conversion, and may go
 * now: a synchronous IO with nothing buffered, in binary or no encoding, no decorator, and no other
 * write holding its lock. */
int evt_rubyio_writes_as_is(VALUE io);

/* io's read and write buffers, which another thread's close frees while the kernel may still be
 * reading into or writing from them (close.c hands them over to the transfers instead). */
enum evt_rubyio_buffer { EVT_RUBYIO_READ_BUFFER, EVT_RUBYIO_WRITE_BUFFER };
/* The buffer's memory (NULL: none) and its capacity. */
char *evt_rubyio_buffer(VALUE io, enum evt_rubyio_buffer which, long *capacity);
/* Lets go of the buffer's memory, which someone else now frees: io gets an empty buffer (Ruby
 * makes a new one if it ever needs one, which a closed IO does not). */
void evt_rubyio_drop_buffer(VALUE io, enum evt_rubyio_buffer which);

#endif
