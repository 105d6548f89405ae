/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for per-connection state in the core (bd_conn_open, the four
 * concurrency levels) and the extent rules of the nbdkit plugin host. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/pool.h"
#include "core/source.h"
#include "formats/plugin.h"
#include "formats/registry.h"

/* Sources open through the formats' table, as in the program. */
__attribute__((constructor)) static void install_formats(void) {
  bd_formats_install(formats_registry);
}

/* ---- a source that counts overlapping calls ---- */

struct fconn {
  atomic_int active;
  int max;
  char name[32];
};

static atomic_int active_all, max_all, max_conn, opened, closed;

/* The overlap a level must allow (2) or forbid (1), overall and within
 * one connection.  A call that expects overlap waits, up to a deadline,
 * for it to happen: a level that wrongly serialises fails at the deadline
 * however slow the machine, and a correct one passes as soon as the
 * second call arrives.  A call that may not overlap lingers 2 ms, the
 * window in which a wrong overlap would show (no result depends on its
 * length). */
static int want_all, want_conn;
static atomic_bool gave_up; /* one wait timed out: the others need not */
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;

static void bump_max(atomic_int *m, int v) {
  int cur = atomic_load(m);
  while (v > cur && !atomic_compare_exchange_weak(m, &cur, v))
    ;
}

static bool overlap_seen(void) {
  return atomic_load(&max_all) >= want_all &&
         atomic_load(&max_conn) >= want_conn;
}

static void wait_for_overlap(void) {
  bool expect = (want_all > 1 || want_conn > 1) && !atomic_load(&gave_up);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  if (expect)
    deadline.tv_sec += 10;
  else
    deadline.tv_nsec += 2 * 1000 * 1000;
  if (deadline.tv_nsec >= 1000000000) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&gate);
  pthread_cond_broadcast(&gate_cond); /* a new call: maybe the awaited one */
  while (!(expect && overlap_seen()))
    if (pthread_cond_timedwait(&gate_cond, &gate, &deadline) != 0) {
      if (expect)
        atomic_store(&gave_up, true);
      break;
    }
  pthread_mutex_unlock(&gate);
}

static int f_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  (void)bd;
  (void)off;
  struct fconn *c = bd_conn_current();
  cr_assert_not_null(c, "no connection state during an operation");
  bump_max(&max_all, atomic_fetch_add(&active_all, 1) + 1);
  int mine = atomic_fetch_add(&c->active, 1) + 1;
  bump_max(&max_conn, mine);
  wait_for_overlap();
  memset(buf, c->name[0], len);
  atomic_fetch_sub(&c->active, 1);
  atomic_fetch_sub(&active_all, 1);
  return 0;
}

static void *f_conn_open(struct bd *bd, const struct bd_conn_params *p) {
  (void)bd;
  struct fconn *c = calloc(1, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s",
           *p->export_name ? p->export_name : "default");
  atomic_fetch_add(&opened, 1);
  return c;
}

static void f_conn_close(struct bd *bd, void *priv) {
  (void)bd;
  free(priv);
  atomic_fetch_add(&closed, 1);
}

static const struct bd_ops fake_ops = {
    .name = "fake",
    .pread = f_pread,
    .conn_open = f_conn_open,
    .conn_close = f_conn_close,
};

static struct bd *fake(enum bd_concurrency conc) {
  atomic_store(&max_all, 0);
  atomic_store(&max_conn, 0);
  atomic_store(&opened, 0);
  atomic_store(&closed, 0);
  struct bd *bd = bd_new(&fake_ops, "fake", NULL);
  bd->size = 1 << 20;
  bd->conc = conc;
  bd->caps.readonly = true;
  return bd;
}

/* 16 reads on each connection, all in flight at once through the pool. */
static atomic_int pending;

static void count_done(struct bd_req *req, int err) {
  (void)req;
  cr_assert_eq(err, 0);
  atomic_fetch_sub(&pending, 1);
}

static bool all_done(void) {
  return atomic_load(&pending) == 0;
}

static void run_reads(struct bd *bd, struct bd_conn **conns, int nconns) {
  static struct bd_req req[4][16];
  static char buf[4][16][512];
  atomic_store(&pending, nconns * 16);
  for (int i = 0; i < 16; i++)
    for (int c = 0; c < nconns; c++) {
      req[c][i] = (struct bd_req){.cmd = BD_READ,
                                  .offset = (uint64_t)i * 512,
                                  .length = 512,
                                  .buf = buf[c][i],
                                  .done = count_done,
                                  .conn = conns[c]};
      bd_submit(bd, &req[c][i]);
    }
  /* Waits for an overlap end within 10 s (then gave_up), others in 2 ms. */
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    usleep(1000);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (!all_done() && t.tv_sec - t0.tv_sec < 60);
  cr_assert(all_done(), "reads still pending after 60 s");
}

