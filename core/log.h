/* SPDX-License-Identifier: BSD-3-Clause */
/* Logging: one line per event, to stderr (prefixed with the program name
 * and the level) or to syslog (daemon facility), filtered by level. */
#ifndef BLOCKPORT_LOG_H
#define BLOCKPORT_LOG_H

#include <string.h>

enum log_level {
  LOG_LEVEL_ERROR,
  LOG_LEVEL_WARN,
  LOG_LEVEL_INFO,
  LOG_LEVEL_DEBUG
};

extern enum log_level log_threshold;

void log_msg(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Parse "error", "warn"/"warning", "info" or "debug".  Returns 0 or -1. */
int log_parse_level(const char *name, enum log_level *out);
/* From now on, lines go to syslog as IDENT (facility daemon). */
void log_to_syslog(const char *ident);

/* The logging options of the long-running commands (serve, mount,
 * vhost): add LOG_LONGOPTS to the getopt table and LOG_USAGE to --help,
 * and pass LOG_OPT_* to log_handle_option(), which returns 0 or -1 for a
 * bad level. */
enum { LOG_OPT_LEVEL = 3000, LOG_OPT_SYSLOG };
#define LOG_LONGOPTS                                                           \
  {"log-level", required_argument, NULL, LOG_OPT_LEVEL}, {                     \
    "syslog", no_argument, NULL, LOG_OPT_SYSLOG                                \
  }
#define LOG_USAGE                                                              \
  "      --log-level LEVEL   error, warn, info (default) or debug\n"           \
  "      --syslog            log to syslog (daemon facility), not stderr\n"
int log_handle_option(int opt, const char *arg);

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...)                                                         \
  do {                                                                         \
    if (log_threshold >= LOG_LEVEL_DEBUG)                                      \
      log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__);                                   \
  } while (0)

#endif
