/* SPDX-License-Identifier: BSD-3-Clause */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"

int cli_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || !*s || v < min || v > max)
    return -1;
  *out = (unsigned)v;
  return 0;
}

int cli_write_pid_file(const char *path) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 ||
      rename(tmp, path) < 0) {
    log_error("pid file %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

void cli_verror(const char *cmd, const char *file, const char *fmt,
                va_list ap) {
  fprintf(stderr, "blockport %s: ", cmd);
  if (file)
    fprintf(stderr, "%s: ", file);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

void cli_error(const char *cmd, const char *file, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror(cmd, file, fmt, ap);
  va_end(ap);
}
