/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the qcow2 overlap map (formats/qcow2/overlap.c): marks,
 * kinds ignored by metadata writes, QEMU's names, growth of the chunk
 * directory under concurrent lock-free readers, and metadata beyond the
 * end of the file. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>

#include "formats/qcow2/overlap.h"

#define CB 16 /* 64 KiB clusters */
#define CS (1ull << CB)

static struct qcow2_ol *ol;

static void setup(void) {
  ol = qcow2_ol_new(CB);
  cr_assert_not_null(ol);
}

static void teardown(void) {
  qcow2_ol_free(ol);
}

TestSuite(overlap, .init = setup, .fini = teardown);

Test(overlap, empty_map_has_only_the_header) {
  cr_expect_eq(qcow2_ol_check(ol, 0, 1, 0), QCOW2_OL_HEADER);
  cr_expect_eq(qcow2_ol_check(ol, CS - 8, 8, 0), QCOW2_OL_HEADER);
  cr_expect_eq(qcow2_ol_check(ol, CS, CS, 0), 0);
  cr_expect_eq(qcow2_ol_check(ol, 1ull << 50, 4096, 0), 0);
  cr_expect_eq(qcow2_ol_check(ol, 0, 0, 0), 0, "empty ranges touch nothing");
}

Test(overlap, marks_are_per_cluster) {
  cr_assert_eq(qcow2_ol_mark(ol, 3 * CS, 16, QCOW2_OL_ACTIVE_L1), 0);
  /* The whole cluster counts, whatever bytes the table uses. */
  cr_expect_eq(qcow2_ol_check(ol, 3 * CS + 4096, 512, 0), QCOW2_OL_ACTIVE_L1);
  cr_expect_eq(qcow2_ol_check(ol, 2 * CS, CS, 0), 0);
  cr_expect_eq(qcow2_ol_check(ol, 4 * CS, CS, 0), 0);
  /* A range across the boundary touches it. */
  cr_expect_eq(qcow2_ol_check(ol, 3 * CS - 1, 2, 0), QCOW2_OL_ACTIVE_L1);
  cr_expect_eq(qcow2_ol_check(ol, 4 * CS - 1, 2, 0), QCOW2_OL_ACTIVE_L1);
  /* A table of several clusters marks them all. */
  cr_assert_eq(qcow2_ol_mark(ol, 10 * CS, 3 * CS, QCOW2_OL_REFCOUNT_TABLE), 0);
  for (int c = 10; c < 13; c++)
    cr_expect_eq(qcow2_ol_check(ol, c * CS, 8, 0), QCOW2_OL_REFCOUNT_TABLE);
  cr_expect_eq(qcow2_ol_check(ol, 13 * CS, 8, 0), 0);
}

Test(overlap, metadata_writes_ignore_their_own_kind) {
  qcow2_ol_mark(ol, 5 * CS, CS, QCOW2_OL_ACTIVE_L2);
  cr_expect_eq(qcow2_ol_check(ol, 5 * CS, 8, QCOW2_OL_ACTIVE_L2), 0);
  cr_expect_eq(qcow2_ol_check(ol, 5 * CS, 8, QCOW2_OL_REFCOUNT_BLOCK),
               QCOW2_OL_ACTIVE_L2);
  /* An L2 table inside the refcount table: an L2 update there is refused
   * (as it is anywhere in the header cluster). */
  qcow2_ol_mark(ol, 5 * CS, CS, QCOW2_OL_REFCOUNT_TABLE);
  cr_expect_eq(qcow2_ol_check(ol, 5 * CS, 8, QCOW2_OL_ACTIVE_L2),
               QCOW2_OL_REFCOUNT_TABLE);
  cr_expect_eq(qcow2_ol_check(ol, 16, 8, QCOW2_OL_ACTIVE_L1), QCOW2_OL_HEADER);
}

Test(overlap, names_follow_qemus_order) {
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_HEADER), "qcow2_header");
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_REFCOUNT_BLOCK), "refcount block");
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_INACTIVE_L1), "inactive L1 table");
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_ACTIVE_L2 | QCOW2_OL_REFCOUNT_TABLE),
                   "refcount table");
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_ACTIVE_L2 | QCOW2_OL_REFCOUNT_BLOCK),
                   "active L2 table");
  cr_expect_str_eq(qcow2_ol_name(QCOW2_OL_BITMAPS),
                   "bitmap directory or table");
}

Test(overlap, unmark_keeps_other_kinds) {
  qcow2_ol_mark(ol, 7 * CS, CS, QCOW2_OL_ACTIVE_L2 | QCOW2_OL_INACTIVE_L2);
  qcow2_ol_unmark(ol, 7 * CS, CS, QCOW2_OL_ACTIVE_L2);
  cr_expect_eq(qcow2_ol_check(ol, 7 * CS, 8, 0), QCOW2_OL_INACTIVE_L2);
  qcow2_ol_unmark(ol, 7 * CS, CS, QCOW2_OL_INACTIVE_L2);
  cr_expect_eq(qcow2_ol_check(ol, 7 * CS, 8, 0), 0);
  /* Unmarking what was never marked, far away, is harmless. */
  qcow2_ol_unmark(ol, 1ull << 40, CS, QCOW2_OL_ACTIVE_L2);
}

