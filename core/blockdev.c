/* SPDX-License-Identifier: BSD-3-Clause */
#include "blockdev.h"
#include "source.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "disk.h"
#include "io.h"
#include "pool.h"

/* ---- sizes ---- */

int bd_parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s))
    return -EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return -EINVAL;
  unsigned shift = 0;
  if (*end) {
    switch (toupper((unsigned char)*end)) {
    case 'B': shift = 0; break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    case 'P': shift = 50; break;
    case 'E': shift = 60; break;
    default: return -EINVAL;
    }
    end++;
    if (shift && *end == 'i' && end[1] == 'B')
      end += 2;
    else if (toupper((unsigned char)*end) == 'B' && shift)
      end++;
    if (*end)
      return -EINVAL;
  }
  if (shift && v > (UINT64_MAX >> shift))
    return -EINVAL;
  /* Sizes beyond INT64_MAX cannot be offsets for pread/lseek. */
  if ((v << shift) > (uint64_t)INT64_MAX)
    return -EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

/* ---- extents ---- */

void bd_extents_init(struct bd_extents *e, uint64_t start, size_t max) {
  memset(e, 0, sizeof *e);
  e->start = e->end = start;
  e->max = max;
}

void bd_extents_reset(struct bd_extents *e, uint64_t start, size_t max) {
  e->n = 0;
  e->start = e->end = start;
  e->max = max;
}

void bd_extents_free(struct bd_extents *e) {
  free(e->v);
  e->v = NULL;
  e->n = e->cap = 0;
}

