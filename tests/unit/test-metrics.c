/* SPDX-License-Identifier: BSD-3-Clause */
/* The Prometheus text rendering of server/metrics.c, the histogram's
 * buckets, the counters of core/stats.h, the HTTP request parser of
 * server/metrics-http-parse.c, and the parsing of --metrics ADDR:PORT. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats.h"
#include "server/metrics.h"

BD_STAT_DEFINE(test_stat, "unit_test_events_total", "Events of the test.")

static struct metrics *make(size_t n, const char *const *names) {
  uint64_t sizes[4] = {1048576, 2, 3, 4};
  struct metrics *m = metrics_create(n, names, sizes);
  cr_assert_not_null(m);
  return m;
}

/* With room to spare, as the HTTP side renders: the process figures (CPU
 * time, open fds) may move between the measuring and the rendering. */
static char *render(struct metrics *m) {
  size_t cap = metrics_render(m, NULL, 0) + 4096;
  char *buf = malloc(cap);
  size_t len = metrics_render(m, buf, cap);
  cr_assert_lt(len, cap);
  cr_assert_eq(strlen(buf), len);
  return buf;
}

/* The value of the sample line that starts with PREFIX (name and labels),
 * -1 when there is none. */
static long long sample(const char *text, const char *prefix) {
  size_t len = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (!strncmp(p, prefix, len) && p[len] == ' ')
      return atoll(p + len + 1);
  return -1;
}

Test(metrics, help_and_type_precede_samples) {
  const char *names[] = {""};
  struct metrics *m = make(1, names);
  char *t = render(m);
  cr_assert(strstr(t, "# HELP blockport_connections "));
  cr_assert(strstr(t, "# TYPE blockport_connections gauge\n"));
  cr_assert(strstr(t, "# TYPE blockport_connections_accepted_total counter\n"));
  cr_assert(strstr(t, "# TYPE blockport_requests_total counter\n"));
  cr_assert(strstr(t, "# TYPE blockport_request_duration_seconds histogram\n"));
  cr_assert_eq(sample(t, "blockport_exports"), 1);
  /* The default export is named "": never an empty label value. */
  cr_assert_eq(sample(t, "blockport_export_info{export=\"(default)\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_size_bytes{export=\"(default)\"}"),
               1048576);
  cr_assert_null(strstr(t, "export=\"\""));
  cr_assert_eq(t[strlen(t) - 1], '\n');
  /* Every line is a comment or "name{labels} value". */
  for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n"))
    cr_assert(line[0] == '#' || !strncmp(line, "blockport_", 10) ||
                  !strncmp(line, "process_", 8),
              "%s", line);
  free(t);
  metrics_free(m);
}

