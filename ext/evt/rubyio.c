/* Ruby's IO internals: with the inline helpers of rubyio.h, the one place evt reads rb_io_t's fields
 * (public in Ruby 3.3 and 3.4, deprecated in 4.0 with nothing public in their place yet). */
#include "rubyio.h"

#include <ruby/encoding.h>
#include <ruby/io.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* rb_io_t's fields: this file's whole job */

void
evt_rubyio_check_closed(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    if (fptr) rb_io_check_closed(fptr);
}

int
evt_rubyio_read_pending(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return fptr && rb_io_read_pending(fptr);
}

VALUE
evt_rubyio_write_io(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return fptr && fptr->tied_io_for_writing ? fptr->tied_io_for_writing : Qnil;
}

int
evt_rubyio_mode(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    return fptr ? fptr->mode : 0;
}

int
evt_rubyio_writes_as_is(VALUE io)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    if (!fptr || !(fptr->mode & FMODE_SYNC) || fptr->wbuf.len) return 0;
    if (fptr->encs.enc && fptr->encs.enc != rb_ascii8bit_encoding()) return 0;
    if (fptr->encs.ecflags & (ECONV_DECORATOR_MASK | ECONV_STATEFUL_DECORATOR_MASK)) return 0;
    /* A write lock held: another fiber's write is under way (waiting); it goes first. */
    return NIL_P(fptr->write_lock) || !RTEST(rb_mutex_locked_p(fptr->write_lock));
}

static rb_io_buffer_t *
buffer_of(VALUE io, enum evt_rubyio_buffer which)
{
    rb_io_t *fptr = evt_rubyio_fptr(io);
    if (!fptr) return NULL;
    return which == EVT_RUBYIO_READ_BUFFER ? &fptr->rbuf : &fptr->wbuf;
}

char *
evt_rubyio_buffer(VALUE io, enum evt_rubyio_buffer which, long *capacity)
{
    rb_io_buffer_t *buffer = buffer_of(io, which);
    *capacity = buffer ? buffer->capa : 0;
    return buffer ? buffer->ptr : NULL;
}

void
evt_rubyio_drop_buffer(VALUE io, enum evt_rubyio_buffer which)
{
    rb_io_buffer_t *buffer = buffer_of(io, which);
    if (!buffer) return;
    buffer->ptr = NULL;
    buffer->off = buffer->len = buffer->capa = 0;
}
