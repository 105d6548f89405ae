/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit plugins as a source: an unmodified nbdkit plugin (.so) loaded and
 * driven the way nbdkit drives it (see nbdkit-plugin(3)).
 *
 * Lifecycle: dlopen, plugin_init, debug flags, load, config per key=value,
 * config_complete, thread_model, get_ready, after_fork; then a probe handle
 * (open, get_size, the can_* queries, close) fixes what the device
 * advertises.  Each connection of a front end opens its own handle
 * (preconnect, open, get_size and can_write as nbdkit asks them), and the
 * core serialises requests as the plugin's thread model asks (see
 * enum bd_concurrency).  Calls run on the worker pool.  cleanup, unload and
 * dlclose when the device closes.  One plugin per process, as in nbdkit.
 *
 * Errors: a callback's nbdkit_error() message becomes the request's
 * message (bd_set_error), its errno the one from nbdkit_set_error(), else
 * errno if the plugin preserves it, else EIO. */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/source.h"
#include "formats.h"
#include "plugin.h"

#ifndef BLOCKPORT_NBDKIT_PLUGINDIR
#define BLOCKPORT_NBDKIT_PLUGINDIR "/usr/lib/x86_64-linux-gnu/nbdkit/plugins"
#endif

/* Largest count passed to a plugin call (counts are 32-bit there). */
#define PL_MAX_COUNT (1u << 30)
#define PL_MAX_EXPORTS 10000

_Thread_local struct pl_thread pl_thread;

struct plugin {
  void *dl;
  char *path;
  struct nbdkit_plugin p;  /* the plugin's struct, zero-extended */
  int api;                 /* 1 or 2 */
  int model;               /* NBDKIT_THREAD_MODEL_* */
  bool readonly;           /* forced read-only by the user */
  int cache_mode;          /* NBDKIT_CACHE_*, from the first handle */
  _Atomic uint64_t ema_ns; /* moving average of read and write times */
  char **strings;          /* config keys and values: live until unload */
  size_t nstrings;
  pthread_mutex_t lock; /* guards interns */
  char **interns;
  size_t ninterns;
};

static struct plugin *the_plugin; /* one per process */

const char *pl_name(void) {
  return the_plugin && the_plugin->p.name ? the_plugin->p.name : "plugin";
}

void pl_report_error(const char *msg) {
  pl_thread.msg_set = true;
  bd_set_error("%s", msg);
  /* A request's error is logged with its reply; others now, as nbdkit
   * does. */
  if (!pl_thread.in_data)
    log_error("%s: %s", pl_name(), msg);
}

void pl_report_debug(const char *msg) {
  log_debug("%s: debug: %s", pl_name(), msg);
}

/* ---- lists the nbdkit_* functions fill ---- */

int pl_extents_init(struct nbdkit_extents *e, uint64_t start, uint64_t end) {
  *e = (struct nbdkit_extents){.start = start, .end = end};
  return 0;
}

void pl_extents_fini(struct nbdkit_extents *e) {
  free(e->v);
  e->v = NULL;
  e->n = e->cap = 0;
}

static int extents_push(struct nbdkit_extents *e, uint64_t offset,
                        uint64_t length, uint32_t type) {
  if (e->n > 0 && e->v[e->n - 1].type == type) {
    e->v[e->n - 1].length += length;
    return 0;
  }
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 16;
    struct pl_extent *v = realloc(e->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = (struct pl_extent){offset, length, type};
  return 0;
}

/* nbdkit_add_extent's rules: ascending and contiguous; what lies before
 * start or from end on is dropped; the first kept extent must cover
 * start.  Returns 0 or -errno with a message in *why. */
int pl_extents_add(struct nbdkit_extents *e, uint64_t offset, uint64_t length,
                   uint32_t type) {
  if (e->any && offset != e->next)
    return -ERANGE;
  if (offset + length < offset)
    return -EOVERFLOW;
  e->any = true;
  e->next = offset + length;
  if (length == 0 || offset >= e->end)
    return 0;
  if (offset + length > e->end)
    length = e->end - offset;
  if (e->n == 0) {
    if (offset + length <= e->start)
      return 0;
    if (offset > e->start)
      return -EINVAL;
    length -= e->start - offset;
    offset = e->start;
  }
  return extents_push(e, offset, length, type);
}

int pl_exports_add(struct nbdkit_exports *x, const char *name,
                   const char *description) {
  if (x->list->n >= PL_MAX_EXPORTS)
    return -EINVAL;
  return bd_export_list_add(x->list, name, description);
}

static int intern_push(char ***v, size_t *n, char *s) {
  char **nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!nv)
    return -ENOMEM;
  nv[(*n)++] = s;
  *v = nv;
  return 0;
}