static void run_level(enum bd_concurrency conc, int expect_all,
                      int expect_conn) {
  cr_assert_eq(bd_pool_start(8), 0);
  want_all = expect_all;
  want_conn = expect_conn;
  atomic_store(&gave_up, false);
  struct bd *bd = fake(conc);
  struct bd_conn *c[2] = {bd_conn_open(bd, "a", true),
                          bd_conn_open(bd, "b", true)};
  cr_assert(c[0] && c[1]);
  run_reads(bd, c, 2);
  bd_conn_close(bd, c[0]);
  bd_conn_close(bd, c[1]);
  bd_close(bd);
  if (expect_all > 1)
    cr_assert_gt(atomic_load(&max_all), 1, "calls never overlapped");
  else
    cr_assert_eq(atomic_load(&max_all), 1, "calls overlapped");
  if (expect_conn > 1)
    cr_assert_gt(atomic_load(&max_conn), 1,
                 "one connection's calls never "
                 "overlapped");
  else
    cr_assert_eq(atomic_load(&max_conn), 1,
                 "one connection's calls "
                 "overlapped");
  cr_assert_eq(atomic_load(&opened), 2);
  cr_assert_eq(atomic_load(&closed), 2);
}

Test(conn, parallel) {
  run_level(BD_CONC_PARALLEL, 2, 2);
}

Test(conn, serialize_conn) {
  run_level(BD_CONC_SERIALIZE_CONN, 2, 1);
}

Test(conn, serialize) {
  run_level(BD_CONC_SERIALIZE, 1, 1);
}

static void *open_second(void *arg) {
  struct bd *bd = arg;
  return bd_conn_open(bd, "second", true);
}

Test(conn, serialize_conns_waits_for_the_first_to_close) {
  struct bd *bd = fake(BD_CONC_SERIALIZE_CONNS);
  struct bd_conn *first = bd_conn_open(bd, "first", true);
  cr_assert_not_null(first);
  pthread_t t;
  pthread_create(&t, NULL, open_second, bd);
  /* An absence can only be watched for a while: 100 ms to open too early. */
  usleep(100 * 1000);
  cr_assert_eq(atomic_load(&opened), 1, "the second opened too early");
  bd_conn_close(bd, first);
  void *second;
  pthread_join(t, &second);
  cr_assert_not_null(second);
  cr_assert_eq(atomic_load(&opened), 2);
  bd_conn_close(bd, second);
  bd_close(bd);
}

/* The second client of a serialize_connections source waits for the
 * first; the front end looks at its client between waits, and cancels. */
struct second {
  struct bd *bd;
  struct bd_conn *c;
  int r;
};

static void *start_second(void *arg) {
  struct second *s = arg;
  s->r = bd_conn_start(s->bd, s->c, 60 * 1000);
  return NULL;
}

Test(conn, cancel_ends_the_wait_for_the_connection_slot) {
  struct bd *bd = fake(BD_CONC_SERIALIZE_CONNS);
  struct bd_conn *first = bd_conn_open(bd, "first", true);
  cr_assert_not_null(first);
  struct second s = {bd, bd_conn_prepare(bd, "second", true, -1), 1};
  cr_assert_not_null(s.c);
  /* A short wait ends without the slot: the front end may look again. */
  cr_assert_eq(bd_conn_start(bd, s.c, 20), -ETIMEDOUT);
  pthread_t t;
  pthread_create(&t, NULL, start_second, &s);
  bd_conn_cancel(bd, s.c); /* before or during its wait: either ends it */
  pthread_join(t, NULL);
  cr_assert_eq(s.r, -ECANCELED, "a cancelled client kept waiting (%d)", s.r);
  cr_assert_eq(atomic_load(&opened), 1, "the cancelled one was opened");
  bd_conn_close(bd, s.c);
  /* The slot is still the first's; once it closes, others get it. */
  struct bd_conn *third = bd_conn_prepare(bd, "third", true, -1);
  bd_conn_close(bd, first);
  cr_assert_eq(bd_conn_start(bd, third, 1000), 0);
  bd_conn_close(bd, third);
  bd_close(bd);
}

static atomic_int cancel_calls;

static void f_cancel(struct bd *bd, struct bd_conn *conn) {
  (void)bd;
  (void)conn;
  atomic_fetch_add(&cancel_calls, 1);
}

