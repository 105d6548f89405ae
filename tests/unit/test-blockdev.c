/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for core/blockdev.c, core/pipeline.c and the memory and null
 * sources. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "formats/registry.h"

/* Sources open through the formats' table, as in the program. */
__attribute__((constructor)) static void install_formats(void) {
  bd_formats_install(formats_registry);
}

/* ---- bd_parse_size ---- */

static uint64_t size_ok(const char *s) {
  uint64_t v = 0xdeadbeef;
  int r = bd_parse_size(s, &v);
  cr_assert_eq(r, 0, "'%s' refused (%d)", s, r);
  return v;
}

static void size_bad(const char *s) {
  uint64_t v = 0xdeadbeef;
  int r = bd_parse_size(s, &v);
  cr_assert_eq(r, -EINVAL, "'%s' gave %d (value %llu)", s, r,
               (unsigned long long)v);
  cr_assert_eq(v, 0xdeadbeef, "'%s' changed the output on failure", s);
}

Test(parse_size, plain_numbers) {
  cr_assert_eq(size_ok("0"), 0);
  cr_assert_eq(size_ok("1"), 1);
  cr_assert_eq(size_ok("4096"), 4096);
  cr_assert_eq(size_ok("007"), 7);
  cr_assert_eq(size_ok("9223372036854775807"), INT64_MAX);
}

Test(parse_size, suffixes) {
  cr_assert_eq(size_ok("1K"), 1024);
  cr_assert_eq(size_ok("1k"), 1024);
  cr_assert_eq(size_ok("512k"), 512 * 1024);
  cr_assert_eq(size_ok("1M"), 1u << 20);
  cr_assert_eq(size_ok("3m"), 3u << 20);
  cr_assert_eq(size_ok("1G"), 1ull << 30);
  cr_assert_eq(size_ok("5g"), 5ull << 30);
  cr_assert_eq(size_ok("1T"), 1ull << 40);
  cr_assert_eq(size_ok("2t"), 2ull << 40);
  cr_assert_eq(size_ok("1P"), 1ull << 50);
  cr_assert_eq(size_ok("7E"), 7ull << 60);
  cr_assert_eq(size_ok("0G"), 0);
  cr_assert_eq(size_ok("512B"), 512);
  cr_assert_eq(size_ok("512b"), 512);
}

Test(parse_size, long_forms) {
  cr_assert_eq(size_ok("1KiB"), 1024);
  cr_assert_eq(size_ok("4kiB"), 4096);
  cr_assert_eq(size_ok("1MiB"), 1u << 20);
  cr_assert_eq(size_ok("2GiB"), 2ull << 30);
  cr_assert_eq(size_ok("1TiB"), 1ull << 40);
  cr_assert_eq(size_ok("1KB"), 1024);
  cr_assert_eq(size_ok("1kb"), 1024);
  cr_assert_eq(size_ok("10MB"), 10u << 20);
  cr_assert_eq(size_ok("1GB"), 1ull << 30);
}

Test(parse_size, overflow) {
  size_bad("9223372036854775808");     /* INT64_MAX + 1 */
  size_bad("18446744073709551615");    /* UINT64_MAX */
  size_bad("18446744073709551616");    /* UINT64_MAX + 1: ERANGE */
  size_bad("99999999999999999999999"); /* ERANGE */
  size_bad("8E");                      /* 2^63 */
  size_bad("16E");                     /* 2^64 */
  size_bad("8192P");                   /* 2^63 */
  size_bad("16384P");                  /* 2^64 */
  size_bad("8388608T");                /* 2^63 */
  size_bad("8589934592G");             /* 2^63 */
  size_bad("17179869184G");            /* 2^64, wraps to 0 */
  size_bad("17179869185G");            /* wraps to 1 GiB */
  cr_assert_eq(size_ok("8388607T"), 8388607ull << 40);
  cr_assert_eq(size_ok("8191P"), 8191ull << 50);
}

