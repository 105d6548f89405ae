/* SPDX-License-Identifier: BSD-3-Clause */
/* Metrics collection (relaxed atomics: counters need no ordering with
 * anything else) and their rendering in the Prometheus text format. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"
#include "core/stats.h"
#include "core/version.h"
#include "metrics-process.h"
#include "nbd-protocol.h"

#define RELAXED memory_order_relaxed

static const char *const cmd_names[METRICS_NCMDS] = {
    "read",         "write",        "flush", "trim",
    "write_zeroes", "block_status", "cache", "other"};

static const char *const refusal_names[METRICS_NREFUSALS] = {
    "allow_list", "max_connections", "tls", "handshake_timeout"};

/* The default export's name is "": an empty label value would read as a
 * missing label, so it gets a name no export can be confused with in
 * practice. */
#define DEFAULT_EXPORT_LABEL "(default)"

struct metrics *metrics_create_for(enum metrics_frontend f) {
  struct metrics *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  m->frontend = f;
  pthread_mutex_init(&m->lock, NULL);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  m->start_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  return m;
}

struct metrics *metrics_create(size_t nexports, const char *const *names,
                               const uint64_t *sizes) {
  struct metrics *m = metrics_create_for(METRICS_NBD);
  for (size_t i = 0; m && i < nexports; i++) {
    if (!metrics_export_get(m, names[i], sizes[i])) {
      metrics_free(m);
      return NULL;
    }
  }
  return m;
}

void metrics_free(struct metrics *m) {
  if (!m)
    return;
  for (size_t i = 0; i < m->nexports; i++) {
    free(m->exports[i]->name);
    bd_stat_scope_free(m->exports[i]->sources);
    free(m->exports[i]);
  }
  free(m->exports);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

static struct metrics_export *find_export(struct metrics *m, const char *name) {
  for (size_t i = 0; i < m->nexports; i++)
    if (!strcmp(m->exports[i]->name, name))
      return m->exports[i];
  return NULL;
}

static struct metrics_export *new_export(struct metrics *m, const char *name) {
  if (m->nexports == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 8;
    struct metrics_export **v = realloc(m->exports, cap * sizeof *v);
    if (!v)
      return NULL;
    m->exports = v;
    m->cap = cap;
  }
  struct metrics_export *e = aligned_alloc(_Alignof(struct metrics_export),
                                           sizeof(struct metrics_export));
  char *copy = strdup(name);
  struct bd_stat_scope *sources = bd_stat_scope_new();
  if (!e || !copy || !sources) {
    free(e);
    free(copy);
    bd_stat_scope_free(sources);
    return NULL;
  }
  memset(e, 0, sizeof *e);
  e->name = copy;
  e->sources = sources;
  m->exports[m->nexports++] = e;
  return e;
}

struct metrics_export *metrics_export_get(struct metrics *m, const char *name,
                                          uint64_t size) {
  pthread_mutex_lock(&m->lock);
  struct metrics_export *e = find_export(m, name);
  if (!e)
    e = new_export(m, name);
  if (e) {
    atomic_store(&e->size, size);
    atomic_store(&e->active, true);
  }
  pthread_mutex_unlock(&m->lock);
  return e;
}

struct bd_stat_scope *metrics_export_sources(struct metrics *m,
                                             const char *name) {
  pthread_mutex_lock(&m->lock);
  struct metrics_export *e = find_export(m, name);
  if (!e)
    e = new_export(m, name);
  pthread_mutex_unlock(&m->lock);
  return e ? e->sources : NULL;
}

void metrics_exports_retire(struct metrics *m) {
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < m->nexports; i++)
    atomic_store(&m->exports[i]->active, false);
  pthread_mutex_unlock(&m->lock);
}