int bd_extents_add(struct bd_extents *e, uint64_t length, uint32_t flags,
                   uint32_t depth) {
  if (length == 0)
    return 0;
  if (e->n > 0) {
    struct bd_extent *last = &e->v[e->n - 1];
    if (last->flags == flags && last->depth == depth) {
      last->length += length;
      e->end += length;
      return 0;
    }
  }
  if (e->max && e->n >= e->max)
    return 1;
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 16;
    struct bd_extent *v = realloc(e->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = (struct bd_extent){length, flags, depth};
  e->end += length;
  return 0;
}

/* ---- lifecycle ---- */

struct bd *bd_new(const struct bd_ops *ops, const char *format,
                  const char *description) {
  struct bd *bd = calloc(1, sizeof *bd);
  if (!bd)
    return NULL;
  bd->ops = ops;
  bd->format = strdup(format);
  bd->description = strdup(description ? description : format);
  if (!bd->format || !bd->description) {
    free(bd->format);
    free(bd->description);
    free(bd->export_description);
    free(bd);
    return NULL;
  }
  bd->exec = BD_EXEC_POOL;
  bd->conc = BD_CONC_PARALLEL;
  bd->caps = bd_caps_full();
  pthread_mutex_init(&bd->serial_lock, NULL);
  pthread_mutex_init(&bd->conn_lock, NULL);
  pthread_cond_init(&bd->conn_cond, NULL);
  return bd;
}

int bd_add_context(struct bd *bd, const char *name) {
  char **v = realloc(bd->contexts, (bd->ncontexts + 1) * sizeof *v);
  if (!v)
    return -ENOMEM;
  bd->contexts = v;
  if (!(v[bd->ncontexts] = strdup(name)))
    return -ENOMEM;
  bd->ncontexts++;
  return 0;
}

unsigned bd_context_find(const struct bd *bd, const char *name) {
  for (size_t i = 0; i < bd->ncontexts; i++)
    if (!strcmp(bd->contexts[i], name))
      return (unsigned)i + 1;
  return 0;
}

struct bd_caps bd_caps_full(void) {
  return (struct bd_caps){.can_trim = true,
                          .can_zero = true,
                          .can_fast_zero = true,
                          .can_fua = true,
                          .native_fua = true,
                          .can_flush = true,
                          .can_cache = true,
                          .can_extents = true,
                          .multi_conn = true,
                          .min_block = 1,
                          .pref_block = 4096,
                          .max_block = BD_MAX_IO};
}

/* ---- opening, through the installed formats ---- */

static const struct bd_format *const *formats;

void bd_formats_install(const struct bd_format *const *table) {
  formats = table;
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

static const struct bd_format *format_named(const char *name) {
  for (const struct bd_format *const *f = formats; *f; f++)
    if (!strcmp((*f)->name, name))
      return *f;
  return NULL;
}

const char *bd_probe_format(const char *path) {
  const struct bd_format *p = format_probing();
  const char *fmt = NULL;
  int r = p ? p->probe(path, &fmt) : -ENOTSUP;
  return (r == 0 || r == -ENOTSUP) && fmt ? fmt : "raw";
}

/* The entry that opens SPEC: the first whose matcher accepts it, else
 * the one named by O->format or found by the probe (which then adds
 * BD_OPEN_PROBED to O->flags). */
static const struct bd_format *format_of(const char *spec,
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
  if (f && f->usage)
    bd_set_error("format '%s' takes %s", name, f->usage);
  else
    bd_set_error("unknown format '%s'", name);
  return NULL;
}

/* A source that takes aligned requests only gets the core's aligner. */
static int start_aligner(struct bd *bd) {
  struct disk *d = malloc(sizeof *d);
  if (!d) {
    bd_set_error("%s: out of memory", bd->description);
    return -ENOMEM;
  }
  int r = disk_init(d, bd);
  if (r < 0) {
    free(d);
    return r;
  }
  bd->aligner = d;
  return 0;
}

/* Whether BD offers the contexts O asked for, as the contract says: a
 * source that knows none (raw, null, a plugin) is refused here, once. */
static bool offers_contexts(const char *spec, const struct bd *bd,
                            const struct bd_open_opts *o) {
  for (size_t i = 0; i < o->ncontexts; i++) {
    const char *name = o->contexts[i];
    if (i < bd->ncontexts && !strcmp(bd->contexts[i], name))
      continue;
    size_t plen = strlen(BD_CTX_BITMAP_PREFIX);
    if (!strncmp(name, BD_CTX_BITMAP_PREFIX, plen))
      bd_set_error("%s: bitmap '%s': a %s image has no persistent bitmaps "
                   "(qcow2 images and NBD servers offer them)",
                   spec, name + plen, bd->format);
    else
      bd_set_error("%s: a %s source offers no block-status context '%s'", spec,
                   bd->format, name);
    return false;
  }
  return true;
}

/* BD in the filters F puts over its images; closed when that fails. */
static struct bd *with_filters(const struct bd_format *f, struct bd *bd,
                               const struct bd_open_opts *o) {
  struct bd *w = f->filter(bd, o);
  if (!w) {
    char why[512]; /* bd_close() may set another message */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    bd_close(bd);
    bd_set_error("%s", why);
  }
  return w;
}

struct bd *bd_open_with(const char *spec, const struct bd_open_opts *o) {
  struct bd_open_opts opts = BD_OPEN_OPTS_INIT;
  if (o)
    opts = *o;
  if (opts.flags & BD_OPEN_SHARE)
    opts.flags |= BD_OPEN_READONLY;
  bd_clear_error();
  if (!formats) {
    bd_set_error("%s: no formats installed (bd_formats_install)", spec);
    return NULL;
  }
  if (opts.ncontexts > BD_MAX_CONTEXTS) {
    bd_set_error("%s: more than %d block-status contexts asked for", spec,
                 BD_MAX_CONTEXTS);
    return NULL;
  }
  const struct bd_format *f = format_of(spec, &opts);
  struct bd *bd = f ? f->open(spec, &opts) : NULL;
  if (bd && !offers_contexts(spec, bd, &opts)) {
    char why[512]; /* bd_close() may set another message */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    bd_close(bd);
    bd_set_error("%s", why);
    return NULL;
  }
  if (bd && (opts.flags & BD_OPEN_READONLY))
    bd->caps.readonly = true;
  if (bd) {
    bd->cache = opts.cache;
    bd->aio = opts.aio;
  }
  if (bd && bd->caps.aligned_only && bd->caps.min_block > 1 &&
      start_aligner(bd) < 0) {
    bd_close(bd);
    return NULL;
  }
  return bd && f->filter ? with_filters(f, bd, &opts) : bd;
}

/* The cache mode's promise for REQ (enum bd_cache): writes made FUA in
 * writethrough and directsync, flushes and FUA dropped in unsafe.
 * Returns true when REQ is finished already (an ignored flush). */
static bool apply_cache_mode(struct bd *bd, struct bd_req *req) {
  switch (bd->cache) {
  case BD_CACHE_WRITETHROUGH:
  case BD_CACHE_DIRECTSYNC:
    if (req->cmd == BD_WRITE || req->cmd == BD_ZERO)
      req->flags |= BD_F_FUA;
    return false;
  case BD_CACHE_UNSAFE:
    req->flags &= ~(uint32_t)BD_F_FUA;
    return req->cmd == BD_FLUSH;
  default: return false;
  }
}

struct bd *bd_open(const char *spec, const char *format, bool readonly) {
  return bd_open_flags(spec, format, readonly ? BD_OPEN_READONLY : 0);
}

struct bd *bd_open_flags(const char *spec, const char *format, unsigned flags) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = format;
  o.flags = flags;
  return bd_open_with(spec, &o);
}

static _Thread_local struct bd_conn *cur_conn;

void *bd_conn_current(void) {
  return cur_conn ? cur_conn->priv : NULL;
}

/* The final flush: through the default connection of a source with
 * connections, if one was opened (each other connection was the front
 * end's to flush). */
static int final_flush(struct bd *bd) {
  if (bd->caps.readonly || !bd->caps.can_flush || !bd->ops->flush)
    return 0;
  if (bd->ops->conn_open && !bd->default_conn)
    return 0;
  struct bd_conn *saved = cur_conn;
  cur_conn = bd->default_conn;
  int r = bd->ops->flush(bd);
  cur_conn = saved;
  return r;
}

void bd_hold_locks(struct bd *bd, bool hold) {
  if (bd->ops->hold_locks)
    bd->ops->hold_locks(bd, hold);
}

int bd_close(struct bd *bd) {
  if (!bd)
    return 0;
  int r = final_flush(bd);
  bd_conn_close(bd, bd->default_conn);
  if (bd->ops->close)
    bd->ops->close(bd);
  if (bd->aligner) {
    disk_fini(bd->aligner);
    free(bd->aligner);
  }
  pthread_cond_destroy(&bd->conn_cond);
  pthread_mutex_destroy(&bd->conn_lock);
  pthread_mutex_destroy(&bd->serial_lock);
  for (size_t i = 0; i < bd->ncontexts; i++)
    free(bd->contexts[i]);
  free(bd->contexts);
  free(bd->format);
  free(bd->description);
  free(bd);
  return r;
}

/* ---- connections ---- */

/* BD_CONC_SERIALIZE_CONNS: wait until no other connection is open, at most
 * WAIT_MS, or until C is cancelled.  Called with conn_lock held. */
static int wait_conn_slot(struct bd *bd, struct bd_conn *c, unsigned wait_ms) {
  struct timespec end;
  clock_gettime(CLOCK_REALTIME, &end);
  end.tv_sec += wait_ms / 1000;
  end.tv_nsec += (long)(wait_ms % 1000) * 1000000;
  if (end.tv_nsec >= 1000000000) {
    end.tv_sec++;
    end.tv_nsec -= 1000000000;
  }
  while (bd->nconns > 0) {
    if (atomic_load(&c->cancelled)) {
      bd_set_error("the client left while waiting for the connection "
                   "before it to close");
      return -ECANCELED;
    }
    if (pthread_cond_timedwait(&bd->conn_cond, &bd->conn_lock, &end) ==
            ETIMEDOUT &&
        bd->nconns > 0) {
      bd_set_error("waiting for the connection before it to close");
      return -ETIMEDOUT;
    }
  }
  return 0;
}

static void *source_conn_open(struct bd *bd, const struct bd_conn_params *p) {
  bool serial = bd->conc >= BD_CONC_SERIALIZE;
  if (serial)
    pthread_mutex_lock(&bd->serial_lock);
  void *priv = bd->ops->conn_open(bd, p);
  if (serial)
    pthread_mutex_unlock(&bd->serial_lock);
  return priv;
}

struct bd_conn *bd_conn_prepare(struct bd *bd, const char *export_name,
                                bool readonly, int peer_fd) {
  struct bd_conn *c = calloc(1, sizeof *c);
  if (c)
    c->export_name = strdup(export_name ? export_name : "");
  if (!c || !c->export_name) {
    free(c);
    bd_set_error("out of memory");
    return NULL;
  }
  c->bd = bd;
  c->readonly = readonly;
  c->peer_fd = peer_fd;
  atomic_init(&c->cancelled, false);
  pthread_mutex_init(&c->lock, NULL);
  return c;
}

/* Gives back the slot C held while the source opened it. */
static void release_slot(struct bd *bd) {
  pthread_mutex_lock(&bd->conn_lock);
  bd->nconns--;
  pthread_cond_broadcast(&bd->conn_cond);
  pthread_mutex_unlock(&bd->conn_lock);
}

int bd_conn_start(struct bd *bd, struct bd_conn *c, unsigned wait_ms) {
  if (atomic_load(&c->cancelled)) {
    bd_set_error("the client is gone");
    return -ECANCELED;
  }
  if (!bd->ops->conn_open || c->started)
    return 0;
  pthread_mutex_lock(&bd->conn_lock);
  int r =
      bd->conc == BD_CONC_SERIALIZE_CONNS ? wait_conn_slot(bd, c, wait_ms) : 0;
  if (r == 0)
    bd->nconns++; /* holds the slot while the source opens */
  pthread_mutex_unlock(&bd->conn_lock);
  if (r < 0)
    return r;
  struct bd_conn_params p = {c->export_name, c->readonly, c->peer_fd};
  if (!(c->priv = source_conn_open(bd, &p))) {
    release_slot(bd);
    return -EIO;
  }
  c->started = true;
  return 0;
}

void bd_conn_cancel(struct bd *bd, struct bd_conn *c) {
  if (!c || atomic_exchange(&c->cancelled, true))
    return;
  /* Wake a bd_conn_start() waiting for the slot. */
  pthread_mutex_lock(&bd->conn_lock);
  pthread_cond_broadcast(&bd->conn_cond);
  pthread_mutex_unlock(&bd->conn_lock);
  if (bd->ops->cancel)
    bd->ops->cancel(bd, c);
}

struct bd_conn *bd_conn_open_peer(struct bd *bd, const char *export_name,
                                  bool readonly, int peer_fd) {
  struct bd_conn *c = bd_conn_prepare(bd, export_name, readonly, peer_fd);
  if (c && bd_conn_start(bd, c, UINT_MAX) < 0) {
    bd_conn_close(bd, c);
    return NULL;
  }
  return c;
}

struct bd_conn *bd_conn_open(struct bd *bd, const char *export_name,
                             bool readonly) {
  return bd_conn_open_peer(bd, export_name, readonly, -1);
}

void bd_conn_close(struct bd *bd, struct bd_conn *c) {
  if (!c)
    return;
  if (c->started) {
    bool serial = bd->conc >= BD_CONC_SERIALIZE;
    if (serial)
      pthread_mutex_lock(&bd->serial_lock);
    if (bd->ops->conn_close)
      bd->ops->conn_close(bd, c->priv);
    if (serial)
      pthread_mutex_unlock(&bd->serial_lock);
    release_slot(bd);
  }
  pthread_mutex_destroy(&c->lock);
  free(c->export_name);
  free(c);
}

/* The connection of a request with conn == NULL, opened on first use. */
static struct bd_conn *default_conn(struct bd *bd) {
  pthread_mutex_lock(&bd->conn_lock);
  struct bd_conn *c = bd->default_conn;
  pthread_mutex_unlock(&bd->conn_lock);
  if (c)
    return c;
  c = bd_conn_open(bd, "", bd->caps.readonly);
  if (!c)
    return NULL;
  pthread_mutex_lock(&bd->conn_lock);
  if (bd->default_conn) { /* another thread won the race */
    pthread_mutex_unlock(&bd->conn_lock);
    bd_conn_close(bd, c);
    pthread_mutex_lock(&bd->conn_lock);
  } else {
    bd->default_conn = c;
  }
  c = bd->default_conn;
  pthread_mutex_unlock(&bd->conn_lock);
  return c;
}

int bd_export_list_add(struct bd_export_list *l, const char *name,
                       const char *description) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    struct bd_export *v = realloc(l->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  char *n = strdup(name), *d = description ? strdup(description) : NULL;
  if (!n || (description && !d)) {
    free(n);
    free(d);
    return -ENOMEM;
  }
  l->v[l->n++] = (struct bd_export){n, d};
  return 0;
}

void bd_export_list_free(struct bd_export_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    free(l->v[i].description);
  }
  free(l->v);
  *l = (struct bd_export_list){0};
}

