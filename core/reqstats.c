/* SPDX-License-Identifier: BSD-3-Clause */
/* The request counters of reqstats.h. */
#include "reqstats.h"

#include <time.h>

#define RELAXED memory_order_relaxed

const uint64_t metrics_bounds_ns[METRICS_NBOUNDS] = {
    1000,       1778,       3162,       5623,       10000,      17780,
    31620,      56230,      100000,     177800,     316200,     562300,
    1000000,    1778000,    3162000,    5623000,    10000000,   17780000,
    31620000,   56230000,   100000000,  177800000,  316200000,  562300000,
    1000000000, 1778000000, 3162000000, 5623000000, 10000000000};

uint64_t metrics_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void add(atomic_uint_least64_t *a, uint64_t v) {
  atomic_fetch_add_explicit(a, v, RELAXED);
}

static void sub(atomic_uint_least64_t *a, uint64_t v) {
  atomic_fetch_sub_explicit(a, v, RELAXED);
}

/* What a request holds in flight: the data of a read or write. */
static uint64_t data_bytes(enum metrics_cmd cmd, uint64_t length) {
  return cmd == METRICS_READ || cmd == METRICS_WRITE ? length : 0;
}

uint64_t metrics_req_start(struct metrics_reqs *r, enum metrics_cmd cmd,
                           uint64_t length) {
  add(&r->inflight, 1);
  add(&r->inflight_bytes, data_bytes(cmd, length));
  return metrics_now_ns();
}

/* A binary search: five comparisons on the request path. */
size_t metrics_bucket_of(uint64_t ns) {
  size_t lo = 0, hi = METRICS_NBOUNDS; /* the answer is in [lo, hi] */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ns <= metrics_bounds_ns[mid])
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

void metrics_observe(struct metrics_reqs *r, enum metrics_cmd cmd, uint64_t ns,
                     uint64_t bytes, bool err) {
  struct metrics_cmd_stats *s = &r->cmd[cmd];
  add(&s->bucket[metrics_bucket_of(ns)], 1);
  add(&s->sum_ns, ns);
  if (err)
    add(&s->errors, 1);
  else if (cmd == METRICS_READ)
    add(&r->bytes_read, bytes);
  else if (cmd == METRICS_WRITE)
    add(&r->bytes_written, bytes);
}

void metrics_req_dropped(struct metrics_reqs *r, enum metrics_cmd cmd,
                         uint64_t length) {
  sub(&r->inflight_bytes, data_bytes(cmd, length));
  sub(&r->inflight, 1);
}

void metrics_req_done(struct metrics_reqs *r, enum metrics_cmd cmd,
                      uint64_t start, uint64_t length, bool err) {
  uint64_t now = metrics_now_ns();
  metrics_observe(r, cmd, now > start ? now - start : 0, length, err);
  metrics_req_dropped(r, cmd, length);
}