Test(metrics, counters) {
  const char *names[] = {"a", "b"};
  struct metrics *m = make(2, names);
  metrics_conn_accepted(m);
  metrics_conn_accepted(m);
  metrics_conn_closed(m);
  struct metrics_export *a = m->exports[0], *b = m->exports[1];
  metrics_export_opened(b);
  metrics_observe(&a->req, METRICS_READ, 1000, 4096, false);
  metrics_observe(&a->req, METRICS_READ, 1000, 4096, false);
  metrics_observe(&a->req, METRICS_READ, 1000, 4096, true);
  metrics_observe(&b->req, METRICS_WRITE, 1000, 512, false);
  uint64_t t0 = metrics_req_start(&b->req, METRICS_FLUSH, 0);
  uint64_t t1 = metrics_req_start(&b->req, METRICS_READ, 65536);
  char *t = render(m);
  cr_assert_eq(sample(t, "blockport_connections"), 1);
  cr_assert_eq(sample(t, "blockport_connections_accepted_total"), 2);
  cr_assert_eq(sample(t, "blockport_export_connections{export=\"b\"}"), 1);
  cr_assert_eq(
      sample(t, "blockport_export_connections_opened_total{export=\"a\"}"), 0);
  cr_assert_eq(sample(t, "blockport_requests_total{export=\"a\",cmd=\"read\"}"),
               3);
  cr_assert_eq(
      sample(t, "blockport_request_errors_total{export=\"a\",cmd=\"read\"}"),
      1);
  cr_assert_eq(sample(t, "blockport_read_bytes_total{export=\"a\"}"), 8192);
  cr_assert_eq(sample(t, "blockport_written_bytes_total{export=\"b\"}"), 512);
  cr_assert_eq(sample(t, "blockport_requests_in_flight{export=\"b\"}"), 2);
  cr_assert_eq(sample(t, "blockport_requests_in_flight_bytes{export=\"b\"}"),
               65536);
  free(t);
  metrics_req_done(&b->req, METRICS_FLUSH, t0, 0, false);
  metrics_req_done(&b->req, METRICS_READ, t1, 65536, false);
  t = render(m);
  cr_assert_eq(sample(t, "blockport_requests_in_flight{export=\"b\"}"), 0);
  cr_assert_eq(sample(t, "blockport_requests_in_flight_bytes{export=\"b\"}"),
               0);
  cr_assert_eq(sample(t, "blockport_read_bytes_total{export=\"b\"}"), 65536);
  cr_assert_eq(
      sample(t, "blockport_requests_total{export=\"b\",cmd=\"flush\"}"), 1);
  free(t);
  metrics_free(m);
}

Test(metrics, histogram_is_cumulative) {
  const char *names[] = {"x"};
  struct metrics *m = make(1, names);
  /* 10us (on a bound: le is inclusive), 50us, 300us, 2ms, 5s */
  uint64_t ns[] = {10000, 50000, 300000, 2000000, 5000000000ull};
  for (size_t i = 0; i < 5; i++)
    metrics_observe(&m->exports[0]->req, METRICS_WRITE, ns[i], 1, false);
  char *t = render(m);
  const char *p = "blockport_request_duration_seconds_bucket{export=\"x\","
                  "cmd=\"write\",le=";
  char key[200];
  struct {
    const char *le;
    long long n;
  } want[] = {{"1e-06", 0},     {"5.623e-06", 0}, {"1e-05", 1},
              {"1.778e-05", 1}, {"5.623e-05", 2}, {"0.0003162", 3},
              {"0.001", 3},     {"0.003162", 4},  {"1", 4},
              {"3.162", 4},     {"5.623", 5},     {"10", 5},
              {"+Inf", 5}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    snprintf(key, sizeof key, "%s\"%s\"}", p, want[i].le);
    cr_assert_eq(sample(t, key), want[i].n, "%s", key);
  }
  cr_assert_eq(sample(t, "blockport_request_duration_seconds_count{export="
                         "\"x\",cmd=\"write\"}"),
               5);
  cr_assert_eq(
      sample(t, "blockport_requests_total{export=\"x\",cmd=\"write\"}"), 5);
  cr_assert(strstr(t, "blockport_request_duration_seconds_sum{export=\"x\","
                      "cmd=\"write\"} 5.002360000\n"));
  /* Buckets never decrease, in every histogram. */
  long long last = -1;
  for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "blockport_request_duration_seconds_bucket", 41))
      continue;
    long long v = atoll(strrchr(line, ' ') + 1);
    if (strstr(line, "le=\"1e-06\""))
      last = -1;
    cr_assert_geq(v, last, "%s", line);
    last = v;
  }
  free(t);
  metrics_free(m);
}

/* A reload: exports get() again keep their counters, removed ones keep
 * their counters but lose their info and size series, new ones appear. */