enum metrics_cmd metrics_cmd_of_nbd(uint16_t nbd_type) {
  switch (nbd_type) {
  case NBD_CMD_READ: return METRICS_READ;
  case NBD_CMD_WRITE: return METRICS_WRITE;
  case NBD_CMD_FLUSH: return METRICS_FLUSH;
  case NBD_CMD_TRIM: return METRICS_TRIM;
  case NBD_CMD_WRITE_ZEROES: return METRICS_WRITE_ZEROES;
  case NBD_CMD_BLOCK_STATUS: return METRICS_BLOCK_STATUS;
  case NBD_CMD_CACHE: return METRICS_CACHE;
  default: return METRICS_OTHER;
  }
}

/* ---- collection ---- */

static void add(atomic_uint_least64_t *a, uint64_t v) {
  atomic_fetch_add_explicit(a, v, RELAXED);
}

static void sub(atomic_uint_least64_t *a, uint64_t v) {
  atomic_fetch_sub_explicit(a, v, RELAXED);
}

static uint64_t get(const atomic_uint_least64_t *a) {
  return atomic_load_explicit((atomic_uint_least64_t *)a, RELAXED);
}

void metrics_conn_accepted(struct metrics *m) {
  add(&m->conns_open, 1);
  add(&m->conns_accepted, 1);
}

void metrics_conn_closed(struct metrics *m) {
  sub(&m->conns_open, 1);
}

void metrics_conn_refused(struct metrics *m, enum metrics_refusal why) {
  add(&m->refused[why], 1);
}

void metrics_export_opened(struct metrics_export *e) {
  add(&e->conns_open, 1);
  add(&e->conns_total, 1);
}

void metrics_export_closed(struct metrics_export *e) {
  sub(&e->conns_open, 1);
}

/* ---- rendering ---- */

/* How each front end's entries are named (enum metrics_frontend). */
static const struct frontend_names {
  const char *family; /* before the request families' names */
  const char *entry;  /* before "info" and "size_bytes" */
  const char *label;  /* the entries' label */
  const char *duration_help;
} frontend_names[] = {
    [METRICS_NBD] = {"", "export_", "export",
                     "Time from a request's arrival (its header parsed) to "
                     "its reply leaving the socket."},
    [METRICS_MOUNT] = {"mount_", "mount_", "mountpoint",
                       "Time from a FUSE request's arrival to its reply to "
                       "the kernel."},
    [METRICS_VHOST] = {"vhost_", "vhost_", "socket",
                       "Time from a guest's request leaving its queue to its "
                       "completion."},
};

/* Text appended to a fixed buffer; len counts what did not fit too. */
struct out {
  char *buf;
  size_t cap, len;
  const struct frontend_names *fe;
};

/* FE's family PREFIX+BASE in BUF. */
static const char *family(char *buf, size_t n, const char *prefix,
                          const char *base) {
  snprintf(buf, n, "%s%s", prefix, base);
  return buf;
}

__attribute__((format(printf, 2, 3))) static void put(struct out *o,
                                                      const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = o->len < o->cap ? o->cap - o->len : 0;
  int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0)
    o->len += (size_t)n;
}

static void put_char(struct out *o, char ch) {
  if (o->len + 1 < o->cap) {
    o->buf[o->len] = ch;
    o->buf[o->len + 1] = '\0';
  }
  o->len++;
}

/* A label value, escaped as the format asks: \\, \" and \n. */
static void put_label_value(struct out *o, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"') {
      put_char(o, '\\');
      put_char(o, *s);
    } else if (*s == '\n') {
      put_char(o, '\\');
      put_char(o, 'n');
    } else {
      put_char(o, *s);
    }
  }
}

static void put_header(struct out *o, const char *name, const char *type,
                       const char *help) {
  put(o, "# HELP blockport_%s %s\n# TYPE blockport_%s %s\n", name, help, name,
      type);
}

static void put_export_label(struct out *o, const struct metrics_export *e) {
  put(o, "%s=\"", o->fe->label);
  put_label_value(o, e->name[0] ? e->name : DEFAULT_EXPORT_LABEL);
  put_char(o, '"');
}

