/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the qcow2 bitmap directory parser (formats/qcow2/bitmap.c):
 * well-formed directories, the constraints QEMU puts on each entry, and
 * every length checked against the buffer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "formats/qcow2/bitmap.h"

#define CB 16
#define CS (1ull << CB)
#define IMAGE (1ull << 30)

static void w16(uint8_t *b, uint16_t v) {
  b[0] = (uint8_t)(v >> 8);
  b[1] = (uint8_t)v;
}
static void w32(uint8_t *b, uint32_t v) {
  w16(b, (uint16_t)(v >> 16));
  w16(b + 2, (uint16_t)v);
}
static void w64(uint8_t *b, uint64_t v) {
  w32(b, (uint32_t)(v >> 32));
  w32(b + 4, (uint32_t)v);
}

/* Append one entry at B + *OFF (granularity 64 KiB: one table entry covers
 * 32 GiB); returns its start. */
static uint8_t *put_entry(uint8_t *b, size_t *off, const char *name,
                          uint32_t flags, uint64_t table) {
  uint8_t *p = b + *off;
  size_t nl = strlen(name);
  memset(p, 0, 24 + nl + 8);
  w64(p, table);
  w32(p + 8, 1);
  w32(p + 12, flags);
  p[16] = 1;
  p[17] = 16;
  w16(p + 18, (uint16_t)nl);
  memcpy(p + 24, name, nl);
  *off += (24 + nl + 7) & ~7ull;
  return p;
}

static int parse(const uint8_t *b, size_t len, uint32_t nb,
                 struct qcow2_bitmap **out, char *err) {
  int r = qcow2_parse_bitmap_dir(b, len, nb, CB, IMAGE, out);
  snprintf(err, 256, "%s", r < 0 ? bd_errmsg() : "");
  return r;
}

Test(bitmap, good_directory) {
  uint8_t b[256];
  size_t off = 0;
  put_entry(b, &off, "b0", QCOW2_BME_AUTO, 5 * CS);
  put_entry(b, &off, "a-longer-name", QCOW2_BME_IN_USE, 7 * CS);
  cr_assert_eq(off, 32 + 40);
  struct qcow2_bitmap *bm;
  char err[256];
  cr_assert_eq(parse(b, off, 2, &bm, err), 0, "%s", err);
  cr_assert_str_eq(bm[0].name, "b0");
  cr_assert_eq(bm[0].flags, QCOW2_BME_AUTO);
  cr_assert_eq(bm[0].table_offset, 5 * CS);
  cr_assert_eq(bm[0].table_size, 1);
  cr_assert_eq(bm[0].granularity_bits, 16);
  cr_assert_eq(bm[0].dir_pos, 0);
  cr_assert_str_eq(bm[1].name, "a-longer-name");
  cr_assert_eq(bm[1].dir_pos, 32);
  qcow2_free_bitmaps(bm, 2);
}

Test(bitmap, count_must_match) {
  uint8_t b[256];
  size_t off = 0;
  put_entry(b, &off, "b0", 0, 5 * CS);
  put_entry(b, &off, "b1", 0, 6 * CS);
  struct qcow2_bitmap *bm;
  char err[256];
  cr_assert_eq(parse(b, off, 1, &bm, err), -EINVAL);
  cr_assert(strstr(err, "more"), "%s", err);
  cr_assert_eq(parse(b, off, 3, &bm, err), -EINVAL);
  cr_assert(strstr(err, "fewer"), "%s", err);
  cr_assert_null(bm);
}

Test(bitmap, truncated) {
  uint8_t b[256];
  size_t off = 0;
  put_entry(b, &off, "bitmap-name", 0, 5 * CS);
  struct qcow2_bitmap *bm;
  char err[256];
  for (size_t len = 1; len < off; len++)
    cr_assert_eq(parse(b, len, 1, &bm, err), -EINVAL, "length %zu", len);
  cr_assert_eq(parse(b, 0, 1, &bm, err), -EINVAL);
  cr_assert_eq(parse(b, off, 1, &bm, err), 0);
  qcow2_free_bitmaps(bm, 1);
  /* A name that runs past the end. */
  w16(b + 18, 200);
  cr_assert_eq(parse(b, off, 1, &bm, err), -EINVAL);
}

/* Each constraint of QEMU's check_dir_entry() refuses the directory. */
Test(bitmap, constraints) {
  struct {
    size_t at, width;
    uint64_t value;
  } bad[] = {
      {0, 8, 0},            /* no table */
      {0, 8, 5 * CS + 512}, /* unaligned table */
      {8, 4, 0},            /* empty table */
      {8, 4, 0x8000001},    /* table too large */
      {12, 4, 4},           /* reserved flag */
      {16, 1, 2},           /* unknown type */
      {17, 1, 8},           /* granularity 256 */
      {17, 1, 32},          /* granularity 4 GiB */
      {20, 4, 8},           /* extra data */
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    uint8_t b[256];
    size_t off = 0;
    uint8_t *p = put_entry(b, &off, "b0", 0, 5 * CS);
    if (bad[k].width == 8)
      w64(p + bad[k].at, bad[k].value);
    else if (bad[k].width == 4)
      w32(p + bad[k].at, (uint32_t)bad[k].value);
    else
      p[bad[k].at] = (uint8_t)bad[k].value;
    struct qcow2_bitmap *bm;
    char err[256];
    cr_assert_eq(parse(b, off, 1, &bm, err), -EINVAL, "case %zu", k);
  }
}

Test(bitmap, must_cover_the_image_unless_in_use) {
  uint8_t b[64];
  size_t off = 0;
  uint8_t *p = put_entry(b, &off, "b0", 0, 5 * CS);
  p[17] = 9; /* 512-byte granularity: one data cluster covers 256 MiB */
  struct qcow2_bitmap *bm;
  char err[256];
  cr_assert_eq(parse(b, off, 1, &bm, err), -EINVAL);
  w32(p + 12, QCOW2_BME_IN_USE);
  cr_assert_eq(parse(b, off, 1, &bm, err), 0, "%s", err);
  qcow2_free_bitmaps(bm, 1);
}

Test(bitmap, table_entries) {
  cr_assert(qcow2_bitmap_entry_ok(0, CB));
  cr_assert(qcow2_bitmap_entry_ok(QCOW2_BITMAP_ALL_ONES, CB));
  cr_assert(qcow2_bitmap_entry_ok(3 * CS, CB));
  cr_assert_not(qcow2_bitmap_entry_ok(3 * CS | 1, CB));
  cr_assert_not(qcow2_bitmap_entry_ok(3 * CS + 512, CB));
  cr_assert_not(qcow2_bitmap_entry_ok(2, CB));
  cr_assert_not(qcow2_bitmap_entry_ok(1ull << 63, CB));
  /* 64 MiB at 64 KiB: 1024 bits, one cluster; 1 TiB at 512 bytes: 2^31
   * bits, 256 MiB, 4096 clusters. */
  cr_assert_eq(qcow2_bitmap_table_entries(64ull << 20, 16, CB), 1);
  cr_assert_eq(qcow2_bitmap_table_entries(1ull << 40, 9, CB), 4096);
  cr_assert_eq(qcow2_bitmap_table_entries((1ull << 40) + 1, 9, CB), 4097);
  cr_assert_eq(qcow2_bitmap_table_entries(0, 16, CB), 0);
}