Test(parse_size, garbage) {
  cr_assert_eq(bd_parse_size(NULL, &(uint64_t){0}), -EINVAL);
  size_bad("");
  size_bad("K");
  size_bad("abc");
  size_bad("-1");
  size_bad("+1");
  size_bad(" 1");
  size_bad("1 ");
  size_bad("1 K");
  size_bad("1.5G");
  size_bad("0x10");
  size_bad("1X");
  size_bad("1KX");
  size_bad("1KK");
  size_bad("1Kib");
  size_bad("1KiBB");
  size_bad("1Ki");
  size_bad("1KBB");
  size_bad("1iB");
  size_bad("1BB");
  size_bad("12M3");
}

/* "B" alone is the byte unit; "BiB" is not a unit. */
Test(parse_size, byte_suffix_has_no_long_form) {
  size_bad("1BiB");
}

/* What a message says about a size refused: the suffix it did not know,
 * a missing number, or a size too large. */
Test(parse_size, problem_names_the_suffix) {
  char buf[96];
  cr_assert_str_eq(bd_size_problem("12Q", buf, sizeof buf),
                   "unknown suffix 'Q' (use k, M, G, T, P or E)");
  cr_assert_str_eq(bd_size_problem("1KBB", buf, sizeof buf),
                   "unknown suffix 'KBB' (use k, M, G, T, P or E)");
  cr_assert(strstr(bd_size_problem("abc", buf, sizeof buf), "a number"));
  cr_assert(strstr(bd_size_problem("", buf, sizeof buf), "a number"));
  cr_assert(
      strstr(bd_size_problem("17179869184G", buf, sizeof buf), "too large"));
}

/* ---- bd_extents ---- */

Test(extents, init_and_add) {
  struct bd_extents e;
  bd_extents_init(&e, 1000, 0);
  cr_assert_eq(e.n, 0);
  cr_assert_eq(e.start, 1000);
  cr_assert_eq(e.end, 1000);
  cr_assert_eq(bd_extents_add(&e, 10, BD_EXT_HOLE, 0), 0);
  cr_assert_eq(e.n, 1);
  cr_assert_eq(e.end, 1010);
  cr_assert_eq(e.v[0].length, 10);
  cr_assert_eq(e.v[0].flags, BD_EXT_HOLE);
  cr_assert_eq(e.v[0].depth, 0);
  cr_assert_eq(e.start, 1000);
  bd_extents_free(&e);
  cr_assert_null(e.v);
  cr_assert_eq(e.n, 0);
}

Test(extents, merging) {
  struct bd_extents e;
  bd_extents_init(&e, 0, 0);
  cr_assert_eq(bd_extents_add(&e, 10, 0, 1), 0);
  cr_assert_eq(bd_extents_add(&e, 20, 0, 1), 0);
  cr_assert_eq(e.n, 1);
  cr_assert_eq(e.v[0].length, 30);
  /* different flags */
  cr_assert_eq(bd_extents_add(&e, 5, BD_EXT_ZERO, 1), 0);
  cr_assert_eq(e.n, 2);
  /* same flags, different depth */
  cr_assert_eq(bd_extents_add(&e, 7, BD_EXT_ZERO, 2), 0);
  cr_assert_eq(e.n, 3);
  cr_assert_eq(bd_extents_add(&e, 8, BD_EXT_ZERO, 2), 0);
  cr_assert_eq(e.n, 3);
  cr_assert_eq(e.v[2].length, 15);
  /* only the last extent merges */
  cr_assert_eq(bd_extents_add(&e, 1, 0, 1), 0);
  cr_assert_eq(e.n, 4);
  cr_assert_eq(e.v[0].length, 30);
  cr_assert_eq(e.v[3].length, 1);
  cr_assert_eq(e.end, 30 + 5 + 15 + 1);
  bd_extents_free(&e);
}

Test(extents, zero_length_ignored) {
  struct bd_extents e;
  bd_extents_init(&e, 50, 1);
  cr_assert_eq(bd_extents_add(&e, 0, 0, 1), 0);
  cr_assert_eq(e.n, 0);
  cr_assert_eq(e.end, 50);
  cr_assert_eq(bd_extents_add(&e, 4, 0, 1), 0);
  cr_assert_eq(bd_extents_add(&e, 0, BD_EXT_HOLE, 0), 0, "full but ignored");
  cr_assert_eq(e.n, 1);
  cr_assert_eq(e.end, 54);
  bd_extents_free(&e);
}