const char *pl_intern(const char *str, size_t n) {
  char *s = strndup(str, n);
  struct pl_conn *c = pl_thread.conn;
  struct plugin *pl = the_plugin;
  if (!s)
    return NULL;
  int r;
  if (c) {
    pthread_mutex_lock(&c->lock);
    r = intern_push(&c->interns, &c->ninterns, s);
    pthread_mutex_unlock(&c->lock);
  } else if (pl) {
    pthread_mutex_lock(&pl->lock);
    r = intern_push(&pl->interns, &pl->ninterns, s);
    pthread_mutex_unlock(&pl->lock);
  } else {
    r = -EINVAL;
  }
  if (r < 0) {
    free(s);
    return NULL;
  }
  return s;
}

static void free_strings(char **v, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

/* ---- calling the plugin ---- */

/* Before a callback: no error recorded yet, on connection C. */
static void call_begin(struct pl_conn *c, bool in_data) {
  pl_thread = (struct pl_thread){.conn = c, .in_data = in_data};
  errno = 0;
}

/* After a failed callback: the errno to report, and a message if the
 * plugin gave none. */
static int call_failed(const struct plugin *pl, const char *what) {
  int e = errno;
  if (pl_thread.err > 0)
    e = pl_thread.err;
  else if (!pl->p.errno_is_preserved || e <= 0)
    e = EIO;
  if (!pl_thread.msg_set)
    bd_set_error("%s: %s failed: %s", pl->p.name, what, strerror(e));
  return -e;
}

static void call_end(void) {
  pl_thread = (struct pl_thread){0};
}

static struct pl_conn *cur(void) {
  return bd_conn_current();
}

/* ---- operations ---- */

/* Reads and writes of a PARALLEL plugin run in the submitting thread
 * (try_nowait) while its calls stay quick, as those of memory, null or
 * pattern do: a hand-off to a worker costs more than the call.  The
 * moving average of call times decides, starting high so that the first
 * calls go to the pool; a plugin whose calls block (curl, ssh, a file on
 * a disk) soon stays on the pool.  Only small requests count: a large
 * copy is slow in any plugin, and goes to the pool. */
#define INLINE_MAX_NS 20000
#define INLINE_MAX_LEN (64 * 1024) /* larger requests: the pool, untimed */
#define EMA_START_NS 1000000

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void record_time(struct plugin *pl, uint64_t len, uint64_t start) {
  if (len > INLINE_MAX_LEN)
    return;
  uint64_t dt = now_ns() - start;
  uint64_t ema = atomic_load_explicit(&pl->ema_ns, memory_order_relaxed);
  ema = ema - ema / 8 + dt / 8; /* racy updates only blur the average */
  atomic_store_explicit(&pl->ema_ns, ema, memory_order_relaxed);
}

static int do_pread(struct bd *bd, struct pl_conn *c, void *buf, uint64_t len,
                    uint64_t off) {
  struct plugin *pl = bd->priv;
  uint64_t start = now_ns();
  call_begin(c, true);
  int r = pl->api == 1 ? pl->p._pread_v1(c->handle, buf, (uint32_t)len, off)
                       : pl->p.pread(c->handle, buf, (uint32_t)len, off, 0);
  r = r < 0 ? call_failed(pl, "pread") : 0;
  call_end();
  record_time(pl, len, start);
  return r;
}

static int do_pwrite(struct bd *bd, struct pl_conn *c, const void *buf,
                     uint64_t len, uint64_t off, uint32_t flags) {
  struct plugin *pl = bd->priv;
  bool fua = (flags & BD_F_FUA) && bd->caps.native_fua;
  uint64_t start = now_ns();
  call_begin(c, true);
  int r = pl->api == 1 ? pl->p._pwrite_v1(c->handle, buf, (uint32_t)len, off)
                       : pl->p.pwrite(c->handle, buf, (uint32_t)len, off,
                                      fua ? NBDKIT_FLAG_FUA : 0);
  r = r < 0 ? call_failed(pl, "pwrite") : 0;
  call_end();
  record_time(pl, len, start);
  return r;
}

static int pl_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  return do_pread(bd, cur(), buf, len, off);
}

static int pl_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                     uint32_t flags) {
  return do_pwrite(bd, cur(), buf, len, off, flags);
}

/* The core offers only reads and writes without FUA of PARALLEL devices. */
static int pl_try_nowait(struct bd *bd, struct bd_req *req) {
  struct plugin *pl = bd->priv;
  if (!req->conn || req->length > INLINE_MAX_LEN ||
      atomic_load_explicit(&pl->ema_ns, memory_order_relaxed) > INLINE_MAX_NS)
    return -EAGAIN;
  struct pl_conn *c = req->conn->priv;
  if (req->cmd == BD_READ)
    return do_pread(bd, c, req->buf, req->length, req->offset);
  return do_pwrite(bd, c, req->buf, req->length, req->offset, req->flags);
}