Test(metrics, exports_survive_reloads) {
  const char *names[] = {"keep", "gone"};
  struct metrics *m = make(2, names);
  struct metrics_export *keep = m->exports[0];
  metrics_observe(&keep->req, METRICS_READ, 1000, 100, false);
  metrics_exports_retire(m);
  cr_assert_eq(metrics_export_get(m, "keep", 7), keep);
  cr_assert_not_null(metrics_export_get(m, "new", 9));
  char *t = render(m);
  cr_assert_eq(sample(t, "blockport_exports"), 2);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"keep\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"gone\"}"), -1);
  cr_assert_eq(sample(t, "blockport_export_size_bytes{export=\"gone\"}"), -1);
  cr_assert_eq(
      sample(t, "blockport_requests_total{export=\"gone\",cmd=\"read\"}"), 0);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"new\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_size_bytes{export=\"keep\"}"), 7);
  cr_assert_eq(sample(t, "blockport_read_bytes_total{export=\"keep\"}"), 100);
  free(t);
  metrics_free(m);
}

Test(metrics, label_values_are_escaped) {
  const char *names[] = {"a\"b\\c\nd"};
  struct metrics *m = make(1, names);
  char *t = render(m);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"a\\\"b\\\\c\\nd\"}"),
               1);
  free(t);
  metrics_free(m);
}

Test(metrics, short_buffer_is_truncated_safely) {
  const char *names[] = {"e"};
  struct metrics *m = make(1, names);
  size_t need = metrics_render(m, NULL, 0);
  char small[100];
  memset(small, 'x', sizeof small);
  cr_assert_eq(metrics_render(m, small, sizeof small), need);
  cr_assert_eq(strlen(small), sizeof small - 1);
  metrics_free(m);
}

Test(metrics, parse_addr) {
  char h[64], p[8];
  cr_assert(
      metrics_http_parse_addr("127.0.0.1:9100", h, sizeof h, p, sizeof p));
  cr_assert_str_eq(h, "127.0.0.1");
  cr_assert_str_eq(p, "9100");
  cr_assert(metrics_http_parse_addr("[::1]:9100", h, sizeof h, p, sizeof p));
  cr_assert_str_eq(h, "::1");
  cr_assert(metrics_http_parse_addr("localhost:1", h, sizeof h, p, sizeof p));
  const char *bad[] = {
      "",          "9100",      ":9100",   "1.2.3.4:", "::1:9100", "[::1]9100",
      "[::1:9100", "1.2.3.4:0", "a:65536", "a:9x",     "[]:1",     "a:-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert(!metrics_http_parse_addr(bad[i], h, sizeof h, p, sizeof p), "%s",
              bad[i]);
}

Test(metrics, bucket_of_matches_a_linear_search) {
  uint64_t probes[] = {0,
                       1,
                       999,
                       1000,
                       1001,
                       1777,
                       1778,
                       1779,
                       5623,
                       5624,
                       999999999,
                       1000000000,
                       1000000001,
                       9999999999,
                       10000000000ull,
                       10000000001ull,
                       UINT64_MAX};
  cr_assert_eq(metrics_bounds_ns[0], 1000);
  cr_assert_eq(metrics_bounds_ns[METRICS_NBOUNDS - 1], 10000000000ull);
  for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
    size_t want = 0;
    while (want < METRICS_NBOUNDS && probes[i] > metrics_bounds_ns[want])
      want++;
    cr_assert_eq(metrics_bucket_of(probes[i]), want, "%llu",
                 (unsigned long long)probes[i]);
  }
  for (size_t b = 1; b < METRICS_NBOUNDS; b++)
    cr_assert_gt(metrics_bounds_ns[b], metrics_bounds_ns[b - 1]);
}