int bd_list_exports(struct bd *bd, bool readonly, struct bd_export_list *l) {
  *l = (struct bd_export_list){0};
  if (!bd->ops->list_exports)
    return -ENOTSUP;
  int r = bd->ops->list_exports(bd, readonly, l);
  if (r < 0)
    bd_export_list_free(l);
  return r;
}

/* ---- execution ---- */

static bool is_write_cmd(enum bd_cmd cmd) {
  return cmd == BD_WRITE || cmd == BD_TRIM || cmd == BD_ZERO;
}

static int check_request(struct bd *bd, const struct bd_req *req) {
  if (req->cmd == BD_FLUSH)
    return 0;
  if (req->offset > bd->size || req->length > bd->size - req->offset) {
    bd_set_error("request [%llu, +%llu) is beyond the end of the device "
                 "(%llu bytes)",
                 (unsigned long long)req->offset,
                 (unsigned long long)req->length, (unsigned long long)bd->size);
    return is_write_cmd(req->cmd) ? -ENOSPC : -EINVAL;
  }
  if (req->cmd == BD_BLOCK_STATUS && req->context > bd->ncontexts) {
    bd_set_error("block-status context %u is not offered", req->context);
    return -EINVAL;
  }
  if (is_write_cmd(req->cmd) && bd->caps.readonly) {
    bd_set_error("the device is read-only");
    return -EPERM;
  }
  if ((req->cmd == BD_READ || req->cmd == BD_WRITE) &&
      req->length > BD_MAX_IO) {
    bd_set_error("request of %llu bytes exceeds the maximum of %u",
                 (unsigned long long)req->length, BD_MAX_IO);
    return -EINVAL;
  }
  return 0;
}

