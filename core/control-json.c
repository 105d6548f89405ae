/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's JSON (core/control.h, docs/CONTROL.md): the request
 * parser and the answer writer.  Pure: no I/O, no threads, so the fuzzer
 * and the unit tests take this file alone.
 *
 * The parser reads any JSON text (RFC 8259) to check it, bounds-checked at
 * every byte, with nesting limited to CTL_MAX_DEPTH; it decodes only what
 * a request needs: the "verb" string and the "args" array of strings.
 * Strings must be valid UTF-8 (no overlong forms, no surrogates), escapes
 * included (\uXXXX pairs make one code point; a lone surrogate is
 * refused), so that what is echoed ("id") and what reaches a handler is
 * valid UTF-8 text. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "hex.h"

/* ---- UTF-8 ---- */

/* The length of the valid UTF-8 sequence at P (N bytes left), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n) {
  unsigned char c = p[0];
  if (c < 0x80)
    return 1;
  size_t len;
  unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
  if (c >= 0xc2 && c <= 0xdf)
    len = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0)
      lo = 0xa0; /* no overlong forms */
    if (c == 0xed)
      hi = 0x9f; /* no surrogates */
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0)
      lo = 0x90;
    if (c == 0xf4)
      hi = 0x8f; /* at most U+10FFFF */
  } else
    return 0;
  if (n < len || p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < len; i++)
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  return len;
}

static size_t utf8_put(char *out, unsigned cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | cp >> 18);
  out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
  out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* ---- the parser ---- */

struct parser {
  const unsigned char *start, *p, *end;
  char *err;
  size_t errlen;
  int depth;
};

__attribute__((format(printf, 2, 3))) static int bad(struct parser *ps,
                                                     const char *fmt, ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (ps->errlen)
    snprintf(ps->err, ps->errlen, "malformed request at byte %zu: %s",
             (size_t)(ps->p - ps->start), what);
  return -EINVAL;
}

static void skip_ws(struct parser *ps) {
  while (ps->p < ps->end &&
         (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

/* Whether the next byte is C (and skip it). */
static bool eat(struct parser *ps, char c) {
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == (unsigned char)c) {
    ps->p++;
    return true;
  }
  return false;
}

static int hex4(struct parser *ps, unsigned *out) {
  if (ps->end - ps->p < 4)
    return bad(ps, "a \\u escape needs four hex digits");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int d = hex_digit(ps->p[i]);
    if (d < 0)
      return bad(ps, "a \\u escape needs four hex digits");
    v = v * 16 + (unsigned)d;
  }
  ps->p += 4;
  *out = v;
  return 0;
}

/* One escape after the backslash, as a code point. */
static int escape(struct parser *ps, unsigned *cp) {
  if (ps->p >= ps->end)
    return bad(ps, "unterminated string");
  unsigned char c = *ps->p++;
  switch (c) {
  case '"': *cp = '"'; return 0;
  case '\\': *cp = '\\'; return 0;
  case '/': *cp = '/'; return 0;
  case 'b': *cp = '\b'; return 0;
  case 'f': *cp = '\f'; return 0;
  case 'n': *cp = '\n'; return 0;
  case 'r': *cp = '\r'; return 0;
  case 't': *cp = '\t'; return 0;
  case 'u': break;
  default:
    ps->p--;
    return bad(ps, "unknown escape '\\%c'", c >= 0x20 && c < 0x7f ? c : '?');
  }
  unsigned hi = 0, lo = 0; /* hex4() sets them; gcc -O2 cannot tell */
  if (hex4(ps, &hi) < 0)
    return -EINVAL;
  if (hi >= 0xdc00 && hi <= 0xdfff)
    return bad(ps, "a lone low surrogate \\u%04x", hi);
  if (hi < 0xd800 || hi > 0xdbff) {
    *cp = hi;
    return 0;
  }
  if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
    return bad(ps, "a high surrogate \\u%04x without its low one", hi);
  ps->p += 2;
  if (hex4(ps, &lo) < 0)
    return -EINVAL;
  if (lo < 0xdc00 || lo > 0xdfff)
    return bad(ps, "a high surrogate \\u%04x without its low one", hi);
  *cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
  return 0;
}

/* A string, the opening quote next.  With OUT, decoded into a new
 * NUL-terminated string, which must then hold no NUL. */
static int string(struct parser *ps, char **out) {
  skip_ws(ps);
  if (ps->p >= ps->end || *ps->p != '"')
    return bad(ps, "expected a string");
  ps->p++;
  /* Decoded text is never longer than its source. */
  char *s = NULL, *q = NULL;
  if (out) {
    s = q = malloc((size_t)(ps->end - ps->p) + 1);
    if (!s)
      return bad(ps, "out of memory");
  }
  for (;;) {
    if (ps->p >= ps->end) {
      free(s);
      return bad(ps, "unterminated string");
    }
    unsigned char c = *ps->p;
    if (c == '"') {
      ps->p++;
      break;
    }
    if (c < 0x20) {
      free(s);
      return bad(ps, "control character 0x%02x in a string", c);
    }
    if (c == '\\') {
      ps->p++;
      unsigned cp = 0;
      if (escape(ps, &cp) < 0) {
        free(s);
        return -EINVAL;
      }
      if (s && cp == 0) {
        free(s);
        return bad(ps, "\\u0000 in a string");
      }
      if (q)
        q += utf8_put(q, cp);
      continue;
    }
    size_t n = utf8_len(ps->p, (size_t)(ps->end - ps->p));
    if (!n) {
      free(s);
      return bad(ps, "invalid UTF-8 in a string");
    }
    if (q) {
      memcpy(q, ps->p, n);
      q += n;
    }
    ps->p += n;
  }
  if (q)
    *q = 0;
  if (out)
    *out = s;
  return 0;
}

static bool digit(const struct parser *ps) {
  return ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9';
}

static int number(struct parser *ps) {
  if (ps->p < ps->end && *ps->p == '-')
    ps->p++;
  if (!digit(ps))
    return bad(ps, "expected a value");
  if (*ps->p == '0')
    ps->p++;
  else
    while (digit(ps))
      ps->p++;
  if (ps->p < ps->end && *ps->p == '.') {
    ps->p++;
    if (!digit(ps))
      return bad(ps, "expected a digit after '.'");
    while (digit(ps))
      ps->p++;
  }
  if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
    ps->p++;
    if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
      ps->p++;
    if (!digit(ps))
      return bad(ps, "expected a digit in the exponent");
    while (digit(ps))
      ps->p++;
  }
  return 0;
}