/* name{export="E"[,EXTRA]} VALUE */
static void put_export_sample(struct out *o, const char *name,
                              const struct metrics_export *e, const char *extra,
                              uint64_t v) {
  put(o, "blockport_%s{", name);
  put_export_label(o, e);
  put(o, "%s%s} %llu\n", extra ? "," : "", extra ? extra : "",
      (unsigned long long)v);
}

/* NS nanoseconds as seconds, exactly. */
static void put_seconds(struct out *o, uint64_t ns) {
  put(o, "%llu.%09llu\n", (unsigned long long)(ns / 1000000000u),
      (unsigned long long)(ns % 1000000000u));
}

/* One of Prometheus' standard process_* metrics (no prefix). */
static void put_process(struct out *o, const char *name, const char *type,
                        const char *help, uint64_t v) {
  put(o, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
      (unsigned long long)v);
}

static void render_process_figures(struct out *o) {
  struct metrics_process p;
  if (metrics_process_read(&p) < 0)
    return;
  put(o,
      "# HELP process_cpu_seconds_total User and system CPU time spent "
      "in seconds.\n# TYPE process_cpu_seconds_total counter\n"
      "process_cpu_seconds_total %llu.%06llu\n",
      (unsigned long long)(p.cpu_us / 1000000u),
      (unsigned long long)(p.cpu_us % 1000000u));
  put_process(o, "process_resident_memory_bytes", "gauge",
              "Resident memory size in bytes.", p.resident_bytes);
  put_process(o, "process_virtual_memory_bytes", "gauge",
              "Virtual memory size in bytes.", p.virtual_bytes);
  put_process(o, "process_open_fds", "gauge",
              "Number of open file descriptors.", p.open_fds);
  put_process(o, "process_max_fds", "gauge",
              "Maximum number of open file descriptors.", p.max_fds);
}

static void render_process(const struct metrics *m, struct out *o) {
  put_header(o, "build_info", "gauge",
             "Always 1; the version of the running blockport as a label.");
  put(o, "blockport_build_info{version=\"");
  put_label_value(o, BLOCKPORT_VERSION);
  put(o, "\"} 1\n");
  /* Prometheus' standard name, without the prefix. */
  put(o, "# HELP process_start_time_seconds Start time of the server since "
         "the Unix epoch in seconds.\n"
         "# TYPE process_start_time_seconds gauge\n"
         "process_start_time_seconds ");
  put_seconds(o, m->start_ns);
  render_process_figures(o);
}

static void render_server(const struct metrics *m, struct out *o) {
  put_header(o, "connections", "gauge",
             "Open client connections, including those in the handshake.");
  put(o, "blockport_connections %llu\n",
      (unsigned long long)get(&m->conns_open));
  put_header(o, "connections_accepted_total", "counter",
             "Client connections accepted.");
  put(o, "blockport_connections_accepted_total %llu\n",
      (unsigned long long)get(&m->conns_accepted));
  put_header(o, "connections_refused_total", "counter",
             "Client connections turned away before choosing an export, by "
             "reason.");
  for (size_t r = 0; r < METRICS_NREFUSALS; r++)
    put(o, "blockport_connections_refused_total{reason=\"%s\"} %llu\n",
        refusal_names[r], (unsigned long long)get(&m->refused[r]));
  size_t active = 0;
  for (size_t i = 0; i < m->nexports; i++)
    active += atomic_load(&m->exports[i]->active);
  put_header(o, "exports", "gauge", "Exports served.");
  put(o, "blockport_exports %zu\n", active);
}

typedef uint64_t (*export_value_fn)(const struct metrics_export *e);