static int pl_flush(struct bd *bd) {
  struct plugin *pl = bd->priv;
  struct pl_conn *c = cur();
  bool has = pl->api == 1 ? pl->p._flush_v1 != NULL : pl->p.flush != NULL;
  if (!has || !c)
    return 0;
  call_begin(c, true);
  int r = pl->api == 1 ? pl->p._flush_v1(c->handle) : pl->p.flush(c->handle, 0);
  r = r < 0 ? call_failed(pl, "flush") : 0;
  call_end();
  return r;
}

/* Trim, zero and cache take 32-bit counts: split longer ranges. */
typedef int piece_fn(struct plugin *pl, struct pl_conn *c, uint32_t count,
                     uint64_t off, uint32_t flags);

static int in_pieces(struct bd *bd, piece_fn *fn, uint64_t len, uint64_t off,
                     uint32_t flags) {
  struct plugin *pl = bd->priv;
  struct pl_conn *c = cur();
  int r = 0;
  call_begin(c, true);
  while (len > 0 && r == 0) {
    uint32_t n = len < PL_MAX_COUNT ? (uint32_t)len : PL_MAX_COUNT;
    r = fn(pl, c, n, off, flags);
    off += n;
    len -= n;
  }
  call_end();
  return r;
}

static int trim_piece(struct plugin *pl, struct pl_conn *c, uint32_t count,
                      uint64_t off, uint32_t flags) {
  int r = pl->api == 1 ? pl->p._trim_v1(c->handle, count, off)
                       : pl->p.trim(c->handle, count, off, flags);
  return r < 0 ? call_failed(pl, "trim") : 0;
}

static int pl_trim(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  if (!bd->caps.can_trim)
    return 0; /* advisory */
  uint32_t f = (flags & BD_F_FUA) && bd->caps.native_fua ? NBDKIT_FLAG_FUA : 0;
  return in_pieces(bd, trim_piece, len, off, f);
}

static int zero_piece(struct plugin *pl, struct pl_conn *c, uint32_t count,
                      uint64_t off, uint32_t flags) {
  int r = pl->api == 1 ? pl->p._zero_v1(c->handle, count, off,
                                        !!(flags & NBDKIT_FLAG_MAY_TRIM))
                       : pl->p.zero(c->handle, count, off, flags);
  return r < 0 ? call_failed(pl, "zero") : 0;
}

/* -ENOTSUP lets the core fall back to writing zeroes, as nbdkit does when
 * .zero is absent, disabled by can_zero, or fails with ENOTSUP. */
static int pl_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  struct plugin *pl = bd->priv;
  bool fast = flags & BD_F_FAST_ZERO;
  bool has = pl->api == 1 ? pl->p._zero_v1 != NULL : pl->p.zero != NULL;
  if (!has || !bd->caps.can_zero || (fast && pl->api == 1)) {
    bd_set_error("%s: cannot zero without writing", pl->p.name);
    return -ENOTSUP;
  }
  uint32_t f =
      ((flags & BD_F_MAY_TRIM) ? NBDKIT_FLAG_MAY_TRIM : 0) |
      (fast ? NBDKIT_FLAG_FAST_ZERO : 0) |
      ((flags & BD_F_FUA) && bd->caps.native_fua ? NBDKIT_FLAG_FUA : 0);
  return in_pieces(bd, zero_piece, len, off, f);
}

static int cache_piece(struct plugin *pl, struct pl_conn *c, uint32_t count,
                       uint64_t off, uint32_t flags) {
  int r = pl->p.cache(c->handle, count, off, flags);
  return r < 0 ? call_failed(pl, "cache") : 0;
}

/* NBDKIT_CACHE_EMULATE: read and drop. */
static int cache_by_reading(struct bd *bd, uint64_t len, uint64_t off) {
  size_t chunk = len < 1024 * 1024 ? (size_t)len : 1024 * 1024;
  void *buf = malloc(chunk);
  if (!buf)
    return -ENOMEM;
  int r = 0;
  while (len > 0 && r == 0) {
    size_t n = len < chunk ? (size_t)len : chunk;
    r = pl_pread(bd, buf, n, off);
    off += n;
    len -= n;
  }
  free(buf);
  return r;
}

