#include "log.h"

#include <stdarg.h>
#include <stdio.h>

enum log_level log_threshold = LOG_LEVEL_INFO;

static const char *const level_names[] = {"error", "warning", "info", "debug"};

void log_msg(enum log_level level, const char *fmt, ...) {
  if (level > log_threshold)
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line keeps lines from different threads whole. */
  fprintf(stderr, "blockport: %s: %s\n", level_names[level], line);
}
