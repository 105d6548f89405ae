/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for core/filter.c: a filter sees what it intercepts and
 * passes the rest through, filters stack, work offloaded to the pool, and
 * a cancelled connection cancels the inner one. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/checkpoint.h"
#include "core/filter.h"
#include "core/source.h"

#define SIZE (1u << 20)

/* ---- a RAM source with counters, connections and cancel ---- */

struct ram {
  uint8_t *data;
  atomic_uint flushes, conns_open, conns_closed, cancels, bitmaps;
  _Atomic(struct bd_conn *) cancelled; /* the last cancel()'s */
};

static int ram_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct ram *r = bd->priv;
  memcpy(buf, r->data + off, len);
  return 0;
}

static int ram_pwrite(struct bd *bd, const void *buf, uint64_t len,
                      uint64_t off, uint32_t flags) {
  (void)flags;
  struct ram *r = bd->priv;
  memcpy(r->data + off, buf, len);
  return 0;
}

static int ram_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  (void)flags;
  struct ram *r = bd->priv;
  memset(r->data + off, 0, len);
  return 0;
}

static int ram_flush(struct bd *bd) {
  struct ram *r = bd->priv;
  atomic_fetch_add(&r->flushes, 1);
  return 0;
}

/* The first half is data, the second a hole. */
static int ram_extents(struct bd *bd, uint64_t len, uint64_t off,
                       uint32_t flags, struct bd_extents *ext) {
  (void)bd, (void)flags;
  uint64_t end = off + len;
  if (off < SIZE / 2)
    bd_extents_add(ext, (end < SIZE / 2 ? end : SIZE / 2) - off, 0, 1);
  if (end > SIZE / 2)
    bd_extents_add(ext, end - (off > SIZE / 2 ? off : SIZE / 2),
                   BD_EXT_HOLE | BD_EXT_ZERO, 0);
  return 0;
}

static void *ram_conn_open(struct bd *bd, const struct bd_conn_params *p) {
  (void)p;
  struct ram *r = bd->priv;
  atomic_fetch_add(&r->conns_open, 1);
  return r;
}

static void ram_conn_close(struct bd *bd, void *priv) {
  (void)priv;
  struct ram *r = bd->priv;
  atomic_fetch_add(&r->conns_closed, 1);
}

static void ram_cancel(struct bd *bd, struct bd_conn *conn) {
  struct ram *r = bd->priv;
  atomic_fetch_add(&r->cancels, 1);
  atomic_store(&r->cancelled, conn);
}

/* Persistent bitmaps, as far as a checkpoint asks: none to resume, and
 * new ones counted. */
static int ram_bitmap_resume(struct bd *bd, char **name) {
  (void)bd, (void)name;
  return -ENOENT;
}

static int ram_bitmap_start(struct bd *bd, const char *name, uint32_t gran) {
  (void)name, (void)gran;
  struct ram *r = bd->priv;
  atomic_fetch_add(&r->bitmaps, 1);
  return 0;
}

static int ram_bitmap_enable(struct bd *bd, const char *name, bool on) {
  (void)bd, (void)name, (void)on;
  return 0;
}

static int ram_bitmap_bits(struct bd *bd, const char *name,
                           int (*dirty)(void *opaque, uint64_t off,
                                        uint64_t len),
                           void *opaque) {
  (void)bd, (void)name, (void)dirty, (void)opaque;
  return 0;
}

static void ram_close(struct bd *bd) {
  struct ram *r = bd->priv;
  free(r->data);
  free(r);
}

static const struct bd_ops ram_ops = {.name = "ram",
                                      .pread = ram_pread,
                                      .pwrite = ram_pwrite,
                                      .zero = ram_zero,
                                      .trim = ram_zero,
                                      .flush = ram_flush,
                                      .extents = ram_extents,
                                      .conn_open = ram_conn_open,
                                      .conn_close = ram_conn_close,
                                      .cancel = ram_cancel,
                                      .bitmap_resume = ram_bitmap_resume,
                                      .bitmap_start = ram_bitmap_start,
                                      .bitmap_enable = ram_bitmap_enable,
                                      .bitmap_bits = ram_bitmap_bits,
                                      .close = ram_close};