static int pl_cache(struct bd *bd, uint64_t len, uint64_t off) {
  struct plugin *pl = bd->priv;
  if (pl->cache_mode == NBDKIT_CACHE_EMULATE)
    return cache_by_reading(bd, len, off);
  if (pl->cache_mode != NBDKIT_CACHE_NATIVE || pl->api == 1 || !pl->p.cache)
    return 0;
  return in_pieces(bd, cache_piece, len, off, 0);
}

static uint32_t extent_flags(uint32_t type) {
  return ((type & NBDKIT_EXTENT_HOLE) ? BD_EXT_HOLE : 0) |
         ((type & NBDKIT_EXTENT_ZERO) ? BD_EXT_ZERO : 0);
}

static int copy_extents(const struct nbdkit_extents *e, uint32_t flags,
                        struct bd_extents *ext) {
  for (size_t i = 0; i < e->n; i++) {
    uint32_t f = extent_flags(e->v[i].type);
    int r = bd_extents_add(ext, e->v[i].length, f, (f & BD_EXT_HOLE) ? 0 : 1);
    if (r < 0)
      return r;
    if (r > 0 || ((flags & BD_F_REQ_ONE) && ext->n > 0))
      break;
  }
  return 0;
}

static int pl_extents(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags,
                      struct bd_extents *ext) {
  struct plugin *pl = bd->priv;
  struct pl_conn *c = cur();
  uint32_t count = len < PL_MAX_COUNT ? (uint32_t)len : PL_MAX_COUNT;
  struct nbdkit_extents e;
  pl_extents_init(&e, off, off + count);
  call_begin(c, true);
  int r = pl->p.extents(c->handle, count, off,
                        (flags & BD_F_REQ_ONE) ? NBDKIT_FLAG_REQ_ONE : 0, &e);
  if (r < 0) {
    r = call_failed(pl, "extents");
  } else if (e.n == 0) {
    bd_set_error("%s: extents: no extent for offset %llu", pl->p.name,
                 (unsigned long long)off);
    r = -EINVAL;
  }
  call_end();
  if (r == 0)
    r = copy_extents(&e, flags, ext);
  pl_extents_fini(&e);
  return r;
}

/* ---- queries, per handle ---- */

/* A can_* query: the callback's answer, or DEFAULT without one; -1 on
 * error. */
static int ask(int (*fn)(void *), void *handle, int dflt) {
  return fn ? fn(handle) : dflt;
}

static int cache_mode(struct plugin *pl, void *handle) {
  bool has_cache = pl->api == 2 && pl->p.cache;
  return ask(pl->p.can_cache, handle,
             has_cache ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE);
}

static int fua_mode(struct plugin *pl, void *handle) {
  bool has_flush = pl->api == 1 ? pl->p._flush_v1 != NULL : pl->p.flush != NULL;
  int mode = ask(pl->p.can_fua, handle,
                 has_flush ? NBDKIT_FUA_EMULATE : NBDKIT_FUA_NONE);
  /* Version 1 write callbacks take no flags. */
  if (pl->api == 1 && mode == NBDKIT_FUA_NATIVE)
    mode = NBDKIT_FUA_EMULATE;
  return mode;
}

struct pl_query {
  int64_t size;
  struct bd_caps caps;
  int cache_mode;
};

#define ASK(field, fn, dflt)                                                   \
  do {                                                                         \
    int v_ = ask(p->fn, h, dflt);                                              \
    if (v_ < 0)                                                                \
      return #fn;                                                              \
    (field) = v_ > 0;                                                          \
  } while (0)

/* What one handle advertises.  Returns NULL, or the name of the query that
 * failed. */
static const char *query_handle(struct plugin *pl, void *h,
                                struct pl_query *q) {
  const struct nbdkit_plugin *p = &pl->p;
  bool v1 = pl->api == 1;
  q->size = p->get_size(h);
  if (q->size < 0)
    return "get_size";
  struct bd_caps *cp = &q->caps;
  *cp = bd_caps_full();
  bool writable;
  ASK(writable, can_write, v1 ? p->_pwrite_v1 != NULL : p->pwrite != NULL);
  cp->readonly = !writable;
  ASK(cp->can_flush, can_flush, v1 ? p->_flush_v1 != NULL : p->flush != NULL);
  ASK(cp->can_trim, can_trim, v1 ? p->_trim_v1 != NULL : p->trim != NULL);
  bool has_zero = v1 ? p->_zero_v1 != NULL : p->zero != NULL;
  ASK(cp->can_zero, can_zero, has_zero);
  ASK(cp->can_fast_zero, can_fast_zero, !has_zero || !cp->can_zero);
  ASK(cp->multi_conn, can_multi_conn, 0);
  ASK(cp->can_extents, can_extents, p->extents != NULL);
  if (!p->extents)
    cp->can_extents = false;
  int fua = fua_mode(pl, h), cache = cache_mode(pl, h);
  if (fua < 0)
    return "can_fua";
  if (cache < 0)
    return "can_cache";
  cp->can_fua = fua != NBDKIT_FUA_NONE;
  cp->native_fua = fua == NBDKIT_FUA_NATIVE;
  cp->can_cache = cache != NBDKIT_CACHE_NONE;
  q->cache_mode = cache;
  uint32_t mn = 0, pref = 0, mx = 0;
  if (p->block_size && p->block_size(h, &mn, &pref, &mx) < 0)
    return "block_size";
  if (mn && pref && mx) {
    cp->min_block = mn;
    cp->pref_block = pref;
    cp->max_block = mx < BD_MAX_IO ? mx : BD_MAX_IO;
  }
  return NULL;
}

