/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 consistency checks and repairs (check.c, rebuild.c), as qemu-img
 * check does them: same verdicts, same repairs, same exit statuses. */
#ifndef BLOCKPORT_QCOW2_CHECK_H
#define BLOCKPORT_QCOW2_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct qcow2dev;

struct qcow2_check_result {
  uint64_t corruptions;  /* refcount below its references, bad metadata */
  uint64_t leaks;        /* refcount above its references */
  uint64_t check_errors; /* the check itself failed somewhere */
  uint64_t corruptions_fixed, leaks_fixed;
  /* Guest clusters: allocated (of total), fragmented, compressed. */
  uint64_t allocated, total, fragmented, compressed;
  uint64_t image_end; /* end of the last host cluster in use */
};

/* What to repair (bits): leaks, errors (corruptions), or both. */
enum qcow2_repair {
  QCOW2_REPAIR_NONE = 0,
  QCOW2_REPAIR_LEAKS = 1,
  QCOW2_REPAIR_ERRORS = 2,
  QCOW2_REPAIR_ALL = 3,
};

/* Count every reference to every host cluster and compare with the
 * refcounts, repairing what FIX asks as qemu-img does (refcounts one by
 * one, or the whole refcount structure rebuilt when a referenced cluster
 * has no refcount; COPIED flags; then the dirty and corrupt bits are
 * cleared if nothing is left to repair).  A line about each problem goes
 * to REPORT (may be NULL).  Returns 0 or -errno (the check could not run:
 * a reason in bd_errmsg()). */
int qcow2_check(struct qcow2dev *q, enum qcow2_repair fix, FILE *report,
                struct qcow2_check_result *res);

/* `blockport check`: open PATH, check (repair if asked, then check again),
 * print the details to REPORT, and what was repaired, before the second
 * check, to SUMMARY (may be NULL).  SHARE (-U, no repair only): check an
 * image another process writes.  Returns 0, or -errno with a message in
 * bd_errmsg() when the check could not run.  The verdict is in RES: the
 * second check's, with the first one's counts of what it fixed. */
int qcow2_check_path(const char *path, enum qcow2_repair repair, bool share,
                     FILE *report, FILE *summary,
                     struct qcow2_check_result *res);

/* rebuild.c: new refcount blocks and table written after the end of the
 * file from the reference counts *N (COUNT clusters; *N is grown to cover
 * the new structures), made durable, then the header points at them. */
int qcow2_write_refcounts(struct qcow2dev *q, uint32_t **n, uint64_t count);

#endif
