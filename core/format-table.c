/* SPDX-License-Identifier: BSD-3-Clause */
/* The installed table of formats: which entry opens a spec, what the
 * probe finds, which names --format takes (format-table.h, open.h).  The
 * core knows no format by name: every answer comes from the table. */
#include "format-table.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "blockdev.h"

static const struct bd_format *const *formats;

void bd_formats_install(const struct bd_format *const *table) {
  formats = table;
}

bool bd_formats_installed(void) {
  return formats != NULL;
}

static const struct bd_format *format_matching(const char *spec) {
  for (const struct bd_format *const *f = formats; f && *f; f++)
    if ((*f)->matches && (*f)->matches(spec))
      return *f;
  return NULL;
}

bool bd_spec_is_backing_source(const char *spec) {
  const struct bd_format *f = format_matching(spec);
  return f && f->backing;
}

static const struct bd_format *format_probing(void) {
  for (const struct bd_format *const *f = formats; f && *f; f++)
    if ((*f)->probe)
      return *f;
  return NULL;
}

static const struct bd_format *format_fallback(void) {
  for (const struct bd_format *const *f = formats; f && *f; f++)
    if ((*f)->probe_fallback)
      return *f;
  return NULL;
}

static const struct bd_format *format_named(const char *name) {
  for (const struct bd_format *const *f = formats; f && *f; f++)
    if (!strcmp((*f)->name, name))
      return *f;
  return NULL;
}

const char *bd_probe_format(const char *path) {
  const struct bd_format *p = format_probing(), *fb = format_fallback();
  const char *fmt = NULL;
  int r = p ? p->probe(path, &fmt) : -ENOTSUP;
  if ((r == 0 || r == -ENOTSUP) && fmt)
    return fmt;
  return fb ? fb->name : NULL;
}

const char *bd_format_names(char *buf, size_t len) {
  size_t n = 0;
  if (len)
    buf[0] = '\0';
  for (const struct bd_format *const *f = formats; f && *f && n < len; f++) {
    if ((*f)->matches)
      continue;
    int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", (*f)->name);
    n += w > 0 ? (size_t)w : 0;
  }
  return buf;
}

/* A name no entry has, or one of a source a spec names by itself. */
static void unknown_format(const char *name, const struct bd_format *f) {
  char known[256];
  if (f && f->usage)
    bd_set_error("format '%s' takes %s", name, f->usage);
  else
    bd_set_error("unknown format '%s' (known: %s)", name,
                 bd_format_names(known, sizeof known));
}

const struct bd_format *bd_format_for(const char *spec,
                                      struct bd_open_opts *o) {
  const struct bd_format *m = format_matching(spec);
  if (m)
    return m;
  const char *name = o->format;
  if (!name) {
    const struct bd_format *p = format_probing();
    if (!p) {
      bd_set_error("%s: no format given, and none can probe it", spec);
      return NULL;
    }
    if (p->probe(spec, &name) < 0)
      return NULL;
    o->flags |= BD_OPEN_PROBED;
  }
  const struct bd_format *f = format_named(name);
  if (f && !f->matches)
    return f;
  unknown_format(name, f);
  return NULL;
}
