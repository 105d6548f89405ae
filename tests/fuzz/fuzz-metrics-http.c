/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the metrics listener's request parser
 * (server/metrics-http-parse.c).
 *
 * The input is what a client sent so far.  The verdict is one of the
 * known ones and the same twice; "more" only below the size bound and
 * "too large" only at it; a verdict other than "more" does not change
 * when more bytes arrive (only the head counts), and "more" holds for
 * every shorter prefix too; the page is served only to a request line
 * that asks for it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-check.h"
#include "server/metrics.h"

static enum metrics_http_verdict parse(const uint8_t *data, size_t size) {
  /* A copy of exactly SIZE bytes, so reading past it is caught. */
  char *buf = malloc(size ? size : 1);
  CHECK(buf);
  memcpy(buf, data, size);
  enum metrics_http_verdict v = metrics_http_parse(buf, size);
  free(buf);
  return v;
}

static bool starts(const uint8_t *data, size_t size, const char *s) {
  size_t n = strlen(s);
  return size >= n && !memcmp(data, s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  enum metrics_http_verdict v = parse(data, size);
  CHECK(v >= METRICS_HTTP_MORE && v <= METRICS_HTTP_TOO_LARGE);
  CHECK(parse(data, size) == v);
  if (v == METRICS_HTTP_MORE)
    CHECK(size < METRICS_HTTP_MAX);
  if (v == METRICS_HTTP_TOO_LARGE)
    CHECK(size >= METRICS_HTTP_MAX);
  if (v == METRICS_HTTP_GET)
    CHECK(starts(data, size, "GET /metrics"));
  if (v == METRICS_HTTP_HEAD)
    CHECK(starts(data, size, "HEAD /metrics"));
  if (v == METRICS_HTTP_MORE) {
    CHECK(parse(data, size / 2) == METRICS_HTTP_MORE);
    return 0;
  }
  /* Later bytes (a body, the next request) change nothing. */
  uint8_t *more = malloc(size + 16);
  CHECK(more);
  memcpy(more, data, size);
  memset(more + size, '\n', 16);
  CHECK(parse(more, size + 16) == v);
  free(more);
  return 0;
}