Test(extents, max_limit) {
  struct bd_extents e;
  bd_extents_init(&e, 0, 2);
  cr_assert_eq(bd_extents_add(&e, 1, 0, 1), 0);
  cr_assert_eq(bd_extents_add(&e, 2, BD_EXT_HOLE, 0), 0);
  cr_assert_eq(bd_extents_add(&e, 4, 0, 1), 1);
  cr_assert_eq(e.n, 2);
  cr_assert_eq(e.end, 3, "a refused extent must not count");
  /* merging into the last one still works when full */
  cr_assert_eq(bd_extents_add(&e, 8, BD_EXT_HOLE, 0), 0);
  cr_assert_eq(e.n, 2);
  cr_assert_eq(e.v[1].length, 10);
  cr_assert_eq(e.end, 11);
  bd_extents_free(&e);
}

Test(extents, growth_and_reset) {
  struct bd_extents e;
  bd_extents_init(&e, 0, 0);
  for (unsigned i = 0; i < 1000; i++)
    cr_assert_eq(bd_extents_add(&e, i + 1, i & 1, 0), 0);
  cr_assert_eq(e.n, 1000);
  cr_assert_eq(e.end, 1000 * 1001 / 2);
  for (unsigned i = 0; i < 1000; i++) {
    cr_assert_eq(e.v[i].length, i + 1);
    cr_assert_eq(e.v[i].flags, i & 1);
  }
  bd_extents_reset(&e, 77, 3);
  cr_assert_eq(e.n, 0);
  cr_assert_eq(e.start, 77);
  cr_assert_eq(e.end, 77);
  cr_assert_eq(e.max, 3);
  cr_assert_eq(bd_extents_add(&e, 5, 0, 1), 0);
  cr_assert_eq(e.n, 1);
  cr_assert_eq(e.end, 82);
  bd_extents_free(&e);
}

/* ---- memory: ---- */

#define MIB (1024u * 1024)
#define CHUNK 65536u

static struct bd *open_dev(const char *spec, bool ro) {
  struct bd *bd = bd_open(spec, NULL, ro);
  cr_assert_not_null(bd, "%s: %s", spec, bd_errmsg());
  return bd;
}

static int run(struct bd *bd, enum bd_cmd cmd, uint32_t flags, uint64_t off,
               uint64_t len) {
  struct bd_req r = {.cmd = cmd, .flags = flags, .offset = off, .length = len};
  return bd_run(bd, &r);
}

/* Block status of [off, off+len) into E (initialised here). */
static int status(struct bd *bd, struct bd_extents *e, uint64_t off,
                  uint64_t len, size_t max, uint32_t flags) {
  bd_extents_init(e, off, max);
  struct bd_req r = {.cmd = BD_BLOCK_STATUS,
                     .flags = flags,
                     .offset = off,
                     .length = len,
                     .extents = e};
  return bd_run(bd, &r);
}

static void expect_ext(const struct bd_extents *e, size_t i, uint64_t len,
                       uint32_t flags, uint32_t depth) {
  cr_assert_gt(e->n, i, "only %zu extents", e->n);
  cr_assert_eq(e->v[i].length, len, "extent %zu length %llu, want %llu", i,
               (unsigned long long)e->v[i].length, (unsigned long long)len);
  cr_assert_eq(e->v[i].flags, flags, "extent %zu flags %u, want %u", i,
               e->v[i].flags, flags);
  cr_assert_eq(e->v[i].depth, depth, "extent %zu depth", i);
}

