/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the qcow2 snapshot table parser (formats/qcow2/snapshot.c):
 * well-formed tables, and every length checked against the buffer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "formats/qcow2/qcow2.h"
#include "formats/qcow2/snapshot-edit.h"
#include "formats/qcow2/snapshot.h"

#define CS 65536ull
#define FILE_SIZE (1ull << 30)

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

/* Append one entry at B + *OFF; returns its start. */
static uint8_t *put_entry(uint8_t *b, size_t *off, const char *id,
                          const char *name, uint32_t extra) {
  uint8_t *p = b + *off;
  size_t il = strlen(id), nl = strlen(name);
  memset(p, 0, 40 + extra + il + nl + 8);
  w64(p, 3 * CS);
  w32(p + 8, 2);
  w16(p + 12, (uint16_t)il);
  w16(p + 14, (uint16_t)nl);
  w32(p + 16, 1700000000);
  w32(p + 20, 5);
  w64(p + 24, 3723004000000ull); /* 1:02:03.004 */
  w32(p + 32, 77);
  w32(p + 36, extra);
  if (extra >= 8)
    w64(p + 40, 1ull << 33);
  if (extra >= 16)
    w64(p + 48, 1ull << 30);
  if (extra >= 24)
    w64(p + 56, 42);
  memcpy(p + 40 + extra, id, il);
  memcpy(p + 40 + extra + il, name, nl);
  *off += (40 + extra + il + nl + 7) & ~7ull;
  return p;
}

static int parse(const uint8_t *b, size_t len, uint32_t nb,
                 struct qcow2_snapshot **s, char *err) {
  size_t used;
  int r = qcow2_parse_snapshots(b, len, nb, CS, FILE_SIZE, s, &used);
  snprintf(err, 256, "%s", r < 0 ? bd_errmsg() : "");
  return r;
}

Test(snapshot, good_table) {
  uint8_t b[4096];
  size_t off = 0;
  put_entry(b, &off, "1", "first", 24);
  put_entry(b, &off, "2", "second one", 16);
  put_entry(b, &off, "10", "", 0);
  struct qcow2_snapshot *s;
  size_t used;
  cr_assert_eq(qcow2_parse_snapshots(b, off, 3, CS, FILE_SIZE, &s, &used), 0,
               "%s", bd_errmsg());
  cr_assert_eq(used, off);
  cr_assert_str_eq(s[0].id, "1");
  cr_assert_str_eq(s[0].name, "first");
  cr_assert_eq(s[0].vm_state_size, 1ull << 33);
  cr_assert_eq(s[0].disk_size, 1ull << 30);
  cr_assert_eq(s[0].icount, 42);
  cr_assert_eq(s[0].date_sec, 1700000000);
  cr_assert_eq(s[0].vm_clock_nsec, 3723004000000ull);
  cr_assert_eq(s[1].icount, UINT64_MAX);
  cr_assert_str_eq(s[1].name, "second one");
  cr_assert_eq(s[2].vm_state_size, 77); /* the 32-bit field */
  cr_assert_str_eq(s[2].name, "");
  qcow2_free_snapshots(s, 3);
}

Test(snapshot, last_entry_without_padding) {
  uint8_t b[256];
  size_t off = 0;
  put_entry(b, &off, "1", "s1", 24); /* 67 bytes, padded to 72 */
  struct qcow2_snapshot *s;
  char err[256];
  cr_assert_eq(parse(b, 67, 1, &s, err), 0, "%s", err);
  qcow2_free_snapshots(s, 1);
  cr_assert_eq(parse(b, 66, 1, &s, err), -ENOSPC);
  cr_assert_null(s);
}

Test(snapshot, truncated_everywhere) {
  uint8_t b[4096];
  size_t off = 0;
  put_entry(b, &off, "1", "first", 24);
  put_entry(b, &off, "2", "second", 24);
  size_t min = off - 7; /* the last padding is optional */
  for (size_t len = 0; len < min; len++) {
    struct qcow2_snapshot *s = (void *)1;
    char err[256] = "";
    /* A copy of exactly LEN bytes, so ASan sees any read past it. */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, b, len);
    int rc = parse(copy, len, 2, &s, err);
    free(copy);
    cr_assert_eq(rc, -ENOSPC, "len %zu: rc %d", len, rc);
    cr_assert_null(s);
    cr_assert_neq(err[0], 0);
  }
}

