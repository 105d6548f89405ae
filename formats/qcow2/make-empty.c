/* SPDX-License-Identifier: BSD-3-Clause */
/* Emptying a qcow2 image (make-empty.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/byteorder.h"
#include "core/io.h"
#include "make-empty.h"
#include "qcow2-internal.h"

/* Refcount I of a refcount block of 2^ORDER-bit entries set to 1. */
static void rc_set_one(uint8_t *block, unsigned order, uint64_t i) {
  unsigned bits = 1u << order;
  if (bits < 8)
    block[i * bits / 8] |= (uint8_t)(1u << (i * bits % 8));
  else
    block[(i + 1) * (bits / 8) - 1] = 1; /* big-endian: the last byte */
}

static int set_incompat(struct qcow2dev *q, uint64_t v) {
  uint8_t b[8];
  put_be64(b, v);
  int r = io_pwrite_all(q->fd, b, 8, 72);
  return r < 0 ? r : io_fdatasync(q->fd);
}

/* The whole reset, in QEMU's order: dirty first, so that a crash midway
 * leaves an image whose refcounts the next writer rebuilds; the old L1
 * table zeroed, so that nothing maps whatever the new tables overwrite. */
static int reset_whole(struct qcow2dev *q, uint64_t l1_clusters) {
  uint64_t cs = q->csize, incompat = q->h.incompatible;
  uint8_t *buf = calloc(1, cs * (2 + l1_clusters));
  if (!buf)
    return -ENOMEM;
  int r = set_incompat(q, incompat | QCOW2_INCOMPAT_DIRTY);
  if (r == 0 && q->h.l1_size)
    r = io_pwrite_all(q->fd, buf, (size_t)(l1_clusters * cs), q->h.l1_offset);
  if (r == 0)
    r = io_fdatasync(q->fd);
  /* Cluster 1 the refcount table, 2 its one block, 3... the L1 table. */
  put_be64(buf, 2 * cs);
  for (uint64_t i = 0; i < 3 + l1_clusters; i++)
    rc_set_one(buf + cs, q->h.refcount_order, i);
  if (r == 0)
    r = io_pwrite_all(q->fd, buf, (size_t)(cs * (2 + l1_clusters)), cs);
  if (r == 0)
    r = io_fdatasync(q->fd);
  uint8_t hdr[20];
  put_be64(hdr, 3 * cs); /* l1_table_offset */
  put_be64(hdr + 8, cs); /* refcount_table_offset */
  put_be32(hdr + 16, 1); /* refcount_table_clusters */
  if (r == 0)
    r = io_pwrite_all(q->fd, hdr, sizeof hdr, 40);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0)
    r = set_incompat(q, incompat & ~QCOW2_INCOMPAT_DIRTY);
  if (r == 0 && ftruncate(q->fd, (off_t)((3 + l1_clusters) * cs)) < 0)
    r = -errno;
  free(buf);
  return r;
}

/* Every cluster that has an entry unmapped (tables without any skipped). */
static int unmap_all(struct bd *bd, struct qcow2dev *q) {
  uint64_t nclusters = (q->h.size + q->csize - 1) / q->csize;
  int r = 0;
  for (uint64_t c = 0; r == 0 && c < nclusters; c++) {
    uint64_t l1i = c >> q->l2_bits;
    if (l1i < q->h.l1_size && !(q->l1[l1i] & QCOW2_OFFSET_MASK)) {
      c = ((l1i + 1) << q->l2_bits) - 1; /* no L2 table: nothing mapped */
      continue;
    }
    r = qcow2_unmap_cluster(q, c);
  }
  return r == 0 ? qcow2_flush(bd) : r;
}

int qcow2_make_empty(struct bd *bd) {
  if (strcmp(bd->format, "qcow2") || !bd->priv || bd->caps.readonly) {
    bd_set_error("%s: cannot be emptied", bd->description);
    return -ENOTSUP;
  }
  struct qcow2dev *q = bd->priv;
  int r = qcow2_flush(bd);
  if (r < 0)
    return r;
  uint64_t l1_clusters = ((uint64_t)q->h.l1_size * 8 + q->csize - 1) / q->csize;
  bool whole = q->h.version >= 3 && q->h.nb_snapshots == 0 &&
               q->h.bitmaps_nb == 0 && !q->g.data_file &&
               3 + l1_clusters <= q->rb_entries;
  r = whole ? reset_whole(q, l1_clusters) : unmap_all(bd, q);
  if (r < 0)
    bd_set_error("qcow2 %s: emptying the image: %s", q->path, strerror(-r));
  return r;
}
