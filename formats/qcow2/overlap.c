/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 overlap map (see overlap.h). */
#include "overlap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (1u << QCOW2_OL_CHUNK_BITS)

struct qcow2_ol *qcow2_ol_new(unsigned cluster_bits) {
  struct qcow2_ol *ol = calloc(1, sizeof *ol);
  if (ol) {
    ol->cluster_bits = cluster_bits;
    ol->far = UINT64_MAX;
  }
  return ol;
}

void qcow2_ol_free(struct qcow2_ol *ol) {
  if (!ol)
    return;
  struct qcow2_ol_dir *d = ol->dir;
  /* The newest directory holds every chunk. */
  for (uint64_t i = 0; d && i < d->len; i++)
    free(d->chunk[i]);
  while (d) {
    struct qcow2_ol_dir *prev = d->prev;
    free(d);
    d = prev;
  }
  free(ol);
}

/* A directory covering chunk I: the current one, or a larger copy
 * published in its place (the old one stays readable until the end). */
static struct qcow2_ol_dir *dir_for(struct qcow2_ol *ol, uint64_t i) {
  struct qcow2_ol_dir *d = ol->dir;
  if (d && i < d->len)
    return d;
  uint64_t len = d ? d->len : 16;
  while (len <= i)
    len *= 2;
  struct qcow2_ol_dir *nd = calloc(1, sizeof *nd + len * sizeof nd->chunk[0]);
  if (!nd)
    return NULL;
  nd->len = len;
  nd->prev = d;
  if (d)
    memcpy(nd->chunk, d->chunk, d->len * sizeof d->chunk[0]);
  __atomic_store_n(&ol->dir, nd, __ATOMIC_RELEASE);
  return nd;
}

static int mark_cluster(struct qcow2_ol *ol, uint64_t c, unsigned kind) {
  uint64_t i = c >> QCOW2_OL_CHUNK_BITS;
  struct qcow2_ol_dir *d = dir_for(ol, i);
  if (!d)
    return -ENOMEM;
  uint8_t *chunk = d->chunk[i];
  if (!chunk) {
    chunk = calloc(1, CHUNK);
    if (!chunk)
      return -ENOMEM;
    __atomic_store_n(&d->chunk[i], chunk, __ATOMIC_RELEASE);
  }
  __atomic_fetch_or(&chunk[c & (CHUNK - 1)], (uint8_t)kind, __ATOMIC_RELAXED);
  return 0;
}

int qcow2_ol_mark(struct qcow2_ol *ol, uint64_t off, uint64_t len,
                  unsigned kind) {
  if (len == 0)
    return 0;
  uint64_t last = (off + len - 1) >> ol->cluster_bits;
  for (uint64_t c = off >> ol->cluster_bits; c <= last; c++) {
    int r = mark_cluster(ol, c, kind);
    if (r < 0)
      return r;
  }
  return 0;
}

void qcow2_ol_unmark(struct qcow2_ol *ol, uint64_t off, uint64_t len,
                     unsigned kind) {
  struct qcow2_ol_dir *d = ol->dir;
  if (len == 0 || !d)
    return;
  uint64_t last = (off + len - 1) >> ol->cluster_bits;
  for (uint64_t c = off >> ol->cluster_bits; c <= last; c++) {
    uint64_t i = c >> QCOW2_OL_CHUNK_BITS;
    if (i < d->len && d->chunk[i])
      __atomic_fetch_and(&d->chunk[i][c & (CHUNK - 1)], (uint8_t)~kind,
                         __ATOMIC_RELAXED);
  }
}

void qcow2_ol_far(struct qcow2_ol *ol, uint64_t off, unsigned kind) {
  uint64_t c = off >> ol->cluster_bits;
  if (c < ol->far) {
    ol->far = c;
    ol->far_kind = kind;
  }
}

const char *qcow2_ol_name(unsigned kinds) {
  /* In the order QEMU checks them, so that a cluster with several kinds
   * is named as QEMU names it. */
  static const struct {
    unsigned kind;
    const char *name;
  } names[] = {
      {QCOW2_OL_HEADER, "qcow2_header"},
      {QCOW2_OL_ACTIVE_L1, "active L1 table"},
      {QCOW2_OL_REFCOUNT_TABLE, "refcount table"},
      {QCOW2_OL_SNAPSHOT_TABLE, "snapshot table"},
      {QCOW2_OL_INACTIVE_L1, "inactive L1 table"},
      {QCOW2_OL_ACTIVE_L2, "active L2 table"},
      {QCOW2_OL_REFCOUNT_BLOCK, "refcount block"},
      {QCOW2_OL_INACTIVE_L2, "inactive L2 table"},
      {QCOW2_OL_BITMAPS, "bitmap directory or table"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (kinds & names[i].kind)
      return names[i].name;
  return "metadata";
}