/* ---- connections ---- */

static void conn_free(struct pl_conn *c) {
  free_strings(c->interns, c->ninterns);
  pthread_mutex_destroy(&c->lock);
  free(c->export_name);
  free(c);
}

/* The name a connection to export NAME gets: "" maps through
 * default_export, as in nbdkit.  NULL when the plugin has no default. */
static const char *export_name(struct plugin *pl, const char *name,
                               bool readonly) {
  if (*name || !pl->p.default_export)
    return name;
  return pl->p.default_export(readonly, 0);
}

static struct pl_conn *conn_new(struct plugin *pl, const char *name,
                                bool readonly, int peer_fd) {
  struct pl_conn *c = calloc(1, sizeof *c);
  if (!c) {
    bd_set_error("out of memory");
    return NULL;
  }
  pthread_mutex_init(&c->lock, NULL);
  c->peer_fd = peer_fd;
  call_begin(NULL, false);
  const char *n = export_name(pl, name, readonly);
  call_end();
  if (!n || !(c->export_name = strdup(n))) {
    bd_set_error("%s: no export \"%s\"", pl->p.name, name);
    conn_free(c);
    return NULL;
  }
  return c;
}

/* preconnect and open: the handle, or NULL with a message. */
static void *handle_open(struct plugin *pl, struct pl_conn *c, bool readonly) {
  call_begin(c, false);
  void *h = NULL;
  if (pl->p.preconnect && pl->p.preconnect(readonly) < 0)
    bd_set_error("%s: connection refused by preconnect", pl->p.name);
  else if (!(h = pl->p.open(readonly)))
    bd_set_error("%s: open failed%s", pl->p.name,
                 pl_thread.msg_set ? " (see above)" : "");
  call_end();
  return h;
}

static void handle_close(struct plugin *pl, struct pl_conn *c) {
  if (pl->p.close) {
    call_begin(c, false);
    pl->p.close(c->handle);
    call_end();
  }
}

static void *pl_conn_open(struct bd *bd, const struct bd_conn_params *p) {
  struct plugin *pl = bd->priv;
  bool ro = p->readonly || pl->readonly;
  struct pl_conn *c = conn_new(pl, p->export_name, ro, p->peer_fd);
  if (!c)
    return NULL;
  if (!(c->handle = handle_open(pl, c, ro))) {
    conn_free(c);
    return NULL;
  }
  /* nbdkit asks these of every connection during negotiation. */
  struct pl_query q;
  call_begin(c, false);
  const char *failed = query_handle(pl, c->handle, &q);
  call_end();
  if (failed) {
    bd_set_error("%s: %s failed", pl->p.name, failed);
    handle_close(pl, c);
    conn_free(c);
    return NULL;
  }
  if ((uint64_t)q.size != bd->size)
    log_warn("%s: export \"%s\" is %lld bytes; serving %llu as the first "
             "connection saw",
             pl->p.name, c->export_name, (long long)q.size,
             (unsigned long long)bd->size);
  return c;
}

static void pl_conn_close(struct bd *bd, void *priv) {
  struct plugin *pl = bd->priv;
  struct pl_conn *c = priv;
  handle_close(pl, c);
  conn_free(c);
}

static int pl_list_exports(struct bd *bd, bool readonly,
                           struct bd_export_list *l) {
  struct plugin *pl = bd->priv;
  struct nbdkit_exports x = {.list = l, .use_default = !pl->p.list_exports};
  int r = 0;
  call_begin(NULL, false);
  if (pl->p.list_exports &&
      pl->p.list_exports(readonly || pl->readonly, 0, &x) < 0) {
    bd_set_error("%s: list_exports failed", pl->p.name);
    r = -EIO;
  }
  if (r == 0 && x.use_default) {
    const char *d = export_name(pl, "", readonly || pl->readonly);
    if (d && bd_export_list_add(l, d, NULL) < 0)
      r = -ENOMEM;
  }
  call_end();
  return r;
}

