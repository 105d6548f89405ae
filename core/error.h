/* SPDX-License-Identifier: BSD-3-Clause */
/* The library's error convention (docs/ARCHITECTURE.md, "Errors"): a
 * function that fails returns -errno (or NULL) and leaves a message for its
 * caller in a per-thread buffer.  Its own file, so that the pure parsers
 * (and their fuzzers) need nothing else from the core. */
#ifndef BLOCKPORT_ERROR_H
#define BLOCKPORT_ERROR_H

#include <stdarg.h>

/* Sets the calling thread's message.  An argument may be bd_errmsg()
 * itself ("context: %s"). */
void bd_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same with a va_list. */
void bd_set_errorv(const char *fmt, va_list ap)
    __attribute__((format(printf, 1, 0)));
/* The last message set on this thread, or "unknown error". */
const char *bd_errmsg(void);
/* Whether a message is set (not forgotten since). */
int bd_error_is_set(void);
/* Forgets it: the next bd_errmsg() says "unknown error" unless a failure
 * sets one. */
void bd_clear_error(void);

#endif