/* Zeroing where the source has no efficient way: write zero buffers. */
static int write_zeroes(struct bd *bd, uint64_t len, uint64_t off) {
  if (!bd->ops->pwrite)
    return -EROFS;
  size_t chunk = len < 1024 * 1024 ? (size_t)len : 1024 * 1024;
  void *zeroes = calloc(1, chunk ? chunk : 1);
  if (!zeroes)
    return -ENOMEM;
  int r = 0;
  while (len > 0 && r == 0) {
    size_t n = len < chunk ? (size_t)len : chunk;
    r = bd->ops->pwrite(bd, zeroes, n, off, 0);
    off += n;
    len -= n;
  }
  free(zeroes);
  return r;
}

static int do_zero(struct bd *bd, struct bd_req *req) {
  if (bd->ops->zero) {
    int r = bd->ops->zero(bd, req->length, req->offset, req->flags);
    if (r != -ENOTSUP || (req->flags & BD_F_FAST_ZERO))
      return r;
  } else if (req->flags & BD_F_FAST_ZERO) {
    bd_set_error("this device cannot zero quickly");
    return -ENOTSUP;
  }
  return write_zeroes(bd, req->length, req->offset);
}

static int do_extents(struct bd *bd, struct bd_req *req) {
  if (req->context && !bd->ops->context_extents)
    return -ENOTSUP;
  if (req->context) /* check_request() saw that the source offers it */
    return bd->ops->context_extents(bd, req->context - 1, req->length,
                                    req->offset, req->flags, req->extents);
  if (bd->ops->extents && bd->caps.can_extents)
    return bd->ops->extents(bd, req->length, req->offset, req->flags,
                            req->extents);
  int r = bd_extents_add(req->extents, req->length, 0, 1);
  return r < 0 ? r : 0;
}

