/* SPDX-License-Identifier: BSD-3-Clause */
/* Fault injection under the formats, for tests: chosen file I/Os fail with
 * an errno or are delayed.  Off unless the environment variable
 * BLOCKPORT_FAULTS holds rules, read once at the first I/O:
 *
 *   BLOCKPORT_FAULTS="RULE[;RULE...]"   RULE = KEY=VALUE[,KEY=VALUE...]
 *     op=read|write|sync|any   which calls (default any)
 *     err=EIO|ENOSPC|EROFS|none  the errno to fail with (default EIO)
 *     after=N                  let the first N matching calls through
 *     count=N                  fail (or delay) N calls, then stop (default:
 *                              every one)
 *     from=OFF,to=OFF          only calls touching bytes [from, to)
 *     delay=MS                 sleep MS milliseconds first
 *
 * Every injected fault is logged.  The first rule that matches decides. */
#ifndef BLOCKPORT_FAULT_H
#define BLOCKPORT_FAULT_H

#include <stddef.h>
#include <stdint.h>

enum fault_op { FAULT_READ, FAULT_WRITE, FAULT_SYNC };

/* 0, or the -errno the call must fail with (after any delay). */
int fault_check(enum fault_op op, uint64_t off, uint64_t len);
/* Whether any rule is set: callers with a fast path that bypasses
 * fault_check() (RWF_NOWAIT) take the slow path instead. */
int fault_active(void);

/* Parse RULES (the variable's format) into the active set; for tests.
 * Returns 0 or -EINVAL with a message in bd_errmsg(). */
int fault_configure(const char *rules);

#endif