static struct bd *ram_new(struct ram **out) {
  struct ram *r = calloc(1, sizeof *r);
  cr_assert_not_null(r);
  r->data = calloc(1, SIZE);
  struct bd *bd = bd_new(&ram_ops, "ram", "ram");
  cr_assert(r->data && bd);
  bd->priv = r;
  bd->size = SIZE;
  bd->exec = BD_EXEC_INLINE;
  bd->caps.can_cache = false;
  *out = r;
  return bd;
}

/* ---- a counting filter ---- */

struct counts {
  atomic_uint seen[BD_BLOCK_STATUS + 1], done;
};

static int count_done(struct bd_req *req, int err, void *arg) {
  (void)req;
  struct counts *c = arg;
  atomic_fetch_add(&c->done, 1);
  return err;
}

static void count_submit(struct bd *bd, struct bd_req *req) {
  struct counts *c = bd_filter_state(bd);
  atomic_fetch_add(&c->seen[req->cmd], 1);
  bd_filter_forward(req, count_done, c);
}

static const struct bd_filter_ops count_all = {
    .name = "count", .intercept = BD_FILTER_ALL, .submit = count_submit};
static const struct bd_filter_ops count_writes = {.name = "count-writes",
                                                  .intercept = BD_FILTER_WRITES,
                                                  .submit = count_submit};

static struct bd *filter(struct bd *inner, const struct bd_filter_ops *ops,
                         struct counts *c) {
  struct bd *f = bd_filter_new(inner, ops, c);
  cr_assert_not_null(f, "%s", bd_errmsg());
  return f;
}

static int run(struct bd *bd, enum bd_cmd cmd, uint64_t off, uint64_t len,
               void *buf, struct bd_extents *ext) {
  struct bd_req r = {
      .cmd = cmd, .offset = off, .length = len, .buf = buf, .extents = ext};
  return bd_run(bd, &r);
}

/* Write, read, zero, trim, flush and block status through BD. */
static void exercise(struct bd *bd) {
  uint8_t w[4096], rd[4096];
  memset(w, 0xa5, sizeof w);
  cr_assert_eq(run(bd, BD_WRITE, 8192, sizeof w, w, NULL), 0);
  cr_assert_eq(run(bd, BD_READ, 8192, sizeof rd, rd, NULL), 0);
  cr_assert_eq(memcmp(w, rd, sizeof w), 0);
  cr_assert_eq(run(bd, BD_ZERO, 8192, 512, NULL, NULL), 0);
  cr_assert_eq(run(bd, BD_TRIM, 8704, 512, NULL, NULL), 0);
  cr_assert_eq(run(bd, BD_READ, 8192, 1024, rd, NULL), 0);
  for (int i = 0; i < 1024; i++)
    cr_assert_eq(rd[i], 0);
  cr_assert_eq(run(bd, BD_FLUSH, 0, 0, NULL, NULL), 0);
}

static void check_extents(struct bd *bd) {
  struct bd_extents e;
  bd_extents_init(&e, SIZE / 4, 0);
  cr_assert_eq(run(bd, BD_BLOCK_STATUS, SIZE / 4, SIZE / 2, NULL, &e), 0);
  cr_assert_eq(e.n, 2);
  cr_assert_eq(e.v[0].length, SIZE / 4);
  cr_assert_eq(e.v[0].flags, 0);
  cr_assert_eq(e.v[1].flags, BD_EXT_HOLE | BD_EXT_ZERO);
  bd_extents_free(&e);
}

Test(filter, counting_filter_sees_every_request) {
  struct ram *r;
  struct counts c = {0};
  struct bd *f = filter(ram_new(&r), &count_all, &c);
  cr_assert_eq(f->size, SIZE);
  cr_assert_eq(bd_filter_ops_of(f), &count_all);
  exercise(f);
  check_extents(f);
  cr_assert_eq(c.seen[BD_WRITE], 1);
  cr_assert_eq(c.seen[BD_READ], 2);
  cr_assert_eq(c.seen[BD_ZERO], 1);
  cr_assert_eq(c.seen[BD_TRIM], 1);
  cr_assert_eq(c.seen[BD_FLUSH], 1);
  cr_assert_eq(c.seen[BD_BLOCK_STATUS], 1);
  cr_assert_eq(c.done, 7);
  cr_assert_eq(r->flushes, 1);
  cr_assert_eq(bd_close(f), 0);
}

