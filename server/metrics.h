/* SPDX-License-Identifier: BSD-3-Clause */
/* Server metrics for Prometheus: counters kept with relaxed atomics on the
 * request path, rendered as the text exposition format on a scrape.
 *
 * Collection is off unless `serve --metrics` created a struct metrics;
 * callers check the pointer first, so the default path takes no
 * timestamps and touches no shared counters. */
#ifndef BLOCKPORT_METRICS_H
#define BLOCKPORT_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum metrics_cmd {
  METRICS_READ,
  METRICS_WRITE,
  METRICS_FLUSH,
  METRICS_TRIM,
  METRICS_WRITE_ZEROES,
  METRICS_BLOCK_STATUS,
  METRICS_CACHE,
  METRICS_OTHER, /* rejected commands of unknown type */
  METRICS_NCMDS
};

/* Latency bucket bounds in ns; the last bucket is +Inf. */
#define METRICS_NBOUNDS 13
#define METRICS_NBUCKETS (METRICS_NBOUNDS + 1)
extern const uint64_t metrics_bounds_ns[METRICS_NBOUNDS];

struct metrics_cmd_stats {
  atomic_uint_least64_t bucket[METRICS_NBUCKETS]; /* not cumulative */
  atomic_uint_least64_t sum_ns;
  atomic_uint_least64_t errors;
};

/* One export's counters; aligned so exports do not share cache lines. */
struct metrics_export {
  _Alignas(64) atomic_uint_least64_t conns_open;
  atomic_uint_least64_t conns_total;
  atomic_uint_least64_t inflight;
  atomic_uint_least64_t bytes_read, bytes_written;
  struct metrics_cmd_stats cmd[METRICS_NCMDS];
  atomic_uint_least64_t size;
  atomic_bool active; /* in the current configuration */
  char *name;
};

/* Exports come and go with config reloads: each name keeps its counters
 * (a removed export's series stay, so rates over a reload stay right);
 * entries are never freed before the whole struct, so connections may
 * keep pointers to them. */
struct metrics {
  atomic_uint_least64_t conns_open; /* including those in the handshake */
  atomic_uint_least64_t conns_accepted;
  pthread_mutex_t lock; /* guards the array below, not the counters */
  struct metrics_export **exports;
  size_t nexports, cap;
};

/* NAMES and SIZES of NEXPORTS exports to start with (the names are
 * copied). */
struct metrics *metrics_create(size_t nexports, const char *const *names,
                               const uint64_t *sizes);
void metrics_free(struct metrics *m);
/* The counters of export NAME, created on first use; marked active, with
 * SIZE as its size.  NULL when out of memory. */
struct metrics_export *metrics_export_get(struct metrics *m, const char *name,
                                          uint64_t size);
/* Mark every export inactive: a new configuration is about to get() its
 * exports again. */
void metrics_exports_retire(struct metrics *m);

/* Monotonic nanoseconds. */
uint64_t metrics_now_ns(void);
enum metrics_cmd metrics_cmd_of_nbd(uint16_t nbd_type);

void metrics_conn_accepted(struct metrics *m);
void metrics_conn_closed(struct metrics *m);
void metrics_export_opened(struct metrics_export *e);
void metrics_export_closed(struct metrics_export *e);
/* A request begins: counted in flight.  Returns its start time. */
uint64_t metrics_req_start(struct metrics_export *e);
/* A request ends after START (from metrics_req_start): BYTES of data
 * moved by a read or write, ERR when it failed. */
void metrics_req_done(struct metrics_export *e, enum metrics_cmd cmd,
                      uint64_t start, uint64_t bytes, bool err);
/* Count a finished request that took NS nanoseconds (for tests). */
void metrics_observe(struct metrics_export *e, enum metrics_cmd cmd,
                     uint64_t ns, uint64_t bytes, bool err);

/* Render M in the Prometheus text format into BUF (CAP bytes, always
 * NUL-terminated when CAP > 0).  Returns the length the whole text needs,
 * excluding the NUL, as snprintf does. */
size_t metrics_render(struct metrics *m, char *buf, size_t cap);

/* metrics-http.c: the listener for GET /metrics. */
struct metrics_http;
/* Parse ADDR:PORT ([V6ADDR]:PORT for IPv6).  False if malformed. */
bool metrics_parse_addr(const char *text, char *host, size_t hostlen,
                        char *port, size_t portlen);
/* Bind TEXT (ADDR:PORT) and serve M on a thread; NULL on error, with the
 * reason in bd_errmsg(). */
struct metrics_http *metrics_http_start(const char *text, struct metrics *m);
void metrics_http_stop(struct metrics_http *h);

#endif