Test(metrics, process_refusals_pool_and_stats) {
  const char *names[] = {"e"};
  struct metrics *m = make(1, names);
  metrics_conn_refused(m, METRICS_REFUSED_MAX_CONNECTIONS);
  metrics_conn_refused(m, METRICS_REFUSED_MAX_CONNECTIONS);
  metrics_conn_refused(m, METRICS_REFUSED_TLS);
  bd_stat_count(metrics_export_sources(m, "e"), &test_stat, 3);
  bd_stat_count(NULL, &test_stat, 5); /* no scope: not counted */
  char *t = render(m);
  cr_assert(strstr(t, "\nblockport_build_info{version=\""));
  cr_assert(strstr(t, "# TYPE process_start_time_seconds gauge\n"));
  const char *st = strstr(t, "\nprocess_start_time_seconds ");
  cr_assert(st);
  cr_assert_gt(atof(st + 28), 1.6e9);
  /* Prometheus' standard process metrics, with live values. */
  const char *rss = strstr(t, "\nprocess_resident_memory_bytes ");
  const char *fds = strstr(t, "\nprocess_open_fds ");
  cr_assert(rss && fds && strstr(t, "\nprocess_cpu_seconds_total "));
  cr_assert(strstr(t, "# TYPE process_cpu_seconds_total counter\n"));
  cr_assert_gt(atoll(rss + 31), 1 << 20);
  cr_assert_gt(atoll(fds + 18), 2); /* stdin, stdout, stderr at least */
  cr_assert(strstr(t, "\nprocess_max_fds "));
  const char *r = "blockport_connections_refused_total{reason=";
  char key[100];
  const char *reasons[] = {"allow_list", "max_connections", "tls",
                           "handshake_timeout"};
  long long want[] = {0, 2, 1, 0};
  for (size_t i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "%s\"%s\"}", r, reasons[i]);
    cr_assert_eq(sample(t, key), want[i], "%s", key);
  }
  cr_assert_geq(sample(t, "blockport_pool_queue_depth"), 0);
  cr_assert_geq(sample(t, "blockport_pool_workers"), 0);
  cr_assert(strstr(t, "# TYPE blockport_unit_test_events_total counter\n"));
  cr_assert_eq(sample(t, "blockport_unit_test_events_total{export=\"e\"}"), 3);
  cr_assert_eq(sample(t, "blockport_unit_test_events_total"), -1);
  free(t);
  metrics_free(m);
}

static void count_test_stat(const struct bd_stat *s, void *ctx) {
  if (!strcmp(s->name, "unit_test_events_total"))
    ++*(size_t *)ctx;
}

Test(metrics, stats_count_once_registered) {
  struct bd_stat_scope *a = bd_stat_scope_new(), *b = bd_stat_scope_new();
  cr_assert(a && b);
  bd_stat_register(&test_stat); /* again: a no-op */
  for (int i = 0; i < 1000; i++)
    bd_stat_count(a, &test_stat, 1);
  bd_stat_count(b, &test_stat, 7);
  cr_assert_eq(bd_stat_scope_value(a, &test_stat), 1000);
  cr_assert_eq(bd_stat_scope_value(b, &test_stat), 7);
  cr_assert_eq(bd_stat_scope_value(NULL, &test_stat), 0);
  size_t seen = 0;
  bd_stats_foreach(count_test_stat, &seen);
  cr_assert_eq(seen, 1);
  bd_stat_scope_free(a);
  bd_stat_scope_free(b);
}

/* Counting from many threads lands in the scope whole (slots per
 * thread, summed on reading). */
static void *count_many(void *arg) {
  for (int i = 0; i < 10000; i++)
    bd_stat_count(arg, &test_stat, 1);
  return NULL;
}

Test(metrics, stats_scope_counts_from_threads) {
  struct bd_stat_scope *sc = bd_stat_scope_new();
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, count_many, sc), 0);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  cr_assert_eq(bd_stat_scope_value(sc, &test_stat), 40000);
  bd_stat_scope_free(sc);
}

static enum metrics_http_verdict parse(const char *s) {
  return metrics_http_parse(s, strlen(s));
}