static void fill(uint8_t *p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

static bool is_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

Test(memory, open) {
  struct bd *bd = open_dev("memory:1M", false);
  cr_assert_eq(bd->size, MIB);
  cr_assert_str_eq(bd->format, "memory");
  cr_assert_not(bd->caps.readonly);
  cr_assert(bd->caps.can_extents);
  cr_assert(bd->caps.can_zero);
  cr_assert(bd->caps.can_trim);
  cr_assert_eq(bd_close(bd), 0);
}

Test(memory, bad_specs) {
  cr_assert_null(bd_open("memory:", NULL, false));
  cr_assert_null(bd_open("memory:abc", NULL, false));
  cr_assert_null(bd_open("memory:2P", NULL, false));
  cr_assert_null(bd_open("null", "null", false)); /* null takes a size */
  cr_assert_null(bd_open("null:-5", NULL, false));
  cr_assert_null(strstr(bd_errmsg(), "unknown error"));
}

Test(memory, fresh_device_reads_zeroes) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t *b = malloc(MIB);
  memset(b, 0xff, MIB);
  cr_assert_eq(bd_pread(bd, b, MIB, 0), 0);
  cr_assert(is_zero(b, MIB));
  free(b);
  bd_close(bd);
}

Test(memory, write_read_back) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t w[8192], r[8192];
  fill(w, sizeof w, 3);
  cr_assert_eq(bd_pwrite(bd, w, 4096, 4096, 0), 0);
  memset(r, 0xee, sizeof r);
  cr_assert_eq(bd_pread(bd, r, 8192, 2048), 0);
  cr_assert(is_zero(r, 2048));
  cr_assert_arr_eq(r + 2048, w, 4096);
  cr_assert(is_zero(r + 6144, 2048));
  /* Across a chunk boundary, with FUA. */
  fill(w, sizeof w, 99);
  cr_assert_eq(bd_pwrite(bd, w, 8192, CHUNK - 100, BD_F_FUA), 0);
  memset(r, 0, sizeof r);
  cr_assert_eq(bd_pread(bd, r, 8192, CHUNK - 100), 0);
  cr_assert_arr_eq(r, w, 8192);
  /* The very last byte. */
  cr_assert_eq(bd_pwrite(bd, "\x5a", 1, MIB - 1, 0), 0);
  uint8_t last = 0;
  cr_assert_eq(bd_pread(bd, &last, 1, MIB - 1), 0);
  cr_assert_eq(last, 0x5a);
  cr_assert_eq(bd_flush(bd), 0);
  bd_close(bd);
}

