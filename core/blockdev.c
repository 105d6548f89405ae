/* SPDX-License-Identifier: BSD-3-Clause */
#include "blockdev.h"
#include "source.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "disk.h"
#include "format-table.h"
#include "io.h"
#include "pipeline.h"

/* ---- sizes ---- */

/* The shift of suffix S ("", "k", "M", "GiB", "TB"...), or -1. */
static int suffix_shift(const char *s) {
  static const char units[] = "KMGTPE";
  if (!*s)
    return 0;
  const char *u = strchr(units, toupper((unsigned char)*s));
  if (toupper((unsigned char)*s) == 'B')
    return s[1] ? -1 : 0;
  if (!u || !*u)
    return -1;
  s++;
  if (s[0] == 'i' && s[1] == 'B')
    s += 2;
  else if (toupper((unsigned char)*s) == 'B')
    s++;
  return *s ? -1 : 10 * (int)(u - units + 1);
}

int bd_parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s))
    return -EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = suffix_shift(end);
  if (errno || shift < 0)
    return -EINVAL;
  if (shift && v > (UINT64_MAX >> shift))
    return -EINVAL;
  /* Sizes beyond INT64_MAX cannot be offsets for pread/lseek. */
  if ((v << shift) > (uint64_t)INT64_MAX)
    return -EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

const char *bd_size_problem(const char *s, char *buf, size_t len) {
  const char *end = s;
  while (isdigit((unsigned char)*end))
    end++;
  if (end == s)
    snprintf(buf, len,
             "expected a number, with k, M, G, T, P or E after it "
             "for a multiple of 1024");
  else if (suffix_shift(end) < 0)
    snprintf(buf, len, "unknown suffix '%s' (use k, M, G, T, P or E)", end);
  else
    snprintf(buf, len, "too large: at most 8E - 1 bytes");
  return buf;
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

/* ---- opening, through the installed formats (format-table.c) ---- */

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
  if (!bd_formats_installed()) {
    bd_set_error("%s: no formats installed (bd_formats_install)", spec);
    return NULL;
  }
  if (opts.ncontexts > BD_MAX_CONTEXTS) {
    bd_set_error("%s: more than %d block-status contexts asked for", spec,
                 BD_MAX_CONTEXTS);
    return NULL;
  }
  const struct bd_format *f = bd_format_for(spec, &opts);
  if (f && bd_opt_check(&opts, f) < 0)
    f = NULL;
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

struct bd *bd_open(const char *spec, const char *format, bool readonly) {
  return bd_open_flags(spec, format, readonly ? BD_OPEN_READONLY : 0);
}

struct bd *bd_open_flags(const char *spec, const char *format, unsigned flags) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = format;
  o.flags = flags;
  return bd_open_with(spec, &o);
}

void bd_hold_locks(struct bd *bd, bool hold) {
  if (bd->ops->hold_locks)
    bd->ops->hold_locks(bd, hold);
}

int bd_close(struct bd *bd) {
  if (!bd)
    return 0;
  int r = bd_final_flush(bd);
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

struct bd_conn *bd_conn_default(struct bd *bd) {
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
