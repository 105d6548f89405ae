/* SPDX-License-Identifier: BSD-3-Clause */
/* The pure parts of changing qcow2 persistent bitmaps
 * (formats/qcow2/bitmap-dir.c): QEMU's limits on a new bitmap, the
 * directory written and parsed back, the header extensions rebuilt, and
 * bits merged between granularities. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "core/byteorder.h"
#include "formats/qcow2/bitmap-dir.h"
#include "formats/qcow2/bitmap.h"
#include "formats/qcow2/qcow2.h"

Test(bitmap_dir, default_granularity_follows_the_cluster_size) {
  cr_assert_eq(qcow2_bitmap_default_granularity(9), 4096);
  cr_assert_eq(qcow2_bitmap_default_granularity(15), 32768);
  cr_assert_eq(qcow2_bitmap_default_granularity(16), 65536);
  cr_assert_eq(qcow2_bitmap_default_granularity(21), 65536);
}

Test(bitmap_dir, refusals_as_qemu_words_them) {
  const uint64_t G = 1ull << 30;
  cr_assert_null(qcow2_bitmap_refuse_new("a", 65536, G, 16, 3, 0, 0));
  cr_assert_null(qcow2_bitmap_refuse_new("a", 1ull << 31, G, 16, 3, 0, 0));
  cr_assert_str_eq(qcow2_bitmap_refuse_new("a", 65536, G, 16, 2, 0, 0),
                   "Cannot store dirty bitmaps in qcow2 v2 files");
  cr_assert_str_eq(qcow2_bitmap_refuse_new("a", 1ull << 32, G, 16, 3, 0, 0),
                   "Granularity exceeds maximum (2147483648 bytes)");
  cr_assert_str_eq(qcow2_bitmap_refuse_new("a", 256, G, 16, 3, 0, 0),
                   "Granularity is under minimum (512 bytes)");
  /* 512-byte bits over 2^29 bytes of bitmap: 2^41 bytes at most. */
  cr_assert_not_null(
      qcow2_bitmap_refuse_new("a", 512, (1ull << 41) + 512, 16, 3, 0, 0));
  char name[1025];
  memset(name, 'x', 1024);
  name[1024] = 0;
  cr_assert_str_eq(qcow2_bitmap_refuse_new(name, 65536, G, 16, 3, 0, 0),
                   "Name length exceeds maximum (1023 characters)");
  name[1023] = 0;
  cr_assert_null(qcow2_bitmap_refuse_new(name, 65536, G, 16, 3, 0, 0));
  cr_assert_str_eq(qcow2_bitmap_refuse_new("a", 65536, G, 16, 3, 65535, 1024),
                   "Maximum number of persistent bitmaps is already reached");
  cr_assert_null(qcow2_bitmap_refuse_new("a", 65536, G, 16, 3, 65534, 1024));
  cr_assert_str_eq(qcow2_bitmap_refuse_new("a", 65536, G, 16, 3, 2,
                                           QCOW2_MAX_BITMAP_DIR - 8),
                   "Not enough space in the bitmap directory");
}

Test(bitmap_dir, written_directory_parses_back) {
  struct qcow2_bitmap_entry e[2] = {{0x30000, 1, QCOW2_BME_AUTO, 16, "one"},
                                    {0x40000, 4, 0, 9, "a-longer-name"}};
  uint8_t buf[128];
  size_t len = qcow2_bitmap_dir_write(e, 2, buf);
  cr_assert_eq(len, qcow2_bitmap_entry_size(3) + qcow2_bitmap_entry_size(13));
  cr_assert_eq(len, 32 + 40);
  struct qcow2_bitmap *b = NULL;
  /* 64 KiB clusters: 1 table entry covers 2^35 bytes at 64 KiB per bit. */
  cr_assert_eq(qcow2_parse_bitmap_dir(buf, len, 2, 16, 1ull << 30, &b), 0);
  cr_assert_str_eq(b[0].name, "one");
  cr_assert_eq(b[0].table_offset, 0x30000);
  cr_assert_eq(b[0].flags, QCOW2_BME_AUTO);
  cr_assert_eq(b[1].granularity_bits, 9);
  cr_assert_eq(b[1].table_size, 4);
  cr_assert_eq(b[1].dir_pos, 32);
  qcow2_free_bitmaps(b, 2);
}