static uint64_t v_size(const struct metrics_export *e) {
  return get(&e->size);
}
static uint64_t v_conns(const struct metrics_export *e) {
  return get(&e->conns_open);
}
static uint64_t v_conns_total(const struct metrics_export *e) {
  return get(&e->conns_total);
}
static uint64_t v_inflight(const struct metrics_export *e) {
  return get(&e->req.inflight);
}
static uint64_t v_inflight_bytes(const struct metrics_export *e) {
  return get(&e->req.inflight_bytes);
}
static uint64_t v_read(const struct metrics_export *e) {
  return get(&e->req.bytes_read);
}
static uint64_t v_written(const struct metrics_export *e) {
  return get(&e->req.bytes_written);
}
static uint64_t v_one(const struct metrics_export *e) {
  (void)e;
  return 1;
}

static bool is_active(const struct metrics_export *e) {
  return atomic_load((atomic_bool *)&e->active);
}

/* One metric with a sample per export; with ACTIVE_ONLY, for the exports
 * of the current configuration only (their description, not counters). */
static void render_per_export(const struct metrics *m, struct out *o,
                              const char *name, const char *type,
                              const char *help, export_value_fn value,
                              bool active_only) {
  put_header(o, name, type, help);
  for (size_t i = 0; i < m->nexports; i++)
    if (!active_only || is_active(m->exports[i]))
      put_export_sample(o, name, m->exports[i], NULL, value(m->exports[i]));
}

static void render_exports(const struct metrics *m, struct out *o) {
  char name[64];
  const char *entry = o->fe->entry;
  render_per_export(m, o, family(name, sizeof name, entry, "info"), "gauge",
                    m->frontend == METRICS_NBD
                        ? "Always 1, for each export served; a reload drops "
                          "the series of the exports it removes."
                        : "Always 1, for the disk served.",
                    v_one, true);
  render_per_export(m, o, family(name, sizeof name, entry, "size_bytes"),
                    "gauge", "Size of the disk.", v_size, true);
  if (m->frontend != METRICS_NBD)
    return;
  render_per_export(m, o, "export_connections", "gauge",
                    "Connections in transmission on each export.", v_conns,
                    false);
  /* Not export_connections_total: OpenMetrics would read that as the
   * counter of the gauge's family above. */
  render_per_export(m, o, "export_connections_opened_total", "counter",
                    "Connections that chose each export.", v_conns_total,
                    false);
}

static uint64_t cmd_count(const struct metrics_cmd_stats *s) {
  uint64_t n = 0;
  for (size_t b = 0; b < METRICS_NBUCKETS; b++)
    n += get(&s->bucket[b]);
  return n;
}

/* Requests and errors by command.  The request count is the histogram's
 * count, so the two always agree. */
static void render_cmd_counter(const struct metrics *m, struct out *o,
                               const char *name, const char *help,
                               bool errors) {
  put_header(o, name, "counter", help);
  char extra[40];
  for (size_t i = 0; i < m->nexports; i++) {
    const struct metrics_export *e = m->exports[i];
    for (size_t c = 0; c < METRICS_NCMDS; c++) {
      snprintf(extra, sizeof extra, "cmd=\"%s\"", cmd_names[c]);
      uint64_t v =
          errors ? get(&e->req.cmd[c].errors) : cmd_count(&e->req.cmd[c]);
      put_export_sample(o, name, e, extra, v);
    }
  }
}

static void render_histogram(const struct metrics_export *e, size_t c,
                             struct out *o) {
  const struct metrics_cmd_stats *s = &e->req.cmd[c];
  const char *pre = o->fe->family;
  char extra[64], name[64];
  uint64_t cum = 0;
  family(name, sizeof name, pre, "request_duration_seconds_bucket");
  for (size_t b = 0; b < METRICS_NBUCKETS; b++) {
    cum += get(&s->bucket[b]);
    if (b < METRICS_NBOUNDS)
      snprintf(extra, sizeof extra, "cmd=\"%s\",le=\"%g\"", cmd_names[c],
               (double)metrics_bounds_ns[b] / 1e9);
    else
      snprintf(extra, sizeof extra, "cmd=\"%s\",le=\"+Inf\"", cmd_names[c]);
    put_export_sample(o, name, e, extra, cum);
  }
  put(o, "blockport_%srequest_duration_seconds_sum{", pre);
  put_export_label(o, e);
  put(o, ",cmd=\"%s\"} ", cmd_names[c]);
  put_seconds(o, get(&s->sum_ns));
  snprintf(extra, sizeof extra, "cmd=\"%s\"", cmd_names[c]);
  put_export_sample(
      o, family(name, sizeof name, pre, "request_duration_seconds_count"), e,
      extra, cum);
}

