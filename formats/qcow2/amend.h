/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing the options of an existing qcow2 image, as qemu-img amend
 * does (QEMU's qcow2_amend_options): version, lazy refcounts, refcount
 * width, data file name and rawness, virtual size.  The image is opened
 * for writing (under its write lock) and nothing else uses it.
 *
 * Every function returns 0 or -errno with QEMU's reason in bd_errmsg(). */
#ifndef BLOCKPORT_QCOW2_AMEND_H
#define BLOCKPORT_QCOW2_AMEND_H

#include <stdbool.h>
#include <stdint.h>

#include "qcow2.h"

struct bd;
struct qcow2dev;

struct qcow2_amend_opts {
  unsigned version;      /* 2 or 3; 0: unchanged */
  int lazy_refcounts;    /* 0 off, 1 on, -1 unchanged */
  int refcount_order;    /* 0..6, -1 unchanged */
  const char *data_file; /* a new name, NULL: unchanged */
  int data_file_raw;     /* 0 off, 1 on, -1 unchanged */
  uint64_t size;         /* 0: unchanged */
  bool backing_given;    /* backing_file or backing_fmt given */
  const char *backing_file, *backing_fmt;
};

/* The changes, in QEMU's order: upgrade, refcount width, data file,
 * backing file (refused unless unchanged), lazy refcounts, size,
 * downgrade.  What was done before a refusal stays done, as in QEMU.
 * PROGRESS, if not NULL, is told how far it is (0 to 1). */
int qcow2_amend(struct bd *bd, const struct qcow2_amend_opts *o,
                void (*progress)(double done, void *ctx), void *ctx);

/* downgrade.c: to version 2, refused as QEMU refuses it. */
int qcow2_downgrade(struct bd *bd);

/* The header rewritten as H says (cluster 0, made durable), and H
 * re-read from it into the image's copy. */
int qcow2_write_header(struct qcow2dev *q, const struct qcow2_header *h);

/* refcount-order.c: every refcount rewritten at width 2^ORDER, into a new
 * table and new blocks, written and made durable before the header points
 * at them; the old ones are freed after. */
int qcow2_change_refcount_order(struct qcow2dev *q, unsigned order,
                                void (*progress)(double done, void *ctx),
                                void *ctx);

#endif