Test(snapshot, nb_larger_than_table) {
  uint8_t b[4096];
  size_t off = 0;
  put_entry(b, &off, "1", "a", 16);
  struct qcow2_snapshot *s;
  char err[256];
  cr_assert_eq(parse(b, off, 5, &s, err), -ENOSPC);
  cr_assert_eq(parse(b, off, 65537, &s, err), -EINVAL);
}

Test(snapshot, bad_fields) {
  uint8_t b[4096];
  struct qcow2_snapshot *s;
  char err[256];
  size_t off = 0;
  uint8_t *p = put_entry(b, &off, "1", "a", 16);
  w32(p + 36, 1025); /* extra data too large */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EFBIG);
  off = 0;
  p = put_entry(b, &off, "1", "a", 16);
  w16(p + 12, 0); /* empty ID */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EINVAL);
  off = 0;
  p = put_entry(b, &off, "1", "a", 16);
  w64(p, 3 * CS + 512); /* unaligned L1 */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EINVAL);
  off = 0;
  p = put_entry(b, &off, "1", "a", 16);
  w64(p, FILE_SIZE); /* L1 past the end */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EINVAL);
  off = 0;
  p = put_entry(b, &off, "1", "a", 16);
  w32(p + 8, 0x01000000); /* L1 too large */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EINVAL);
  off = 0;
  p = put_entry(b, &off, "1", "ab", 16);
  p[40 + 16 + 1] = 0; /* NUL in the name */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -EINVAL);
  off = 0;
  p = put_entry(b, &off, "1", "a", 16);
  w16(p + 14, 0xffff); /* name runs past the buffer */
  cr_assert_eq(parse(b, sizeof b, 1, &s, err), -ENOSPC);
}

/* Cluster size 0: the L1 tables are left to the caller (the check). */
Test(snapshot, l1_not_judged) {
  uint8_t b[4096];
  size_t off = 0, used;
  uint8_t *p = put_entry(b, &off, "1", "a", 16);
  w64(p, 3 * CS + 512);   /* unaligned */
  w32(p + 8, 0x01000000); /* too large */
  struct qcow2_snapshot *s;
  cr_assert_eq(qcow2_parse_snapshots(b, off, 1, 0, 0, &s, &used), 0, "%s",
               bd_errmsg());
  cr_assert_eq(s[0].l1_size, 0x01000000u);
  qcow2_free_snapshots(s, 1);
}

Test(snapshot, empty) {
  struct qcow2_snapshot *s;
  char err[256];
  cr_assert_eq(parse(NULL, 0, 0, &s, err), 0);
  qcow2_free_snapshots(s, 0);
}

/* ---- writing the table (snapshot-edit.c) ---- */

/* The table written back parses to the same snapshots: a short extra
 * grows to QEMU's 24 bytes, a longer one keeps its unknown bytes, the
 * last entry goes unpadded. */
Test(snapshot, table_round_trip) {
  uint8_t b[4096];
  size_t off = 0, used;
  put_entry(b, &off, "1", "first", 16);
  uint8_t *p = put_entry(b, &off, "7", "x", 32);
  memcpy(p + 40 + 24, "UNKNOWN!", 8);
  struct qcow2_snapshot *s, *t;
  cr_assert_eq(qcow2_parse_snapshots(b, off, 2, CS, FILE_SIZE, &s, &used), 0);
  s[0].disk_size = 5ull << 20; /* not recorded: the caller fills it in */
  size_t len = qcow2_snapshot_table_size(s, 2);
  /* 40+24+1+5 = 70, padded to 72; then 40+32+1+1 = 74, unpadded */
  cr_assert_eq(len, 72 + 74);
  uint8_t *w = malloc(len);
  qcow2_snapshot_table_write(s, 2, w);
  cr_assert_eq(qcow2_parse_snapshots(w, len, 2, CS, FILE_SIZE, &t, &used), 0,
               "%s", bd_errmsg());
  cr_assert_eq(used, len);
  cr_assert_str_eq(t[0].name, "first");
  cr_assert_eq(t[0].extra_len, 24);
  cr_assert_eq(t[0].disk_size, 5ull << 20);
  cr_assert_eq(t[0].icount, UINT64_MAX);
  cr_assert_eq(t[0].l1_offset, 3 * CS);
  cr_assert_eq(t[0].l1_size, 2);
  cr_assert_eq(t[0].date_sec, 1700000000);
  cr_assert_eq(t[0].date_nsec, 5);
  cr_assert_eq(t[0].vm_clock_nsec, 3723004000000ull);
  cr_assert_eq(t[0].vm_state_size, 1ull << 33);
  cr_assert_str_eq(t[1].id, "7");
  cr_assert_eq(t[1].extra_len, 32);
  cr_assert_eq(memcmp(t[1].extra + 24, "UNKNOWN!", 8), 0);
  cr_assert_eq(t[1].icount, 42);
  free(w);
  qcow2_free_snapshots(t, 2);
  qcow2_free_snapshots(s, 2);
}