static int literal(struct parser *ps, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
    return bad(ps, "expected a value");
  ps->p += n;
  return 0;
}

static int value(struct parser *ps);

/* The members or elements after '{' or '[' up to CLOSE. */
static int container(struct parser *ps, bool object, char close) {
  if (++ps->depth > CTL_MAX_DEPTH)
    return bad(ps, "nested deeper than %d", CTL_MAX_DEPTH);
  if (eat(ps, close)) {
    ps->depth--;
    return 0;
  }
  do {
    if (object && string(ps, NULL) < 0)
      return -EINVAL;
    if (object && !eat(ps, ':'))
      return bad(ps, "expected ':'");
    if (value(ps) < 0)
      return -EINVAL;
  } while (eat(ps, ','));
  if (!eat(ps, close))
    return bad(ps, "expected ',' or '%c'", close);
  ps->depth--;
  return 0;
}

/* Any value, checked and skipped. */
static int value(struct parser *ps) {
  skip_ws(ps);
  if (ps->p >= ps->end)
    return bad(ps, "expected a value");
  switch (*ps->p) {
  case '"': return string(ps, NULL);
  case '{': ps->p++; return container(ps, true, '}');
  case '[': ps->p++; return container(ps, false, ']');
  case 't': return literal(ps, "true");
  case 'f': return literal(ps, "false");
  case 'n': return literal(ps, "null");
  default: return number(ps);
  }
}

/* "args": an array of at most CTL_MAX_ARGS strings. */
static int args(struct parser *ps, struct ctl_request *req) {
  if (!eat(ps, '['))
    return bad(ps, "\"args\" must be an array of strings");
  req->args = calloc(CTL_MAX_ARGS, sizeof *req->args);
  if (!req->args)
    return bad(ps, "out of memory");
  if (eat(ps, ']'))
    return 0;
  do {
    if (req->nargs == CTL_MAX_ARGS)
      return bad(ps, "more than %d args", CTL_MAX_ARGS);
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"')
      return bad(ps, "\"args\" must be an array of strings");
    if (string(ps, &req->args[req->nargs]) < 0)
      return -EINVAL;
    req->nargs++;
  } while (eat(ps, ','));
  if (!eat(ps, ']'))
    return bad(ps, "expected ',' or ']'");
  return 0;
}

