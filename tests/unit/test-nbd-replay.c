/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD source's replay log (formats/nbd-replay.c): what a flush covers,
 * the bound, and the bytes past it. */
#include <criterion/criterion.h>
#include <string.h>

#include "formats/nbd-replay.h"

#define HDR sizeof(struct replay_entry)

static unsigned count(struct replay_log *l) {
  unsigned n = 0;
  for (struct replay_entry *e = l->head; e; e = e->next)
    n++;
  return n;
}

Test(nbd_replay, keeps_in_order_with_data_until_a_flush_covers) {
  struct replay_log l;
  char a[512], b[512];
  memset(a, 'a', sizeof a);
  memset(b, 'b', sizeof b);
  replay_init(&l, 1 << 20);
  replay_add(&l, BD_WRITE, 0, 0, sizeof a, a);
  uint64_t mark = replay_mark(&l); /* a flush submitted now */
  replay_add(&l, BD_ZERO, BD_F_MAY_TRIM, 4096, 65536, NULL);
  replay_add(&l, BD_WRITE, 0, 512, sizeof b, b);
  cr_assert_eq(count(&l), 3);
  cr_assert_eq(l.head->off, 0);
  cr_assert_eq(memcmp(l.head->data, a, sizeof a), 0);
  cr_assert_eq(l.bytes, 3 * HDR + 1024);
  cr_assert(!replay_clean(&l));
  replay_flushed(&l, mark);
  cr_assert_eq(count(&l), 2, "only what came before the flush goes");
  cr_assert_eq(l.head->cmd, BD_ZERO);
  cr_assert_eq(l.tail->off, 512);
  cr_assert_eq(memcmp(l.tail->data, b, sizeof b), 0);
  replay_flushed(&l, replay_mark(&l));
  cr_assert_null(l.head);
  cr_assert_eq(l.bytes, 0);
  cr_assert(replay_clean(&l));
  cr_assert_eq(l.peak, 3 * HDR + 1024);
  replay_destroy(&l);
}

Test(nbd_replay, past_the_bound_drops_the_oldest_and_counts_them) {
  struct replay_log l;
  static char buf[4096];
  replay_init(&l, 2 * (HDR + 4096));
  for (int i = 0; i < 3; i++)
    replay_add(&l, BD_WRITE, 0, (uint64_t)i * 4096, 4096, buf);
  cr_assert_eq(count(&l), 2);
  cr_assert_eq(l.head->off, 4096, "the oldest went");
  cr_assert_eq(replay_past(&l), HDR + 4096);
  /* A flush submitted before the drop does not cover it. */
  replay_flushed(&l, 0);
  cr_assert_eq(replay_past(&l), HDR + 4096);
  replay_flushed(&l, replay_mark(&l));
  cr_assert_eq(replay_past(&l), 0, "a covering flush clears the count");
  replay_destroy(&l);
}

Test(nbd_replay, larger_than_the_bound_or_zero_bound_keeps_nothing) {
  struct replay_log l;
  static char buf[8192];
  replay_init(&l, 0);
  replay_add(&l, BD_TRIM, 0, 0, 4096, NULL);
  cr_assert_null(l.head);
  cr_assert_eq(replay_past(&l), HDR);
  replay_destroy(&l);
  replay_init(&l, 4096);
  replay_add(&l, BD_WRITE, 0, 0, sizeof buf, buf);
  cr_assert_null(l.head);
  cr_assert_eq(replay_past(&l), HDR + sizeof buf);
  replay_destroy(&l);
}

Test(nbd_replay, fua_writes_dropped_are_not_at_risk) {
  struct replay_log l;
  static char buf[4096];
  replay_init(&l, 1024);
  replay_add(&l, BD_WRITE, BD_F_FUA, 0, sizeof buf, buf);
  cr_assert_null(l.head);
  cr_assert_eq(replay_past(&l), 0, "durable when acknowledged");
  cr_assert(!replay_clean(&l));
  replay_destroy(&l);
}