Test(memory, block_status) {
  struct bd *bd = open_dev("memory:1M", false);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 0, MIB, 0, 0), 0);
  cr_assert_eq(e.n, 1);
  expect_ext(&e, 0, MIB, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  cr_assert_eq(e.end, MIB);
  bd_extents_free(&e);

  uint8_t w[200];
  fill(w, sizeof w, 1);
  cr_assert_eq(bd_pwrite(bd, w, 1, 4096, 0), 0);
  /* Across chunks 2 and 3. */
  cr_assert_eq(bd_pwrite(bd, w, sizeof w, 3 * CHUNK - 100, 0), 0);
  cr_assert_eq(status(bd, &e, 0, MIB, 0, 0), 0);
  cr_assert_eq(e.n, 4);
  expect_ext(&e, 0, CHUNK, 0, 1);
  expect_ext(&e, 1, CHUNK, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  expect_ext(&e, 2, 2 * CHUNK, 0, 1);
  expect_ext(&e, 3, MIB - 4 * CHUNK, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  cr_assert_eq(e.end, MIB);
  bd_extents_free(&e);

  /* From an unaligned offset. */
  cr_assert_eq(status(bd, &e, CHUNK + 5, 2 * CHUNK, 0, 0), 0);
  cr_assert_eq(e.n, 2);
  expect_ext(&e, 0, CHUNK - 5, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  expect_ext(&e, 1, CHUNK + 5, 0, 1);
  cr_assert_eq(e.start, CHUNK + 5);
  cr_assert_eq(e.end, 3 * CHUNK + 5);
  bd_extents_free(&e);

  /* A limit of one extent. */
  cr_assert_eq(status(bd, &e, 0, MIB, 1, 0), 0);
  cr_assert_eq(e.n, 1);
  expect_ext(&e, 0, CHUNK, 0, 1);
  bd_extents_free(&e);

  /* REQ_ONE: the first extent is right, and it stops early. */
  cr_assert_eq(status(bd, &e, 0, MIB, 0, BD_F_REQ_ONE), 0);
  cr_assert_geq(e.n, 1);
  cr_assert_lt(e.n, 4);
  expect_ext(&e, 0, CHUNK, 0, 1);
  bd_extents_free(&e);
  bd_close(bd);
}

Test(memory, zero_frees_whole_chunks) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t *w = malloc(2 * CHUNK), *r = malloc(2 * CHUNK);
  fill(w, 2 * CHUNK, 5);
  cr_assert_eq(bd_pwrite(bd, w, 2 * CHUNK, 0, 0), 0);
  cr_assert_eq(run(bd, BD_ZERO, 0, 0, CHUNK), 0);
  memset(r, 0xff, 2 * CHUNK);
  cr_assert_eq(bd_pread(bd, r, 2 * CHUNK, 0), 0);
  cr_assert(is_zero(r, CHUNK));
  cr_assert_arr_eq(r + CHUNK, w + CHUNK, CHUNK);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 0, MIB, 0, 0), 0);
  cr_assert_eq(e.n, 3);
  expect_ext(&e, 0, CHUNK, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  expect_ext(&e, 1, CHUNK, 0, 1);
  expect_ext(&e, 2, MIB - 2 * CHUNK, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  bd_extents_free(&e);
  free(w);
  free(r);
  bd_close(bd);
}

Test(memory, zero_partial_chunk) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t w[4096], r[4096];
  fill(w, sizeof w, 9);
  cr_assert_eq(bd_pwrite(bd, w, sizeof w, 8192, 0), 0);
  cr_assert_eq(run(bd, BD_ZERO, BD_F_MAY_TRIM, 8192 + 100, 200), 0);
  cr_assert_eq(bd_pread(bd, r, sizeof r, 8192), 0);
  cr_assert_arr_eq(r, w, 100);
  cr_assert(is_zero(r + 100, 200));
  cr_assert_arr_eq(r + 300, w + 300, sizeof w - 300);
  /* The chunk still holds data. */
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 0, CHUNK, 0, 0), 0);
  cr_assert_eq(e.n, 1);
  expect_ext(&e, 0, CHUNK, 0, 1);
  bd_extents_free(&e);
  /* Fast zero is supported. */
  cr_assert_eq(run(bd, BD_ZERO, BD_F_FAST_ZERO, 0, MIB), 0);
  cr_assert_eq(bd_pread(bd, r, sizeof r, 8192), 0);
  cr_assert(is_zero(r, sizeof r));
  cr_assert_eq(status(bd, &e, 0, MIB, 0, 0), 0);
  cr_assert_eq(e.n, 1);
  expect_ext(&e, 0, MIB, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  bd_extents_free(&e);
  bd_close(bd);
}

Test(memory, trim) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t w[100], r[100];
  fill(w, sizeof w, 11);
  cr_assert_eq(bd_pwrite(bd, w, sizeof w, 5 * CHUNK, 0), 0);
  cr_assert_eq(run(bd, BD_TRIM, 0, 4 * CHUNK, 2 * CHUNK), 0);
  memset(r, 0xff, sizeof r);
  cr_assert_eq(bd_pread(bd, r, sizeof r, 5 * CHUNK), 0);
  cr_assert(is_zero(r, sizeof r));
  cr_assert_eq(run(bd, BD_CACHE, 0, 0, MIB), 0);
  bd_close(bd);
}

Test(memory, odd_size) {
  struct bd *bd = open_dev("memory:100000", false);
  cr_assert_eq(bd->size, 100000);
  cr_assert_eq(bd_pwrite(bd, "abcdefghij", 10, 99990, 0), 0);
  char r[10];
  cr_assert_eq(bd_pread(bd, r, 10, 99990), 0);
  cr_assert_arr_eq(r, "abcdefghij", 10);
  cr_assert_eq(bd_pwrite(bd, "abcdefghij", 10, 99991, 0), -ENOSPC);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 0, 100000, 0, 0), 0);
  cr_assert_eq(e.n, 2);
  expect_ext(&e, 0, CHUNK, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  expect_ext(&e, 1, 100000 - CHUNK, 0, 1);
  cr_assert_eq(e.end, 100000);
  bd_extents_free(&e);
  bd_close(bd);
}