static struct qcow2_snapshot snap(char *id, char *name) {
  return (struct qcow2_snapshot){.id = id, .name = name};
}

/* Apply looks an ID up first, then a name; delete names only; the first
 * match wins. */
Test(snapshot, find) {
  struct qcow2_snapshot s[] = {snap("1", "2"), snap("2", "a"), snap("3", "a")};
  cr_assert_eq(qcow2_snapshot_find(s, 3, "2", true), 1);
  cr_assert_eq(qcow2_snapshot_find(s, 3, "2", false), 0);
  cr_assert_eq(qcow2_snapshot_find(s, 3, "a", true), 1);
  cr_assert_eq(qcow2_snapshot_find(s, 3, "3", true), 2);
  cr_assert_eq(qcow2_snapshot_find(s, 3, "3", false), -1);
  cr_assert_eq(qcow2_snapshot_find(s, 3, "b", true), -1);
  cr_assert_eq(qcow2_snapshot_find(s, 0, "a", true), -1);
}

/* One more than the largest ID read as a number, as QEMU numbers. */
Test(snapshot, next_id) {
  char id[32];
  qcow2_snapshot_next_id(NULL, 0, id, sizeof id);
  cr_assert_str_eq(id, "1");
  struct qcow2_snapshot s[] = {snap("2", ""), snap("10x", ""), snap("b", "")};
  qcow2_snapshot_next_id(s, 3, id, sizeof id);
  cr_assert_str_eq(id, "11");
}

/* The clusters an L2 entry holds a reference to. */
Test(snapshot, entry_extent) {
  uint64_t off, len;
  bool copied;
  /* 64k clusters: a normal entry, its COPIED flag. */
  cr_assert(qcow2_entry_extent(16, false, QCOW2_L2_COPIED | 0x50000, &off, &len,
                               &copied));
  cr_assert_eq(off, 0x50000);
  cr_assert_eq(len, 65536);
  cr_assert(copied);
  /* A preallocated zero cluster keeps its offset. */
  cr_assert(qcow2_entry_extent(16, false, 0x70000 | QCOW2_L2_ZERO, &off, &len,
                               &copied));
  cr_assert_eq(off, 0x70000);
  cr_assert(!qcow2_entry_extent(16, false, QCOW2_L2_ZERO, &off, &len, &copied));
  cr_assert(!qcow2_entry_extent(16, false, 0, &off, &len, &copied));
  /* Compressed: offset in bits 0-53, sectors-1 above (x = 54 at 64k). */
  uint64_t e = QCOW2_L2_COMPRESSED | (2ull << 54) | 0x12345;
  cr_assert(qcow2_entry_extent(16, false, e, &off, &len, &copied));
  cr_assert_eq(off, 0x12345);
  cr_assert_eq(len, 3 * 512 - 0x145);
  cr_assert(!copied);
}

Test(snapshot, entry_copied) {
  cr_assert_eq(qcow2_entry_copied(0x50000, 1), QCOW2_L2_COPIED | 0x50000);
  cr_assert_eq(qcow2_entry_copied(QCOW2_L2_COPIED | 0x50000, 2), 0x50000);
  cr_assert_eq(qcow2_entry_copied(0x50001, 3), 0x50001);
}
