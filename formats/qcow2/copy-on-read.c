/* SPDX-License-Identifier: BSD-3-Clause */
/* Copy-on-read (BD_OPEN_COPY_ON_READ, QEMU's copy-on-read), a filter
 * (core/filter.h) over a writable qcow2 image with a backing file: a read
 * that reaches clusters the image does not hold reads them whole (one
 * request to the image with the rest of the read), and writes them into
 * the image, so that the next read of them stays local: a cache of a
 * remote base in the overlay.  Off by default.  Reads run on the worker
 * pool (a mapping lookup may load an L2 table); the rest passes through. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/filter.h"
#include "core/open.h"

#include "qcow2-internal.h"

/* Whether guest CLUSTER is whole inside the image and inside the backing
 * file, and shows the backing file. */
static bool to_copy(struct qcow2dev *q, uint64_t cluster) {
  uint64_t end = (cluster + 1) << q->h.cluster_bits;
  return end <= q->h.size && end <= q->backing->size &&
         qcow2_cluster_unallocated(q, cluster);
}

static int read_inner(struct bd *inner, void *buf, uint64_t len, uint64_t off,
                      const struct bd_req *req) {
  struct bd_req r = {.cmd = BD_READ,
                     .offset = off,
                     .length = len,
                     .buf = buf,
                     .conn = req->conn ? req->conn->priv : NULL};
  return bd_run(inner, &r);
}

/* On a pool worker: REQ read through the image, widened to whole clusters
 * at the ends that will be copied. */
static void read_copying(struct bd *bd, struct bd_req *req) {
  struct bd *inner = bd_filter_inner(bd);
  struct qcow2dev *q = inner->priv;
  uint8_t *buf = req->buf;
  uint64_t off = req->offset, len = req->length;
  unsigned bits = q->h.cluster_bits;
  uint64_t first = off >> bits, last = (off + len - 1) >> bits;
  uint64_t lo = to_copy(q, first) ? first << bits : off;
  uint64_t hi = to_copy(q, last) ? (last + 1) << bits : off + len;
  uint8_t *span = lo == off && hi == off + len ? buf : malloc(hi - lo);
  if (!span) {
    bd_complete(req, read_inner(inner, buf, len, off, req));
    return;
  }
  int r = read_inner(inner, span, hi - lo, lo, req);
  if (r == 0 && span != buf)
    memcpy(buf, span + (off - lo), len);
  /* The copies are a cache: a failure leaves the cluster to the backing
   * file, and the read has its data. */
  for (uint64_t c = (lo + q->csize - 1) >> bits; r == 0 && c < hi >> bits; c++)
    if (to_copy(q, c))
      qcow2_copy_on_read(q, c, span + ((c << bits) - lo));
  if (span != buf)
    free(span);
  bd_complete(req, r);
}

static void cor_submit(struct bd *bd, struct bd_req *req) {
  (void)bd;
  if (req->length == 0 || bd_filter_offload(req, read_copying) < 0)
    bd_filter_forward(req, NULL, NULL); /* a plain read then */
}

static const struct bd_filter_ops cor_ops = {
    .name = "copy-on-read", .intercept = BD_FILTER_READS, .submit = cor_submit};

struct bd *qcow2_filters(struct bd *bd, const struct bd_open_opts *o) {
  struct qcow2dev *q = bd->priv;
  if (!(o->flags & BD_OPEN_COPY_ON_READ) || bd->caps.readonly || !q->writable ||
      !q->backing || q->g.data_file)
    return bd;
  return bd_filter_new(bd, &cor_ops, NULL);
}
