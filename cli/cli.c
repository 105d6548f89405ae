/* SPDX-License-Identifier: BSD-3-Clause */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
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

/* Length of the valid UTF-8 sequence at P, or 0. */
static size_t utf8_len(const unsigned char *p) {
  size_t n = p[0] >= 0xf0 && p[0] <= 0xf4   ? 4
             : p[0] >= 0xe0                 ? 3
             : p[0] >= 0xc2 && p[0] <= 0xdf ? 2
                                            : 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  /* No overlong forms, surrogates or code points past U+10FFFF. */
  if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) ||
      (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
    return 0;
  return n;
}

/* A JSON string; bytes that are not UTF-8 become U+FFFD. */
void cli_json_str(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    size_t n;
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      printf("\\u%04x", *p);
    else if (*p < 0x80)
      putchar(*p);
    else if ((n = utf8_len(p)) != 0) {
      fwrite(p, 1, n, stdout);
      p += n - 1;
    } else
      fputs("\\ufffd", stdout);
  }
  putchar('"');
}

/* The multiplier of a size suffix qemu accepts, or 0. */
static uint64_t size_suffix(char c) {
  switch (c) {
  case 'b':
  case 'B': return 1;
  case 'k':
  case 'K': return 1ull << 10;
  case 'm':
  case 'M': return 1ull << 20;
  case 'g':
  case 'G': return 1ull << 30;
  case 't':
  case 'T': return 1ull << 40;
  case 'p':
  case 'P': return 1ull << 50;
  case 'e':
  case 'E': return 1ull << 60;
  default: return 0;
  }
}

int cli_parse_qemu_size(const char *s, uint64_t *out) {
  while (isspace((unsigned char)*s))
    s++;
  bool hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
  if (errno || end == s)
    return -1;
  /* A fraction: decimal digits only (no exponent), not after hex. */
  double frac = 0, scale = 0.1;
  if (*end == '.') {
    if (hex)
      return -1;
    for (end++; isdigit((unsigned char)*end); end++, scale /= 10)
      frac += (*end - '0') * scale;
  }
  uint64_t mul = size_suffix(*end);
  if (mul)
    end++;
  else
    mul = 1;
  if (*end || (mul == 1 && frac > 0) || v > (uint64_t)INT64_MAX / mul)
    return -1;
  uint64_t r = (uint64_t)v * mul;
  uint64_t f = (uint64_t)(frac * (double)mul);
  if (f > (uint64_t)INT64_MAX - r)
    return -1;
  *out = r + f;
  return 0;
}

void cli_usage_error(const char *cmd, const char *fmt, ...) {
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(cmd, NULL, fmt, ap);
    va_end(ap);
  }
  fprintf(stderr, "Try 'blockport %s --help'.\n", cmd);
}

int cli_built_without(const char *cmd, enum feature f) {
  feature_missing(f);
  cli_error(cmd, NULL, "%s", bd_errmsg());
  return 1;
}
