/* SPDX-License-Identifier: BSD-3-Clause */
/* `qemu-img measure` for a qcow2 output: the bytes a new image needs, from
 * its creation options, as QEMU 7.2 computes them (pure, unit-tested). */
#ifndef BLOCKPORT_QCOW2_MEASURE_H
#define BLOCKPORT_QCOW2_MEASURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The file size of a fully allocated image of SIZE bytes (rounded up to a
 * cluster): header, L2 and L1 tables, refcount table and blocks, data. */
uint64_t qcow2_measure_full(uint64_t size, unsigned cluster_bits,
                            unsigned refcount_order, bool extended_l2);

/* The refcount table and blocks that cover CLUSTERS clusters and
 * themselves, in bytes. */
uint64_t qcow2_measure_refcounts(uint64_t clusters, unsigned cluster_bits,
                                 unsigned refcount_order);

/* One persistent bitmap to carry over. */
struct qcow2_measure_bitmap {
  size_t name_len;
  unsigned granularity_bits;
};

/* The bytes N bitmaps take in a new image of SIZE bytes with 2^CLUSTER_BITS
 * clusters: every bitmap fully allocated, its table, and the directory. */
uint64_t qcow2_measure_bitmaps(const struct qcow2_measure_bitmap *b, size_t n,
                               uint64_t size, unsigned cluster_bits);

#endif