static int dispatch(struct bd *bd, struct bd_req *req) {
  switch (req->cmd) {
  case BD_READ: return bd->ops->pread(bd, req->buf, req->length, req->offset);
  case BD_WRITE:
    if (!bd->ops->pwrite)
      return -EROFS;
    return bd->ops->pwrite(bd, req->buf, req->length, req->offset, req->flags);
  case BD_FLUSH: return bd->ops->flush ? bd->ops->flush(bd) : 0;
  case BD_TRIM:
    /* Trim is advisory: a source that cannot trim succeeds doing nothing. */
    return bd->ops->trim
               ? bd->ops->trim(bd, req->length, req->offset, req->flags)
               : 0;
  case BD_ZERO: return do_zero(bd, req);
  case BD_CACHE:
    return bd->ops->cache ? bd->ops->cache(bd, req->length, req->offset) : 0;
  case BD_BLOCK_STATUS: return do_extents(bd, req);
  }
  return -EINVAL;
}

/* The lock that serialises a request as the source's concurrency asks,
 * or NULL. */
static pthread_mutex_t *serial_lock(struct bd *bd, struct bd_conn *c) {
  switch (bd->conc) {
  case BD_CONC_PARALLEL: return NULL;
  case BD_CONC_SERIALIZE_CONN: return c ? &c->lock : &bd->serial_lock;
  case BD_CONC_SERIALIZE:
  case BD_CONC_SERIALIZE_CONNS: return &bd->serial_lock;
  }
  return &bd->serial_lock;
}