static const struct bd_ops cancel_ops = {
    .name = "fake",
    .pread = f_pread,
    .conn_open = f_conn_open,
    .conn_close = f_conn_close,
    .cancel = f_cancel,
};

Test(conn, a_cancelled_connection_runs_no_more_requests) {
  struct bd *bd = fake(BD_CONC_PARALLEL);
  bd->ops = &cancel_ops;
  want_all = want_conn = 1;
  struct bd_conn *gone = bd_conn_open(bd, "gone", true);
  struct bd_conn *kept = bd_conn_open(bd, "kept", true);
  cr_assert(gone && kept);
  bd_conn_cancel(bd, gone);
  bd_conn_cancel(bd, gone); /* once is what the source hears */
  cr_assert_eq(atomic_load(&cancel_calls), 1);
  char buf[512];
  struct bd_req req = {.cmd = BD_READ, .length = 512, .buf = buf, .conn = gone};
  cr_assert_eq(bd_run(bd, &req), -ECANCELED);
  cr_assert(strstr(req.errmsg, "client is gone"), "message: %s", req.errmsg);
  req.conn = kept;
  cr_assert_eq(bd_run(bd, &req), 0, "the other client's request failed");
  cr_assert_eq(buf[0], 'k');
  bd_conn_close(bd, gone);
  bd_conn_close(bd, kept);
  bd_close(bd);
  cr_assert_eq(atomic_load(&closed), 2);
}

Test(conn, default_connection_opens_once_and_closes_with_the_device) {
  struct bd *bd = fake(BD_CONC_PARALLEL);
  char buf[512];
  cr_assert_eq(bd_pread(bd, buf, sizeof buf, 0), 0);
  cr_assert_eq(bd_pread(bd, buf, sizeof buf, 512), 0);
  cr_assert_eq(buf[0], 'd', "the default connection is export \"\"");
  cr_assert_eq(atomic_load(&opened), 1);
  bd_close(bd);
  cr_assert_eq(atomic_load(&closed), 1);
}

Test(conn, sources_without_connections_get_a_placeholder) {
  struct bd *bd = bd_open("memory:1M", NULL, false);
  cr_assert_not_null(bd);
  struct bd_conn *c = bd_conn_open(bd, "x", false);
  cr_assert_not_null(c);
  char buf[512] = {1};
  struct bd_req req = {.cmd = BD_READ, .length = 512, .buf = buf, .conn = c};
  cr_assert_eq(bd_run(bd, &req), 0);
  cr_assert_eq(buf[0], 0);
  bd_conn_close(bd, c);
  bd_close(bd);
}

/* ---- nbdkit_add_extent's rules ---- */

Test(plugin_extents, clipped_to_the_range_and_merged) {
  struct nbdkit_extents e;
  pl_extents_init(&e, 1000, 5000);
  cr_assert_eq(pl_extents_add(&e, 0, 500, 0), 0); /* before: dropped */
  cr_assert_eq(e.n, 0);
  cr_assert_eq(pl_extents_add(&e, 500, 1000, 3), 0);  /* covers start */
  cr_assert_eq(pl_extents_add(&e, 1500, 500, 3), 0);  /* same type: merged */
  cr_assert_eq(pl_extents_add(&e, 2000, 0, 0), 0);    /* empty: ignored */
  cr_assert_eq(pl_extents_add(&e, 2000, 9000, 0), 0); /* past end: cut */
  cr_assert_eq(pl_extents_add(&e, 11000, 10, 3), 0);  /* beyond: dropped */
  cr_assert_eq(e.n, 2);
  cr_assert_eq(e.v[0].offset, 1000);
  cr_assert_eq(e.v[0].length, 1000);
  cr_assert_eq(e.v[0].type, 3);
  cr_assert_eq(e.v[1].offset, 2000);
  cr_assert_eq(e.v[1].length, 3000);
  pl_extents_fini(&e);
}

Test(plugin_extents, gaps_and_late_starts_are_errors) {
  struct nbdkit_extents e;
  pl_extents_init(&e, 1000, 5000);
  cr_assert_eq(pl_extents_add(&e, 1200, 100, 0), -EINVAL);
  pl_extents_fini(&e);
  pl_extents_init(&e, 0, 5000);
  cr_assert_eq(pl_extents_add(&e, 0, 100, 0), 0);
  cr_assert_eq(pl_extents_add(&e, 200, 100, 0), -ERANGE);
  cr_assert_eq(pl_extents_add(&e, 50, 100, 0), -ERANGE);
  pl_extents_fini(&e);
}
