/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing the persistent bitmaps of a qcow2 image, as qemu-img bitmap
 * and convert --bitmaps do (bitmap-edit.c): add, remove, clear, enable,
 * disable and merge work on the bitmaps in memory, in the order asked;
 * qcow2_bm_commit() then writes what changed, crash-safely: new data
 * clusters and tables, then a new directory, then the header, and only
 * then are the old clusters freed (a crash leaks at worst).
 *
 * Every function returns 0 or -errno with QEMU's reason in bd_errmsg(). */
#ifndef BLOCKPORT_QCOW2_BITMAP_EDIT_H
#define BLOCKPORT_QCOW2_BITMAP_EDIT_H

#include <stdbool.h>
#include <stdint.h>

struct bd;
struct qcow2_bm_edit;

/* Whether BD keeps persistent bitmaps: a qcow2 image of version 3. */
bool qcow2_bm_supported(const struct bd *bd);

/* The bitmaps of BD, a qcow2 image, to change (opened for writing: the
 * bitmaps it tracks are stored first and left to this) or to read (opened
 * read-only: a merge source).  -ENOTSUP for other formats. */
int qcow2_bm_open(struct bd *bd, struct qcow2_bm_edit **out);
/* Write what changed (nothing if nothing did). */
int qcow2_bm_commit(struct qcow2_bm_edit *e);
void qcow2_bm_close(struct qcow2_bm_edit *e);

/* GRANULARITY 0: the default for the image's cluster size. */
int qcow2_bm_add(struct qcow2_bm_edit *e, const char *name,
                 uint64_t granularity, bool disabled);
int qcow2_bm_remove(struct qcow2_bm_edit *e, const char *name);
int qcow2_bm_clear(struct qcow2_bm_edit *e, const char *name);
int qcow2_bm_enable(struct qcow2_bm_edit *e, const char *name, bool on);
/* Bits of SRC_NAME in SRC (E itself, or another image's) set in NAME. */
int qcow2_bm_merge(struct qcow2_bm_edit *e, const char *name,
                   struct qcow2_bm_edit *src, const char *src_name);

/* The bitmaps, in directory order, for convert --bitmaps. */
struct qcow2_bm_info {
  const char *name;
  uint64_t granularity;
  bool enabled, in_use;
};
uint32_t qcow2_bm_count(const struct qcow2_bm_edit *e);
void qcow2_bm_get(const struct qcow2_bm_edit *e, uint32_t i,
                  struct qcow2_bm_info *info);

#endif
