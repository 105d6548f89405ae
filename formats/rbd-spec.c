/* SPDX-License-Identifier: BSD-3-Clause */
/* Parsing rbd:POOL/IMAGE[@SNAP][:KEY=VALUE]... (rbd-spec.h).  The spec is
 * copied once; tokens are cut in place and unescaped, so every string of
 * the result lives in one buffer. */
#include "rbd-spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hex.h"

bool rbd_spec_matches(const char *spec) {
  return strncmp(spec, RBD_SPEC_PREFIX, strlen(RBD_SPEC_PREFIX)) == 0;
}

/* Cuts *P at the first unescaped DELIM: returns the token and leaves *P
 * after the delimiter, or NULL when there was none. */
static char *next_token(char **p, char delim) {
  char *tok = *p;
  for (char *c = tok; *c; c++) {
    if (*c == '\\' && c[1]) {
      c++;
      continue;
    }
    if (*c == delim) {
      *c = '\0';
      *p = c + 1;
      return tok;
    }
  }
  *p = NULL;
  return tok;
}

/* Cuts *P at the first DELIM, no escapes (URIs percent-encode). */
static char *next_token_plain(char **p, char delim) {
  char *tok = *p, *c = strchr(tok, delim);
  if (c)
    *c = '\0';
  *p = c ? c + 1 : NULL;
  return tok;
}

/* Drops the backslashes that escape a character, in place. */
static void unescape(char *s) {
  char *out = s;
  for (; *s; s++) {
    if (*s == '\\' && s[1])
      s++;
    *out++ = *s;
  }
  *out = '\0';
}

static int bad(const char *spec, const char *why) {
  bd_set_error("bad RBD spec '%s': %s (expected "
               "rbd:POOL/IMAGE[@SNAP][:KEY=VALUE]...)",
               spec, why);
  return -EINVAL;
}

/* The ':'-separated KEY=VALUE list after the image. */
static int parse_options(const char *spec, char *p, struct rbd_spec *s) {
  while (p) {
    char *kv = next_token(&p, ':');
    char *v = kv;
    char *k = next_token(&v, '=');
    if (!v || !*k)
      return bad(spec, "an option is not KEY=VALUE");
    unescape(k);
    unescape(v);
    if (strcmp(k, "conf") == 0)
      s->conf = v;
    else if (strcmp(k, "id") == 0)
      s->id = v;
    else if (s->nopts == RBD_SPEC_MAX_OPTS)
      return bad(spec, "too many options");
    else
      s->opts[s->nopts++] = (struct rbd_spec_opt){k, v};
  }
  return 0;
}

/* POOL/[NS/]IMAGE[@SNAP], then the options. */
static int parse_name(const char *spec, char *p, struct rbd_spec *s) {
  s->pool = next_token(&p, '/');
  if (!p)
    return bad(spec, "no '/' between pool and image");
  char *name = next_token(&p, ':');
  char *rest = p;
  char *snap = name;
  name = next_token(&snap, '@');
  s->snap = snap;
  char *image = name;
  s->image = next_token(&image, '/');
  if (image) { /* NS/IMAGE */
    s->ns = s->image;
    s->image = image;
  }
  unescape(s->pool);
  unescape(s->image);
  if (s->ns)
    unescape(s->ns);
  if (s->snap)
    unescape(s->snap);
  if (!*s->pool || !*s->image || (s->snap && !*s->snap))
    return bad(spec, "empty pool, image or snapshot name");
  if (strchr(s->image, '/') || (s->snap && strchr(s->snap, '/')))
    return bad(spec, "too many '/'");
  return parse_options(spec, rest, s);
}

/* %XX decoding in place; false on a malformed escape or a %00. */
static bool percent_decode(char *s) {
  char *out = s;
  for (; *s; s++) {
    if (*s == '%') {
      int byte = hex_byte(s + 1);
      if (byte <= 0)
        return false;
      *out++ = (char)byte;
      s += 2;
    } else {
      *out++ = *s;
    }
  }
  *out = '\0';
  return true;
}

/* rbd://FSID/POOL/IMAGE[/SNAP], as Glance stores image locations. */
static int parse_uri(const char *spec, char *p, struct rbd_spec *s) {
  char *part[5];
  int n = 0;
  while (p && n < 5)
    part[n++] = next_token_plain(&p, '/');
  if (n < 3 || n > 4 || p)
    return bad(spec, "an rbd:// URI is rbd://FSID/POOL/IMAGE[/SNAP]");
  for (int i = 0; i < n; i++)
    if (!percent_decode(part[i]))
      return bad(spec, "a bad %-escape");
  s->fsid = part[0];
  s->pool = part[1];
  s->image = part[2];
  s->snap = n == 4 ? part[3] : NULL;
  if (!*s->pool || !*s->image || (s->snap && !*s->snap))
    return bad(spec, "empty pool, image or snapshot name");
  if (strchr(s->pool, '/') || strchr(s->image, '/') ||
      (s->snap && strchr(s->snap, '/')))
    return bad(spec, "a '/' in a name");
  return 0;
}

int rbd_spec_parse(const char *spec, struct rbd_spec *s) {
  memset(s, 0, sizeof *s);
  if (!rbd_spec_matches(spec))
    return bad(spec, "no rbd: prefix");
  bool uri = strncmp(spec, RBD_URI_PREFIX, strlen(RBD_URI_PREFIX)) == 0;
  size_t skip = strlen(uri ? RBD_URI_PREFIX : RBD_SPEC_PREFIX);
  if (!(s->buf = strdup(spec + skip))) {
    bd_set_error("out of memory");
    return -ENOMEM;
  }
  int r = uri ? parse_uri(spec, s->buf, s) : parse_name(spec, s->buf, s);
  if (r < 0)
    rbd_spec_free(s);
  return r;
}

void rbd_spec_free(struct rbd_spec *s) {
  free(s->buf);
  memset(s, 0, sizeof *s);
}

const char *rbd_spec_name(const struct rbd_spec *s, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s%s%s%s%s", s->pool, s->ns ? s->ns : "",
           s->ns ? "/" : "", s->image, s->snap ? "@" : "",
           s->snap ? s->snap : "");
  return buf;
}
