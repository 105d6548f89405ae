/* SPDX-License-Identifier: BSD-3-Clause */
/* Sizes for `blockport measure -O qcow2`.  The numbers follow QEMU 7.2's
 * estimate, metadata of a fully allocated image included, so that a tool
 * comparing the two programs' answers sees the same figures. */
#include "measure.h"

static uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

static uint64_t round_up(uint64_t a, uint64_t b) {
  return div_up(a, b) * b;
}

uint64_t qcow2_measure_refcounts(uint64_t clusters, unsigned cluster_bits,
                                 unsigned refcount_order) {
  uint64_t csize = 1ull << cluster_bits;
  uint64_t per_block = (csize * 8) >> refcount_order;
  uint64_t per_table_cluster = csize / 8;
  uint64_t blocks = 0, table = 0, n = 0, last;
  /* The blocks count themselves and the table: grow until it settles. */
  do {
    last = n;
    blocks = div_up(clusters + table + blocks, per_block);
    table = div_up(blocks, per_table_cluster);
    n = clusters + blocks + table;
  } while (n != last);
  return (blocks + table) * csize;
}

uint64_t qcow2_measure_full(uint64_t size, unsigned cluster_bits,
                            unsigned refcount_order, bool extended_l2) {
  uint64_t csize = 1ull << cluster_bits;
  uint64_t l2e = extended_l2 ? 16 : 8;
  uint64_t data = round_up(size, csize);
  uint64_t meta = csize; /* the header */
  uint64_t nl2e = round_up(data / csize, csize / l2e);
  meta += nl2e * l2e;
  uint64_t nl1e = round_up(nl2e * l2e / csize, csize / 8);
  meta += nl1e * 8;
  meta += qcow2_measure_refcounts((meta + data) / csize, cluster_bits,
                                  refcount_order);
  return meta + data;
}

uint64_t qcow2_measure_bitmaps(const struct qcow2_measure_bitmap *b, size_t n,
                               uint64_t size, unsigned cluster_bits) {
  uint64_t csize = 1ull << cluster_bits, total = 0, dir = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t bits = div_up(size, 1ull << b[i].granularity_bits);
    uint64_t clusters = div_up(bits, csize * 8);
    total += clusters * csize;              /* the bitmap, all allocated */
    total += round_up(clusters * 8, csize); /* its table */
    dir += round_up(24 + b[i].name_len, 8); /* its directory entry */
  }
  return total + round_up(dir, csize);
}
