/* SPDX-License-Identifier: BSD-3-Clause */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <syslog.h>

enum log_level log_threshold = LOG_LEVEL_INFO;

static const char *const level_names[] = {"error", "warning", "info", "debug"};
static const int syslog_priority[] = {LOG_ERR, LOG_WARNING, LOG_INFO,
                                      LOG_DEBUG};
static bool use_syslog;

int log_parse_level(const char *name, enum log_level *out) {
  static const struct {
    const char *name;
    enum log_level level;
  } names[] = {{"error", LOG_LEVEL_ERROR},
               {"warn", LOG_LEVEL_WARN},
               {"warning", LOG_LEVEL_WARN},
               {"info", LOG_LEVEL_INFO},
               {"debug", LOG_LEVEL_DEBUG}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) {
      *out = names[i].level;
      return 0;
    }
  return -1;
}

void log_to_syslog(const char *ident) {
  openlog(ident, LOG_PID | LOG_NDELAY, LOG_DAEMON);
  use_syslog = true;
}

void log_msg(enum log_level level, const char *fmt, ...) {
  if (level > log_threshold)
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (use_syslog) {
    syslog(syslog_priority[level], "%s", line);
    return;
  }
  /* One fprintf per line keeps lines from different threads whole. */
  fprintf(stderr, "blockport: %s: %s\n", level_names[level], line);
}

int log_handle_option(int opt, const char *arg) {
  if (opt == LOG_OPT_SYSLOG) {
    log_to_syslog("blockport");
    return 0;
  }
  return log_parse_level(arg, &log_threshold);
}