/* Whether REQ's connection was cancelled (its client is gone), with the
 * request's message saying so. */
bool bd_req_cancelled(const struct bd_req *req) {
  return req->conn && atomic_load(&req->conn->cancelled);
}

static bool conn_cancelled(struct bd_req *req) {
  if (!bd_req_cancelled(req))
    return false;
  bd_req_set_error(req, "cancelled: the client is gone");
  return true;
}

/* Run one request in the calling thread: validation, the connection,
 * serialisation, the operation, then FUA emulated by a flush where the
 * source asks. */
int bd_execute(struct bd *bd, struct bd_req *req) {
  bd_clear_error(); /* what bd_complete() then finds is this request's */
  int r = check_request(bd, req);
  if (r < 0)
    return r;
  if (conn_cancelled(req))
    return -ECANCELED; /* queued before its client left */
  if (req->length == 0 && req->cmd != BD_FLUSH)
    return 0;
  struct bd_conn *c = req->conn;
  if (!c && bd->ops->conn_open && !(c = default_conn(bd)))
    return -EIO;
  pthread_mutex_t *lock = serial_lock(bd, c);
  struct bd_conn *saved = cur_conn; /* a backing device runs nested */
  cur_conn = c;
  if (lock)
    pthread_mutex_lock(lock);
  r = dispatch(bd, req);
  if (r == 0 && (req->flags & BD_F_FUA) && is_write_cmd(req->cmd) &&
      !bd->caps.native_fua && bd->ops->flush)
    r = bd->ops->flush(bd);
  if (lock)
    pthread_mutex_unlock(lock);
  cur_conn = saved;
  return r;
}

/* A pool source's request: finished in the calling thread when it needs
 * no device I/O (try_nowait), started on the source's own queue
 * (submit_async), or else queued to the pool.  Checked once for both. */
static void submit_pooled(struct bd *bd, struct bd_req *req) {
  const struct bd_ops *ops = bd->ops;
  if (bd->conc != BD_CONC_PARALLEL ||
      (!ops->try_nowait && !ops->submit_async)) {
    bd_pool_queue(req);
    return;
  }
  bd_clear_error();
  int r = check_request(bd, req);
  bool rw = req->cmd == BD_READ || req->cmd == BD_WRITE;
  if (r == 0 && req->length == 0 && req->cmd != BD_FLUSH)
    r = 0; /* nothing to do */
  else if (r == 0 && ops->try_nowait && rw && !(req->flags & BD_F_FUA))
    r = ops->try_nowait(bd, req);
  else if (r == 0)
    r = -EAGAIN;
  if (r != -EAGAIN) {
    bd_complete(req, r);
    return;
  }
  r = ops->submit_async ? ops->submit_async(bd, req) : -EAGAIN;
  if (r == -EAGAIN)
    bd_pool_queue(req);
  else if (r < 0)
    bd_complete(req, r); /* 0: started, the source completes it */
}

