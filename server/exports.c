/* SPDX-License-Identifier: BSD-3-Clause */
/* Export sets and the devices they share: see exports.h. */
#include "exports.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "core/log.h"
#include "core/open.h"
#include "metrics.h"
#include "nbd-protocol.h"
#include "server.h"

/* ---- devices ---- */

/* Identity of the image an export names: the file (device and inode) when
 * it is one, so two spellings of a path share one device; otherwise the
 * export's name and spec, so a memory: disk belongs to its export and
 * survives reloads that keep both. */
static void free_strv(char **v) {
  for (size_t i = 0; v && v[i]; i++)
    free(v[i]);
  free(v);
}

static char *device_key(const char *name, const char *spec) {
  struct stat st;
  char *k = NULL;
  int r;
  if (stat(spec, &st) == 0 && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)))
    r = asprintf(&k, "file:%ju:%ju", (uintmax_t)st.st_dev,
                 (uintmax_t)st.st_ino);
  else
    r = asprintf(&k, "spec:%s\n%s", name, spec);
  return r < 0 ? NULL : k;
}

/* C's option lines, '\n'-joined (an option value holds no newline), to
 * tell whether a device was opened with them; NULL when it has none or
 * out of memory (*OOM set). */
static char *joined_options(const struct export_conf *c, bool *oom) {
  size_t n = 0;
  for (size_t i = 0; i < c->noptions; i++)
    n += strlen(c->options[i]) + 1;
  char *s = n ? malloc(n) : NULL, *p = s;
  *oom = n && !s;
  for (size_t i = 0; s && i < c->noptions; i++) {
    size_t l = strlen(c->options[i]);
    memcpy(p, c->options[i], l);
    p[l] = i + 1 < c->noptions ? '\n' : '\0';
    p += l + 1;
  }
  return s;
}

static bool same_options(const struct device *d, const struct export_conf *c) {
  bool oom;
  char *j = joined_options(c, &oom);
  bool same = !oom && !strcmp(d->options ? d->options : "", j ? j : "");
  free(j);
  return same;
}

static struct device *device_find(struct server *srv, const char *key) {
  for (struct device *d = srv->devices; d; d = d->next)
    if (!strcmp(d->key, key))
      return d;
  return NULL;
}

/* Drop one user; the last closes (and so flushes) the image. */
static int device_put(struct server *srv, struct device *d) {
  pthread_mutex_lock(&srv->lock);
  bool last = --d->users == 0;
  if (last) {
    for (struct device **pp = &srv->devices; *pp; pp = &(*pp)->next) {
      if (*pp == d) {
        *pp = d->next;
        break;
      }
    }
  }
  pthread_mutex_unlock(&srv->lock);
  if (!last)
    return 0;
  int r = bd_close(d->bd);
  if (r < 0)
    log_error("%s: final flush failed: %s", d->spec, strerror(-r));
  else
    log_debug("closed %s", d->spec);
  struct device *base = d->base;
  free(d->key);
  free(d->spec);
  free(d->options);
  free(d);
  /* A view's image stays open until the view is closed. */
  if (base && device_put(srv, base) < 0)
    r = -1;
  return r < 0 ? -1 : 0;
}

/* ---- building a set ---- */

struct build {
  struct server *srv;
  const struct config *cf;
  const struct exports_opts *o;
  struct export_set *s;
  char **keys; /* device_key() of each cf->v[i] */
  char *err;
  size_t errlen;
  /* Idle devices being replaced by another opening of their image: their
   * image locks are dropped meanwhile, and taken back if the build fails. */
  struct device **replaced;
  size_t nreplaced;
  const struct bd_open_opts *open; /* NULL: the defaults */
};