Test(filter, two_stacked_filters) {
  struct ram *r;
  struct counts lo = {0}, hi = {0};
  struct bd *inner = filter(ram_new(&r), &count_all, &lo);
  struct bd *f = filter(inner, &count_writes, &hi);
  cr_assert_eq(bd_filter_inner(f), inner);
  exercise(f);
  check_extents(f);
  cr_assert_eq(hi.seen[BD_WRITE] + hi.seen[BD_ZERO] + hi.seen[BD_TRIM], 3);
  cr_assert_eq(hi.seen[BD_READ] + hi.seen[BD_FLUSH], 0);
  cr_assert_eq(lo.done, 7); /* everything reached the lower one */
  cr_assert_eq(bd_close(f), 0);
}

Test(filter, block_status_and_flush_pass_through) {
  struct ram *r;
  struct counts c = {0};
  struct bd *f = filter(ram_new(&r), &count_writes, &c);
  check_extents(f);
  cr_assert_eq(run(f, BD_FLUSH, 0, 0, NULL, NULL), 0);
  cr_assert_eq(r->flushes, 1);
  cr_assert_eq(c.seen[BD_FLUSH] + c.seen[BD_BLOCK_STATUS], 0);
  cr_assert_eq(bd_close(f), 0);
}

Test(filter, cancel_reaches_the_inner_connection) {
  struct ram *r;
  struct counts c = {0};
  struct bd *f = filter(ram_new(&r), &count_all, &c);
  struct bd_conn *conn = bd_conn_open(f, "", false);
  cr_assert_not_null(conn, "%s", bd_errmsg());
  cr_assert_eq(r->conns_open, 1);
  struct bd_conn *in = conn->priv;
  cr_assert_eq(in->bd, bd_filter_inner(f));
  bd_conn_cancel(f, conn);
  cr_assert_eq(r->cancels, 1);
  cr_assert_eq(atomic_load(&r->cancelled), in);
  uint8_t b[512];
  struct bd_req q = {
      .cmd = BD_READ, .length = sizeof b, .buf = b, .conn = conn};
  cr_assert_eq(bd_run(f, &q), -ECANCELED);
  bd_conn_close(f, conn);
  cr_assert_eq(r->conns_closed, 1);
  cr_assert_eq(bd_close(f), 0);
}

/* A filter answering reads itself on a worker: 0x5a everywhere. */
static void fill(struct bd *bd, struct bd_req *req) {
  (void)bd;
  memset(req->buf, 0x5a, req->length);
  bd_complete(req, 0);
}

static void offload_submit(struct bd *bd, struct bd_req *req) {
  (void)bd;
  if (bd_filter_offload(req, fill) < 0)
    bd_complete(req, -ENOMEM);
}

static const struct bd_filter_ops fill_reads = {
    .name = "fill", .intercept = BD_FILTER_READS, .submit = offload_submit};

Test(filter, work_offloaded_to_the_pool) {
  struct ram *r;
  struct bd *f = bd_filter_new(ram_new(&r), &fill_reads, NULL);
  cr_assert_not_null(f);
  uint8_t b[4096];
  cr_assert_eq(run(f, BD_READ, 0, sizeof b, b, NULL), 0);
  for (size_t i = 0; i < sizeof b; i++)
    cr_assert_eq(b[i], 0x5a);
  cr_assert_eq(run(f, BD_WRITE, 0, sizeof b, b, NULL), 0);
  cr_assert_eq(r->data[100], 0x5a); /* writes went through */
  cr_assert_eq(bd_close(f), 0);
}

/* A checkpoint over a filter keeps its bitmaps in the source below. */
Test(filter, persistent_bitmaps_pass_through) {
  struct ram *r;
  struct counts c = {0};
  struct bd *live = ckpt_live_open(filter(ram_new(&r), &count_all, &c), NULL);
  cr_assert_not_null(live, "%s", bd_errmsg());
  struct bd *view = NULL;
  cr_assert_eq(ckpt_take(live, "c1", &view), 0, "%s", bd_errmsg());
  cr_assert_eq(r->bitmaps, 1);
  uint8_t b[4096] = {1};
  cr_assert_eq(run(live, BD_WRITE, 0, sizeof b, b, NULL), 0);
  cr_assert_eq(c.seen[BD_READ], 1); /* the copy for the view */
  cr_assert_eq(c.seen[BD_WRITE], 1);
  bd_close(view);
  cr_assert_eq(bd_close(live), 0);
}