/* "id": any value, kept as its text. */
static int id(struct parser *ps, struct ctl_request *req) {
  skip_ws(ps);
  const unsigned char *from = ps->p;
  if (value(ps) < 0)
    return -EINVAL;
  size_t n = (size_t)(ps->p - from);
  req->id = malloc(n + 1);
  if (!req->id)
    return bad(ps, "out of memory");
  /* Outside strings (which hold no raw control characters) only: a line
   * break between tokens must not break the answer's line. */
  for (size_t i = 0; i < n; i++)
    req->id[i] = from[i] == '\n' || from[i] == '\r' ? ' ' : (char)from[i];
  req->id[n] = 0;
  return 0;
}

/* One member of the request object. */
static int member(struct parser *ps, struct ctl_request *req) {
  char *key;
  if (string(ps, &key) < 0)
    return -EINVAL;
  if (!eat(ps, ':')) {
    free(key);
    return bad(ps, "expected ':'");
  }
  int r;
  if ((!strcmp(key, "verb") && req->verb) ||
      (!strcmp(key, "args") && req->args) || (!strcmp(key, "id") && req->id))
    r = bad(ps, "\"%s\" given twice", key);
  else if (!strcmp(key, "verb")) {
    skip_ws(ps);
    r = ps->p < ps->end && *ps->p == '"' ? string(ps, &req->verb)
                                         : bad(ps, "\"verb\" must be a string");
  } else if (!strcmp(key, "args"))
    r = args(ps, req);
  else if (!strcmp(key, "id"))
    r = id(ps, req);
  else
    r = value(ps); /* a member this version does not know: ignored */
  free(key);
  return r;
}

void ctl_request_free(struct ctl_request *req) {
  free(req->verb);
  if (req->args)
    for (size_t i = 0; i < req->nargs; i++)
      free(req->args[i]);
  free(req->args);
  free(req->id);
  *req = (struct ctl_request){0};
}

int ctl_parse_request(const char *line, size_t len, struct ctl_request *req,
                      char *err, size_t errlen) {
  *req = (struct ctl_request){0};
  struct parser ps = {.start = (const unsigned char *)line,
                      .p = (const unsigned char *)line,
                      .end = (const unsigned char *)line + len,
                      .err = err,
                      .errlen = errlen};
  if (errlen)
    err[0] = 0;
  int r = 0;
  if (!eat(&ps, '{'))
    r = bad(&ps, "a request is a JSON object");
  else if (!eat(&ps, '}')) {
    ps.depth = 1;
    do
      r = member(&ps, req);
    while (r == 0 && eat(&ps, ','));
    if (r == 0 && !eat(&ps, '}'))
      r = bad(&ps, "expected ',' or '}'");
  }
  skip_ws(&ps);
  if (r == 0 && ps.p != ps.end)
    r = bad(&ps, "text after the request object");
  if (r == 0 && !req->verb)
    r = bad(&ps, "no \"verb\"");
  if (r < 0) {
    char *keep = req->id;
    req->id = NULL;
    ctl_request_free(req);
    req->id = keep;
    return -EINVAL;
  }
  if (!req->args)
    req->args = calloc(1, sizeof *req->args);
  if (!req->args) {
    ctl_request_free(req);
    if (errlen)
      snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  return 0;
}

/* ---- for clients ---- */

char *ctl_json_member(const char *text, size_t len, const char *key) {
  struct parser ps = {.start = (const unsigned char *)text,
                      .p = (const unsigned char *)text,
                      .end = (const unsigned char *)text + len};
  char *found = NULL;
  if (!eat(&ps, '{'))
    return NULL;
  ps.depth = 1;
  if (!eat(&ps, '}')) {
    do {
      char *k;
      if (string(&ps, &k) < 0)
        goto bad;
      bool want = !found && !strcmp(k, key);
      free(k);
      if (!eat(&ps, ':'))
        goto bad;
      skip_ws(&ps);
      const unsigned char *from = ps.p;
      if (value(&ps) < 0)
        goto bad;
      if (want && !(found = strndup((const char *)from, (size_t)(ps.p - from))))
        goto bad;
    } while (eat(&ps, ','));
    if (!eat(&ps, '}'))
      goto bad;
  }
  skip_ws(&ps);
  if (ps.p == ps.end)
    return found;
bad:
  free(found);
  return NULL;
}

char *ctl_json_decode_str(const char *text) {
  size_t len = strlen(text);
  struct parser ps = {.start = (const unsigned char *)text,
                      .p = (const unsigned char *)text,
                      .end = (const unsigned char *)text + len};
  char *out;
  if (string(&ps, &out) < 0)
    return NULL;
  skip_ws(&ps);
  if (ps.p != ps.end) {
    free(out);
    return NULL;
  }
  return out;
}

bool ctl_utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    size_t l = utf8_len(p + i, n - i);
    if (!l)
      return false;
    i += l;
  }
  return true;
}

