/* SPDX-License-Identifier: BSD-3-Clause */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Room for QEMU's messages that name a bitmap of 1023 bytes twice. */
static _Thread_local char errbuf[4096];

void bd_set_errorv(const char *fmt, va_list ap) {
  /* Formatted aside first: an argument may point into errbuf. */
  char msg[sizeof errbuf];
  vsnprintf(msg, sizeof msg, fmt, ap);
  memcpy(errbuf, msg, sizeof errbuf);
}

void bd_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bd_set_errorv(fmt, ap);
  va_end(ap);
}

const char *bd_errmsg(void) {
  return errbuf[0] ? errbuf : "unknown error";
}

int bd_error_is_set(void) {
  return errbuf[0] != 0;
}

void bd_clear_error(void) {
  errbuf[0] = 0;
}
