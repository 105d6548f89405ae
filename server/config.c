/* SPDX-License-Identifier: BSD-3-Clause */
/* The config file parser: see config.h and docs/CONFIG.md. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/error.h"
#include "core/features.h"

enum key {
  K_PATH,
  K_FORMAT,
  K_DESCRIPTION,
  K_READ_ONLY,
  K_REQUIRE_TLS,
  K_ALLOW,
  K_DEFAULT,
  K_CACHE,
  K_AIO,
  K_BITMAP,
  K_OPTION,
  NKEYS
};

static const char *const key_names[NKEYS] = {
    "path",    "format", "description", "read-only", "require-tls", "allow",
    "default", "cache",  "aio",         "bitmap",    "option"};

/* Names an operator may reach for, and the key they mean. */
static const struct {
  const char *alias, *key;
} aliases[] = {{"tls", "require-tls"},  {"ro", "read-only"},
               {"file", "path"},        {"image", "path"},
               {"desc", "description"}, {"fmt", "format"},
               {"acl", "allow"}};

/* A piece of the text, not NUL-terminated. */
struct span {
  const char *s;
  size_t n;
};

/* The export names seen so far, as indexes + 1 into the config's exports (0:
 * an empty slot): open addressing, so many exports are not quadratic. */
struct name_set {
  size_t *slot;
  size_t cap; /* a power of two, or 0 */
};

struct parser {
  const char *file;
  bool has_dir;  /* FILE has a directory part ... */
  size_t dirlen; /* ... FILE's first DIRLEN bytes ("" for "/x.conf") */
  struct config *cfg;
  struct name_set names;
  unsigned line;
  bool in_section;          /* cfg's last export is the open section */
  unsigned key_line[NKEYS]; /* where the open section gave each key, or 0 */
  unsigned default_line;    /* the first "default = yes", or 0 */
  int error;                /* -EINVAL or -ENOMEM once a failure is recorded */
};

static bool is_blank(char c) {
  return c == ' ' || c == '\t';
}
static char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static struct span trim(struct span s) {
  while (s.n && is_blank(s.s[0]))
    s.s++, s.n--;
  while (s.n && is_blank(s.s[s.n - 1]))
    s.n--;
  return s;
}

static struct span str_span(const char *s) {
  return (struct span){s, strlen(s)};
}

static bool span_eq(struct span s, const char *lit) {
  return s.n == strlen(lit) && memcmp(s.s, lit, s.n) == 0;
}

/* User text fit for a message: at most 64 bytes, control characters as
 * \xNN.  Returned by value so that two can appear in one message (the array
 * lives until the end of the full expression). */
struct shown {
  char s[64 * 4 + 4];
};

static struct shown show(struct span t) {
  struct shown r;
  size_t o = 0;
  for (size_t i = 0; i < t.n && i < 64; i++) {
    unsigned char c = (unsigned char)t.s[i];
    if (c < 0x20 || c == 0x7f)
      o += (size_t)snprintf(r.s + o, sizeof r.s - o, "\\x%02x", c);
    else
      r.s[o++] = (char)c;
  }
  r.s[o] = 0;
  if (t.n > 64)
    strcpy(r.s + o, "...");
  return r;
}

__attribute__((format(printf, 3, 4))) static int
fail(struct parser *p, unsigned line, const char *fmt, ...) {
  char reason[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  bd_set_error("%s:%u: %s", p->file, line, reason);
  p->error = -EINVAL;
  return -1;
}

static int oom(struct parser *p) {
  fail(p, p->line, "out of memory");
  p->error = -ENOMEM;
  return -1;
}

/* Make room for element N of *V (elements of SIZE bytes).  The capacity is
 * implied: 4, then the next power of two, so it is full when N is 0 or a
 * power of two from 4 on. */
static int grow(void **v, size_t n, size_t size) {
  if (n != 0 && (n < 4 || (n & (n - 1)) != 0))
    return 0;
  size_t cap = n ? n * 2 : 4;
  if (cap > SIZE_MAX / size)
    return -1;
  void *nv = realloc(*v, cap * size);
  if (!nv)
    return -1;
  *v = nv;
  return 0;
}

/* --- export names --- */

static size_t name_hash(const char *s) {
  uint64_t h = 14695981039346656037u; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211u;
  return (size_t)h;
}

/* The slot holding NAME, or the empty one where it would go. */
static size_t *name_slot(const struct name_set *set, const struct config *c,
                         const char *name) {
  size_t mask = set->cap - 1;
  for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
    size_t x = set->slot[i];
    if (!x || strcmp(c->v[x - 1].name, name) == 0)
      return &set->slot[i];
  }
}