__attribute__((format(printf, 3, 4))) static int
fail(struct build *b, const struct export_conf *c, const char *fmt, ...) {
  size_t used = 0;
  if (b->o->file && c->line)
    used = (size_t)snprintf(b->err, b->errlen, "%s:%u: ", b->o->file, c->line);
  if (used < b->errlen) {
    used += (size_t)snprintf(b->err + used, b->errlen - used,
                             "export '%.200s': ", c->name);
  }
  if (used < b->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err + used, b->errlen - used, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* A failure of the build as a whole (no export to name). */
static int fail_oom(struct build *b) {
  snprintf(b->err, b->errlen, "out of memory");
  return -1;
}

/* Whether any export of the configuration needs image KEY writable. */
static bool key_needs_rw(const struct build *b, const char *key) {
  if (b->o->readonly)
    return false;
  for (size_t i = 0; i < b->cf->n; i++)
    if (!b->cf->v[i].readonly && !strcmp(b->keys[i], key))
      return true;
  return false;
}

static char *bitmap_context(const char *bitmap) {
  size_t n = strlen(BD_CTX_BITMAP_PREFIX) + strlen(bitmap) + 1;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, BD_CTX_BITMAP_PREFIX "%s", bitmap);
  return s;
}

/* Whether BD offers every bitmap C exports. */
static bool offers_bitmaps(const struct bd *bd, const struct export_conf *c) {
  for (size_t i = 0; i < c->nbitmaps; i++) {
    char *name = bitmap_context(c->bitmaps[i]);
    bool ok = name && bd_context_find(bd, name);
    free(name);
    if (!ok)
      return false;
  }
  return true;
}

/* Add context NAME (taken) to V (N so far) unless it is there. */
static int add_unique(char **v, size_t *n, char *name) {
  if (!name)
    return -ENOMEM;
  for (size_t k = 0; k < *n; k++)
    if (!strcmp(v[k], name)) {
      free(name);
      return 0;
    }
  if (*n == BD_MAX_CONTEXTS) {
    free(name);
    return -E2BIG;
  }
  v[(*n)++] = name;
  return 0;
}

/* The contexts image KEY is opened with: every bitmap any export of the
 * configuration exports from it, once.  NULL-terminated in *OUT; returns
 * how many, or -errno. */
static int key_contexts(const struct build *b, const char *key, char ***out) {
  size_t n = 0;
  char **v = calloc(BD_MAX_CONTEXTS + 1, sizeof *v);
  int r = v ? 0 : -ENOMEM;
  for (size_t i = 0; r == 0 && i < b->cf->n; i++) {
    const struct export_conf *c = &b->cf->v[i];
    if (strcmp(b->keys[i], key) != 0)
      continue;
    for (size_t j = 0; r == 0 && j < c->nbitmaps; j++)
      r = add_unique(v, &n, bitmap_context(c->bitmaps[j]));
  }
  if (r < 0) {
    free_strv(v);
    return r;
  }
  *out = v;
  return (int)n;
}

/* A live device for C's image, with a user added, if it can serve C.  One
 * nobody is connected to may be replaced (the old one closes with the
 * configuration it belongs to), also to reopen it read-only when no
 * export needs it writable any more, so that its lock lets readers in;
 * one in use may not be opened again in a way that conflicts with it. */
static int reuse_device(struct build *b, const struct export_conf *c,
                        const char *key, const char *fmt, bool rw,
                        struct device **out, struct device **replace) {
  struct server *srv = b->srv;
  pthread_mutex_lock(&srv->lock);
  struct device *d = device_find(srv, key);
  enum bd_cache mode = c->has_cache ? c->cache
                       : b->open    ? b->open->cache
                                    : BD_CACHE_WRITEBACK;
  enum bd_aio aio = c->has_aio ? c->aio
                    : b->open  ? b->open->aio
                               : BD_AIO_DEFAULT;
  /* Another format, cache or I/O mode is another opening of the image. */
  bool other_fmt = d && ((fmt && strcmp(fmt, d->bd->format)) ||
                         mode != d->bd->cache || aio != d->bd->aio ||
                         !offers_bitmaps(d->bd, c) || !same_options(d, c));
  bool need_rw = d && rw && d->bd->caps.readonly;
  bool busy = d && d->conns > 0;
  bool downgrade = d && !rw && !d->bd->caps.readonly && !busy;
  bool keep = d && !other_fmt && !need_rw && !downgrade;
  if (keep)
    d->users++;
  pthread_mutex_unlock(&srv->lock);
  *out = keep ? d : NULL;
  *replace = d && !busy && !keep ? d : NULL;
  if (busy && other_fmt)
    return fail(b, c,
                "%s is open as %s with --cache %s (and its bitmaps) for "
                "connected clients",
                c->path, d->bd->format, bd_cache_name(d->bd->cache));
  if (busy && need_rw)
    return fail(b, c,
                "%s is open read-only for connected clients; it can be "
                "made writable once they disconnect",
                c->path);
  return 0;
}

/* The options C's source opens with: the command line's (O's) then C's
 * own, which win; O points to the result, to be freed after the
 * opening.  NULL when out of memory. */
static const char **merged_options(struct bd_open_opts *o,
                                   const struct export_conf *c) {
  const char **v = malloc((o->noptions + c->noptions) * sizeof *v);
  if (!v)
    return NULL;
  for (size_t i = 0; i < o->noptions; i++)
    v[i] = o->options[i];
  for (size_t i = 0; i < c->noptions; i++)
    v[o->noptions + i] = c->options[i];
  o->options = v;
  o->noptions += c->noptions;
  return v;
}

/* OLD's image is opened again: drop its locks, which would refuse the
 * new opening, until the build ends (see exports_build()). */
static bool remember_replaced(struct build *b, struct device *old) {
  struct device **v = realloc(b->replaced, (b->nreplaced + 1) * sizeof *v);
  if (!v)
    return false;
  b->replaced = v;
  v[b->nreplaced++] = old;
  bd_hold_locks(old->bd, false);
  return true;
}

/* --control: BD behind a live device that takes checkpoints; NULL (BD
 * closed) with bd_errmsg() when that fails. */
static struct bd *live_device(struct bd *bd, const struct ckpt_opts *o) {
  struct bd *live = ckpt_live_open(bd, o);
  if (!live) {
    char why[512]; /* bd_close() may set another message */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    bd_close(bd);
    bd_set_error("%s", why);
  }
  return live;
}

static int attach_device(struct build *b, size_t i, struct export *e) {
  const struct export_conf *c = &b->cf->v[i];
  const char *fmt = c->format ? c->format : b->o->format;
  bool rw = key_needs_rw(b, b->keys[i]);
  struct device *old;
  if (reuse_device(b, c, b->keys[i], fmt, rw, &e->dev, &old) < 0)
    return -1;
  if (e->dev)
    return 0;
  struct device *d = calloc(1, sizeof *d);
  if (!d)
    return fail(b, c, "out of memory");
  if (old && !remember_replaced(b, old)) {
    free(d);
    return fail(b, c, "out of memory");
  }
  struct bd_open_opts oo = BD_OPEN_OPTS_INIT;
  if (b->open)
    oo = *b->open;
  oo.format = fmt;
  if (c->has_cache)
    oo.cache = c->cache;
  if (c->has_aio)
    oo.aio = c->aio;
  /* Read-only, refusing resizes, as qemu-nbd -r's export (raw passes
   * that to its file; qcow2 refuses writers as well). */
  oo.flags = (rw ? 0 : BD_OPEN_READONLY | BD_OPEN_UNSHARE_RESIZE) |
             (b->o->share && !rw ? BD_OPEN_SHARE : 0) |
             (oo.flags & BD_OPEN_COPY_ON_READ);
  char **ctx = NULL;
  int nctx = key_contexts(b, b->keys[i], &ctx);
  if (nctx < 0) {
    free(d);
    return fail(b, c, "%s",
                nctx == -E2BIG ? "more than 16 bitmaps of one image"
                               : "out of memory");
  }
  oo.contexts = (const char *const *)ctx;
  oo.ncontexts = (size_t)nctx;
  /* The image's qcow2 cache and nbd:// connections count per export. */
  if (b->srv->metrics)
    oo.stats = metrics_export_sources(b->srv->metrics, c->name);
  const char **opts = NULL;
  bool oom = c->noptions && !(opts = merged_options(&oo, c));
  if (!oom)
    d->options = joined_options(c, &oom);
  if (oom) {
    free(opts);
    free_strv(ctx);
    free(d->options);
    free(d);
    return fail(b, c, "out of memory");
  }
  d->bd = bd_open_with(c->path, &oo);
  free(opts);
  free_strv(ctx);
  if (d->bd && rw && b->srv->checkpoints)
    d->bd = live_device(d->bd, &b->srv->ckpt);
  d->key = strdup(b->keys[i]);
  d->spec = strdup(c->path);
  if (!d->bd || !d->key || !d->spec) {
    fail(b, c, "%s", d->bd ? "out of memory" : bd_errmsg());
    if (d->bd)
      bd_close(d->bd);
    free(d->key);
    free(d->spec);
    free(d->options);
    free(d);
    return -1;
  }
  d->users = 1;
  pthread_mutex_lock(&b->srv->lock);
  d->next = b->srv->devices;
  b->srv->devices = d;
  pthread_mutex_unlock(&b->srv->lock);
  e->dev = d;
  log_info("export '%s': %s %s, %" PRIu64 " bytes%s", c->name, d->bd->format,
           b->o->plugin ? "plugin" : c->path, d->bd->size,
           d->bd->caps.readonly ? ", read-only" : "");
  return 0;
}

/* What the handshake tells clients about export E: what its device can
 * do (an nbdkit plugin may lack flush, FUA or trim). */

/* The minimum block clients are told.  A device the core aligns for
 * (direct I/O) takes any range, but a client honouring the minimum does
 * its own read-modify-write, which is cheaper; only an export whose size
 * is not a multiple of it says 1, since a client aligning its last block
 * would ask past the end (QEMU 7.2 does). */
static uint32_t advertised_min(const struct bd *bd) {
  uint32_t m = bd->caps.min_block ? bd->caps.min_block : 1;
  if (bd->caps.aligned_only && bd->size % m != 0)
    return 1;
  return m;
}

/* E's own contexts: C's bitmaps, by their number on E's device. */
static int map_contexts(struct export *e, const struct export_conf *c) {
  if (!c->nbitmaps)
    return 0;
  e->ctx_names = calloc(c->nbitmaps, sizeof *e->ctx_names);
  e->ctx_map = calloc(c->nbitmaps, sizeof *e->ctx_map);
  if (!e->ctx_names || !e->ctx_map)
    return -1;
  for (size_t i = 0; i < c->nbitmaps; i++) {
    if (!(e->ctx_names[i] = bitmap_context(c->bitmaps[i])))
      return -1;
    e->nctx = i + 1; /* freed with the export from here on */
    e->ctx_map[i] = bd_context_find(e->dev->bd, e->ctx_names[i]);
  }
  return 0;
}

static struct hs_export hs_export_of(const struct export *e) {
  const struct bd *bd = e->dev->bd;
  const struct bd_caps *cp = &bd->caps;
  uint16_t f = cp->can_flush ? NBD_FLAG_SEND_FLUSH : 0;
  if (cp->readonly || e->readonly)
    f |= NBD_FLAG_READ_ONLY;
  else
    f |= (cp->can_fua ? NBD_FLAG_SEND_FUA : 0) |
         (cp->can_trim ? NBD_FLAG_SEND_TRIM : 0) | NBD_FLAG_SEND_WRITE_ZEROES |
         (cp->can_fast_zero ? NBD_FLAG_SEND_FAST_ZERO : 0);
  if (cp->multi_conn)
    f |= NBD_FLAG_CAN_MULTI_CONN;
  if (cp->can_cache)
    f |= NBD_FLAG_SEND_CACHE;
  return (struct hs_export){
      .name = e->name,
      /* One given (--description, the config), else what the source
       * says of itself: never the device's description, which names the
       * server's file (a client has no business seeing it). */
      .description = e->description           ? e->description
                     : bd->export_description ? bd->export_description
                                              : "",
      .size = bd->size,
      .tflags = f,
      .min_block = advertised_min(bd),
      .pref_block = cp->pref_block,
      .max_block = cp->max_block,
      .tls_required = e->tls_required,
      .contexts = (const char *const *)e->ctx_names,
      .ncontexts = e->nctx,
  };
}

static int copy_allow(struct export *e, const struct export_conf *c) {
  if (!c->nallow)
    return 0;
  e->allow = malloc(c->nallow * sizeof *e->allow);
  if (!e->allow)
    return -1;
  memcpy(e->allow, c->allow, c->nallow * sizeof *e->allow);
  e->nallow = c->nallow;
  return 0;
}

static int add_export(struct build *b, size_t i) {
  const struct export_conf *c = &b->cf->v[i];
  struct export_set *s = b->s;
  struct export *e = &s->v[s->n];
  *e = (struct export){.readonly = b->o->readonly || c->readonly,
                       .tls_required = c->tls_required};
  e->name = strdup(c->name);
  e->description = c->description ? strdup(c->description) : NULL;
  if (!e->name || (c->description && !e->description) || copy_allow(e, c) < 0)
    return fail(b, c, "out of memory");
  s->n++; /* from here on, freeing the set frees it */
  if (attach_device(b, i, e) < 0)
    return -1;
  if (map_contexts(e, c) < 0)
    return fail(b, c, "out of memory");
  s->hs[s->n - 1] = hs_export_of(e);
  return 0;
}

/* An nbdkit plugin's other exports (list_exports): more names on the one
 * device, each connection opening the plugin with its name.  The default
 * export "" stays reachable, but is listed only if the plugin lists it. */
static int add_listed(struct build *b) {
  struct export_set *s = b->s;
  const struct export_conf *c0 = &b->cf->v[0];
  int r = bd_list_exports(s->v[0].dev->bd, b->o->readonly, &s->listed);
  if (r == -ENOTSUP)
    return 0;
  if (r < 0)
    return fail(b, c0, "%s", bd_errmsg());
  size_t n = s->n + s->listed.n;
  struct export *ev = realloc(s->v, n * sizeof *ev);
  if (ev)
    s->v = ev;
  struct hs_export *hv = ev ? realloc(s->hs, n * sizeof *hv) : NULL;
  if (!hv)
    return fail(b, c0, "out of memory");
  s->hs = hv;
  bool listed_default = false;
  for (size_t i = 0; i < s->listed.n; i++) {
    const struct bd_export *l = &s->listed.v[i];
    if (!*l->name) {
      listed_default = true;
      continue;
    }
    struct export *e = &s->v[s->n];
    *e = (struct export){.name = strdup(l->name),
                         .readonly = s->v[0].readonly,
                         .dev = s->v[0].dev};
    if (!e->name)
      return fail(b, c0, "out of memory");
    pthread_mutex_lock(&b->srv->lock);
    e->dev->users++;
    pthread_mutex_unlock(&b->srv->lock);
    s->hs[s->n++] = hs_export_of(e);
    if (l->description)
      s->hs[s->n - 1].description = l->description;
  }
  s->hs[0].unlisted = !listed_default;
  return 0;
}

/* The views of SRV (checkpoints.c), read-only exports after the others. */
static int add_views(struct build *b) {
  struct export_set *s = b->s;
  pthread_mutex_lock(&b->srv->lock);
  size_t nv = 0;
  for (struct view *v = b->srv->views; v; v = v->next)
    nv++;
  struct export *ev = nv ? realloc(s->v, (s->n + nv) * sizeof *ev) : s->v;
  if (ev)
    s->v = ev;
  struct hs_export *hv = !ev  ? NULL
                         : nv ? realloc(s->hs, (s->n + nv) * sizeof *hv)
                              : s->hs;
  if (hv)
    s->hs = hv;
  for (struct view *v = b->srv->views; hv && v; v = v->next) {
    struct export *e = &s->v[s->n];
    *e = (struct export){.name = strdup(v->name), .readonly = true};
    e->ctx_names = calloc(v->nctx ? v->nctx : 1, sizeof *e->ctx_names);
    e->ctx_map = calloc(v->nctx ? v->nctx : 1, sizeof *e->ctx_map);
    if (!e->name || !e->ctx_names || !e->ctx_map) {
      free(e->name);
      free(e->ctx_names);
      free(e->ctx_map);
      hv = NULL;
      break;
    }
    e->dev = v->dev;
    v->dev->users++;
    s->n++; /* from here on, freeing the set frees it */
    for (size_t i = 0; i < v->nctx; i++) {
      if (!(e->ctx_names[i] = strdup(v->ctx_names[i]))) {
        hv = NULL;
        break;
      }
      e->nctx = i + 1;
      e->ctx_map[i] = (unsigned)i + 1; /* the view offers them in order */
    }
    s->hs[s->n - 1] = hs_export_of(e);
  }
  pthread_mutex_unlock(&b->srv->lock);
  return hv ? 0 : fail_oom(b);
}

static void free_view(struct view *v) {
  for (size_t i = 0; i < v->nctx; i++)
    free(v->ctx_names[i]);
  free(v->ctx_names);
  free(v->name);
  free(v);
}

int exports_add_view(struct server *srv, const char *name, struct bd *view_bd,
                     struct device *base, const char *const *ctx, size_t nctx) {
  struct view *v = calloc(1, sizeof *v);
  struct device *d = calloc(1, sizeof *d);
  bool ok = v && d && (v->name = strdup(name)) &&
            (v->ctx_names = calloc(nctx ? nctx : 1, sizeof *v->ctx_names)) &&
            (d->key = strdup("view:")) && (d->spec = strdup(name));
  for (size_t i = 0; ok && i < nctx; i++)
    ok = (v->ctx_names[v->nctx++] = strdup(ctx[i])) != NULL;
  if (!ok) {
    if (v)
      free_view(v);
    if (d) {
      free(d->key);
      free(d->spec);
    }
    free(d);
    bd_close(view_bd);
    return -ENOMEM;
  }
  d->bd = view_bd;
  d->users = 1; /* the view list's */
  d->base = base;
  v->dev = d;
  pthread_mutex_lock(&srv->lock);
  if (base)
    base->users++;
  d->next = srv->devices;
  srv->devices = d;
  v->next = srv->views;
  srv->views = v;
  pthread_mutex_unlock(&srv->lock);
  return 0;
}

struct view *exports_view_find(struct server *srv, const char *name) {
  for (struct view *v = srv->views; v; v = v->next)
    if (!strcmp(v->name, name))
      return v;
  return NULL;
}

int exports_remove_view(struct server *srv, const char *name) {
  pthread_mutex_lock(&srv->lock);
  struct view **pp = &srv->views;
  while (*pp && strcmp((*pp)->name, name))
    pp = &(*pp)->next;
  struct view *v = *pp;
  if (v)
    *pp = v->next;
  pthread_mutex_unlock(&srv->lock);
  if (!v)
    return -ENOENT;
  device_put(srv, v->dev);
  free_view(v);
  return 0;
}

void exports_remove_views(struct server *srv) {
  for (;;) {
    pthread_mutex_lock(&srv->lock);
    struct view *v = srv->views;
    if (v)
      srv->views = v->next;
    pthread_mutex_unlock(&srv->lock);
    if (!v)
      return;
    device_put(srv, v->dev);
    free_view(v);
  }
}

static int set_free(struct server *srv, struct export_set *s) {
  int ret = 0;
  for (size_t i = 0; i < s->n; i++) {
    struct export *e = &s->v[i];
    if (e->dev && device_put(srv, e->dev) < 0)
      ret = -1;
    free(e->name);
    free(e->description);
    free(e->allow);
    for (size_t j = 0; j < e->nctx; j++)
      free(e->ctx_names[j]);
    free(e->ctx_names);
    free(e->ctx_map);
  }
  free(s->v);
  free(s->hs);
  bd_export_list_free(&s->listed);
  free(s);
  return ret;
}

/* The order of the catalog: the default export first (it is v[0]). */
static size_t *export_order(const struct config *cf, bool *has_default) {
  size_t *order = malloc((cf->n ? cf->n : 1) * sizeof *order), def = 0, k = 0;
  *has_default = false;
  if (!order || !cf->n)
    return order;
  for (size_t i = 0; i < cf->n && !*has_default; i++)
    if (cf->v[i].is_default) {
      def = i;
      *has_default = true;
    }
  order[k++] = def;
  for (size_t i = 0; i < cf->n; i++)
    if (i != def)
      order[k++] = i;
  return order;
}

/* --readonly-export: the exports each name means refuse writes, at the
 * protocol (an nbdkit plugin's listed exports share one writable device).
 * A name that means none fails the build. */
static int apply_ro_names(struct build *b, bool has_default) {
  struct export_set *s = b->s;
  for (size_t k = 0; k < b->o->n_ro_names; k++) {
    const char *name = b->o->ro_names[k];
    bool found = false;
    for (size_t i = 0; i < s->n; i++) {
      bool alias = !*name && i == 0 && has_default;
      if (!alias && strcmp(s->v[i].name, name))
        continue;
      found = true;
      s->v[i].readonly = true;
      s->hs[i].tflags = hs_export_of(&s->v[i]).tflags;
    }
    if (!found) {
      snprintf(b->err, b->errlen, "--readonly-export '%.200s': no %s", name,
               *name ? "such export" : "default export");
      return -1;
    }
  }
  return 0;
}

static int build_all(struct build *b) {
  const struct config *cf = b->cf;
  bool has_default = false;
  size_t *order = export_order(cf, &has_default);
  size_t n = cf->n ? cf->n : 1; /* a view server's set: views only */
  b->keys = calloc(n, sizeof *b->keys);
  b->s->v = calloc(n, sizeof *b->s->v);
  b->s->hs = calloc(n, sizeof *b->s->hs);
  int r = order && b->keys && b->s->v && b->s->hs ? 0 : -1;
  for (size_t i = 0; r == 0 && i < cf->n; i++)
    if (!(b->keys[i] = device_key(cf->v[i].name, cf->v[i].path)))
      r = -1;
  if (r < 0)
    fail_oom(b);
  for (size_t k = 0; r == 0 && k < cf->n; k++)
    r = add_export(b, order[k]);
  if (r == 0 && b->o->plugin)
    r = add_listed(b);
  if (r == 0)
    r = apply_ro_names(b, has_default);
  if (r == 0)
    r = add_views(b);
  b->s->catalog = (struct hs_catalog){
      .v = b->s->hs, .n = b->s->n, .no_default = !has_default};
  for (size_t i = 0; b->keys && i < cf->n; i++)
    free(b->keys[i]);
  free(b->keys);
  free(order);
  return r;
}

struct export_set *exports_build(struct server *srv, const struct config *cf,
                                 const struct exports_opts *o, char *err,
                                 size_t errlen,
                                 const struct bd_open_opts *open) {
  struct export_set *s = calloc(1, sizeof *s);
  struct build b = {srv, cf, o, s, NULL, err, errlen, NULL, 0, open};
  if (!s || (cf->n == 0 && !srv->views_only)) {
    snprintf(err, errlen, "%s", s ? "no exports" : "out of memory");
    free(s);
    return NULL;
  }
  s->refs = 1;
  int r = build_all(&b);
  if (r < 0)
    set_free(srv, s); /* closes the new openings, dropping their locks */
  for (size_t i = 0; r < 0 && i < b.nreplaced; i++)
    bd_hold_locks(b.replaced[i]->bd, true);
  free(b.replaced);
  return r < 0 ? NULL : s;
}

/* ---- the current set ---- */

/* --metrics: counters for S's exports (kept, by name, across reloads). */
static void attach_metrics(struct server *srv, struct export_set *s) {
  if (!srv->metrics)
    return;
  metrics_exports_retire(srv->metrics);
  for (size_t i = 0; i < s->n; i++)
    s->v[i].mx = metrics_export_get(srv->metrics, s->v[i].name, s->hs[i].size);
}

void exports_install(struct server *srv, struct export_set *s) {
  attach_metrics(srv, s); /* before any connection can see S */
  pthread_mutex_lock(&srv->lock);
  struct export_set *old = srv->current;
  s->generation = ++srv->generation;
  srv->current = s;
  pthread_mutex_unlock(&srv->lock);
  if (old)
    exports_put(srv, old);
}

struct export_set *exports_get(struct server *srv) {
  pthread_mutex_lock(&srv->lock);
  struct export_set *s = srv->current;
  if (s)
    s->refs++;
  pthread_mutex_unlock(&srv->lock);
  return s;
}

struct export_set *exports_refresh(struct server *srv, struct export_set **s) {
  struct export_set *old = NULL;
  pthread_mutex_lock(&srv->lock);
  if (srv->current && srv->current != *s) {
    old = *s;
    *s = srv->current;
    (*s)->refs++;
  }
  pthread_mutex_unlock(&srv->lock);
  return old;
}

int exports_put(struct server *srv, struct export_set *s) {
  if (!s)
    return 0;
  pthread_mutex_lock(&srv->lock);
  bool last = --s->refs == 0;
  pthread_mutex_unlock(&srv->lock);
  return last ? set_free(srv, s) : 0;
}

void exports_conn_begin(struct server *srv, struct export *e) {
  pthread_mutex_lock(&srv->lock);
  e->dev->conns++;
  pthread_mutex_unlock(&srv->lock);
}

void exports_conn_end(struct server *srv, struct export *e) {
  pthread_mutex_lock(&srv->lock);
  e->dev->conns--;
  pthread_mutex_unlock(&srv->lock);
}

int exports_find(const struct export_set *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->v[i].name, name))
      return (int)i;
  return -1;
}