/* ---- the writer ---- */

#define MAX_NEST 8

struct ctl_answer {
  char *id;
  char *buf; /* the fields, each starting with ',' at the top level */
  size_t len, cap;
  int depth;
  bool first[MAX_NEST + 1]; /* nothing written yet in this container */
  bool in_array[MAX_NEST + 1];
  bool failed, broken, nomem;
  int err;
  char msg[512];
  char *line; /* what ctl_answer_finish() made */
};

static int grow(char **out, size_t *len, size_t *cap, size_t more) {
  if (*len + more + 1 <= *cap)
    return 0;
  size_t c = *cap ? *cap : 256;
  while (c < *len + more + 1)
    c *= 2;
  char *n = realloc(*out, c);
  if (!n)
    return -ENOMEM;
  *out = n;
  *cap = c;
  return 0;
}

static int put(char **out, size_t *len, size_t *cap, const char *s, size_t n) {
  if (grow(out, len, cap, n) < 0)
    return -ENOMEM;
  memcpy(*out + *len, s, n);
  *len += n;
  (*out)[*len] = 0;
  return 0;
}

int ctl_json_str(char **out, size_t *len, size_t *cap, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  /* At most 6 bytes out per byte in ("\u00XX"), and quotes. */
  if (grow(out, len, cap, n * 6 + 2) < 0)
    return -ENOMEM;
  char *q = *out + *len;
  *q++ = '"';
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    const char *esc = NULL;
    switch (c) {
    case '"': esc = "\\\""; break;
    case '\\': esc = "\\\\"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    default: break;
    }
    if (esc) {
      memcpy(q, esc, 2);
      q += 2;
      i++;
    } else if (c < 0x20 || c == 0x7f) {
      q += sprintf(q, "\\u%04x", c);
      i++;
    } else {
      size_t l = utf8_len(p + i, n - i);
      if (l) {
        memcpy(q, p + i, l);
        q += l;
        i += l;
      } else {
        memcpy(q, "\xef\xbf\xbd", 3); /* U+FFFD */
        q += 3;
        i++;
      }
    }
  }
  *q++ = '"';
  *q = 0;
  *len = (size_t)(q - *out);
  return 0;
}

struct ctl_answer *ctl_answer_new(const char *id) {
  struct ctl_answer *a = calloc(1, sizeof *a);
  if (!a)
    return NULL;
  if (id && !(a->id = strdup(id))) {
    free(a);
    return NULL;
  }
  a->first[0] = false; /* top level: every field starts with ',' */
  return a;
}

void ctl_answer_free(struct ctl_answer *a) {
  if (!a)
    return;
  free(a->id);
  free(a->buf);
  free(a->line);
  free(a);
}

bool ctl_answer_failed(const struct ctl_answer *a) {
  return a->failed || a->broken || a->nomem;
}

static void mark(struct ctl_answer *a, int r) {
  if (r < 0)
    a->nomem = true;
}

/* The separator and "KEY": before a field of an object; misuse (a key
 * in an array, or no key in an object) breaks the answer.  False: do not
 * write it. */
static bool field(struct ctl_answer *a, const char *key) {
  if (a->failed || a->broken || a->nomem)
    return false;
  bool array = a->in_array[a->depth];
  if (array == (key != NULL)) {
    a->broken = true;
    return false;
  }
  if (!a->first[a->depth])
    mark(a, put(&a->buf, &a->len, &a->cap, ",", 1));
  a->first[a->depth] = false;
  if (key) {
    mark(a, ctl_json_str(&a->buf, &a->len, &a->cap, key));
    mark(a, put(&a->buf, &a->len, &a->cap, ":", 1));
  }
  return !a->nomem;
}