Test(memory, out_of_range) {
  struct bd *bd = open_dev("memory:1M", false);
  uint8_t b[4096] = {0};
  cr_assert_eq(bd_pread(bd, b, 1, MIB), -EINVAL);
  cr_assert_neq(strstr(bd_errmsg(), "beyond the end"), NULL, "%s", bd_errmsg());
  cr_assert_eq(bd_pread(bd, b, 4096, MIB - 4095), -EINVAL);
  cr_assert_eq(bd_pread(bd, b, 16, UINT64_MAX - 8), -EINVAL);
  cr_assert_eq(bd_pwrite(bd, b, 1, MIB, 0), -ENOSPC);
  cr_assert_eq(bd_pwrite(bd, b, 4096, MIB - 4095, 0), -ENOSPC);
  cr_assert_eq(bd_pwrite(bd, b, 16, UINT64_MAX - 8, 0), -ENOSPC);
  cr_assert_eq(run(bd, BD_ZERO, 0, MIB - 1, 2), -ENOSPC);
  cr_assert_eq(run(bd, BD_TRIM, 0, MIB - 1, 2), -ENOSPC);
  cr_assert_eq(run(bd, BD_CACHE, 0, MIB - 1, 2), -EINVAL);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, MIB - 1, 2, 0, 0), -EINVAL);
  cr_assert_eq(e.n, 0);
  bd_extents_free(&e);
  /* Nothing was written by the refused requests. */
  cr_assert_eq(bd_pread(bd, b, 4096, MIB - 4096), 0);
  cr_assert(is_zero(b, 4096));
  /* Zero-length requests at the end are fine. */
  cr_assert_eq(bd_pread(bd, b, 0, MIB), 0);
  cr_assert_eq(bd_pwrite(bd, b, 0, MIB, 0), 0);
  bd_close(bd);
}

Test(memory, request_too_large) {
  struct bd *bd = open_dev("memory:64M", false);
  uint8_t *b = calloc(1, BD_MAX_IO + 1);
  cr_assert_eq(bd_pread(bd, b, BD_MAX_IO + 1, 0), -EINVAL);
  cr_assert_eq(bd_pwrite(bd, b, BD_MAX_IO + 1, 0, 0), -EINVAL);
  cr_assert_eq(bd_pread(bd, b, BD_MAX_IO, 0), 0);
  /* Zeroing is not bounded. */
  cr_assert_eq(run(bd, BD_ZERO, 0, 0, 64 * MIB), 0);
  free(b);
  bd_close(bd);
}

Test(memory, read_only) {
  struct bd *bd = open_dev("memory:1M", true);
  cr_assert(bd->caps.readonly);
  uint8_t b[512];
  memset(b, 0xab, sizeof b);
  cr_assert_eq(bd_pwrite(bd, b, sizeof b, 0, 0), -EPERM);
  cr_assert_eq(run(bd, BD_ZERO, 0, 0, 512), -EPERM);
  cr_assert_eq(run(bd, BD_TRIM, 0, 0, 512), -EPERM);
  cr_assert_eq(bd_pread(bd, b, sizeof b, 0), 0);
  cr_assert(is_zero(b, sizeof b));
  cr_assert_eq(bd_flush(bd), 0);
  cr_assert_eq(run(bd, BD_CACHE, 0, 0, 512), 0);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 0, MIB, 0, 0), 0);
  expect_ext(&e, 0, MIB, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  bd_extents_free(&e);
  cr_assert_eq(bd_close(bd), 0);
}

/* ---- null: ---- */

