/* SPDX-License-Identifier: BSD-3-Clause */
/* Rebuilding the refcount structure of a qcow2 image from the references
 * check.c counted: new refcount blocks and a new table after the end of
 * the file, sized so that they also describe themselves, made durable
 * before the header points at them.  The old structure is left where it
 * was (its clusters are free in the new one). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "qcow2-internal.h"

static void put_refcount(const struct qcow2dev *q, uint8_t *blk, uint64_t i,
                         uint64_t v) {
  uint64_t bit = i * q->rc_bits;
  if (q->rc_bits < 8) {
    unsigned shift = (unsigned)(bit % 8);
    uint8_t mask = (uint8_t)(((1u << q->rc_bits) - 1) << shift);
    blk[bit / 8] = (uint8_t)((blk[bit / 8] & ~mask) | ((v << shift) & mask));
    return;
  }
  for (unsigned k = 0; k < q->rc_bits / 8; k++)
    blk[bit / 8 + q->rc_bits / 8 - 1 - k] = (uint8_t)(v >> (8 * k));
}

/* Blocks and table clusters for COUNT clusters plus themselves. */
static void size_structures(const struct qcow2dev *q, uint64_t count,
                            uint64_t *nblocks, uint64_t *ntable) {
  *nblocks = 0;
  *ntable = 1;
  for (;;) { /* fixpoint: the structures need refcounts too */
    uint64_t total = count + *nblocks + *ntable;
    uint64_t nb = (total + q->rb_entries - 1) / q->rb_entries;
    uint64_t nt = (nb * 8 + q->csize - 1) / q->csize;
    if (nb == *nblocks && nt == *ntable)
      return;
    *nblocks = nb;
    *ntable = nt;
  }
}

static int write_blocks(struct qcow2dev *q, const uint32_t *n, uint64_t start,
                        uint64_t nblocks, uint64_t total, uint8_t *table) {
  uint8_t *blk = malloc(q->csize);
  int e = blk ? 0 : -ENOMEM;
  uint64_t rcmax = q->rc_bits == 64 ? UINT64_MAX : (1ull << q->rc_bits) - 1;
  for (uint64_t b = 0; e == 0 && b < nblocks; b++) {
    memset(blk, 0, q->csize);
    for (uint64_t i = 0; i < q->rb_entries; i++) {
      uint64_t c = b * q->rb_entries + i;
      if (c < total && n[c])
        put_refcount(q, blk, i, n[c] < rcmax ? n[c] : rcmax);
    }
    uint64_t at = (start + b) << q->h.cluster_bits;
    put_be64(table + b * 8, at);
    e = io_pwrite_all(q->fd, blk, q->csize, at);
  }
  free(blk);
  return e;
}

int qcow2_write_refcounts(struct qcow2dev *q, uint32_t **np, uint64_t count) {
  q->rc_bits = 1u << q->h.refcount_order;
  q->rb_entries = q->csize * 8 / q->rc_bits;
  uint64_t start = count, nblocks, ntable;
  size_structures(q, count, &nblocks, &ntable);
  uint64_t total = start + nblocks + ntable;
  if (ntable * q->csize > QCOW2_MAX_REFTABLE_BYTES)
    return -EFBIG;
  uint32_t *n = realloc(*np, total * sizeof *n);
  if (!n)
    return -ENOMEM;
  *np = n;
  for (uint64_t c = start; c < total; c++)
    n[c] = 1;
  uint8_t *table = calloc(ntable, q->csize);
  int e = table ? write_blocks(q, n, start, nblocks, total, table) : -ENOMEM;
  uint64_t toff = (start + nblocks) << q->h.cluster_bits;
  if (e == 0)
    e = io_pwrite_all(q->fd, table, ntable * q->csize, toff);
  if (e == 0)
    e = io_fdatasync(q->fd);
  uint8_t hdr[12];
  put_be64(hdr, toff);
  put_be32(hdr + 8, (uint32_t)ntable);
  if (e == 0)
    e = io_pwrite_all(q->fd, hdr, 12, 48);
  if (e == 0)
    e = io_fdatasync(q->fd);
  free(table);
  if (e == 0) {
    q->h.reftable_offset = toff;
    q->h.reftable_clusters = (uint32_t)ntable;
    q->file_size = total << q->h.cluster_bits;
  }
  return e;
}
