/* Logging to stderr: one line per event, prefixed with the program name. */
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

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...)                                                         \
  do {                                                                         \
    if (log_threshold >= LOG_LEVEL_DEBUG)                                      \
      log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__);                                   \
  } while (0)

#endif