/* ---- loading ---- */

/* The library stays mapped (no dlclose): a thread the plugin left running
 * keeps its code, and what the plugin still points at from its globals is
 * not a leak. */
static void plugin_free(struct plugin *pl) {
  if (!pl)
    return;
  free_strings(pl->strings, pl->nstrings);
  free_strings(pl->interns, pl->ninterns);
  pthread_mutex_destroy(&pl->lock);
  free(pl->path);
  free(pl);
}

static void pl_close(struct bd *bd) {
  struct plugin *pl = bd->priv;
  call_begin(NULL, false);
  if (pl->p.cleanup)
    pl->p.cleanup();
  if (pl->p.unload)
    pl->p.unload();
  call_end();
  plugin_free(pl);
  the_plugin = NULL;
}

static const struct bd_ops plugin_ops = {
    .name = "nbdkit",
    .pread = pl_pread,
    .pwrite = pl_pwrite,
    .flush = pl_flush,
    .trim = pl_trim,
    .zero = pl_zero,
    .cache = pl_cache,
    .extents = pl_extents,
    .try_nowait = pl_try_nowait,
    .close = pl_close,
    .conn_open = pl_conn_open,
    .conn_close = pl_conn_close,
    .list_exports = pl_list_exports,
};

/* A bare name ("memory") is looked up in nbdkit's plugin directory; a name
 * with a '/' or a '.' is a file name, as nbdkit decides. */
static char *plugin_path(const char *name) {
  char *path;
  if (strchr(name, '/') || strchr(name, '.'))
    path = strdup(name);
  else if (asprintf(&path, "%s/nbdkit-%s-plugin.so", BLOCKPORT_NBDKIT_PLUGINDIR,
                    name) < 0)
    path = NULL;
  return path;
}

static int load_library(struct plugin *pl, const char *name) {
  if (!(pl->path = plugin_path(name)))
    return -ENOMEM;
  if (access(pl->path, R_OK) < 0) {
    bd_set_error("nbdkit plugin '%s': %s: %s", name, pl->path, strerror(errno));
    return -ENOENT;
  }
  /* A plugin linked against a relative path needs ./ to be a path. */
  if (!strchr(pl->path, '/')) {
    char *p;
    if (asprintf(&p, "./%s", pl->path) < 0)
      return -ENOMEM;
    free(pl->path);
    pl->path = p;
  }
  dlerror();
  pl->dl = dlopen(pl->path, RTLD_NOW | RTLD_GLOBAL);
  if (!pl->dl) {
    bd_set_error("cannot load nbdkit plugin %s: %s", pl->path, dlerror());
    return -EINVAL;
  }
  return 0;
}

/* plugin_init, and the struct it returns, checked as nbdkit checks it. */
static int register_plugin(struct plugin *pl) {
  struct nbdkit_plugin *(*init)(void);
  *(void **)&init = dlsym(pl->dl, "plugin_init");
  if (!init) {
    bd_set_error("%s: not an nbdkit plugin (no plugin_init)", pl->path);
    return -EINVAL;
  }
  struct nbdkit_plugin *p = init();
  if (!p) {
    bd_set_error("%s: plugin_init failed", pl->path);
    return -EINVAL;
  }
  size_t n = p->_struct_size < sizeof pl->p ? p->_struct_size : sizeof pl->p;
  memcpy(&pl->p, p, n); /* fields past the plugin's struct stay NULL */
  pl->api = p->_api_version;
  pl->model = p->_thread_model;
  const char *missing = !pl->p.name                          ? "name"
                        : !pl->p.open                        ? "open"
                        : !pl->p.get_size                    ? "get_size"
                        : (pl->api == 1 && !pl->p._pread_v1) ? "pread"
                        : (pl->api == 2 && !pl->p.pread)     ? "pread"
                                                             : NULL;
  if (pl->api < 1 || pl->api > 2) {
    bd_set_error("%s: nbdkit API version %d is not supported", pl->path,
                 pl->api);
    return -EINVAL;
  }
  if (n < offsetof(struct nbdkit_plugin, can_zero)) {
    bd_set_error("%s: plugin struct too small", pl->path);
    return -EINVAL;
  }
  if (missing) {
    bd_set_error("%s: the plugin lacks .%s", pl->path, missing);
    return -EINVAL;
  }
  if (pl->model < NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS ||
      pl->model > NBDKIT_THREAD_MODEL_PARALLEL) {
    bd_set_error("%s: unknown thread model %d", pl->path, pl->model);
    return -EINVAL;
  }
  return 0;
}