/* Room for one more name: at most half the slots are used. */
static int name_reserve(struct name_set *set, const struct config *c) {
  if (set->cap && c->n + 1 <= set->cap / 2)
    return 0;
  size_t cap = set->cap ? set->cap * 2 : 16;
  if (cap > SIZE_MAX / sizeof *set->slot)
    return -1;
  struct name_set bigger = {calloc(cap, sizeof *set->slot), cap};
  if (!bigger.slot)
    return -1;
  for (size_t i = 0; i < c->n; i++)
    *name_slot(&bigger, c, c->v[i].name) = i + 1;
  free(set->slot);
  *set = bigger;
  return 0;
}

/* --- sections --- */

static struct export_conf *cur(struct parser *p) {
  return &p->cfg->v[p->cfg->n - 1];
}

static int end_section(struct parser *p) {
  if (!p->in_section)
    return 0;
  p->in_section = false;
  const struct export_conf *e = cur(p);
  if (!e->path)
    return fail(p, e->line, "export '%s' has no path",
                show(str_span(e->name)).s);
  return 0;
}

static int check_name(struct parser *p, struct span name) {
  if (name.n == 0)
    return fail(p, p->line, "empty export name");
  if (name.n > CONFIG_MAX_NAME)
    return fail(p, p->line, "export name longer than %u bytes",
                CONFIG_MAX_NAME);
  for (size_t i = 0; i < name.n; i++) {
    unsigned char c = (unsigned char)name.s[i];
    if (c < 0x20 || c == 0x7f)
      return fail(p, p->line, "control character in export name '%s'",
                  show(name).s);
  }
  return 0;
}

/* Declare the export NAME (NUL-terminated, owned by the parser from now
 * on) and open its section. */
static int add_export(struct parser *p, char *name) {
  struct config *c = p->cfg;
  if (name_reserve(&p->names, c) < 0 ||
      grow((void **)&c->v, c->n, sizeof *c->v) < 0) {
    free(name);
    return oom(p);
  }
  size_t *slot = name_slot(&p->names, c, name);
  if (*slot) {
    int r = fail(p, p->line, "export '%s' is declared twice (first at line %u)",
                 show(str_span(name)).s, c->v[*slot - 1].line);
    free(name);
    return r;
  }
  c->v[c->n] = (struct export_conf){.name = name, .line = p->line};
  *slot = ++c->n;
  p->in_section = true;
  memset(p->key_line, 0, sizeof p->key_line);
  return 0;
}

/* A quoted name: S starts at its opening '"'.  The unescaped name goes to
 * OUT (room for S.n bytes), what follows the closing quote to *AFTER. */
static int parse_quoted(struct parser *p, struct span s, char *out,
                        size_t *outlen, struct span *after) {
  size_t n = 0;
  for (size_t i = 1; i < s.n; i++) {
    char c = s.s[i];
    if (c == '"') {
      *outlen = n;
      *after = (struct span){s.s + i + 1, s.n - i - 1};
      return 0;
    }
    if (c == '\\' && i + 1 < s.n) {
      c = s.s[++i];
      if (c != '"' && c != '\\')
        return fail(p, p->line,
                    "bad escape '\\%s' in a quoted export name (only \\\" and "
                    "\\\\ are allowed)",
                    show((struct span){&s.s[i], 1}).s);
    }
    out[n++] = c;
  }
  return fail(p, p->line, "missing closing '\"' in the export name");
}

/* The name in "[export NAME]": S is what follows "export" and the blanks
 * after it; the name goes to OUT (room for S.n bytes). */
static int parse_name(struct parser *p, struct span s, char *out,
                      size_t *outlen) {
  struct span after;
  if (s.n && s.s[0] == '"') {
    if (parse_quoted(p, s, out, outlen, &after) < 0)
      return -1;
    after = trim(after);
    if (!after.n || after.s[0] != ']')
      return fail(p, p->line, "missing ']' after the quoted export name");
    after.s++, after.n--;
  } else {
    const char *close = memchr(s.s, ']', s.n);
    if (!close)
      return fail(p, p->line, "missing ']' at the end of the section header");
    struct span name = trim((struct span){s.s, (size_t)(close - s.s)});
    if (memchr(name.s, '"', name.n))
      return fail(p, p->line,
                  "'\"' in an unquoted export name (write the name in double "
                  "quotes, with \\\" for '\"')");
    memcpy(out, name.s, name.n);
    *outlen = name.n;
    after = (struct span){close + 1, s.n - (size_t)(close + 1 - s.s)};
  }
  after = trim(after);
  if (after.n)
    return fail(p, p->line, "unexpected text after ']': '%s' (%s)",
                show(after).s,
                after.s[0] == '#' ? "a comment must be on a line of its own"
                                  : "write a name with ']' in double quotes");
  return 0;
}