Test(metrics, http_parse) {
  cr_assert_eq(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
               METRICS_HTTP_GET);
  cr_assert_eq(parse("GET /metrics?x=1 HTTP/1.0\n\n"), METRICS_HTTP_GET);
  cr_assert_eq(parse("HEAD /metrics HTTP/1.0\r\n\r\n"), METRICS_HTTP_HEAD);
  cr_assert_eq(parse("POST /metrics HTTP/1.0\r\n\r\nbody"),
               METRICS_HTTP_BAD_METHOD);
  cr_assert_eq(parse("GET / HTTP/1.0\r\n\r\n"), METRICS_HTTP_NOT_FOUND);
  cr_assert_eq(parse("GET /metricsx HTTP/1.0\r\n\r\n"), METRICS_HTTP_NOT_FOUND);
  cr_assert_eq(parse("POST /x HTTP/1.0\r\n\r\n"), METRICS_HTTP_NOT_FOUND);
  /* Incomplete heads ask for more. */
  cr_assert_eq(parse(""), METRICS_HTTP_MORE);
  cr_assert_eq(parse("GET /metr"), METRICS_HTTP_MORE);
  cr_assert_eq(parse("GET /metrics HTTP/1.0\r\n"), METRICS_HTTP_MORE);
  cr_assert_eq(parse("GET /metrics HTTP/1.0\r\n\r"), METRICS_HTTP_MORE);
  /* Malformed request lines. */
  const char *bad[] = {"garbage\r\n\r\n",
                       "GET\r\n\r\n",
                       "GET /metrics\r\n\r\n",
                       "GET  /metrics HTTP/1.0\n\n",
                       "GET /metrics FTP/1\n\n",
                       "G3T /metrics HTTP/1.0\n\n",
                       "GET /me\ttrics HTTP/1.0\n\n",
                       "\n\n",
                       "GET /metrics HTTP/1.0 x\n\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(parse(bad[i]), METRICS_HTTP_MALFORMED, "%s", bad[i]);
  static const char nul[] = "GET /metrics HTTP/1.0\r\nX: \0\r\n\r\n";
  cr_assert_eq(metrics_http_parse(nul, sizeof nul - 1), METRICS_HTTP_MALFORMED);
  /* The size bound: a head must end within METRICS_HTTP_MAX bytes. */
  char *big = malloc(METRICS_HTTP_MAX + 10);
  memset(big, 'a', METRICS_HTTP_MAX + 10);
  memcpy(big, "GET /metrics HTTP/1.0\r\nX: ", 26);
  cr_assert_eq(metrics_http_parse(big, METRICS_HTTP_MAX - 1),
               METRICS_HTTP_MORE);
  cr_assert_eq(metrics_http_parse(big, METRICS_HTTP_MAX),
               METRICS_HTTP_TOO_LARGE);
  memcpy(big + METRICS_HTTP_MAX - 4, "\r\n\r\n", 4);
  cr_assert_eq(metrics_http_parse(big, METRICS_HTTP_MAX + 10),
               METRICS_HTTP_GET);
  memcpy(big + METRICS_HTTP_MAX - 3, "\r\n\r\n", 4);
  cr_assert_eq(metrics_http_parse(big, METRICS_HTTP_MAX + 10),
               METRICS_HTTP_TOO_LARGE);
  free(big);
}

/* OpenMetrics reads a counter NAME_total as family NAME: no other metric
 * may be called NAME (a gauge of open connections beside a counter of
 * them was). */
Test(metrics, no_family_names_shared) {
  const char *names[] = {"a", "b"};
  struct metrics *m = make(2, names);
  char *t = render(m);
  char fam[64][128];
  size_t n = 0;
  for (const char *p = t; (p = strstr(p, "# TYPE ")); p++) {
    char name[128], type[32];
    cr_assert_eq(sscanf(p + 7, "%127s %31s", name, type), 2);
    size_t len = strlen(name);
    if (!strcmp(type, "counter") && len > 6 &&
        !strcmp(name + len - 6, "_total"))
      name[len - 6] = '\0';
    for (size_t i = 0; i < n; i++)
      cr_assert_str_neq(fam[i], name, "family %s twice", name);
    cr_assert_lt(n, 64);
    snprintf(fam[n++], sizeof fam[0], "%s", name);
  }
  cr_assert_gt(n, 20);
  free(t);
  metrics_free(m);
}