Test(null, open_read_write) {
  struct bd *bd = open_dev("null:1G", false);
  cr_assert_eq(bd->size, 1ull << 30);
  cr_assert_str_eq(bd->format, "null");
  uint8_t b[4096];
  memset(b, 0x77, sizeof b);
  cr_assert_eq(bd_pwrite(bd, b, sizeof b, 12345, BD_F_FUA), 0);
  memset(b, 0xff, sizeof b);
  cr_assert_eq(bd_pread(bd, b, sizeof b, 12345), 0);
  cr_assert(is_zero(b, sizeof b));
  cr_assert_eq(run(bd, BD_ZERO, BD_F_FAST_ZERO, 0, 1ull << 30), 0);
  cr_assert_eq(run(bd, BD_TRIM, 0, 0, 1ull << 30), 0);
  cr_assert_eq(bd_flush(bd), 0);
  cr_assert_eq(bd_close(bd), 0);
}

Test(null, block_status) {
  struct bd *bd = open_dev("null:1G", false);
  struct bd_extents e;
  cr_assert_eq(status(bd, &e, 4096, (1ull << 30) - 4096, 0, 0), 0);
  cr_assert_eq(e.n, 1);
  expect_ext(&e, 0, (1ull << 30) - 4096, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  cr_assert_eq(e.end, 1ull << 30);
  bd_extents_free(&e);
  bd_close(bd);
}

Test(null, out_of_range_and_read_only) {
  struct bd *bd = open_dev("null:1M", false);
  uint8_t b[2] = {0};
  cr_assert_eq(bd_pread(bd, b, 2, MIB - 1), -EINVAL);
  cr_assert_eq(bd_pwrite(bd, b, 2, MIB - 1, 0), -ENOSPC);
  cr_assert_eq(run(bd, BD_ZERO, 0, MIB, 1), -ENOSPC);
  bd_close(bd);
  bd = open_dev("null:1M", true);
  cr_assert_eq(bd_pwrite(bd, b, 2, 0, 0), -EPERM);
  cr_assert_eq(run(bd, BD_ZERO, 0, 0, 2), -EPERM);
  cr_assert_eq(bd_pread(bd, b, 2, 0), 0);
  bd_close(bd);
}

Test(null, sizes) {
  struct bd *bd = open_dev("null:0", false);
  cr_assert_eq(bd->size, 0);
  uint8_t b[1];
  cr_assert_eq(bd_pread(bd, b, 1, 0), -EINVAL);
  bd_close(bd);
  bd = open_dev("null:7E", false);
  cr_assert_eq(bd->size, 7ull << 60);
  bd_close(bd);
  cr_assert_null(bd_open("null:", NULL, false));
  cr_assert_null(bd_open("null:8E", NULL, false));
  cr_assert_null(bd_open("null:1Q", NULL, false));
}

/* ---- completion batches ---- */

struct counted_hook {
  struct bd_batch_hook h;
  int runs;
};

static void count_run(struct bd_batch_hook *h) {
  ((struct counted_hook *)h)->runs++;
}

Test(batch, outside_a_batch_nothing_is_deferred) {
  struct counted_hook a = {.h.run = count_run};
  cr_assert_not(bd_batch_defer(&a.h));
  bd_batch_begin();
  bd_batch_end();
  cr_assert_eq(a.runs, 0);
}

Test(batch, hooks_run_once_each_at_the_outermost_end) {
  struct counted_hook a = {.h.run = count_run}, b = {.h.run = count_run};
  bd_batch_begin();
  cr_assert(bd_batch_defer(&a.h));
  bd_batch_begin(); /* nested: its end is not the batch's */
  cr_assert(bd_batch_defer(&b.h));
  bd_batch_end();
  cr_assert_eq(a.runs + b.runs, 0, "a hook ran before the batch ended");
  bd_batch_end();
  cr_assert_eq(a.runs, 1);
  cr_assert_eq(b.runs, 1);
  /* The batch is over: the next defer is refused, the hooks stay run. */
  cr_assert_not(bd_batch_defer(&a.h));
  cr_assert_eq(a.runs, 1);
}

static void *defer_elsewhere(void *arg) {
  return (void *)(uintptr_t)bd_batch_defer(arg);
}

Test(batch, a_batch_belongs_to_its_thread) {
  struct counted_hook a = {.h.run = count_run};
  bd_batch_begin();
  pthread_t t;
  void *deferred;
  cr_assert_eq(pthread_create(&t, NULL, defer_elsewhere, &a.h), 0);
  pthread_join(t, &deferred);
  bd_batch_end();
  cr_assert_null(deferred, "another thread's completion was deferred");
  cr_assert_eq(a.runs, 0);
}

/* ---- submission plugs ---- */

Test(plug, hooks_run_once_at_the_outermost_end_and_not_in_a_batch) {
  struct counted_hook a = {.h.run = count_run};
  cr_assert_not(bd_plug_defer(&a.h), "outside a plug");
  bd_batch_begin(); /* a completion batch is not a plug */
  cr_assert_not(bd_plug_defer(&a.h));
  bd_batch_end();
  bd_plug_begin();
  cr_assert_not(bd_plug_pending(), "an empty plug holds nothing back");
  bd_plug_begin();
  cr_assert(bd_plug_defer(&a.h));
  cr_assert(bd_plug_pending());
  bd_plug_end();
  cr_assert_eq(a.runs, 0, "the hook ran at an inner end");
  bd_plug_end();
  cr_assert_eq(a.runs, 1);
  cr_assert_not(bd_plug_pending());
}

/* ---- I/O modes ---- */

Test(aio_mode, names_round_trip_and_default_is_not_a_name) {
  enum bd_aio m;
  cr_assert_eq(bd_aio_parse("io_uring", &m), 0);
  cr_assert_eq(m, BD_AIO_IO_URING);
  cr_assert_eq(bd_aio_parse("threads", &m), 0);
  cr_assert_eq(m, BD_AIO_THREADS);
  cr_assert_str_eq(bd_aio_name(BD_AIO_THREADS), "threads");
  cr_assert_eq(bd_aio_parse("default", &m), -EINVAL);
  cr_assert_eq(bd_aio_parse("native", &m), -EINVAL);
  cr_assert_eq(bd_aio_parse("", &m), -EINVAL);
}

/* ---- cache modes ---- */

Test(cache_mode, names_round_trip) {
  const char *names[] = {"writeback", "none", "writethrough", "directsync",
                         "unsafe"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    enum bd_cache m;
    cr_assert_eq(bd_cache_parse(names[i], &m), 0, "%s", names[i]);
    cr_assert_str_eq(bd_cache_name(m), names[i]);
    cr_assert_eq(bd_cache_direct(m),
                 m == BD_CACHE_NONE || m == BD_CACHE_DIRECTSYNC);
  }
  enum bd_cache m = BD_CACHE_UNSAFE;
  cr_assert_eq(bd_cache_parse("None", &m), -EINVAL);
  cr_assert_eq(bd_cache_parse("", &m), -EINVAL);
  cr_assert_eq(bd_cache_parse("page", &m), -EINVAL);
  cr_assert_eq(m, BD_CACHE_UNSAFE, "a refused name changed the mode");
}

/* writethrough makes writes FUA and unsafe drops FUA, as the request that
 * reaches the source shows (flushes: test-cache-modes.sh, with strace). */
Test(cache_mode, unsafe_drops_fua_writethrough_adds_it) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.cache = BD_CACHE_UNSAFE;
  struct bd *bd = bd_open_with("memory:1M", &o);
  cr_assert_not_null(bd, "%s", bd_errmsg());
  cr_assert_eq(bd->cache, BD_CACHE_UNSAFE);
  struct bd_req f = {.cmd = BD_FLUSH};
  cr_assert_eq(bd_run(bd, &f), 0);
  struct bd_req w = {
      .cmd = BD_WRITE, .flags = BD_F_FUA, .length = 512, .buf = calloc(1, 512)};
  cr_assert_eq(bd_run(bd, &w), 0);
  cr_assert_eq(w.flags & BD_F_FUA, 0, "unsafe kept FUA");
  bd->cache = BD_CACHE_WRITETHROUGH;
  w.flags = 0;
  cr_assert_eq(bd_run(bd, &w), 0);
  cr_assert_neq(w.flags & BD_F_FUA, 0, "writethrough did not add FUA");
  free(w.buf);
  bd_close(bd);
}