/* "[export NAME]": L is the trimmed line, starting with '['. */
static int parse_header(struct parser *p, struct span l) {
  if (end_section(p) < 0)
    return -1;
  struct span s = trim((struct span){l.s + 1, l.n - 1});
  size_t w = 0;
  while (w < s.n && !is_blank(s.s[w]) && s.s[w] != ']')
    w++;
  struct span kind = {s.s, w};
  if (!span_eq(kind, "export"))
    return fail(p, p->line,
                "unknown section kind '%s' (only [export NAME] sections)",
                show(kind).s);
  s = trim((struct span){s.s + w, s.n - w});
  if (s.n && s.s[0] == ']')
    return fail(p, p->line, "empty export name");
  char *name = malloc(s.n + 1);
  if (!name)
    return oom(p);
  size_t n = 0;
  if (parse_name(p, s, name, &n) < 0 ||
      check_name(p, (struct span){name, n}) < 0) {
    free(name);
    return -1;
  }
  name[n] = 0;
  return add_export(p, name);
}

/* --- keys --- */

/* " (...)" when V looks like it carries a comment, for the messages of keys
 * whose values are words. */
static const char *comment_hint(const char *v) {
  return strchr(v, '#') ? " (a comment must be on a line of its own)" : "";
}

static bool word_in(const char *v, const char *const *words) {
  for (; *words; words++) {
    const char *a = v, *b = *words;
    while (*a && ascii_lower(*a) == *b)
      a++, b++;
    if (!*a && !*b)
      return true;
  }
  return false;
}

static int parse_bool(struct parser *p, enum key k, const char *v, bool *out) {
  static const char *const yes[] = {"yes", "true", "on", "1", NULL};
  static const char *const no[] = {"no", "false", "off", "0", NULL};
  if (word_in(v, yes) || word_in(v, no)) {
    *out = word_in(v, yes);
    return 0;
  }
  return fail(p, p->line,
              "%s: '%s' is not a boolean (use yes/no, true/false, on/off or "
              "1/0)%s",
              key_names[k], show(str_span(v)).s, comment_hint(v));
}

/* Whether SPEC names a source rather than a file: its first ':' comes
 * before any '/' (null:1G, nbd://host/x). */
static bool is_source_spec(const char *spec) {
  return spec[strcspn(spec, ":/")] == ':';
}

/* PATH as the server must open it: a relative file path is taken from the
 * config file's directory. */
static char *resolve_path(const struct parser *p, const char *path) {
  if (path[0] == '/' || is_source_spec(path) || !p->has_dir)
    return strdup(path);
  size_t n = strlen(path);
  char *r = malloc(p->dirlen + 1 + n + 1);
  if (!r)
    return NULL;
  memcpy(r, p->file, p->dirlen);
  r[p->dirlen] = '/';
  memcpy(r + p->dirlen + 1, path, n + 1);
  return r;
}

static int set_path(struct parser *p, struct export_conf *e, char **v) {
  if (!**v)
    return fail(p, p->line, "empty path");
  e->path = resolve_path(p, *v);
  return e->path ? 0 : oom(p);
}

/* Any name: the file names no format, opening the export asks the
 * installed format table (which says "unknown format" and lists them). */
static int set_format(struct parser *p, struct export_conf *e, char **v) {
  if (!**v || strpbrk(*v, " \t#;"))
    return fail(p, p->line, "format: '%s' is not a format name%s",
                show(str_span(*v)).s, comment_hint(*v));
  e->format = *v;
  *v = NULL;
  return 0;
}

static int set_description(struct parser *p, struct export_conf *e, char **v) {
  /* NBD strings are at most 4096 bytes. */
  if (strlen(*v) > CONFIG_MAX_NAME)
    return fail(p, p->line, "description longer than %u bytes",
                CONFIG_MAX_NAME);
  if (**v) {
    e->description = *v;
    *v = NULL;
  }
  return 0;
}

