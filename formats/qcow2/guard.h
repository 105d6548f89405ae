/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 metadata guard: no write lands on metadata it does not mean to
 * change (guard.c).  A writable image keeps an overlap map (overlap.h) of
 * its metadata; every write to the image file is checked against it
 * first.  A hit fails the request with EIO, marks the image corrupt
 * (incompatible bit 1, durably), is logged once, and from then on writes
 * are refused while reads go on.  All of this is a no-op while the map
 * does not exist (read-only images, and the check tool before it opens
 * for writing). */
#ifndef BLOCKPORT_QCOW2_GUARD_H
#define BLOCKPORT_QCOW2_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "overlap.h"

struct qcow2dev;

/* Build the map from a walk of the metadata (opening for writing, after
 * the refcounts are loaded): header, active L1 and its L2 tables, refcount
 * table and blocks, snapshot table and each snapshot's L1 and L2 tables,
 * bitmap directory, tables and data.  -errno with bd_errmsg() set when the
 * metadata cannot be walked (then it cannot be protected either). */
int qcow2_guard_init(struct qcow2dev *q);
void qcow2_guard_free(struct qcow2dev *q);

/* Guest data about to be written at [off, off+len) of the image file:
 * 0, or -EIO after signalling corruption.  Lock-free. */
int qcow2_guard_data(struct qcow2dev *q, uint64_t off, uint64_t len);
/* Whether such a write would hit metadata (for paths that hand over to
 * the careful path instead of failing). */
bool qcow2_guard_would_hit(const struct qcow2dev *q, uint64_t off,
                           uint64_t len);
/* Metadata of KIND about to be written at [off, off+len): it may overlap
 * metadata of that kind only (header fields: anything).  0 or -EIO
 * (signalled). */
int qcow2_guard_meta(struct qcow2dev *q, unsigned kind, uint64_t off,
                     uint64_t len);
/* qcow2_guard_meta(), then io_pwrite_all() to the image file. */
int qcow2_guard_pwrite(struct qcow2dev *q, unsigned kind, const void *buf,
                       uint64_t len, uint64_t off);
/* Metadata of KIND now lives at [off, off+len) (metadata lock held; the
 * mark comes before the first write there).  0 or -ENOMEM. */
int qcow2_guard_mark(struct qcow2dev *q, unsigned kind, uint64_t off,
                     uint64_t len);
void qcow2_guard_unmark(struct qcow2dev *q, unsigned kind, uint64_t off,
                        uint64_t len);
/* The active L2 table at L2OFF lost an L1 entry: it is no longer active
 * unless another entry still points at it (metadata lock held). */
void qcow2_guard_l2_replaced(struct qcow2dev *q, uint64_t l2off);
/* A reference to host CLUSTER is about to be dropped (metadata lock held):
 * metadata is never freed that way, so dropping the last reference to a
 * cluster that holds metadata signals corruption instead (-EIO). */
int qcow2_guard_release(struct qcow2dev *q, uint64_t cluster);

/* A malformed table entry (WHAT, its VALUE) met on the way to guest
 * offset GUEST: -EIO with bd_errmsg() set.  An image open for writing is
 * marked corrupt, as QEMU marks it; a read-only one is logged once. */
int qcow2_bad_entry(struct qcow2dev *q, const char *what, uint64_t value,
                    uint64_t guest);

/* Why writes are refused now: 0, -EROFS (the image was found corrupt) or
 * -EIO (a metadata update failed), with bd_errmsg() set. */
int qcow2_writes_refused(struct qcow2dev *q);
bool qcow2_is_corrupt(const struct qcow2dev *q);
/* Clear the corrupt bit on disk (check --repair, once nothing is left to
 * repair). */
int qcow2_mark_consistent(struct qcow2dev *q);

#endif