void bd_submit(struct bd *bd, struct bd_req *req) {
  req->bd = bd;
  req->errmsg[0] = 0;
  if (conn_cancelled(req)) {
    bd_complete(req, -ECANCELED);
    return;
  }
  if (apply_cache_mode(bd, req)) {
    bd_complete(req, 0);
    return;
  }
  if (disk_wants(bd, req)) {
    disk_submit_for(bd, req);
    return;
  }
  req->flags &= ~BD_F_ALIGNED;
  if (req->cmd == BD_BLOCK_STATUS && req->context && bd->caps.contexts_nowait &&
      bd->exec == BD_EXEC_POOL) {
    bd_complete(req, bd_execute(bd, req));
    return;
  }
  switch (bd->exec) {
  case BD_EXEC_INLINE: bd_complete(req, bd_execute(bd, req)); return;
  case BD_EXEC_POOL: submit_pooled(bd, req); return;
  case BD_EXEC_ASYNC: {
    int r = check_request(bd, req);
    if (r < 0)
      bd_complete(req, r);
    else
      bd->ops->submit(bd, req);
    return;
  }
  }
}

void bd_req_set_error(struct bd_req *req, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->errmsg, sizeof req->errmsg, fmt, ap);
  va_end(ap);
}

void bd_complete(struct bd_req *req, int err) {
  if (err < 0) {
    if (!req->errmsg[0])
      snprintf(req->errmsg, sizeof req->errmsg, "%s",
               bd_error_is_set() ? bd_errmsg() : strerror(-err));
    /* For done() callbacks that still read the thread's message. */
    bd_set_error("%s", req->errmsg);
  }
  req->done(req, err);
}

/* A thread's nesting of batches (or plugs) and the hooks deferred to the
 * outermost end. */
struct hook_stack {
  unsigned depth;
  struct bd_batch_hook *hooks;
};

static bool stack_defer(struct hook_stack *st, struct bd_batch_hook *h) {
  if (st->depth == 0)
    return false;
  h->next = st->hooks;
  st->hooks = h;
  return true;
}

static void stack_end(struct hook_stack *st) {
  if (--st->depth > 0)
    return;
  /* Outside now: whatever a hook completes or submits is handled inline. */
  struct bd_batch_hook *h = st->hooks;
  st->hooks = NULL;
  while (h) {
    struct bd_batch_hook *next = h->next;
    h->run(h);
    h = next;
  }
}

static _Thread_local struct hook_stack batch, plug;

void bd_batch_begin(void) {
  batch.depth++;
}

bool bd_batch_defer(struct bd_batch_hook *h) {
  return stack_defer(&batch, h);
}

void bd_batch_end(void) {
  stack_end(&batch);
}

void bd_plug_begin(void) {
  plug.depth++;
}

bool bd_plug_defer(struct bd_batch_hook *h) {
  return stack_defer(&plug, h);
}

bool bd_plug_pending(void) {
  return plug.hooks != NULL;
}

void bd_plug_end(void) {
  stack_end(&plug);
}

/* bd_run() on an asynchronous source: submit a copy of the request that
 * carries its own wait state, then sleep until it completes. */
struct sync_req {
  struct bd_req req; /* first, so done() can find the rest */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
};