static int set_cache(struct parser *p, struct export_conf *e, char **v) {
  if (bd_cache_parse(*v, &e->cache) < 0)
    return fail(p, p->line,
                "cache: '%s' is not none, writeback, writethrough, "
                "directsync or unsafe%s",
                show(str_span(*v)).s, comment_hint(*v));
  e->has_cache = true;
  return 0;
}

static int set_aio(struct parser *p, struct export_conf *e, char **v) {
  if (bd_aio_parse(*v, &e->aio) < 0)
    return fail(p, p->line, "aio: '%s' is not io_uring or threads%s",
                show(str_span(*v)).s, comment_hint(*v));
  if (e->aio == BD_AIO_IO_URING && !feature_built(FEATURE_IO_URING)) {
    feature_missing(FEATURE_IO_URING);
    return fail(p, p->line, "aio: io_uring: %s", bd_errmsg());
  }
  e->has_aio = true;
  return 0;
}

static int set_read_only(struct parser *p, struct export_conf *e, char **v) {
  return parse_bool(p, K_READ_ONLY, *v, &e->readonly);
}

static int set_require_tls(struct parser *p, struct export_conf *e, char **v) {
  return parse_bool(p, K_REQUIRE_TLS, *v, &e->tls_required);
}

static int set_default(struct parser *p, struct export_conf *e, char **v) {
  if (parse_bool(p, K_DEFAULT, *v, &e->is_default) < 0)
    return -1;
  if (!e->is_default)
    return 0;
  if (p->default_line)
    return fail(p, p->line,
                "more than one export says default = yes (also at line %u)",
                p->default_line);
  p->default_line = p->line;
  return 0;
}

/* bitmap = NAME: one more persistent bitmap to export (repeatable). */
static int set_bitmap(struct parser *p, struct export_conf *e, char **v) {
  if (!**v || strlen(*v) > CONFIG_MAX_BITMAP_NAME)
    return fail(p, p->line, "bitmap: a name of 1 to %u bytes",
                CONFIG_MAX_BITMAP_NAME);
  if (e->nbitmaps >= CONFIG_MAX_BITMAPS)
    return fail(p, p->line, "more than %u bitmaps", CONFIG_MAX_BITMAPS);
  for (size_t i = 0; i < e->nbitmaps; i++)
    if (!strcmp(e->bitmaps[i], *v))
      return fail(p, p->line, "bitmap '%s' given twice", show(str_span(*v)).s);
  char **b = realloc(e->bitmaps, (e->nbitmaps + 1) * sizeof *b);
  if (!b)
    return oom(p);
  e->bitmaps = b;
  b[e->nbitmaps++] = *v;
  *v = NULL;
  return 0;
}

/* option = KEY=VALUE: one more option of the source's format
 * (repeatable), whose keys only the format knows. */
static int set_option(struct parser *p, struct export_conf *e, char **v) {
  const char *eq = strchr(*v, '=');
  if (!eq || eq == *v)
    return fail(p, p->line, "option: '%s' is not KEY=VALUE%s",
                show(str_span(*v)).s, comment_hint(*v));
  if (e->noptions >= CONFIG_MAX_OPTIONS)
    return fail(p, p->line, "more than %u options", CONFIG_MAX_OPTIONS);
  char **o = realloc(e->options, (e->noptions + 1) * sizeof *o);
  if (!o)
    return oom(p);
  e->options = o;
  o[e->noptions++] = *v;
  *v = NULL;
  return 0;
}

/* One entry of an allow list, NUL-terminated and trimmed. */
static int add_rule(struct parser *p, struct export_conf *e, const char *item) {
  char why[160];
  struct acl_rule rule;
  if (acl_parse(item, &rule) < 0) {
    snprintf(why, sizeof why, "%s", bd_errmsg());
    for (char *c = why; *c; c++)
      if ((unsigned char)*c < 0x20 || *c == 0x7f)
        *c = '?';
    return fail(p, p->line, "allow: %s", why);
  }
  if (grow((void **)&e->allow, e->nallow, sizeof *e->allow) < 0)
    return oom(p);
  e->allow[e->nallow++] = rule;
  return 0;
}

/* "allow = A, B/N, ...": the entries add up over the lines. */
static int set_allow(struct parser *p, struct export_conf *e, char **v) {
  if (!**v)
    return fail(p, p->line,
                "empty allow list (leave 'allow' out to admit "
                "everyone)");
  for (char *s = *v;;) {
    char *comma = strchr(s, ',');
    char *end = comma ? comma : s + strlen(s);
    while (is_blank(*s))
      s++;
    while (end > s && is_blank(end[-1]))
      end--;
    if (end == s)
      return fail(p, p->line, "empty entry in the allow list");
    *end = 0;
    if (add_rule(p, e, s) < 0)
      return -1;
    if (!comma)
      return 0;
    s = comma + 1;
  }
}

