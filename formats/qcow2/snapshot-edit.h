/* SPDX-License-Identifier: BSD-3-Clause */
/* Creating, deleting and applying the internal snapshots of a qcow2
 * image, as qemu-img snapshot does (snapshot-edit.c), on an image opened
 * for writing (its write lock held) and nothing else in flight.
 *
 * Refcounts count, as QEMU's do, one reference per L1 table that reaches
 * a cluster: a snapshot adds one to each L2 table and data cluster of the
 * tree it copies.  The COPIED flag of an active L1 or L2 entry says that
 * its cluster has exactly one reference (the writer may then write it in
 * place); every change recomputes it on the active tree.  New structures
 * are written and flushed before the header points at them, old ones are
 * freed after: a crash leaks clusters at worst.
 *
 * Each returns 0 or -errno with QEMU's words in bd_errmsg() where QEMU
 * has some (qemu-img prints its "%d (%s)" for create itself). */
#ifndef BLOCKPORT_QCOW2_SNAPSHOT_EDIT_H
#define BLOCKPORT_QCOW2_SNAPSHOT_EDIT_H

#include <stdbool.h>
#include <stdint.h>

struct bd;
struct qcow2_snapshot;

/* The snapshots of BD (read-only is enough): none for other formats than
 * qcow2.  Free *OUT with qcow2_free_snapshots(). */
int qcow2_snapshot_list(struct bd *bd, struct qcow2_snapshot **out,
                        uint32_t *n);

/* NAME: truncated to 255 bytes as QEMU keeps it.  -ENOTSUP with an
 * external data file, -EFBIG with too many snapshots. */
int qcow2_snapshot_create(struct bd *bd, const char *name, uint32_t date_sec,
                          uint32_t date_nsec);
/* The first snapshot named NAME (qemu-img snapshot -d finds it by name
 * only); -ENOENT if none. */
int qcow2_snapshot_delete(struct bd *bd, const char *name);
/* The snapshot with that ID, else the first with that name; -ENOENT. */
int qcow2_snapshot_apply(struct bd *bd, const char *id_or_name);

/* The pure maths, for the unit tests.  The host extent whose clusters an
 * L2 entry of a standard (not extended L2) or extended image of
 * CLUSTER_BITS holds a reference to: false if none.  *HAS_COPIED: whether
 * the entry carries a COPIED flag (compressed ones do not). */
bool qcow2_entry_extent(unsigned cluster_bits, bool extended_l2, uint64_t entry,
                        uint64_t *off, uint64_t *len, bool *has_copied);
/* ENTRY with COPIED set exactly when REFCOUNT is 1. */
uint64_t qcow2_entry_copied(uint64_t entry, uint64_t refcount);

#endif
