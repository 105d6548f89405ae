/* SPDX-License-Identifier: BSD-3-Clause */
/* The one splitter (bd_split_count(), bd_split_piece()): pieces that
 * cover the range exactly, in order, none above the maximum. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "core/blockdev.h"

/* Walk the pieces of [OFF, OFF + LEN) cut at MAX and check that they
 * tile it; returns how many there were. */
static size_t walk(uint64_t off, uint64_t len, uint64_t max) {
  size_t n = bd_split_count(len, max);
  uint64_t at = off;
  for (size_t i = 0; i < n; i++) {
    struct bd_split s = bd_split_piece(off, len, max, i);
    cr_assert_eq(s.offset, at, "piece %zu starts at %llu", i,
                 (unsigned long long)s.offset);
    cr_assert_eq(s.skip, at - off);
    cr_assert_gt(s.length, 0);
    if (max)
      cr_assert_leq(s.length, max);
    at += s.length;
  }
  cr_assert_eq(at, off + len, "the pieces end at %llu, not %llu",
               (unsigned long long)at, (unsigned long long)(off + len));
  return n;
}

Test(split, empty_range_has_no_pieces) {
  cr_expect_eq(bd_split_count(0, 4096), 0);
  cr_expect_eq(bd_split_count(0, 0), 0);
}

Test(split, within_the_maximum_is_one_piece) {
  cr_expect_eq(walk(123, 1, 4096), 1);
  cr_expect_eq(walk(0, 4096, 4096), 1);
  struct bd_split s = bd_split_piece(512, 4096, 4096, 0);
  cr_expect_eq(s.offset, 512);
  cr_expect_eq(s.length, 4096);
  cr_expect_eq(s.skip, 0);
}

Test(split, no_maximum_is_one_piece) {
  cr_expect_eq(walk(7, (uint64_t)1 << 40, 0), 1);
}

Test(split, exact_multiple) {
  cr_expect_eq(walk(4096, 3 * 65536, 65536), 3);
  struct bd_split last = bd_split_piece(4096, 3 * 65536, 65536, 2);
  cr_expect_eq(last.offset, 4096 + 2 * 65536);
  cr_expect_eq(last.length, 65536);
}

Test(split, short_last_piece) {
  cr_expect_eq(walk(0, 2 * 65536 + 1, 65536), 3);
  struct bd_split last = bd_split_piece(0, 2 * 65536 + 1, 65536, 2);
  cr_expect_eq(last.length, 1);
}

Test(split, large_ranges_do_not_overflow) {
  uint64_t len = (uint64_t)1 << 50, max = 32u * 1024 * 1024;
  cr_expect_eq(bd_split_count(len, max), (size_t)(len / max));
  cr_expect_eq(bd_split_count(len + 1, max), (size_t)(len / max) + 1);
  struct bd_split last = bd_split_piece(0, len + 1, max, len / max);
  cr_expect_eq(last.offset, len);
  cr_expect_eq(last.length, 1);
}

Test(split, many_shapes_tile) {
  const uint64_t maxes[] = {1, 512, 4096, 65536, 1000};
  for (size_t m = 0; m < sizeof maxes / sizeof *maxes; m++)
    for (uint64_t len = 1; len < 5000; len += 97)
      walk(len * 3, len, maxes[m]);
}