/* Each setter may take the value (leaving *V NULL). */
typedef int setter(struct parser *p, struct export_conf *e, char **v);
static setter *const setters[NKEYS] = {[K_PATH] = set_path,
                                       [K_FORMAT] = set_format,
                                       [K_DESCRIPTION] = set_description,
                                       [K_READ_ONLY] = set_read_only,
                                       [K_REQUIRE_TLS] = set_require_tls,
                                       [K_ALLOW] = set_allow,
                                       [K_DEFAULT] = set_default,
                                       [K_CACHE] = set_cache,
                                       [K_AIO] = set_aio,
                                       [K_BITMAP] = set_bitmap,
                                       [K_OPTION] = set_option};

/* Edit distance between A and B, both at most 32 bytes. */
static size_t distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[33];
  for (size_t j = 0; j <= lb; j++)
    row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* S without its dashes, into OUT (33 bytes). */
static void undash(const char *s, char *out) {
  for (; *s; s++)
    if (*s != '-')
      *out++ = *s;
  *out = 0;
}

/* The key an unknown KEY was probably meant to be, or NULL. */
static const char *suggest(struct span key) {
  char k[33], bare[33], other[33];
  if (key.n >= sizeof k)
    return NULL;
  /* read_only, Read Only, READ-ONLY: read-only */
  for (size_t i = 0; i < key.n; i++) {
    char c = ascii_lower(key.s[i]);
    k[i] = c == '_' || is_blank(c) ? '-' : c;
  }
  k[key.n] = 0;
  undash(k, bare);
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (!strcmp(bare, aliases[i].alias))
      return aliases[i].key;
  const char *best = NULL;
  size_t best_d = 3; /* more edits than 2 is a different word */
  for (int i = 0; i < NKEYS; i++) {
    undash(key_names[i], other);
    if (!strcmp(bare, other))
      return key_names[i];
    size_t d = distance(k, key_names[i]);
    if (key.n >= 3 && d < best_d)
      best = key_names[i], best_d = d;
  }
  return best;
}

static int unknown_key(struct parser *p, struct span key) {
  const char *hint = suggest(key);
  if (hint)
    return fail(p, p->line, "unknown key '%s' (did you mean '%s'?)",
                show(key).s, hint);
  return fail(p, p->line,
              "unknown key '%s' (keys: path, format, description, read-only, "
              "require-tls, allow, default, cache, aio)",
              show(key).s);
}

/* "key = value": L is the trimmed line. */
static int parse_key(struct parser *p, struct span l) {
  const char *eq = memchr(l.s, '=', l.n);
  if (!eq)
    return fail(p, p->line, "missing '=' in '%s' (expected key = value)",
                show(l).s);
  struct span key = trim((struct span){l.s, (size_t)(eq - l.s)});
  struct span val = trim((struct span){eq + 1, l.n - (size_t)(eq + 1 - l.s)});
  if (!key.n)
    return fail(p, p->line, "missing key before '='");
  int k = 0;
  while (k < NKEYS && !span_eq(key, key_names[k]))
    k++;
  if (k == NKEYS)
    return unknown_key(p, key);
  if (k != K_ALLOW && k != K_BITMAP && k != K_OPTION && p->key_line[k])
    return fail(p, p->line, "'%s' given twice (first at line %u)", key_names[k],
                p->key_line[k]);
  p->key_line[k] = p->line;
  char *v = strndup(val.s, val.n);
  if (!v)
    return oom(p);
  int r = setters[k](p, cur(p), &v);
  free(v);
  return r;
}

/* --- lines and files --- */

static int parse_line(struct parser *p, struct span l) {
  if (l.n > CONFIG_MAX_LINE)
    return fail(p, p->line, "line longer than %u bytes", CONFIG_MAX_LINE);
  if (memchr(l.s, 0, l.n))
    return fail(p, p->line, "NUL byte in the file");
  if (l.n && l.s[l.n - 1] == '\r')
    l.n--;
  l = trim(l);
  if (!l.n || l.s[0] == '#')
    return 0;
  if (l.s[0] == '[')
    return parse_header(p, l);
  if (!p->in_section)
    return fail(p, p->line, "key outside an [export] section");
  return parse_key(p, l);
}