/* ---- debug flags ---- */

static bool same_name(const char *a, size_t alen, const char *b) {
  return strlen(b) == alen && strncmp(a, b, alen) == 0;
}

/* NAME.FLAG=N sets the plugin's global int NAME_debug_FLAG ('.' and '-'
 * become '_'). */
static int apply_debug_flag(struct plugin *pl, const char *arg) {
  const char *dot = strchr(arg, '.'), *eq = strchr(arg, '=');
  if (!same_name(arg, (size_t)(dot - arg), pl->p.name)) {
    log_warn("-D %s: the plugin is called '%s'; flag not used", arg,
             pl->p.name);
    return 0;
  }
  char sym[256];
  int len = snprintf(sym, sizeof sym, "%s_debug_%.*s", pl->p.name,
                     (int)(eq - dot - 1), dot + 1);
  if (len < 0 || (size_t)len >= sizeof sym)
    return -EINVAL;
  for (char *s = sym; *s; s++)
    if (*s == '.' || *s == '-')
      *s = '_';
  char *end;
  errno = 0;
  long v = strtol(eq + 1, &end, 0);
  if (errno || *end || v < INT_MIN || v > INT_MAX) {
    bd_set_error("-D %s: '%s' is not an int", arg, eq + 1);
    return -EINVAL;
  }
  int *var = dlsym(pl->dl, sym);
  if (!var) {
    bd_set_error("-D %s: %s has no global variable %s", arg, pl->path, sym);
    return -EINVAL;
  }
  *var = (int)v;
  return 0;
}

/* ---- configuration ---- */

/* nbdkit's rule for what is a key in key=value. */
static bool is_config_key(const char *s, size_t n) {
  if (n == 0 || !isalpha((unsigned char)s[0]))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
      return false;
  return true;
}

static char *keep(struct plugin *pl, const char *s, size_t n) {
  char *c = strndup(s, n);
  if (c && intern_push(&pl->strings, &pl->nstrings, c) < 0) {
    free(c);
    c = NULL;
  }
  return c;
}

static int config_one(struct plugin *pl, const char *param, bool first) {
  const char *eq = strchr(param, '=');
  const char *key, *value;
  if (eq && is_config_key(param, (size_t)(eq - param))) {
    key = keep(pl, param, (size_t)(eq - param));
    value = keep(pl, eq + 1, strlen(eq + 1));
  } else if (pl->p.magic_config_key || first) {
    key = pl->p.magic_config_key ? pl->p.magic_config_key : "script";
    value = keep(pl, param, strlen(param));
  } else {
    bd_set_error("%s: parameter '%s' is not key=value", pl->p.name, param);
    return -EINVAL;
  }
  if (!key || !value)
    return -ENOMEM;
  if (!pl->p.config) {
    bd_set_error("%s: the plugin takes no parameters (got '%s')", pl->p.name,
                 param);
    return -EINVAL;
  }
  if (pl->p.config(key, value) < 0) {
    bd_set_error("%s: configuration refused: %s=%s", pl->p.name, key, value);
    return -EINVAL;
  }
  return 0;
}

/* A lifecycle callback that returns -1 on failure. */
static int step(struct plugin *pl, int (*fn)(void), const char *what) {
  if (fn && fn() < 0) {
    bd_set_error("%s: %s failed", pl->p.name, what);
    return -EINVAL;
  }
  return 0;
}

static int configure(struct plugin *pl, char **params, size_t n,
                     const struct bd_open_opts *o) {
  size_t pos = 0;
  for (const char *f; (f = bd_opt_next(o, "nbdkit", "debug", &pos));)
    if (plugin_check_debug_flag(f) < 0 || apply_debug_flag(pl, f) < 0)
      return -EINVAL;
  if (pl->p.load)
    pl->p.load();
  for (size_t i = 0; i < n; i++)
    if (config_one(pl, params[i], i == 0) < 0)
      return -EINVAL;
  if (step(pl, pl->p.config_complete, "config_complete") < 0)
    return -EINVAL;
  if (pl->p.thread_model) {
    int m = pl->p.thread_model();
    if (m < 0) {
      bd_set_error("%s: thread_model failed", pl->p.name);
      return -EINVAL;
    }
    if (m < pl->model) /* looser requests are ignored */
      pl->model = m;
  }
  if (step(pl, pl->p.get_ready, "get_ready") < 0 ||
      step(pl, pl->p.after_fork, "after_fork") < 0)
    return -EINVAL;
  return 0;
}

/* ---- the device ---- */

