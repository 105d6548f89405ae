/* SPDX-License-Identifier: BSD-3-Clause */
/* Copy-on-read (BD_OPEN_COPY_ON_READ, QEMU's copy-on-read): a read that
 * reaches clusters the image does not hold reads them whole from the
 * backing file (one request with the rest of the read) and writes them
 * into the image, so that the next read of them stays local: a cache of a
 * remote base in the overlay.  Off by default. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/open.h"

#include "qcow2-internal.h"

/* Whether guest CLUSTER is whole inside the image and inside the backing
 * file, and shows the backing file. */
static bool to_copy(struct qcow2dev *q, uint64_t cluster) {
  uint64_t end = (cluster + 1) << q->h.cluster_bits;
  return end <= q->h.size && end <= q->backing->size &&
         qcow2_cluster_unallocated(q, cluster);
}

int qcow2_read_copying(struct qcow2dev *q, uint8_t *buf, uint64_t len,
                       uint64_t off) {
  unsigned bits = q->h.cluster_bits;
  uint64_t first = off >> bits, last = (off + len - 1) >> bits;
  /* Widen the read to whole clusters at the ends that will be copied. */
  uint64_t lo = to_copy(q, first) ? first << bits : off;
  uint64_t hi = to_copy(q, last) ? (last + 1) << bits : off + len;
  uint8_t *span = lo == off && hi == off + len ? buf : malloc(hi - lo);
  if (!span)
    return qcow2_read(q, buf, len, off);
  int r = qcow2_read(q, span, hi - lo, lo);
  if (r == 0 && span != buf)
    memcpy(buf, span + (off - lo), len);
  /* The copies are a cache: a failure leaves the cluster to the backing
   * file, and the read has its data. */
  for (uint64_t c = (lo + q->csize - 1) >> bits; r == 0 && c < hi >> bits; c++)
    if (to_copy(q, c))
      qcow2_copy_on_read(q, c, span + ((c << bits) - lo));
  if (span != buf)
    free(span);
  return r;
}