static int parse_lines(struct parser *p, const char *text, size_t len) {
  size_t pos = 0;
  if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
    pos = 3; /* a UTF-8 byte order mark */
  while (pos < len) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - text) : len;
    if (p->line == UINT_MAX)
      return fail(p, p->line, "too many lines");
    p->line++;
    if (parse_line(p, (struct span){text + pos, end - pos}) < 0)
      return -1;
    pos = end + 1;
  }
  if (end_section(p) < 0)
    return -1;
  if (p->cfg->n == 0)
    return fail(p, p->line ? p->line : 1,
                "no exports (the file has no [export NAME] section)");
  return 0;
}

int config_parse(const char *text, size_t len, const char *file,
                 struct config *out) {
  struct parser p = {.file = file ? file : "(config)", .cfg = out};
  const char *slash = strrchr(p.file, '/');
  p.has_dir = slash != NULL;
  p.dirlen = slash ? (size_t)(slash - p.file) : 0;
  memset(out, 0, sizeof *out);
  int r = parse_lines(&p, text, len);
  free(p.names.slot);
  if (r < 0)
    config_free(out);
  return r < 0 ? (p.error ? p.error : -EINVAL) : 0;
}

/* Up to CONFIG_MAX_FILE + 1 bytes of FD into BUF; the count, or -1. */
static ssize_t read_all(int fd, char *buf) {
  size_t n = 0;
  while (n <= CONFIG_MAX_FILE) {
    ssize_t r = read(fd, buf + n, CONFIG_MAX_FILE + 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0)
      break;
    n += (size_t)r;
  }
  return (ssize_t)n;
}

int config_load(const char *file, struct config *out) {
  memset(out, 0, sizeof *out);
  CLEANUP_FREE char *buf = malloc(CONFIG_MAX_FILE + 1);
  if (!buf) {
    bd_set_error("%s: %s", file, strerror(ENOMEM));
    return -ENOMEM;
  }
  CLEANUP_CLOSE int fd = open(file, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd < 0 ? -1 : read_all(fd, buf);
  if (n < 0) {
    int e = errno;
    bd_set_error("%s: %s", file, strerror(e));
    return -e;
  }
  if ((size_t)n > CONFIG_MAX_FILE) {
    bd_set_error("%s: larger than 1 MiB", file);
    return -EFBIG;
  }
  return config_parse(buf, (size_t)n, file, out);
}

void config_export_free(struct export_conf *e) {
  free(e->name);
  free(e->path);
  free(e->format);
  free(e->description);
  free(e->allow);
  for (size_t i = 0; i < e->nbitmaps; i++)
    free(e->bitmaps[i]);
  free(e->bitmaps);
  for (size_t i = 0; i < e->noptions; i++)
    free(e->options[i]);
  free(e->options);
  memset(e, 0, sizeof *e);
}

void config_free(struct config *c) {
  for (size_t i = 0; i < c->n; i++)
    config_export_free(&c->v[i]);
  free(c->v);
  memset(c, 0, sizeof *c);
}

static char *dup_or_null(const char *s, bool *failed) {
  char *d = s ? strdup(s) : NULL;
  if (s && !d)
    *failed = true;
  return d;
}

int config_export_copy(struct export_conf *dst, const struct export_conf *src) {
  bool failed = false;
  *dst = *src;
  dst->name = dup_or_null(src->name, &failed);
  dst->path = dup_or_null(src->path, &failed);
  dst->format = dup_or_null(src->format, &failed);
  dst->description = dup_or_null(src->description, &failed);
  dst->allow = NULL;
  dst->bitmaps = src->nbitmaps ? calloc(src->nbitmaps, sizeof(char *)) : NULL;
  if (src->nbitmaps && !dst->bitmaps)
    failed = true, dst->nbitmaps = 0;
  for (size_t i = 0; dst->bitmaps && i < src->nbitmaps; i++)
    dst->bitmaps[i] = dup_or_null(src->bitmaps[i], &failed);
  dst->options = src->noptions ? calloc(src->noptions, sizeof(char *)) : NULL;
  if (src->noptions && !dst->options)
    failed = true, dst->noptions = 0;
  for (size_t i = 0; dst->options && i < src->noptions; i++)
    dst->options[i] = dup_or_null(src->options[i], &failed);
  if (src->nallow) {
    dst->allow = malloc(src->nallow * sizeof *src->allow);
    if (dst->allow)
      memcpy(dst->allow, src->allow, src->nallow * sizeof *src->allow);
    else
      failed = true;
  }
  if (failed) {
    config_export_free(dst);
    return -1;
  }
  return 0;
}
