/* SPDX-License-Identifier: BSD-3-Clause */
/* Counting the references to every host cluster of a qcow2 image (refs.c),
 * for check.c.  Internal to formats/qcow2/. */
#ifndef BLOCKPORT_QCOW2_REFS_H
#define BLOCKPORT_QCOW2_REFS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "overlap.h"

struct qcow2dev;
struct qcow2_snapshot;

struct refs {
  struct qcow2dev *q;
  FILE *report;
  struct qcow2_check_result *res;
  enum qcow2_repair fix;
  uint32_t *n;    /* references per host cluster */
  uint64_t count; /* clusters in the file */
  uint64_t used;  /* clusters to compare: count, or one more if referenced */
  uint32_t max;   /* the most references a refcount can hold */
  bool rebuild;   /* the refcount structure must be rebuilt */
  uint8_t *tbl;   /* one cluster: the table being walked */
  struct qcow2_snapshot *snaps; /* the snapshot table, once parsed */
  uint32_t nsnaps;
  size_t snaps_used; /* its bytes */
  /* Where the metadata lies, for the repairs, as QEMU's overlap checks
   * see it: header, active and snapshot L1 tables, L2 tables, refcount
   * table and blocks, snapshot table, bitmap directory. */
  struct qcow2_ol *ol;
  bool nomem; /* the map could not be built */
};

/* What an L2 entry describes, as QEMU classifies it. */
enum qcow2_l2_type {
  L2_UNALLOCATED,
  L2_ZERO_PLAIN,
  L2_ZERO_ALLOC, /* zero, with a host cluster */
  L2_NORMAL,
  L2_COMPRESSED,
};
enum qcow2_l2_type qcow2_l2_type(const struct qcow2dev *q, uint64_t entry);

/* Count the references (header, L1/L2 trees of the image and its
 * snapshots, snapshot table, bitmaps, and with REFCOUNTS the refcount table
 * and blocks, which are checked too), reporting malformed metadata as
 * corruptions in R->res.  Returns 0, or -errno if the check cannot go on
 * (a reason in bd_errmsg()).  Free R with qcow2_refs_free() either way. */
int qcow2_count_refs(struct qcow2dev *q, struct refs *r, bool refcounts);
void qcow2_refs_free(struct refs *r);

/* A line to R->report. */
void qcow2_say(const struct refs *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
