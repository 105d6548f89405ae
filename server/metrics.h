/* SPDX-License-Identifier: BSD-3-Clause */
/* Metrics for Prometheus: counters kept with relaxed atomics on the
 * request path, rendered as the text exposition format on a scrape, and
 * the HTTP endpoint that serves them.  `serve`, `mount` and `vhost`
 * --metrics each make one struct metrics for their kind of front end: an
 * NBD server's entries are its exports, a mount's its mount point, a vhost
 * device's its socket.
 *
 * Collection is off unless --metrics created a struct metrics; callers
 * check the pointer first, so the default path takes no timestamps and
 * touches no shared counters. */
#ifndef BLOCKPORT_METRICS_H
#define BLOCKPORT_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/reqstats.h"

/* Why a connection was turned away before it could choose an export. */
enum metrics_refusal {
  METRICS_REFUSED_ALLOW_LIST,        /* not in --allow */
  METRICS_REFUSED_MAX_CONNECTIONS,   /* --max-connections reached */
  METRICS_REFUSED_TLS,               /* the TLS handshake failed */
  METRICS_REFUSED_HANDSHAKE_TIMEOUT, /* the NBD handshake took too long */
  METRICS_NREFUSALS
};

/* Which front end a struct metrics describes: it names the families and
 * the label of its entries (blockport_requests_total{export=...},
 * blockport_mount_requests_total{mountpoint=...},
 * blockport_vhost_requests_total{socket=...}). */
enum metrics_frontend { METRICS_NBD, METRICS_MOUNT, METRICS_VHOST };

/* One export's counters; aligned so exports do not share cache lines. */
struct metrics_export {
  _Alignas(64) atomic_uint_least64_t conns_open;
  atomic_uint_least64_t conns_total;
  struct metrics_reqs req;
  atomic_uint_least64_t size;
  atomic_bool active; /* in the current configuration */
  char *name;
  /* What the export's sources count (core/stats.h): given to the opening
   * of its image, so a qcow2 cache or an nbd:// source counts per export. */
  struct bd_stat_scope *sources;
};

/* Exports come and go with config reloads: each name keeps its counters
 * (a removed export's counters stay, so rates over a reload stay right,
 * while its blockport_export_info and size series go); entries are never
 * freed before the whole struct, so connections may keep pointers to
 * them.  The default export, named "", is labelled export="(default)". */
struct metrics {
  enum metrics_frontend frontend;
  atomic_uint_least64_t conns_open; /* including those in the handshake */
  atomic_uint_least64_t conns_accepted;
  atomic_uint_least64_t refused[METRICS_NREFUSALS];
  uint64_t start_ns;    /* CLOCK_REALTIME when created */
  pthread_mutex_t lock; /* guards the array below, not the counters */
  struct metrics_export **exports;
  size_t nexports, cap;
};

/* NAMES and SIZES of NEXPORTS exports to start with (the names are
 * copied). */
struct metrics *metrics_create(size_t nexports, const char *const *names,
                               const uint64_t *sizes);
/* For a mount or a vhost device: no entries yet (metrics_export_get()
 * makes the one it has, named by its mount point or socket). */
struct metrics *metrics_create_for(enum metrics_frontend f);
void metrics_free(struct metrics *m);
/* The counters of export NAME, created on first use; marked active, with
 * SIZE as its size.  NULL when out of memory. */
struct metrics_export *metrics_export_get(struct metrics *m, const char *name,
                                          uint64_t size);
/* The scope export NAME's sources count in (its entry created, inactive,
 * when new), for the opening of its image; NULL when out of memory. */
struct bd_stat_scope *metrics_export_sources(struct metrics *m,
                                             const char *name);
/* Mark every export inactive: a new configuration is about to get() its
 * exports again. */
void metrics_exports_retire(struct metrics *m);

enum metrics_cmd metrics_cmd_of_nbd(uint16_t nbd_type);

void metrics_conn_accepted(struct metrics *m);
void metrics_conn_closed(struct metrics *m);
void metrics_conn_refused(struct metrics *m, enum metrics_refusal why);
void metrics_export_opened(struct metrics_export *e);
void metrics_export_closed(struct metrics_export *e);
/* Render M in the Prometheus text format into BUF (CAP bytes, always
 * NUL-terminated when CAP > 0).  Returns the length the whole text needs,
 * excluding the NUL, as snprintf does. */
size_t metrics_render(struct metrics *m, char *buf, size_t cap);

/* metrics-http-parse.c: what an HTTP request head asks, from its first
 * LEN bytes in BUF (pure, for the listener and its fuzzer).  The head
 * ends with an empty line; one that has not ended within
 * METRICS_HTTP_MAX bytes is too large. */
#define METRICS_HTTP_MAX 4096
enum metrics_http_verdict {
  METRICS_HTTP_MORE,       /* incomplete: read more */
  METRICS_HTTP_GET,        /* GET /metrics: the page */
  METRICS_HTTP_HEAD,       /* HEAD /metrics: its headers */
  METRICS_HTTP_NOT_FOUND,  /* another path: 404 */
  METRICS_HTTP_BAD_METHOD, /* another method on /metrics: 405 */
  METRICS_HTTP_MALFORMED,  /* not an HTTP request: 400 */
  METRICS_HTTP_TOO_LARGE,  /* no end within METRICS_HTTP_MAX bytes: 431 */
};
enum metrics_http_verdict metrics_http_parse(const char *buf, size_t len);

/* metrics-http.c: the listener for GET /metrics. */
struct metrics_http;
/* Parse ADDR:PORT ([V6ADDR]:PORT for IPv6).  False if malformed. */
bool metrics_http_parse_addr(const char *text, char *host, size_t hostlen,
                             char *port, size_t portlen);
/* Bind TEXT (ADDR:PORT) and serve M on a thread of its own: one poll()
 * loop over non-blocking sockets, so that an idle or slow client delays
 * no other.  At most METRICS_HTTP_CLIENTS clients at once; each has
 * METRICS_HTTP_CLIENT_MS for its request and reply.  NULL on error, with
 * the reason in bd_errmsg(). */
#define METRICS_HTTP_CLIENTS 64
#define METRICS_HTTP_CLIENT_MS 30000
struct metrics_http *metrics_http_start(const char *text, struct metrics *m);
void metrics_http_stop(struct metrics_http *h);

#endif
