/* SPDX-License-Identifier: BSD-3-Clause */
/* The Prometheus text rendering of server/metrics.c, and the parsing of
 * --metrics ADDR:PORT. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"

static struct metrics *make(size_t n, const char *const *names) {
  uint64_t sizes[4] = {1048576, 2, 3, 4};
  struct metrics *m = metrics_create(n, names, sizes);
  cr_assert_not_null(m);
  return m;
}

static char *render(struct metrics *m) {
  size_t need = metrics_render(m, NULL, 0);
  char *buf = malloc(need + 1);
  cr_assert_eq(metrics_render(m, buf, need + 1), need);
  cr_assert_eq(strlen(buf), need);
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
  cr_assert_eq(sample(t, "blockport_export_info{export=\"\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_size_bytes{export=\"\"}"), 1048576);
  cr_assert_eq(t[strlen(t) - 1], '\n');
  /* Every line is a comment or "name{labels} value". */
  for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n"))
    cr_assert(line[0] == '#' || !strncmp(line, "blockport_", 10), "%s", line);
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
  metrics_observe(a, METRICS_READ, 1000, 4096, false);
  metrics_observe(a, METRICS_READ, 1000, 4096, false);
  metrics_observe(a, METRICS_READ, 1000, 4096, true);
  metrics_observe(b, METRICS_WRITE, 1000, 512, false);
  uint64_t t0 = metrics_req_start(b);
  char *t = render(m);
  cr_assert_eq(sample(t, "blockport_connections"), 1);
  cr_assert_eq(sample(t, "blockport_connections_accepted_total"), 2);
  cr_assert_eq(sample(t, "blockport_export_connections{export=\"b\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_connections_total{export=\"a\"}"),
               0);
  cr_assert_eq(sample(t, "blockport_requests_total{export=\"a\",cmd=\"read\"}"),
               3);
  cr_assert_eq(
      sample(t, "blockport_request_errors_total{export=\"a\",cmd=\"read\"}"),
      1);
  cr_assert_eq(sample(t, "blockport_read_bytes_total{export=\"a\"}"), 8192);
  cr_assert_eq(sample(t, "blockport_written_bytes_total{export=\"b\"}"), 512);
  cr_assert_eq(sample(t, "blockport_requests_in_flight{export=\"b\"}"), 1);
  free(t);
  metrics_req_done(b, METRICS_FLUSH, t0, 0, false);
  t = render(m);
  cr_assert_eq(sample(t, "blockport_requests_in_flight{export=\"b\"}"), 0);
  cr_assert_eq(
      sample(t, "blockport_requests_total{export=\"b\",cmd=\"flush\"}"), 1);
  free(t);
  metrics_free(m);
}

Test(metrics, histogram_is_cumulative) {
  const char *names[] = {"x"};
  struct metrics *m = make(1, names);
  /* 10us, 50us (on the bound: le is inclusive), 300us, 2ms, 5s */
  uint64_t ns[] = {10000, 50000, 300000, 2000000, 5000000000ull};
  for (size_t i = 0; i < 5; i++)
    metrics_observe(m->exports[0], METRICS_WRITE, ns[i], 1, false);
  char *t = render(m);
  const char *p = "blockport_request_duration_seconds_bucket{export=\"x\","
                  "cmd=\"write\",le=";
  char key[200];
  struct {
    const char *le;
    long long n;
  } want[] = {{"5e-05", 2}, {"0.0001", 2}, {"0.00025", 2}, {"0.0005", 3},
              {"0.001", 3}, {"0.0025", 4}, {"1", 4},       {"+Inf", 5}};
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
    if (strstr(line, "le=\"5e-05\""))
      last = -1;
    cr_assert_geq(v, last, "%s", line);
    last = v;
  }
  free(t);
  metrics_free(m);
}

/* A reload: exports get() again keep their counters, removed ones stay
 * with export_info 0, new ones appear. */
Test(metrics, exports_survive_reloads) {
  const char *names[] = {"keep", "gone"};
  struct metrics *m = make(2, names);
  struct metrics_export *keep = m->exports[0];
  metrics_observe(keep, METRICS_READ, 1000, 100, false);
  metrics_exports_retire(m);
  cr_assert_eq(metrics_export_get(m, "keep", 7), keep);
  cr_assert_not_null(metrics_export_get(m, "new", 9));
  char *t = render(m);
  cr_assert_eq(sample(t, "blockport_exports"), 2);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"keep\"}"), 1);
  cr_assert_eq(sample(t, "blockport_export_info{export=\"gone\"}"), 0);
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
  cr_assert(metrics_parse_addr("127.0.0.1:9100", h, sizeof h, p, sizeof p));
  cr_assert_str_eq(h, "127.0.0.1");
  cr_assert_str_eq(p, "9100");
  cr_assert(metrics_parse_addr("[::1]:9100", h, sizeof h, p, sizeof p));
  cr_assert_str_eq(h, "::1");
  cr_assert(metrics_parse_addr("localhost:1", h, sizeof h, p, sizeof p));
  const char *bad[] = {
      "",          "9100",      ":9100",   "1.2.3.4:", "::1:9100", "[::1]9100",
      "[::1:9100", "1.2.3.4:0", "a:65536", "a:9x",     "[]:1",     "a:-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert(!metrics_parse_addr(bad[i], h, sizeof h, p, sizeof p), "%s",
              bad[i]);
}