/* A v3 header of 104 bytes with a backing format extension and a backing
 * file name after the end marker. */
static size_t header(uint8_t *h, size_t cap, bool with_bitmaps) {
  memset(h, 0, cap);
  put_be32(h, QCOW2_MAGIC);
  put_be32(h + 4, 3);
  put_be32(h + 100, 104);
  size_t p = 104;
  put_be32(h + p, QCOW2_EXT_BACKING_FORMAT);
  put_be32(h + p + 4, 5);
  memcpy(h + p + 8, "qcow2", 5);
  p += 16;
  if (with_bitmaps) {
    put_be32(h + p, QCOW2_EXT_BITMAPS);
    put_be32(h + p + 4, 24);
    put_be32(h + p + 8, 7);
    p += 32;
  }
  p += 8; /* end */
  memcpy(h + p, "base.qcow2", 10);
  put_be64(h + 8, p);
  put_be32(h + 16, 10);
  return p;
}

Test(bitmap_dir, extensions_rebuilt_around_the_bitmaps_one) {
  uint8_t h[512], out[512], ext[24] = {0};
  size_t used = 0, name_at = header(h, sizeof h, false);
  put_be32(ext, 1);
  cr_assert_eq(
      qcow2_rebuild_extensions(h, sizeof h, 104, name_at, 10, ext, out, &used),
      0);
  /* Backing format kept, bitmaps added, the name moved past them. */
  cr_assert_eq(get_be32(out + 104), QCOW2_EXT_BACKING_FORMAT);
  cr_assert_eq(get_be32(out + 120), QCOW2_EXT_BITMAPS);
  cr_assert_eq(get_be32(out + 128), 1);
  cr_assert_eq(get_be32(out + 152), QCOW2_EXT_END);
  cr_assert_eq(get_be64(out + 8), 160);
  cr_assert_eq(memcmp(out + 160, "base.qcow2", 10), 0);
  cr_assert_eq(used, 170);
  /* And removed again: the name moves back. */
  name_at = header(h, sizeof h, true);
  cr_assert_eq(
      qcow2_rebuild_extensions(h, sizeof h, 104, name_at, 10, NULL, out, &used),
      0);
  cr_assert_eq(get_be32(out + 120), QCOW2_EXT_END);
  cr_assert_eq(get_be64(out + 8), 128);
  cr_assert_eq(used, 138);
  /* No room left in the cluster. */
  name_at = header(h, sizeof h, false);
  cr_assert_eq(
      qcow2_rebuild_extensions(h, 150, 104, name_at, 10, ext, out, &used),
      -ENOSPC);
}

Test(bitmap_dir, merge_between_granularities) {
  /* 8 KiB image: 16 bits of 512 bytes, 2 bits of 4 KiB. */
  uint8_t fine[2] = {0x00, 0x80}, coarse[1] = {0};
  qcow2_bitmap_merge_bits(coarse, 12, fine, 9, 8192);
  cr_assert_eq(coarse[0], 0x02); /* bit 15 of 512 B lies in 4 KiB bit 1 */
  uint8_t back[2] = {0};
  qcow2_bitmap_merge_bits(back, 9, coarse, 12, 8192);
  cr_assert_eq(back[0], 0x00);
  cr_assert_eq(back[1], 0xff); /* the whole 4 KiB under it */
  /* A last bit that covers less than its granularity stops at the end. */
  uint8_t c2[1] = {0x01}, f2[2] = {0};
  qcow2_bitmap_merge_bits(f2, 9, c2, 12, 1024);
  cr_assert_eq(f2[0], 0x03);
  cr_assert_eq(f2[1], 0x00);
}
