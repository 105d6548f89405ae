/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers every subcommand's command line uses. */
#ifndef BLOCKPORT_CLI_H
#define BLOCKPORT_CLI_H

#include <stdarg.h>
#include <stdint.h>

#include "core/features.h"

/* A decimal number in [MIN, MAX].  Returns 0, or -1 when S is not one. */
int cli_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out);
/* Write our pid to PATH atomically (a temporary file renamed over it), so a
 * reader never sees it half written.  Returns 0, or -1 with a log line. */
int cli_write_pid_file(const char *path);

/* The one way the commands report an error: "blockport CMD: FILE: reason"
 * on stderr, or "blockport CMD: reason" when FILE is NULL. */
void cli_error(const char *cmd, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cli_verror(const char *cmd, const char *file, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* An image size as qemu-img reads one: a decimal (or 0x hex) number, a
 * decimal fraction only with a suffix, and at most one suffix of b, k, M,
 * G, T, P, E (any case; powers of 1024), below 2^63.  "1.5G" is taken,
 * "1MiB" and "1KB" are not.  0, or -1 when S is not one. */
int cli_parse_qemu_size(const char *s, uint64_t *out);

/* A usage error of CMD: "blockport CMD: REASON" (none when FMT is NULL:
 * getopt has said it) and one line pointing at --help, on stderr. */
void cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What a command of a part left out of the build does (core/features.h):
 * "blockport CMD: built without NAME" on stderr.  Returns 1, its exit
 * status. */
int cli_built_without(const char *cmd, enum feature f);

/* S as a JSON string on stdout; bytes that are not UTF-8 become U+FFFD. */
void cli_json_str(const char *s);

#endif