Test(overlap, the_directory_grows_and_keeps_earlier_marks) {
  qcow2_ol_mark(ol, 1 * CS, CS, QCOW2_OL_REFCOUNT_BLOCK);
  /* Clusters far apart: chunks allocated only where marked. */
  uint64_t far[] = {5000, 70000, 1234567, (1ull << 24) - 1};
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++)
    cr_assert_eq(qcow2_ol_mark(ol, far[i] * CS, 1, QCOW2_OL_ACTIVE_L2), 0);
  cr_expect_eq(qcow2_ol_check(ol, 1 * CS, 8, 0), QCOW2_OL_REFCOUNT_BLOCK);
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
    cr_expect_eq(qcow2_ol_check(ol, far[i] * CS, 8, 0), QCOW2_OL_ACTIVE_L2);
    cr_expect_eq(qcow2_ol_check(ol, (far[i] - 1) * CS, 8, 0), 0);
  }
}

Test(overlap, small_and_large_clusters) {
  struct qcow2_ol *s = qcow2_ol_new(9), *l = qcow2_ol_new(21);
  cr_assert(s && l);
  qcow2_ol_mark(s, 512 * 3, 512, QCOW2_OL_ACTIVE_L1);
  cr_expect_eq(qcow2_ol_check(s, 512 * 3 + 100, 8, 0), QCOW2_OL_ACTIVE_L1);
  cr_expect_eq(qcow2_ol_check(s, 512 * 4, 512, 0), 0);
  cr_expect_eq(qcow2_ol_check(s, 511, 1, 0), QCOW2_OL_HEADER);
  cr_expect_eq(qcow2_ol_check(s, 512, 1, 0), 0);
  /* Lookups anywhere qcow2 can point (bits 9-55) are safe. */
  cr_expect_eq(qcow2_ol_check(s, (1ull << 56) - 512, 512, 0), 0);
  qcow2_ol_mark(l, 3ull << 21, 8, QCOW2_OL_SNAPSHOT_TABLE);
  cr_expect_eq(qcow2_ol_check(l, (3ull << 21) + (1u << 20), 8, 0),
               QCOW2_OL_SNAPSHOT_TABLE);
  cr_expect_eq(qcow2_ol_check(l, (1ull << 21) - 1, 1, 0), QCOW2_OL_HEADER);
  qcow2_ol_free(s);
  qcow2_ol_free(l);
}

Test(overlap, beyond_far_everything_is_metadata) {
  qcow2_ol_far(ol, 100 * CS, QCOW2_OL_ACTIVE_L2);
  qcow2_ol_far(ol, 200 * CS, QCOW2_OL_INACTIVE_L2); /* the lowest counts */
  cr_expect_eq(qcow2_ol_check(ol, 99 * CS, CS, 0), 0);
  cr_expect_eq(qcow2_ol_check(ol, 100 * CS, 8, 0), QCOW2_OL_ACTIVE_L2);
  cr_expect_eq(qcow2_ol_check(ol, 99 * CS, CS + 1, 0), QCOW2_OL_ACTIVE_L2);
  cr_expect_eq(qcow2_ol_check(ol, 300 * CS, 8, 0), QCOW2_OL_ACTIVE_L2);
  /* Even a write of the same kind: nothing is written there. */
  cr_expect_eq(qcow2_ol_check(ol, 150 * CS, 8, QCOW2_OL_ACTIVE_L2),
               QCOW2_OL_ACTIVE_L2);
}

/* Readers take no lock while the (single) writer grows the directory:
 * every mark made before a reader starts stays visible throughout. */
struct reader {
  const struct qcow2_ol *ol;
  bool stop; /* atomic */
  unsigned long misses, reads;
};

static void *read_loop(void *arg) {
  struct reader *r = arg;
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    for (uint64_t c = 1; c <= 64; c++) {
      r->reads++;
      if (qcow2_ol_check(r->ol, c * 4096 * CS, 8, 0) != QCOW2_OL_ACTIVE_L2)
        r->misses++;
    }
  }
  return NULL;
}

Test(overlap, lock_free_readers_during_growth) {
  for (uint64_t c = 1; c <= 64; c++)
    qcow2_ol_mark(ol, c * 4096 * CS, 1, QCOW2_OL_ACTIVE_L2);
  struct reader r = {.ol = ol};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, read_loop, &r), 0);
  /* Marks further and further out: the directory doubles many times. */
  for (uint64_t c = 65; c < 20000; c += 7)
    cr_assert_eq(qcow2_ol_mark(ol, c * 4096 * CS, 1, QCOW2_OL_REFCOUNT_BLOCK),
                 0);
  __atomic_store_n(&r.stop, true, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  cr_expect_gt(r.reads, 0);
  cr_expect_eq(r.misses, 0, "%lu of %lu lookups missed a mark", r.misses,
               r.reads);
}