void ctl_add_str(struct ctl_answer *a, const char *key, const char *value) {
  if (field(a, key))
    mark(a, ctl_json_str(&a->buf, &a->len, &a->cap, value ? value : ""));
}

void ctl_add_i64(struct ctl_answer *a, const char *key, int64_t value) {
  char n[24];
  if (field(a, key))
    mark(a, put(&a->buf, &a->len, &a->cap, n,
                (size_t)snprintf(n, sizeof n, "%lld", (long long)value)));
}

void ctl_add_u64(struct ctl_answer *a, const char *key, uint64_t value) {
  char n[24];
  if (field(a, key))
    mark(a,
         put(&a->buf, &a->len, &a->cap, n,
             (size_t)snprintf(n, sizeof n, "%llu", (unsigned long long)value)));
}

void ctl_add_bool(struct ctl_answer *a, const char *key, bool value) {
  if (field(a, key))
    mark(a, put(&a->buf, &a->len, &a->cap, value ? "true" : "false",
                value ? 4 : 5));
}

static void open_container(struct ctl_answer *a, const char *key, bool array) {
  if (a->depth == MAX_NEST) {
    a->broken = true;
    return;
  }
  if (!field(a, key))
    return;
  mark(a, put(&a->buf, &a->len, &a->cap, array ? "[" : "{", 1));
  a->depth++;
  a->first[a->depth] = true;
  a->in_array[a->depth] = array;
}

static void close_container(struct ctl_answer *a, bool array) {
  if (a->failed || a->broken || a->nomem)
    return;
  if (a->depth == 0 || a->in_array[a->depth] != array) {
    a->broken = true;
    return;
  }
  a->depth--;
  mark(a, put(&a->buf, &a->len, &a->cap, array ? "]" : "}", 1));
}

void ctl_array_begin(struct ctl_answer *a, const char *key) {
  open_container(a, key, true);
}

void ctl_object_begin(struct ctl_answer *a) {
  open_container(a, NULL, false);
}

void ctl_object_end(struct ctl_answer *a) {
  close_container(a, false);
}

void ctl_array_end(struct ctl_answer *a) {
  close_container(a, true);
}

void ctl_add_strv(struct ctl_answer *a, const char *key,
                  const char *const *values, size_t n) {
  ctl_array_begin(a, key);
  for (size_t i = 0; i < n; i++)
    ctl_add_str(a, NULL, values[i]);
  ctl_array_end(a);
}

int ctl_fail(struct ctl_answer *a, int err, const char *fmt, ...) {
  if (err <= 0)
    err = EIO;
  if (!a->failed) {
    a->failed = true;
    a->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->msg, sizeof a->msg, fmt, ap);
    va_end(ap);
  }
  return -err;
}

static const char *errno_name(int err) {
  const char *n = strerrorname_np(err);
  return n ? n : "EIO";
}

const char *ctl_answer_finish(struct ctl_answer *a, size_t *len) {
  if (!a->failed && (a->broken || a->depth != 0)) {
    a->failed = true;
    a->err = EPROTO;
    snprintf(a->msg, sizeof a->msg, "internal error: malformed answer");
  }
  if (!a->failed && a->nomem) {
    a->failed = true;
    a->err = ENOMEM;
    snprintf(a->msg, sizeof a->msg, "out of memory");
  }
  char *out = NULL;
  size_t n = 0, cap = 0;
  int r = put(&out, &n, &cap, a->failed ? "{\"ok\":false" : "{\"ok\":true",
              a->failed ? 11 : 10);
  if (r == 0 && a->id) {
    r = put(&out, &n, &cap, ",\"id\":", 6);
    if (r == 0)
      r = put(&out, &n, &cap, a->id, strlen(a->id));
  }
  if (r == 0 && a->failed) {
    r = put(&out, &n, &cap, ",\"error\":", 9);
    if (r == 0)
      r = ctl_json_str(&out, &n, &cap, a->msg);
    if (r == 0)
      r = put(&out, &n, &cap, ",\"errno\":", 9);
    if (r == 0)
      r = ctl_json_str(&out, &n, &cap, errno_name(a->err));
  } else if (r == 0 && a->len) {
    r = put(&out, &n, &cap, a->buf, a->len);
  }
  if (r == 0)
    r = put(&out, &n, &cap, "}\n", 2);
  if (r < 0) {
    free(out);
    return NULL;
  }
  free(a->line);
  a->line = out;
  *len = n;
  return out;
}