static void sync_done(struct bd_req *req, int err) {
  struct sync_req *s = (struct sync_req *)req;
  pthread_mutex_lock(&s->lock);
  s->done = true;
  s->err = err;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

/* An unaligned read of an aligned-only device, run in the calling thread:
 * the aligned range around it into a bounce, then the part asked for. */
static int read_widened(struct bd *bd, struct bd_req *req) {
  uint32_t a = bd->caps.min_block;
  uint64_t s = req->offset - req->offset % a;
  uint64_t e = req->offset + req->length;
  e = e % a ? e + (a - e % a) : e;
  if (e > bd->size)
    e = bd->size; /* the device reads its unaligned last block itself */
  void *b = NULL;
  if (e - s > BD_MAX_IO || posix_memalign(&b, 4096, e - s) != 0)
    return disk_run_for(bd, req);
  struct bd_req w = {.cmd = BD_READ,
                     .offset = s,
                     .length = e - s,
                     .buf = b,
                     .conn = req->conn,
                     .bd = bd};
  int r = bd_execute(bd, &w);
  if (r == 0)
    memcpy(req->buf, (uint8_t *)b + (req->offset - s), req->length);
  free(b);
  return r;
}

int bd_run(struct bd *bd, struct bd_req *req) {
  req->bd = bd;
  if (apply_cache_mode(bd, req))
    return 0;
  /* Synchronous callers (the image tools, a format reading its backing
   * file from a worker) go through the aligner only for a range it must
   * widen.  A read is widened here, in the calling thread: waiting in the
   * aligner for pieces that need workers could starve the pool when the
   * caller is a worker. */
  if (bd->aligner && !(req->flags & BD_F_ALIGNED) &&
      (req->offset | req->length) % bd->caps.min_block &&
      req->offset <= bd->size && req->length <= bd->size - req->offset) {
    if (req->cmd == BD_READ && bd->exec != BD_EXEC_ASYNC)
      return read_widened(bd, req);
    if (req->cmd == BD_READ || req->cmd == BD_WRITE || req->cmd == BD_ZERO)
      return disk_run_for(bd, req);
  }
  req->flags &= ~BD_F_ALIGNED;
  if (bd->exec != BD_EXEC_ASYNC)
    return bd_execute(bd, req);
  struct sync_req s = {.req = *req, .done = false};
  pthread_mutex_init(&s.lock, NULL);
  pthread_cond_init(&s.cond, NULL);
  s.req.done = sync_done;
  bd_submit(bd, &s.req);
  pthread_mutex_lock(&s.lock);
  while (!s.done)
    pthread_cond_wait(&s.cond, &s.lock);
  pthread_mutex_unlock(&s.lock);
  pthread_cond_destroy(&s.cond);
  pthread_mutex_destroy(&s.lock);
  if (s.err < 0) /* the request's message, for this thread's caller */
    bd_set_error("%s", s.req.errmsg);
  return s.err;
}

int bd_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct bd_req req = {
      .cmd = BD_READ, .offset = off, .length = len, .buf = buf};
  return bd_run(bd, &req);
}

int bd_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
              uint32_t flags) {
  struct bd_req req = {.cmd = BD_WRITE,
                       .offset = off,
                       .length = len,
                       .buf = (void *)buf,
                       .flags = flags};
  return bd_run(bd, &req);
}

int bd_flush(struct bd *bd) {
  struct bd_req req = {.cmd = BD_FLUSH};
  return bd_run(bd, &req);
}

static int host_range(struct bd *bd, uint64_t off, uint64_t len, int *fd,
                      uint64_t *host, uint64_t *n) {
  if (!bd->ops->host_range)
    return -ENOTSUP;
  int r = bd->ops->host_range(bd, off, len, fd, host, n);
  return r == 0 && *n == 0 ? -ENOTSUP : r;
}

int bd_copy_range(struct bd *src, struct bd *dst, uint64_t off, uint64_t len,
                  uint64_t *done) {
  *done = 0;
  while (*done < len) {
    int sfd, dfd;
    uint64_t sh, dh, n, dn;
    uint64_t at = off + *done, left = len - *done;
    int r = host_range(src, at, left, &sfd, &sh, &n);
    if (r == 0)
      r = host_range(dst, at, n, &dfd, &dh, &dn);
    if (r < 0)
      return r;
    uint64_t k = 0;
    r = io_copy_range(sfd, sh, dfd, dh, dn, &k);
    *done += k;
    if (r < 0)
      return r;
  }
  return 0;
}

int bd_prealloc_parse(const char *name, enum bd_prealloc *out) {
  static const char *const names[] = {"off", "metadata", "falloc", "full"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp(name, names[i]) == 0) {
      *out = (enum bd_prealloc)i;
      return 0;
    }
  return -EINVAL;
}

int bd_resize(struct bd *bd, uint64_t size, enum bd_prealloc prealloc) {
  if (!bd->ops->resize) {
    bd_set_error("%s: a %s source cannot be resized", bd->description,
                 bd->format);
    return -ENOTSUP;
  }
  if (bd->caps.readonly) {
    bd_set_error("%s: opened read-only", bd->description);
    return -EROFS;
  }
  int r = bd->ops->resize(bd, size, prealloc);
  if (r == 0)
    bd->size = size;
  return r;
}
