/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 L2 entries: what a guest range inside one cluster maps to. */
#include <errno.h>

#include "qcow2.h"

static int decode_compressed(const struct qcow2_geom *g, uint64_t entry,
                             uint32_t in, struct qcow2_run *run) {
  /* x = 62 - (cluster_bits - 8): offset in bits 0..x-1, then the count of
   * additional 512-byte sectors in bits x..61. */
  unsigned x = 62 - (g->cluster_bits - 8);
  uint64_t desc = entry & ~(QCOW2_L2_COPIED | QCOW2_L2_COMPRESSED);
  uint64_t off = desc & ((1ull << x) - 1);
  uint64_t nsect = desc >> x;
  if (off >> 56)
    return -EIO;
  run->kind = QCOW2_COMPRESSED;
  run->coffset = off;
  run->csize = (nsect + 1) * 512 - (off & 511);
  run->length = (1ull << g->cluster_bits) - in;
  return 0;
}

/* Subcluster status: 0 unallocated, 1 zero, 2 data. */
static int sc_status(uint64_t bitmap, unsigned i) {
  if (bitmap & (1ull << i))
    return 2;
  return (bitmap & (1ull << (i + 32))) ? 1 : 0;
}

static int decode_extended(const struct qcow2_geom *g, uint64_t host,
                           bool allocated, uint64_t bitmap, uint32_t in,
                           uint32_t max, struct qcow2_run *run) {
  uint32_t sc_bits = g->cluster_bits - 5, sc_size = 1u << sc_bits;
  /* A subcluster may not be both allocated and zero, nor allocated in an
   * unallocated cluster. */
  if ((bitmap & (bitmap >> 32) & 0xffffffffull) ||
      (!allocated && (bitmap & 0xffffffffull)))
    return -EIO;
  unsigned first = in >> sc_bits;
  int st = sc_status(bitmap, first);
  uint32_t end = ((first + 1) << sc_bits);
  for (unsigned i = first + 1; i < 32 && end - in < max; i++) {
    if (sc_status(bitmap, i) != st)
      break;
    end += sc_size;
  }
  run->length = end - in < max ? end - in : max;
  run->kind = st == 2 ? QCOW2_DATA : st == 1 ? QCOW2_ZERO : QCOW2_UNALLOCATED;
  run->host = st == 2 ? host + in : 0;
  return 0;
}

int qcow2_decode_l2(const struct qcow2_geom *g, uint64_t entry, uint64_t bitmap,
                    uint32_t in, uint32_t max, struct qcow2_run *run) {
  uint32_t csize = 1u << g->cluster_bits;
  if (in >= csize || max == 0)
    return -EINVAL;
  if (max > csize - in)
    max = csize - in;
  *run = (struct qcow2_run){.length = max};
  if (entry & QCOW2_L2_COMPRESSED) {
    /* Images with an external data file have no compressed clusters. */
    if ((g->extended_l2 && bitmap != 0) || g->data_file)
      return -EIO;
    int r = decode_compressed(g, entry, in, run);
    run->length = max;
    return r;
  }
  if (entry & QCOW2_L2_STD_RESERVED)
    return -EIO;
  uint64_t host = entry & QCOW2_OFFSET_MASK;
  if (host & (csize - 1))
    return -EIO;
  /* Host offset 0 is a real cluster only in an external data file, and
   * then the COPIED bit says so. */
  bool allocated = host != 0 || (g->data_file && (entry & QCOW2_L2_COPIED));
  if (g->extended_l2) {
    if (entry & QCOW2_L2_ZERO)
      return -EIO; /* bit 0 is reserved with extended L2 */
    return decode_extended(g, host, allocated, bitmap, in, max, run);
  }
  if ((entry & QCOW2_L2_ZERO) && g->v3) {
    run->kind = QCOW2_ZERO;
  } else if (entry & QCOW2_L2_ZERO) {
    return -EIO; /* version 2 has no zero flag */
  } else if (!allocated) {
    run->kind = QCOW2_UNALLOCATED;
  } else {
    run->kind = QCOW2_DATA;
    run->host = host + in;
  }
  return 0;
}

uint64_t qcow2_sc_mask(unsigned cluster_bits, uint32_t in, uint64_t n) {
  unsigned bits = cluster_bits - 5;
  unsigned first = in >> bits, last = (unsigned)((in + n - 1) >> bits);
  return ((2ull << last) - 1) & ~((1ull << first) - 1);
}

uint64_t qcow2_sc_allocate(uint64_t bitmap, uint64_t mask) {
  return (bitmap | mask) & ~(mask << 32);
}

uint64_t qcow2_sc_zero(uint64_t bitmap, uint64_t mask) {
  return (bitmap & ~mask) | (mask << 32);
}