static enum bd_concurrency concurrency(int model) {
  switch (model) {
  case NBDKIT_THREAD_MODEL_SERIALIZE_CONNECTIONS:
    return BD_CONC_SERIALIZE_CONNS;
  case NBDKIT_THREAD_MODEL_SERIALIZE_ALL_REQUESTS: return BD_CONC_SERIALIZE;
  case NBDKIT_THREAD_MODEL_SERIALIZE_REQUESTS: return BD_CONC_SERIALIZE_CONN;
  default: return BD_CONC_PARALLEL;
  }
}

static const char *model_name(int model) {
  static const char *names[] = {"serialize_connections",
                                "serialize_all_requests", "serialize_requests",
                                "parallel"};
  return names[model];
}

/* Open a first handle on the default export: its answers are what the
 * device advertises. */
static int probe(struct plugin *pl, struct pl_query *q, char **desc) {
  struct pl_conn *c = conn_new(pl, "", pl->readonly, -1);
  if (!c)
    return -EINVAL;
  if (!(c->handle = handle_open(pl, c, pl->readonly))) {
    conn_free(c);
    return -EINVAL;
  }
  call_begin(c, false);
  const char *failed = query_handle(pl, c->handle, q);
  const char *d = !failed && pl->p.export_description
                      ? pl->p.export_description(c->handle)
                      : NULL;
  *desc = d ? strdup(d) : NULL;
  call_end();
  handle_close(pl, c);
  conn_free(c);
  if (failed) {
    bd_set_error("%s: %s failed", pl->p.name, failed);
    return -EINVAL;
  }
  return 0;
}

static struct bd *make_device(struct plugin *pl) {
  struct pl_query q;
  char *desc = NULL;
  if (probe(pl, &q, &desc) < 0)
    return NULL;
  char *fallback = NULL;
  if (!desc && asprintf(&fallback, "nbdkit plugin %s", pl->p.name) < 0)
    fallback = NULL;
  struct bd *bd = bd_new(&plugin_ops, "nbdkit", desc ? desc : fallback);
  free(fallback);
  if (bd)
    bd->export_description = desc; /* the plugin's own words */
  else
    free(desc);
  if (!bd) {
    bd_set_error("out of memory");
    return NULL;
  }
  bd->priv = pl;
  bd->size = (uint64_t)q.size;
  bd->caps = q.caps;
  bd->caps.readonly = q.caps.readonly || pl->readonly;
  bd->conc = concurrency(pl->model);
  pl->cache_mode = q.cache_mode;
  bd->exec = BD_EXEC_POOL;
  log_debug("%s: %s, thread model %s, %llu bytes", pl->p.name, pl->path,
            model_name(pl->model), (unsigned long long)bd->size);
  return bd;
}

/* SPEC: the plugin's name or path, then its parameters, separated by
 * PLUGIN_SPEC_SEP. */
static int split_spec(const char *spec, char ***argv, size_t *argc) {
  spec += strlen(PLUGIN_SPEC_PREFIX);
  size_t n = 1;
  for (const char *s = spec; *s; s++)
    n += *s == PLUGIN_SPEC_SEP;
  char **v = calloc(n + 1, sizeof *v);
  char *copy = strdup(spec);
  if (!v || !copy) {
    free(v);
    free(copy);
    return -ENOMEM;
  }
  size_t i = 0;
  for (char *s = copy, *sep; s; s = sep ? sep + 1 : NULL) {
    sep = strchr(s, PLUGIN_SPEC_SEP);
    if (sep)
      *sep = 0;
    v[i++] = s;
  }
  *argv = v;
  *argc = i;
  return 0;
}

struct bd *plugin_source_open(const char *spec, const struct bd_open_opts *o) {
  bool readonly = o->flags & BD_OPEN_READONLY;
  if (the_plugin) {
    bd_set_error("only one nbdkit plugin can be loaded at a time");
    return NULL;
  }
  char **argv;
  size_t argc;
  struct plugin *pl = calloc(1, sizeof *pl);
  if (!pl || split_spec(spec, &argv, &argc) < 0) {
    free(pl);
    bd_set_error("out of memory");
    return NULL;
  }
  pthread_mutex_init(&pl->lock, NULL);
  pl->readonly = readonly;
  atomic_init(&pl->ema_ns, EMA_START_NS);
  struct bd *bd = NULL;
  if (load_library(pl, argv[0]) == 0 && register_plugin(pl) == 0) {
    the_plugin = pl;
    if (configure(pl, argv + 1, argc - 1, o) == 0)
      bd = make_device(pl);
  }
  free(argv[0]);
  free(argv);
  if (!bd) {
    the_plugin = NULL;
    plugin_free(pl);
  }
  return bd;
}

const char *plugin_dir(void) {
  return BLOCKPORT_NBDKIT_PLUGINDIR;
}
