/* SPDX-License-Identifier: BSD-3-Clause */
/* The KEY=VALUE options of struct bd_open_opts, as a format reads them
 * and as bd_open_with() checks them (core/open.h).  Pure: strings in,
 * values and messages out. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "blockdev.h"
#include "open.h"

/* Whether ENTRY ("KEY=VALUE") sets KEY: its value, else NULL. */
static const char *value_of(const char *entry, const char *key) {
  size_t n = strlen(key);
  return !strncmp(entry, key, n) && entry[n] == '=' ? entry + n + 1 : NULL;
}

/* Whether default ENTRY ("[FORMAT.]KEY=VALUE") applies to FORMAT's KEY. */
static const char *default_of(const char *entry, const char *format,
                              const char *key) {
  size_t n = strlen(format);
  const char *eq = strchr(entry, '='), *dot = strchr(entry, '.');
  if (dot && eq && dot < eq) {
    if (strncmp(entry, format, n) || entry + n != dot)
      return NULL;
    entry = dot + 1;
  }
  return value_of(entry, key);
}

const char *bd_opt_next(const struct bd_open_opts *o, const char *format,
                        const char *key, size_t *pos) {
  for (; *pos < o->ndefaults + o->noptions; (*pos)++) {
    size_t i = *pos;
    const char *v = i < o->ndefaults
                        ? default_of(o->defaults[i], format, key)
                        : value_of(o->options[i - o->ndefaults], key);
    if (v) {
      (*pos)++;
      return v;
    }
  }
  return NULL;
}

const char *bd_opt_get(const struct bd_open_opts *o, const char *format,
                       const char *key) {
  const char *last = NULL, *v;
  size_t pos = 0;
  while ((v = bd_opt_next(o, format, key, &pos)))
    last = v;
  return last;
}

static int expected(const char *format, const char *key, const char *v,
                    const char *what) {
  bd_set_error("%s: %s=%s: expected %s", format, key, v, what);
  return -EINVAL;
}

int bd_opt_uint(const struct bd_open_opts *o, const char *format,
                const char *key, unsigned min, unsigned max, unsigned *out) {
  const char *v = bd_opt_get(o, format, key);
  if (!v)
    return 0;
  unsigned long long n = 0;
  const char *p = v;
  for (; *p >= '0' && *p <= '9' && n <= max; p++)
    n = n * 10 + (unsigned)(*p - '0');
  if (p == v || *p || n < min || n > max) {
    char what[64];
    snprintf(what, sizeof what, "a number in %u-%u", min, max);
    return expected(format, key, v, what);
  }
  *out = (unsigned)n;
  return 0;
}

int bd_opt_size(const struct bd_open_opts *o, const char *format,
                const char *key, uint64_t min, uint64_t *out) {
  const char *v = bd_opt_get(o, format, key);
  uint64_t n;
  if (!v)
    return 0;
  if (bd_parse_size(v, &n) < 0 || n < min) {
    char what[64];
    if (min)
      snprintf(what, sizeof what, "a size of at least %" PRIu64, min);
    else
      snprintf(what, sizeof what, "a size (4096, 512K, 64M, ...)");
    return expected(format, key, v, what);
  }
  *out = n;
  return 0;
}

/* "a, b or c" of the NULL-terminated LIST, in BUF. */
static const char *listed(const char *const *list, const char *last_sep,
                          char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; list[i] && n < len; i++) {
    const char *sep = i == 0 ? "" : list[i + 1] ? ", " : last_sep;
    int w = snprintf(buf + n, len - n, "%s%s", sep, list[i]);
    n += w > 0 ? (size_t)w : 0;
  }
  return buf;
}

int bd_opt_choice(const struct bd_open_opts *o, const char *format,
                  const char *key, const char *const *choices, unsigned *out) {
  const char *v = bd_opt_get(o, format, key);
  if (!v)
    return 0;
  for (unsigned i = 0; choices[i]; i++)
    if (!strcmp(v, choices[i])) {
      *out = i;
      return 0;
    }
  char what[128];
  return expected(format, key, v, listed(choices, " or ", what, sizeof what));
}

static bool knows(const struct bd_format *f, const char *entry, size_t n) {
  for (const char *const *k = f->option_keys; k && *k; k++)
    if (strlen(*k) == n && !strncmp(*k, entry, n))
      return true;
  return false;
}

int bd_opt_check(const struct bd_open_opts *o, const struct bd_format *f) {
  for (size_t i = 0; i < o->noptions; i++) {
    const char *e = o->options[i], *eq = strchr(e, '=');
    if (!eq || eq == e) {
      bd_set_error("%s: option '%s': expected KEY=VALUE", f->name, e);
      return -EINVAL;
    }
    size_t n = (size_t)(eq - e);
    if (knows(f, e, n) || (o->flags & BD_OPEN_LENIENT_OPTIONS))
      continue;
    char known[256];
    if (f->option_keys && f->option_keys[0])
      bd_set_error("%s: unknown option '%.*s' (known: %s)", f->name, (int)n, e,
                   listed(f->option_keys, ", ", known, sizeof known));
    else
      bd_set_error("%s: unknown option '%.*s' (%s takes none)", f->name, (int)n,
                   e, f->name);
    return -EINVAL;
  }
  return 0;
}
