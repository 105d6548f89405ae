/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 measure: the figures QEMU 7.2's `qemu-img measure -O qcow2` prints
 * (read off qemu-img 7.2.22 for each case). */
#include <criterion/criterion.h>

#include "formats/qcow2/measure.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

Test(measure, fully_allocated_default_options) {
  /* qemu-img measure --size 1G -O qcow2 */
  cr_assert_eq(qcow2_measure_full(GiB, 16, 4, false), 1074135040);
  /* --size 100M */
  cr_assert_eq(qcow2_measure_full(100 * MiB, 16, 4, false), 105185280);
}

Test(measure, small_clusters_and_extended_l2) {
  /* -o cluster_size=4096,compat=0.10 --size 1G */
  cr_assert_eq(qcow2_measure_full(GiB, 12, 4, false), 1076379648);
  /* -o extended_l2=on --size 1G */
  cr_assert_eq(qcow2_measure_full(GiB, 16, 4, true), 1074266112);
}

Test(measure, empty_image_is_its_metadata) {
  /* --size 0: header, one L1 cluster's worth, refcounts */
  cr_assert_eq(qcow2_measure_full(0, 16, 4, false), 196608);
}

Test(measure, refcounts_cover_themselves) {
  /* One 64k block of 16-bit refcounts covers 32768 clusters: 32767 data
   * clusters, the block and the table need a second block. */
  cr_assert_eq(qcow2_measure_refcounts(32766, 16, 4), 2 * 65536);
  cr_assert_eq(qcow2_measure_refcounts(32767, 16, 4), 3 * 65536);
}

Test(measure, bitmaps) {
  /* one bitmap "b0", 64k granularity, 100M image, 64k clusters */
  struct qcow2_measure_bitmap b = {.name_len = 2, .granularity_bits = 16};
  cr_assert_eq(qcow2_measure_bitmaps(&b, 1, 100 * MiB, 16), 196608);
  cr_assert_eq(qcow2_measure_bitmaps(NULL, 0, 100 * MiB, 16), 0);
}