static void render_requests(const struct metrics *m, struct out *o) {
  const char *pre = o->fe->family;
  char name[64];
  render_cmd_counter(m, o, family(name, sizeof name, pre, "requests_total"),
                     "Requests answered.", false);
  render_cmd_counter(m, o,
                     family(name, sizeof name, pre, "request_errors_total"),
                     "Requests answered with an error.", true);
  render_per_export(m, o, family(name, sizeof name, pre, "requests_in_flight"),
                    "gauge", "Requests received and not yet answered.",
                    v_inflight, false);
  render_per_export(
      m, o, family(name, sizeof name, pre, "requests_in_flight_bytes"), "gauge",
      "Data of the reads and writes in flight.", v_inflight_bytes, false);
  render_per_export(m, o, family(name, sizeof name, pre, "read_bytes_total"),
                    "counter", "Bytes read by successful requests.", v_read,
                    false);
  render_per_export(m, o, family(name, sizeof name, pre, "written_bytes_total"),
                    "counter", "Bytes written by successful requests.",
                    v_written, false);
  put_header(o, family(name, sizeof name, pre, "request_duration_seconds"),
             "histogram", o->fe->duration_help);
  for (size_t i = 0; i < m->nexports; i++)
    for (size_t c = 0; c < METRICS_NCMDS; c++)
      render_histogram(m->exports[i], c, o);
}

static void render_pool(struct out *o) {
  struct bd_pool_load l = bd_pool_load();
  put_header(o, "pool_workers", "gauge",
             "Worker threads that run blocking sources' requests.");
  put(o, "blockport_pool_workers %u\n", l.workers);
  put_header(o, "pool_busy_workers", "gauge", "Workers running a request.");
  put(o, "blockport_pool_busy_workers %u\n", l.busy);
  put_header(o, "pool_queue_depth", "gauge",
             "Requests queued for a worker, not yet started.");
  put(o, "blockport_pool_queue_depth %u\n", l.queued);
}

/* The counters the layers below keep (core/stats.h): the nbd:// source's,
 * the qcow2 L2 cache's. */
struct stat_render {
  const struct metrics *m;
  struct out *o;
};

/* One source counter, a series per export (present from 0, whatever its
 * sources are: a dashboard needs no special case for "no qcow2 here"). */
static void render_stat(const struct bd_stat *s, void *ctx) {
  struct stat_render *sr = ctx;
  put_header(sr->o, s->name, "counter", s->help);
  for (size_t i = 0; i < sr->m->nexports; i++) {
    const struct metrics_export *e = sr->m->exports[i];
    put_export_sample(sr->o, s->name, e, NULL,
                      bd_stat_scope_value(e->sources, s));
  }
}

size_t metrics_render(struct metrics *m, char *buf, size_t cap) {
  struct out o = {buf, cap, 0, &frontend_names[m->frontend]};
  if (cap)
    buf[0] = '\0';
  render_process(m, &o);
  pthread_mutex_lock(&m->lock); /* a reload may add exports meanwhile */
  if (m->frontend == METRICS_NBD)
    render_server(m, &o);
  render_exports(m, &o);
  render_requests(m, &o);
  struct stat_render sr = {m, &o};
  bd_stats_foreach(render_stat, &sr);
  pthread_mutex_unlock(&m->lock);
  render_pool(&o);
  return o.len;
}
