/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing the width of a qcow2 image's refcounts (amend refcount_bits),
 * as QEMU's qcow2_change_refcount_order() does it: a refcount too large
 * for the new width is refused before anything changes; the new table
 * and blocks are written at the end of the file, covering every cluster
 * (themselves included), and made durable; then the header points at
 * them and gives the new width in one write; then the old table and
 * blocks are freed.  A crash before the header leaks the new structures,
 * after it the old ones. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "amend.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "create.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"

struct layout {
  uint64_t first;   /* first cluster of the new structures */
  uint64_t blocks;  /* new refcount blocks, from FIRST on */
  uint64_t tclust;  /* new table clusters, after the blocks */
  uint64_t entries; /* refcounts per new block */
};

static uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

/* Enough blocks to cover the image, the blocks and the table. */
static void plan(const struct qcow2dev *q, unsigned order, struct layout *l) {
  l->first = div_up(q->alloc_end, q->csize);
  l->entries = (q->csize * 8) >> order;
  l->blocks = 1;
  for (;;) {
    l->tclust = div_up(l->blocks * 8, q->csize);
    uint64_t need = div_up(l->first + l->blocks + l->tclust, l->entries);
    if (need <= l->blocks)
      return;
    l->blocks = need;
  }
}

/* Every refcount fits the new width: else QEMU's refusal. */
static int fits(struct qcow2dev *q, unsigned order, uint64_t nclusters) {
  uint64_t max = order == 6 ? UINT64_MAX : (1ull << (1u << order)) - 1;
  for (uint64_t c = 0; c < nclusters; c++) {
    uint64_t v = 0;
    int r = qcow2_rc_get(q, c, &v);
    if (r < 0)
      return r;
    if (v > max)
      return qcow2_err(-EINVAL,
                       "Cannot decrease refcount entry width to %u bits: "
                       "Cluster at offset %#" PRIx64 " has a refcount of "
                       "%" PRIu64,
                       1u << order, c * q->csize, v);
  }
  return 0;
}

/* The new blocks and table, in memory (BLK: blocks then table). */
static int fill(struct qcow2dev *q, unsigned order, const struct layout *l,
                uint8_t *blk) {
  uint64_t end = l->first + l->blocks + l->tclust;
  for (uint64_t c = 0; c < end; c++) {
    uint64_t v = 1;
    int r = c < l->first ? qcow2_rc_get(q, c, &v) : 0;
    if (r < 0)
      return r;
    if (v)
      qcow2_set_refcount(blk + (c / l->entries) * q->csize, order,
                         c % l->entries, v);
  }
  uint8_t *table = blk + l->blocks * q->csize;
  for (uint64_t b = 0; b < l->blocks; b++)
    put_be64(table + b * 8, (l->first + b) * q->csize);
  return 0;
}

static int write_new(struct qcow2dev *q, const struct layout *l,
                     const uint8_t *blk) {
  uint64_t off = l->first * q->csize, bbytes = l->blocks * q->csize;
  uint64_t tbytes = l->tclust * q->csize;
  int r = qcow2_guard_mark(q, QCOW2_OL_REFCOUNT_BLOCK, off, bbytes);
  if (r == 0)
    r = qcow2_guard_mark(q, QCOW2_OL_REFCOUNT_TABLE, off + bbytes, tbytes);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_BLOCK, blk, bbytes, off);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_TABLE, blk + bbytes, tbytes,
                           off + bbytes);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0 && off + bbytes + tbytes > q->file_size)
    q->file_size = off + bbytes + tbytes;
  return r;
}

/* The old table and blocks, no longer pointed at, dropped from the new
 * refcounts. */
static int free_old(struct qcow2dev *q, const uint64_t *blocks, uint64_t n,
                    uint64_t toff, uint64_t tclusters) {
  int r = 0;
  for (uint64_t i = 0; r == 0 && i < n; i++) {
    if (!blocks[i])
      continue;
    qcow2_guard_unmark(q, QCOW2_OL_REFCOUNT_BLOCK, blocks[i], q->csize);
    r = qcow2_free_range(q, blocks[i], q->csize, true);
  }
  uint64_t tbytes = tclusters * q->csize;
  qcow2_guard_unmark(q, QCOW2_OL_REFCOUNT_TABLE, toff, tbytes);
  if (r == 0)
    r = qcow2_free_range(q, toff, tbytes, true);
  return r == 0 ? io_fdatasync(q->fd) : r;
}

static int switch_to(struct qcow2dev *q, unsigned order,
                     const struct layout *l) {
  struct qcow2_header h = q->h;
  h.refcount_order = order;
  h.reftable_offset = (l->first + l->blocks) * q->csize;
  h.reftable_clusters = (uint32_t)l->tclust;
  uint64_t n = q->reftable_entries, toff = q->h.reftable_offset;
  uint64_t tcl = q->h.reftable_clusters;
  uint64_t *old = malloc((n ? n : 1) * sizeof *old);
  if (!old)
    return -ENOMEM;
  memcpy(old, q->reftable, n * sizeof *old);
  int r = qcow2_write_header(q, &h);
  if (r == 0)
    r = qcow2_rc_init(q); /* the new table, width and allocation end */
  if (r == 0)
    r = free_old(q, old, n, toff, tcl);
  free(old);
  return r;
}

int qcow2_change_refcount_order(struct qcow2dev *q, unsigned order,
                                void (*progress)(double done, void *ctx),
                                void *ctx) {
  struct layout l;
  pthread_mutex_lock(&q->meta);
  plan(q, order, &l);
  int r = l.tclust * q->csize > QCOW2_MAX_REFTABLE_BYTES
              ? qcow2_err(-EFBIG, "the refcount table would be too large")
              : fits(q, order, l.first);
  uint8_t *blk = NULL;
  if (r == 0) {
    blk = calloc(l.blocks + l.tclust, q->csize);
    r = blk ? fill(q, order, &l, blk) : -ENOMEM;
  }
  if (progress && r == 0)
    progress(0.5, ctx);
  if (r == 0)
    r = write_new(q, &l, blk);
  free(blk);
  if (r == 0)
    r = switch_to(q, order, &l);
  pthread_mutex_unlock(&q->meta);
  if (progress && r == 0)
    progress(1.0, ctx);
  if (r < 0 && r != -EINVAL && r != -EFBIG)
    bd_set_error("Failed to change the refcount width: %s", strerror(-r));
  return r;
}
