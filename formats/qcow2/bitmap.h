/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 persistent dirty bitmaps: the bitmap directory and bitmap table
 * entries (qcow2.rst, "Bitmaps extension"), parsed from buffers with every
 * field checked as QEMU checks it.  Pure, for the unit tests, `check` and
 * the tracking of bitmaps while an image is written (dirty-bitmaps.c). */
#ifndef BLOCKPORT_QCOW2_BITMAP_H
#define BLOCKPORT_QCOW2_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Directory entry flags. */
#define QCOW2_BME_IN_USE 1u /* modified since it was last stored */
#define QCOW2_BME_AUTO 2u   /* enabled: tracks writes */
#define QCOW2_BME_RESERVED 0xfffffffcu
/* Limits, as QEMU's. */
#define QCOW2_BITMAP_MIN_GRAN 9
#define QCOW2_BITMAP_MAX_GRAN 31
#define QCOW2_BITMAP_MAX_TABLE 0x8000000u
#define QCOW2_BITMAP_MAX_BYTES 0x20000000u
#define QCOW2_BITMAP_MAX_NAME 1023
/* Bitmap table entries: a data cluster's offset, or with offset 0, bit 0
 * set for a cluster of ones (clear: zeroes). */
#define QCOW2_BITMAP_ALL_ONES 1ull
#define QCOW2_BITMAP_RESERVED 0xff000000000001feull

struct qcow2_bitmap {
  uint64_t table_offset;
  uint32_t table_size; /* entries */
  uint32_t flags;
  unsigned granularity_bits;
  uint32_t dir_pos; /* where the entry starts in the directory */
  char *name;
};

/* Parse the directory in DIR (LEN bytes) of NB bitmaps of an image of
 * IMAGE_SIZE bytes.  Returns 0 with *OUT (free with qcow2_free_bitmaps), or
 * -EINVAL with a reason in bd_errmsg(). */
int qcow2_parse_bitmap_dir(const uint8_t *dir, size_t len, uint32_t nb,
                           unsigned cluster_bits, uint64_t image_size,
                           struct qcow2_bitmap **out);
void qcow2_free_bitmaps(struct qcow2_bitmap *b, uint32_t nb);

/* Whether a bitmap table entry is well-formed. */
bool qcow2_bitmap_entry_ok(uint64_t entry, unsigned cluster_bits);
/* The table entries a bitmap with 2^GRAN_BITS bytes per bit needs for an
 * image of SIZE bytes (each data cluster holds 8 << CLUSTER_BITS bits). */
uint64_t qcow2_bitmap_table_entries(uint64_t size, unsigned gran_bits,
                                    unsigned cluster_bits);

#endif
