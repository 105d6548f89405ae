/* SPDX-License-Identifier: BSD-3-Clause */
/* The request head of the metrics listener, parsed without side effects:
 * bytes in, a verdict out (metrics.h).  Only the request line matters;
 * the header fields are skipped, and a body is ignored. */
#include <stdbool.h>
#include <string.h>

#include "metrics.h"

/* The length of the head up to and including its empty line, 0 if it has
 * not ended within the first LEN bytes. */
static size_t head_length(const char *buf, size_t len) {
  for (size_t i = 0; i + 1 < len; i++) {
    if (buf[i] != '\n')
      continue;
    if (buf[i + 1] == '\n')
      return i + 2;
    if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n')
      return i + 3;
  }
  return 0;
}

/* A method is a token: letters only will do for any real one. */
static bool is_method(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z')))
      return false;
  return true;
}

/* Printable and without spaces. */
static bool is_word(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
      return false;
  return n > 0;
}

static bool word_is(const char *s, size_t n, const char *w) {
  return n == strlen(w) && memcmp(s, w, n) == 0;
}

/* "METHOD PATH HTTP/x.y" in LINE (N bytes, without its line end). */
static enum metrics_http_verdict request_line(const char *line, size_t n) {
  const char *sp1 = memchr(line, ' ', n);
  if (!sp1)
    return METRICS_HTTP_MALFORMED;
  const char *path = sp1 + 1, *end = line + n;
  const char *sp2 = memchr(path, ' ', (size_t)(end - path));
  if (!sp2)
    return METRICS_HTTP_MALFORMED;
  const char *version = sp2 + 1;
  size_t mlen = (size_t)(sp1 - line), plen = (size_t)(sp2 - path),
         vlen = (size_t)(end - version);
  if (!is_method(line, mlen) || !is_word(path, plen) ||
      !is_word(version, vlen) || vlen < 5 || memcmp(version, "HTTP/", 5))
    return METRICS_HTTP_MALFORMED;
  const char *query = memchr(path, '?', plen);
  if (query)
    plen = (size_t)(query - path);
  if (!word_is(path, plen, "/metrics"))
    return METRICS_HTTP_NOT_FOUND;
  if (word_is(line, mlen, "GET"))
    return METRICS_HTTP_GET;
  if (word_is(line, mlen, "HEAD"))
    return METRICS_HTTP_HEAD;
  return METRICS_HTTP_BAD_METHOD;
}

enum metrics_http_verdict metrics_http_parse(const char *buf, size_t len) {
  size_t n = len < METRICS_HTTP_MAX ? len : METRICS_HTTP_MAX;
  size_t head = head_length(buf, n);
  if (!head)
    return len >= METRICS_HTTP_MAX ? METRICS_HTTP_TOO_LARGE : METRICS_HTTP_MORE;
  if (memchr(buf, '\0', head))
    return METRICS_HTTP_MALFORMED;
  const char *nl = memchr(buf, '\n', head); /* found: the head ends so */
  size_t line = (size_t)(nl - buf);
  if (line > 0 && buf[line - 1] == '\r')
    line--;
  return request_line(buf, line);
}
