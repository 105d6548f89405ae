/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD URIs: see nbd-uri.h.  libnbd percent-decodes query values, so the
 * directory goes in percent-encoded. */
#include "nbd-uri.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const path_keys[] = {
    "socket=", "tls-certificates=", "tls-psk-file="};

/* The parameter at P (up to the next separator) names a relative file. */
static bool is_relative_path_param(const char *p, size_t len, size_t *klen) {
  for (size_t i = 0; i < sizeof path_keys / sizeof *path_keys; i++) {
    size_t k = strlen(path_keys[i]);
    if (len > k && strncmp(p, path_keys[i], k) == 0) {
      *klen = k;
      return p[k] != '/' && strncasecmp(p + k, "%2f", 3) != 0;
    }
  }
  return false;
}

static bool unreserved(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || strchr("-._~/", ch);
}

/* CWD percent-encoded, with a trailing '/'. */
static char *encoded_cwd(void) {
  char *cwd = getcwd(NULL, 0);
  if (!cwd)
    return NULL;
  char *out = malloc(strlen(cwd) * 3 + 2), *o = out;
  for (const unsigned char *s = (unsigned char *)cwd; out && *s; s++) {
    if (unreserved(*s))
      *o++ = (char)*s;
    else
      o += sprintf(o, "%%%02X", *s);
  }
  if (out) {
    if (o == out || o[-1] != '/')
      *o++ = '/';
    *o = '\0';
  }
  free(cwd);
  return out;
}

char *nbd_uri_absolute(const char *uri) {
  const char *q = strchr(uri, '?');
  if (!q)
    return strdup(uri);
  char *dir = encoded_cwd();
  if (!dir)
    return NULL;
  size_t count = 0; /* parameters to rewrite, at most one per '&' */
  for (const char *p = q; *p && *p != '#'; p++)
    count += *p == '?' || *p == '&' || *p == ';';
  char *out = malloc(strlen(uri) + count * strlen(dir) + 1), *o = out;
  const char *p = uri;
  while (out && *p) {
    *o++ = *p;
    bool start = p >= q && (*p == '?' || *p == '&' || *p == ';');
    if (*p++ == '#')
      q = p + strlen(p); /* the fragment: copied as is */
    if (!start)
      continue;
    size_t len = strcspn(p, "&;#"), klen;
    if (is_relative_path_param(p, len, &klen)) {
      o = stpcpy(stpncpy(o, p, klen), dir);
      p += klen;
    }
  }
  if (out)
    *o = '\0';
  free(dir);
  return out;
}
