/* SPDX-License-Identifier: BSD-3-Clause */
/* Checkpoint views by copy-before-write (checkpoint.h says what).
 *
 * How it holds together:
 *   - One struct live per wrapped device, shared by the live struct bd and
 *     every view (refcounted: INNER closes with the last of them).
 *   - Writes in flight are counted (inflight).  ckpt_take() sets paused
 *     and waits for the count to reach 0; a writer increments the count
 *     first and then reads paused (both sequentially consistent), so either
 *     it sees the pause and queues itself, or the taker sees it and waits.
 *     Views, the recording bitmap and the view list therefore change only
 *     while no write is in flight, and a writer reads them without a lock.
 *   - Per view, a hash map granule -> fleece offset, marked COPYING while
 *     its copy is under way (readers read INNER, writers wait), then
 *     DRAINING while readers that read INNER there are still at it (new
 *     readers read the fleece, writers still wait).  A writer that finds a
 * granule absent (or COPYING, by another writer) for an open unbroken view goes
 * to the pool: per granule it marks it COPYING in every view lacking it, reads
 *     it from INNER once, appends it to each view's fleece, marks it
 *     DRAINING, waits for the view readers registered before that mark that
 *     overlap it (they read INNER there), marks it copied, and finally
 *     forwards the write.  Any other writer of the granule meanwhile waits
 *     (for the copier, which is running); a copier waits only for readers,
 *     which wait for nothing: no cycle.
 *   - A view read registers its granule range with a sequence number, then
 *     reads copied granules from the fleece and the others from INNER.
 *   - Everything but the counters is under one mutex, taken only when a
 *     view is open (or by ckpt_take, ckpt_list, closing). */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bitrun.h"
#include "filter.h"
#include "io.h"
#include "log.h"
#include "source.h"

#define COPYING (1ull << 63)  /* map value: fleece slot, copy under way */
#define DRAINING (1ull << 62) /* ... copied, earlier readers still on INNER */
#define BUSY (COPYING | DRAINING)
#define COPY_CHUNK (1u << 20) /* copy buffer: a granule in pieces of this */
#define NONE UINT64_MAX

/* ---- dirty bitmaps ---- */

struct cbm {
  uint64_t nbits;
  _Atomic(uint64_t) w[];
};

static struct cbm *cbm_new(uint64_t nbits) {
  uint64_t nw = (nbits + 63) / 64;
  struct cbm *b = calloc(1, sizeof *b + nw * sizeof(uint64_t));
  if (b)
    b->nbits = nbits;
  return b;
}

/* Granules [G0, G1): lock-free, and no store where the bits are set. */
static void cbm_set(struct cbm *b, uint64_t g0, uint64_t g1) {
  while (g0 < g1) {
    uint64_t w = g0 / 64, lo = g0 % 64;
    uint64_t n = g1 - g0 < 64 - lo ? g1 - g0 : 64 - lo;
    uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << lo;
    if ((atomic_load_explicit(&b->w[w], memory_order_relaxed) & mask) != mask)
      atomic_fetch_or_explicit(&b->w[w], mask, memory_order_relaxed);
    g0 += n;
  }
}

static uint64_t cbm_word(const struct cbm *b, uint64_t w) {
  return atomic_load_explicit((_Atomic(uint64_t) *)&b->w[w],
                              memory_order_relaxed);
}

static bool cbm_bit(const struct cbm *b, uint64_t g) {
  return (cbm_word(b, g / 64) >> (g % 64)) & 1;
}

static uint64_t cbm_word_of(const void *b, uint64_t w) {
  return cbm_word(b, w);
}

static uint64_t cbm_count(const struct cbm *b) {
  uint64_t n = 0;
  for (uint64_t w = 0; w < (b->nbits + 63) / 64; w++)
    n += (uint64_t)__builtin_popcountll(cbm_word(b, w));
  return n;
}

/* ---- granule -> fleece offset ---- */

struct fent {
  uint64_t key; /* granule + 1; 0: empty */
  uint64_t val; /* fleece offset, | COPYING or DRAINING */
};

struct fmap {
  struct fent *v;
  size_t cap, n; /* cap: a power of two, or 0 */
};

static size_t fmap_slot(const struct fmap *m, uint64_t g) {
  return (size_t)((g * 0x9e3779b97f4a7c15ull) >> 20) & (m->cap - 1);
}

static uint64_t *fmap_get(const struct fmap *m, uint64_t g) {
  if (!m->cap)
    return NULL;
  for (size_t i = fmap_slot(m, g);; i = (i + 1) & (m->cap - 1)) {
    if (m->v[i].key == g + 1)
      return &m->v[i].val;
    if (m->v[i].key == 0)
      return NULL;
  }
}

static int fmap_put(struct fmap *m, uint64_t g, uint64_t val) {
  if ((m->n + 1) * 4 > m->cap * 3) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct fent *v = calloc(cap, sizeof *v);
    if (!v)
      return -ENOMEM;
    struct fmap nm = {v, cap, m->n};
    for (size_t i = 0; i < m->cap; i++)
      if (m->v[i].key) {
        size_t j = fmap_slot(&nm, m->v[i].key - 1);
        while (v[j].key)
          j = (j + 1) & (cap - 1);
        v[j] = m->v[i];
      }
    free(m->v);
    *m = nm;
  }
  size_t i = fmap_slot(m, g);
  while (m->v[i].key && m->v[i].key != g + 1)
    i = (i + 1) & (m->cap - 1);
  if (!m->v[i].key)
    m->n++;
  m->v[i] = (struct fent){g + 1, val};
  return 0;
}

static void fmap_free(struct fmap *m) {
  free(m->v);
  *m = (struct fmap){0};
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The granules in [G0, G1) copied (not COPYING), sorted, into *OUT. */
static int fmap_copied_in(const struct fmap *m, uint64_t g0, uint64_t g1,
                          uint64_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!m->n || g0 >= g1)
    return 0;
  size_t cap = m->n < g1 - g0 ? m->n : (size_t)(g1 - g0);
  uint64_t *v = malloc(cap * sizeof *v);
  if (!v)
    return -ENOMEM;
  size_t k = 0;
  if (g1 - g0 <= (uint64_t)m->cap) { /* walk the range */
    for (uint64_t g = g0; g < g1 && k < cap; g++) {
      const uint64_t *e = fmap_get(m, g);
      if (e && !(*e & COPYING))
        v[k++] = g;
    }
  } else { /* walk the map */
    for (size_t i = 0; i < m->cap && k < cap; i++) {
      uint64_t g = m->v[i].key - 1;
      if (m->v[i].key && g >= g0 && g < g1 && !(m->v[i].val & COPYING))
        v[k++] = g;
    }
    qsort(v, k, sizeof *v, cmp_u64);
  }
  if (k == 0) {
    free(v);
    v = NULL;
  }
  *out = v;
  *n = k;
  return 0;
}

/* Whether any granule of [G0, G1) is copied (or draining): held by the
 * fleece rather than INNER. */
static bool fmap_any(const struct fmap *m, uint64_t g0, uint64_t g1) {
  if (!m->n)
    return false;
  if (g1 - g0 <= (uint64_t)m->cap) { /* walk the range */
    for (uint64_t g = g0; g < g1; g++) {
      const uint64_t *e = fmap_get(m, g);
      if (e && !(*e & COPYING))
        return true;
    }
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) { /* walk the map */
    uint64_t g = m->v[i].key - 1;
    if (m->v[i].key && g >= g0 && g < g1 && !(m->v[i].val & COPYING))
      return true;
  }
  return false;
}

/* ---- the shared state ---- */

struct ckpt;
struct live;

/* A view reader in flight: granules [g0, g1), registered at seq. */
struct reader {
  uint64_t g0, g1, seq;
  struct reader *prev, *next;
};

struct cview {
  struct live *lv;
  struct ckpt *ck;   /* its checkpoint */
  struct ckpt *prev; /* the previous checkpoint (its bitmap), or NULL */
  unsigned refs;     /* the view device, and copies under way */
  bool closed, broken;
  char reason[160];
  int fd;            /* fleece file, -1 once closed */
  unsigned fd_users; /* copies writing, readers reading it */
  uint64_t fleece_end;
  uint64_t fleece; /* bytes it holds, counted in live.used */
  struct fmap map;
  struct reader *readers;
  /* The view's synchronous side, a BD_EXEC_POOL twin (view_sync_ops):
   * reads that touch the fleece, block status.  Reads of granules INNER
   * still holds go to INNER from the submitting thread (view_submit). */
  struct bd *sync;
  struct cview *next; /* live.views: open views */
};

struct ckpt {
  char *name, *prev;
  bool persistent; /* INNER keeps its bitmap too (bitmap_start) */
  struct cbm *bm;  /* dirty since it: recording (latest) or frozen */
  struct cview *view;
  struct ckpt *next;
};

/* A write on the live device queued during a checkpoint's pause. */
struct lreq {
  struct bd_req *req;
  struct lreq *next;
};

struct live {
  struct bd *inner;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  unsigned waiters; /* threads in cond_wait: broadcast only then */
  unsigned refs;    /* the live device and each view */
  uint32_t gran;
  unsigned gshift;
  uint64_t ngran;
  char *fleece_dir;
  uint64_t limit, used;
  atomic_uint inflight;
  atomic_bool paused;
  struct lreq *queued, **qtail;
  _Atomic(struct cbm *) rec; /* recording bitmap, NULL before the first */
  atomic_uint nviews;        /* open, unbroken views */
  struct cview *views;
  struct ckpt *ckpts;
  bool persist; /* INNER keeps the bitmaps too (bd_ops bitmap_*) */
  bool taking;
  uint64_t rseq; /* reader sequence */
};

static void lv_wait(struct live *lv) {
  lv->waiters++;
  pthread_cond_wait(&lv->cond, &lv->lock);
  lv->waiters--;
}

static void lv_wake(struct live *lv) {
  if (lv->waiters)
    pthread_cond_broadcast(&lv->cond);
}

static uint64_t glen(const struct live *lv, uint64_t g) {
  uint64_t s = g << lv->gshift, e = s + lv->gran;
  return (e > lv->inner->size ? lv->inner->size : e) - s;
}

static void ckpt_free(struct ckpt *c) {
  free(c->name);
  free(c->prev);
  free(c->bm);
  free(c);
}

static void lv_free(struct live *lv) {
  while (lv->ckpts) {
    struct ckpt *c = lv->ckpts;
    lv->ckpts = c->next;
    ckpt_free(c);
  }
  bd_close(lv->inner);
  pthread_cond_destroy(&lv->cond);
  pthread_mutex_destroy(&lv->lock);
  free(lv->fleece_dir);
  free(lv);
}

/* Under the lock; returns whether LV is to be freed (by the caller, after
 * unlocking). */
static bool lv_unref(struct live *lv) {
  return --lv->refs == 0;
}

/* ---- views: fleece and breaking (under the lock) ---- */

static void fd_put(struct cview *v) {
  if (--v->fd_users == 0 && (v->broken || v->closed) && v->fd >= 0) {
    close(v->fd);
    v->fd = -1;
  }
}

/* Frees what the view holds of the fleece (the file closed when nobody
 * uses it), once it broke or closed. */
static void drop_fleece(struct cview *v) {
  v->lv->used -= v->fleece;
  v->fleece = 0;
  fmap_free(&v->map);
  if (v->fd >= 0) {
    if (ftruncate(v->fd, 0) < 0) { /* closing frees it anyway */
    }
    if (v->fd_users == 0) {
      close(v->fd);
      v->fd = -1;
    }
  }
}

static void view_break(struct cview *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void view_break(struct cview *v, const char *fmt, ...) {
  if (v->broken || v->closed)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->reason, sizeof v->reason, fmt, ap);
  va_end(ap);
  v->broken = true;
  atomic_fetch_sub(&v->lv->nviews, 1);
  drop_fleece(v);
  log_warn("checkpoint '%s': view broken: %s", v->ck->name, v->reason);
  lv_wake(v->lv);
}

/* A view's last reference: returns whether LV is to be freed too. */
static bool view_unref(struct cview *v) {
  if (--v->refs > 0)
    return false;
  struct live *lv = v->lv;
  fmap_free(&v->map);
  if (v->fd >= 0)
    close(v->fd);
  free(v);
  return lv_unref(lv);
}

/* ---- copy-before-write ---- */

/* Whether a write of granules [G0, G1) must copy first: some open
 * unbroken view lacks one of them, or another writer is copying it. */
static bool needs_copy(struct live *lv, uint64_t g0, uint64_t g1) {
  for (struct cview *v = lv->views; v; v = v->next) {
    if (v->broken)
      continue;
    for (uint64_t g = g0; g < g1; g++) {
      const uint64_t *e = fmap_get(&v->map, g);
      if (!e || (*e & BUSY))
        return true;
    }
  }
  return false;
}

struct slot {
  struct cview *v;
  uint64_t off; /* fleece offset */
  int err;
};

static bool all_zero(const void *buf, size_t n) {
  const unsigned char *b = buf;
  return n == 0 || (b[0] == 0 && memcmp(b, b + 1, n - 1) == 0);
}

/* Data to copy: LEN bytes of fleece for each view of SLOTS, within the
 * limit; a view past it breaks (and its slot is skipped). */
static void reserve(struct live *lv, struct slot *slots, size_t k,
                    uint64_t len) {
  pthread_mutex_lock(&lv->lock);
  for (size_t i = 0; i < k; i++) {
    struct cview *v = slots[i].v;
    if (v->broken || v->closed) {
      slots[i].err = -ECANCELED;
    } else if (lv->limit && lv->used + len > lv->limit) {
      view_break(v, "fleece limit of %llu bytes reached",
                 (unsigned long long)lv->limit);
      slots[i].err = -ECANCELED;
    } else {
      v->fleece += len;
      lv->used += len;
    }
  }
  pthread_mutex_unlock(&lv->lock);
}

/* Copies granule G aside for every open view that still needs it, and
 * returns once INNER may be written there.  Called with the lock held. */
static void copy_granule(struct live *lv, uint64_t g, void **buf,
                         struct slot **slots, size_t *nslots) {
  uint64_t len = glen(lv, g);
  size_t n;
again:
  n = 0;
  for (struct cview *v = lv->views; v; v = v->next) {
    if (v->broken)
      continue;
    const uint64_t *e = fmap_get(&v->map, g);
    if (e && (*e & BUSY)) { /* another writer copies it: wait */
      lv_wait(lv);
      goto again;
    }
    n += !e;
  }
  if (n == 0)
    return;
  if (n > *nslots) {
    struct slot *s = realloc(*slots, n * sizeof *s);
    if (!s) {
      for (struct cview *v = lv->views; v; v = v->next)
        if (!fmap_get(&v->map, g))
          view_break(v, "out of memory");
      return;
    }
    *slots = s;
    *nslots = n;
  }
  size_t k = 0;
  for (struct cview *v = lv->views; v && k < n; v = v->next) {
    if (v->broken || fmap_get(&v->map, g))
      continue;
    if (fmap_put(&v->map, g, v->fleece_end | COPYING) < 0) {
      view_break(v, "out of memory");
      continue;
    }
    (*slots)[k++] = (struct slot){v, v->fleece_end, 0};
    v->fleece_end += len; /* a hole, until data comes */
    v->refs++;
    v->fd_users++;
  }
  if (k == 0)
    return;
  pthread_mutex_unlock(&lv->lock);

  /* Copy: INNER read once, written to every view's fleece.  Zeroes are
   * not written: the fleece file reads as zeroes there, a hole that takes
   * no space (a trim of an empty disk copies nothing). */
  uint64_t chunk = len < COPY_CHUNK ? len : COPY_CHUNK;
  bool zero = true;
  int rerr = 0;
  if (!*buf && !(*buf = malloc(COPY_CHUNK)))
    rerr = -ENOMEM;
  char why[128] = "";
  for (uint64_t at = 0; at < len && !rerr; at += chunk) {
    uint64_t m = len - at < chunk ? len - at : chunk;
    rerr = bd_pread(lv->inner, *buf, m, (g << lv->gshift) + at);
    if (rerr < 0) {
      snprintf(why, sizeof why, "%s", bd_errmsg());
      break;
    }
    if (all_zero(*buf, (size_t)m))
      continue;
    if (zero) {
      zero = false;
      reserve(lv, *slots, k, len);
    }
    for (size_t i = 0; i < k; i++)
      if (!(*slots)[i].err)
        (*slots)[i].err = io_pwrite_all((*slots)[i].v->fd, *buf, (size_t)m,
                                        (*slots)[i].off + at);
  }

  pthread_mutex_lock(&lv->lock);
  for (size_t i = 0; i < k; i++) {
    struct cview *v = (*slots)[i].v;
    int err = rerr ? rerr : (*slots)[i].err;
    fd_put(v);
    if (v->broken || v->closed)
      continue;
    if (rerr)
      view_break(v, "reading the image to copy it failed: %s",
                 why[0] ? why : strerror(-rerr));
    else if (err)
      view_break(v, "writing the fleece file failed: %s", strerror(-err));
    else
      *fmap_get(&v->map, g) = (*slots)[i].off | DRAINING;
  }
  lv_wake(lv);
  /* Readers that registered before the mark may be reading INNER here. */
  uint64_t mark = lv->rseq;
  for (;;) {
    bool busy = false;
    for (size_t i = 0; i < k && !busy; i++) {
      struct cview *v = (*slots)[i].v;
      if (v->broken || v->closed)
        continue;
      for (struct reader *r = v->readers; r && !busy; r = r->next)
        busy = r->seq < mark && r->g0 <= g && g < r->g1;
    }
    if (!busy)
      break;
    lv_wait(lv);
  }
  /* Never the last reference to LV: the live device is open while a
   * write is in flight. */
  for (size_t i = 0; i < k; i++) {
    struct cview *v = (*slots)[i].v;
    if (!v->broken && !v->closed)
      *fmap_get(&v->map, g) = (*slots)[i].off;
  }
  lv_wake(lv);
  for (size_t i = 0; i < k; i++)
    (void)view_unref((*slots)[i].v);
}

/* ---- the live device: a filter guarding writes ---- */

static int write_after(struct bd_req *req, int err, void *arg);

/* Released first: the request's done() may close the device. */
static void write_release(struct live *lv) {
  if (atomic_fetch_sub(&lv->inflight, 1) == 1 && atomic_load(&lv->paused)) {
    pthread_mutex_lock(&lv->lock);
    lv_wake(lv);
    pthread_mutex_unlock(&lv->lock);
  }
}

static int write_after(struct bd_req *req, int err, void *arg) {
  (void)req;
  write_release(arg);
  return err;
}

/* On a pool worker: the copies one write needs, then the write. */
static void copy_then_write(struct bd *bd, struct bd_req *req) {
  struct live *lv = bd_filter_state(bd);
  uint64_t g0 = req->offset >> lv->gshift;
  uint64_t g1 = ((req->offset + req->length - 1) >> lv->gshift) + 1;
  void *cbuf = NULL;
  struct slot *slots = NULL;
  size_t nslots = 0;
  pthread_mutex_lock(&lv->lock);
  for (uint64_t g = g0; g < g1; g++)
    copy_granule(lv, g, &cbuf, &slots, &nslots);
  pthread_mutex_unlock(&lv->lock);
  free(cbuf);
  free(slots);
  bd_filter_forward(req, write_after, lv);
}

/* A write admitted (counted in flight, no pause): mark it, copy what views
 * need, forward it. */
static void write_start(struct live *lv, struct bd_req *req) {
  if (req->length == 0) {
    bd_filter_forward(req, write_after, lv);
    return;
  }
  uint64_t g0 = req->offset >> lv->gshift;
  uint64_t g1 = ((req->offset + req->length - 1) >> lv->gshift) + 1;
  struct cbm *bm = atomic_load(&lv->rec);
  if (bm)
    cbm_set(bm, g0, g1);
  bool copy = false;
  if (atomic_load(&lv->nviews) > 0) {
    pthread_mutex_lock(&lv->lock);
    copy = needs_copy(lv, g0, g1);
    pthread_mutex_unlock(&lv->lock);
  }
  if (!copy)
    bd_filter_forward(req, write_after, lv);
  else if (bd_filter_offload(req, copy_then_write) < 0)
    bd_complete(req, write_after(req, -ENOMEM, lv));
}

/* Counts the write in flight, or queues it while a checkpoint is taken. */
static void write_admit(struct live *lv, struct bd_req *req) {
  for (;;) {
    atomic_fetch_add(&lv->inflight, 1);
    if (!atomic_load(&lv->paused))
      break;
    write_release(lv);
    pthread_mutex_lock(&lv->lock);
    if (atomic_load(&lv->paused)) {
      struct lreq *q = malloc(sizeof *q);
      if (q) {
        *q = (struct lreq){req, NULL};
        *lv->qtail = q;
        lv->qtail = &q->next;
      }
      pthread_mutex_unlock(&lv->lock);
      if (!q)
        bd_complete(req, -ENOMEM);
      return;
    }
    pthread_mutex_unlock(&lv->lock);
  }
  write_start(lv, req);
}

/* Writes, zeroes and trims (BD_FILTER_WRITES); the rest is forwarded. */
static void live_submit(struct bd *bd, struct bd_req *req) {
  write_admit(bd_filter_state(bd), req);
}

/* The live device closed: INNER stays open while views read it. */
static void live_close(void *state, struct bd *inner) {
  (void)inner; /* lv->inner */
  struct live *lv = state;
  pthread_mutex_lock(&lv->lock);
  bool last = lv_unref(lv);
  pthread_mutex_unlock(&lv->lock);
  if (last)
    lv_free(lv);
}

static const struct bd_filter_ops cbw_ops = {.name = "copy-before-write",
                                             .intercept = BD_FILTER_WRITES,
                                             .submit = live_submit,
                                             .close = live_close};

/* ---- bitmaps INNER keeps ---- */

struct seed {
  struct cbm *bm;
  unsigned gshift;
};

static int seed_range(void *opaque, uint64_t off, uint64_t len) {
  struct seed *s = opaque;
  if (len == 0)
    return 0;
  uint64_t g0 = off >> s->gshift, g1 = ((off + len - 1) >> s->gshift) + 1;
  if (g1 > s->bm->nbits)
    g1 = s->bm->nbits;
  if (g0 < g1)
    cbm_set(s->bm, g0, g1);
  return 0;
}

/* The checkpoint INNER's bitmap NAME records since, with its bits. */
static struct ckpt *resumed(struct live *lv, char *name) {
  const struct bd_ops *ops = lv->inner->ops;
  struct ckpt *c = calloc(1, sizeof *c);
  struct seed s = {cbm_new(lv->ngran), lv->gshift};
  int r =
      c && s.bm ? ops->bitmap_bits(lv->inner, name, seed_range, &s) : -ENOMEM;
  if (r < 0) {
    log_warn("%s: bitmap '%s' not resumed as a checkpoint: %s",
             lv->inner->description, name,
             r == -ENOMEM ? "out of memory" : bd_errmsg());
    /* Stopped, so that the last enabled bitmap is a checkpoint's again. */
    if (ops->bitmap_enable(lv->inner, name, false) < 0)
      log_warn("%s: %s", lv->inner->description, bd_errmsg());
    free(s.bm);
    free(c);
    free(name);
    return NULL;
  }
  c->name = name;
  c->persistent = true;
  c->bm = s.bm;
  return c;
}

/* At open: whether INNER keeps checkpoint bitmaps, and the checkpoint it
 * still records, taken up again (no view; the next one offers it). */
static void resume(struct live *lv) {
  const struct bd_ops *ops = lv->inner->ops;
  if (lv->inner->caps.readonly || !ops->bitmap_resume || !ops->bitmap_start ||
      !ops->bitmap_enable || !ops->bitmap_bits)
    return;
  char *name = NULL;
  int r = ops->bitmap_resume(lv->inner, &name);
  if (r < 0 && r != -ENOENT) {
    log_info("%s: checkpoint bitmaps kept in memory only (%s)",
             lv->inner->description, bd_errmsg());
    return;
  }
  lv->persist = true;
  struct ckpt *c = r == 0 ? resumed(lv, name) : NULL;
  if (!c)
    return;
  lv->ckpts = c;
  atomic_store(&lv->rec, c->bm);
  log_info("%s: checkpoint '%s' resumed from the image's bitmap",
           lv->inner->description, c->name);
}

/* In a checkpoint's pause (no write in flight): INNER's bitmap of PREV
 * (the recording checkpoint, or NULL) stops, bitmap NAME starts; all or
 * nothing, with a message. */
static int persist_switch(struct live *lv, struct ckpt *prev,
                          const char *name) {
  const struct bd_ops *ops = lv->inner->ops;
  bool stop = prev && prev->persistent;
  int r = stop ? ops->bitmap_enable(lv->inner, prev->name, false) : 0;
  bool stopped = stop && r == 0;
  if (r == 0)
    r = ops->bitmap_start(lv->inner, name, lv->gran);
  if (r < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", bd_errmsg());
    if (stopped && ops->bitmap_enable(lv->inner, prev->name, true) < 0)
      log_error("%s: bitmap '%s' could not record again: %s",
                lv->inner->description, prev->name, bd_errmsg());
    bd_set_error("checkpoint '%s': %s", name, why);
  }
  return r;
}

bool ckpt_is_live(const struct bd *bd) {
  return bd_filter_ops_of(bd) == &cbw_ops;
}

uint32_t ckpt_granularity(const struct bd *live) {
  return ckpt_is_live(live) ? ((struct live *)bd_filter_state(live))->gran : 0;
}

/* The granule for INNER: GRAN raised to its minimum block; 0 with a
 * message when either is no power of two. */
static uint64_t granule(const struct bd *inner, uint64_t gran) {
  if (gran < 512 || gran > (1ull << 31) || (gran & (gran - 1))) {
    bd_set_error("%s: checkpoint granularity %llu is not a power of two "
                 "from 512 bytes to 2 GiB",
                 inner->description, (unsigned long long)gran);
    return 0;
  }
  uint32_t mb = inner->caps.min_block;
  if (mb > gran && (mb & (mb - 1))) {
    bd_set_error("%s: minimum block %u is not a power of two",
                 inner->description, mb);
    return 0;
  }
  return mb > gran ? mb : gran;
}

struct bd *ckpt_live_open(struct bd *inner, const struct ckpt_opts *o) {
  struct ckpt_opts opts = {0};
  if (o)
    opts = *o;
  uint64_t gran = granule(inner, opts.granularity ? opts.granularity
                                                  : CKPT_DEFAULT_GRANULARITY);
  if (!gran)
    return NULL;
  struct live *lv = calloc(1, sizeof *lv);
  char *dir =
      strdup(opts.fleece_dir ? opts.fleece_dir : CKPT_DEFAULT_FLEECE_DIR);
  struct bd *bd = lv && dir ? bd_filter_new(inner, &cbw_ops, lv) : NULL;
  if (!bd) {
    bd_set_error("%s: out of memory", inner->description);
    free(lv);
    free(dir);
    return NULL;
  }
  pthread_mutex_init(&lv->lock, NULL);
  pthread_cond_init(&lv->cond, NULL);
  lv->inner = inner;
  lv->refs = 1;
  lv->gran = (uint32_t)gran;
  lv->gshift = (unsigned)__builtin_ctzll(gran);
  lv->ngran = (inner->size + gran - 1) / gran;
  lv->fleece_dir = dir;
  lv->limit = opts.fleece_limit;
  lv->qtail = &lv->queued;
  resume(lv);
  return bd;
}

/* ---- views ---- */

static int view_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct cview *v = bd->priv;
  struct live *lv = v->lv;
  uint64_t g0 = off >> lv->gshift;
  uint64_t g1 = ((off + len - 1) >> lv->gshift) + 1;
  uint64_t *where = malloc((size_t)(g1 - g0) * sizeof *where);
  if (!where)
    return -ENOMEM;
  pthread_mutex_lock(&lv->lock);
  if (v->broken) {
    bd_set_error("checkpoint '%s': view broken: %s", v->ck->name, v->reason);
    pthread_mutex_unlock(&lv->lock);
    free(where);
    return -EIO;
  }
  struct reader me = {g0, g1, lv->rseq++, NULL, v->readers};
  if (v->readers)
    v->readers->prev = &me;
  v->readers = &me;
  bool fleece = false;
  for (uint64_t g = g0; g < g1; g++) {
    const uint64_t *e = fmap_get(&v->map, g);
    where[g - g0] = e && !(*e & COPYING) ? *e & ~DRAINING : NONE;
    fleece |= where[g - g0] != NONE;
  }
  if (fleece)
    v->fd_users++;
  int fd = v->fd;
  pthread_mutex_unlock(&lv->lock);

  int r = 0;
  uint64_t pos = off, end = off + len;
  while (pos < end && r == 0) {
    uint64_t g = pos >> lv->gshift;
    uint64_t gend = (g + 1) << lv->gshift;
    if (where[g - g0] != NONE) {
      uint64_t n = (gend < end ? gend : end) - pos;
      r = io_pread_zero(fd, (char *)buf + (pos - off), (size_t)n,
                        where[g - g0] + (pos - (g << lv->gshift)));
      if (r < 0)
        bd_set_error("checkpoint '%s': reading the fleece file: %s",
                     v->ck->name, strerror(-r));
      pos += n;
      continue;
    }
    /* A run of granules INNER still holds. */
    uint64_t h = g + 1;
    while (h < g1 && where[h - g0] == NONE)
      h++;
    uint64_t stop = h << lv->gshift;
    if (stop > end)
      stop = end;
    r = bd_pread(lv->inner, (char *)buf + (pos - off), stop - pos, pos);
    pos = stop;
  }
  free(where);

  pthread_mutex_lock(&lv->lock);
  if (me.prev)
    me.prev->next = me.next;
  else
    v->readers = me.next;
  if (me.next)
    me.next->prev = me.prev;
  if (fleece)
    fd_put(v);
  if (v->broken) {
    bd_set_error("checkpoint '%s': view broken: %s", v->ck->name, v->reason);
    r = -EIO;
  }
  lv_wake(lv);
  pthread_mutex_unlock(&lv->lock);
  return r;
}

/* base:allocation: INNER's answer (asked first), with the granules copied
 * by then as data: a granule INNER changed after the question was copied
 * before it changed. */
static int view_extents(struct bd *bd, uint64_t len, uint64_t off,
                        uint32_t flags, struct bd_extents *ext) {
  struct cview *v = bd->priv;
  struct live *lv = v->lv;
  struct bd_extents in;
  bd_extents_init(&in, off, ext->max);
  struct bd_req req = {.cmd = BD_BLOCK_STATUS,
                       .flags = flags & BD_F_REQ_ONE,
                       .offset = off,
                       .length = len,
                       .extents = &in};
  int r = bd_run(lv->inner, &req);
  uint64_t *cp = NULL;
  size_t ncp = 0;
  if (r == 0 && in.end > off) {
    pthread_mutex_lock(&lv->lock);
    if (v->broken) {
      bd_set_error("checkpoint '%s': view broken: %s", v->ck->name, v->reason);
      r = -EIO;
    } else {
      r = fmap_copied_in(&v->map, off >> lv->gshift,
                         ((in.end - 1) >> lv->gshift) + 1, &cp, &ncp);
    }
    pthread_mutex_unlock(&lv->lock);
  }
  uint64_t pos = off;
  size_t ci = 0;
  for (size_t i = 0; r == 0 && i < in.n; i++) {
    uint64_t eend = pos + in.v[i].length;
    while (pos < eend) {
      while (ci < ncp && (cp[ci] + 1) << lv->gshift <= pos)
        ci++;
      uint64_t cs = ci < ncp ? cp[ci] << lv->gshift : UINT64_MAX;
      int a;
      if (cs > pos) {
        uint64_t stop = cs < eend ? cs : eend;
        a = bd_extents_add(ext, stop - pos, in.v[i].flags, in.v[i].depth);
        pos = stop;
      } else {
        uint64_t ce = (cp[ci] + 1) << lv->gshift;
        ce = ce < eend ? ce : eend;
        a = bd_extents_add(ext, ce - pos, 0, 1);
        pos = ce;
      }
      if (a != 0 || (flags & BD_F_REQ_ONE)) {
        r = a < 0 ? a : 0;
        goto out;
      }
    }
  }
out:
  free(cp);
  bd_extents_free(&in);
  return r;
}

/* qemu:dirty-bitmap:PREV, from the frozen bitmap. */
static int view_context_extents(struct bd *bd, size_t ctx, uint64_t len,
                                uint64_t off, uint32_t flags,
                                struct bd_extents *ext) {
  struct cview *v = bd->priv;
  struct live *lv = v->lv;
  if (ctx != 0 || !v->prev || !v->prev->bm)
    return -EINVAL;
  const struct cbm *b = v->prev->bm;
  return bitrun_extents(cbm_word_of, b, b->nbits, lv->gshift, len, off, flags,
                        ext);
}

/* Under the lock: forget checkpoint C when nothing needs it any more. */
static void ckpt_gc(struct live *lv, struct ckpt *c) {
  if (c->view || c->bm)
    return;
  for (struct ckpt **p = &lv->ckpts; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      ckpt_free(c);
      return;
    }
}

static const struct bd_ops view_ops;

/* A view request on its way: to INNER (a read of granules INNER still
 * holds, registered as a reader) or to the view's pool twin. */
struct vreq {
  struct bd_req child; /* first: the child's done() finds the vreq */
  struct bd_req *parent;
  struct cview *v;
  struct reader rd;
  bool reader;
};

static void vreq_done(struct bd_req *child, int err) {
  struct vreq *q = (struct vreq *)child;
  struct bd_req *parent = q->parent;
  if (q->reader) {
    struct cview *v = q->v;
    struct live *lv = v->lv;
    pthread_mutex_lock(&lv->lock);
    if (q->rd.prev)
      q->rd.prev->next = q->rd.next;
    else
      v->readers = q->rd.next;
    if (q->rd.next)
      q->rd.next->prev = q->rd.prev;
    if (v->broken && err == 0) {
      bd_req_set_error(parent, "checkpoint '%s': view broken: %s", v->ck->name,
                       v->reason);
      err = -EIO;
    }
    lv_wake(lv);
    pthread_mutex_unlock(&lv->lock);
  }
  if (err < 0 && !parent->errmsg[0])
    memcpy(parent->errmsg, child->errmsg, sizeof parent->errmsg);
  free(q);
  bd_complete(parent, err);
}

/* Registers Q as a reader of granules INNER still holds all of, under the
 * lock; false (nothing done) when the view broke or holds one of them. */
static bool read_from_inner(struct cview *v, struct vreq *q) {
  struct live *lv = v->lv;
  const struct bd_req *p = q->parent;
  uint64_t g0 = p->offset >> lv->gshift;
  uint64_t g1 = ((p->offset + p->length - 1) >> lv->gshift) + 1;
  pthread_mutex_lock(&lv->lock);
  bool ok = !v->broken && !fmap_any(&v->map, g0, g1);
  if (ok) {
    q->rd = (struct reader){g0, g1, lv->rseq++, NULL, v->readers};
    if (v->readers)
      v->readers->prev = &q->rd;
    v->readers = &q->rd;
    q->reader = true;
  }
  pthread_mutex_unlock(&lv->lock);
  return ok;
}

/* Reads of granules INNER still holds (most of a view, most of the time)
 * go to INNER in the submitting thread, as the live device's do; the rest
 * runs on the pool through the twin. */
static void view_submit(struct bd *bd, struct bd_req *req) {
  struct cview *v = bd->priv;
  struct vreq *q = malloc(sizeof *q);
  if (!q) {
    bd_set_error("checkpoint: out of memory");
    bd_complete(req, -ENOMEM);
    return;
  }
  *q = (struct vreq){.parent = req, .v = v};
  q->child = (struct bd_req){.cmd = req->cmd,
                             .flags = req->flags,
                             .offset = req->offset,
                             .length = req->length,
                             .buf = req->buf,
                             .extents = req->extents,
                             .context = req->context,
                             .done = vreq_done};
  bool direct = req->cmd == BD_READ && req->length > 0 && read_from_inner(v, q);
  bd_submit(direct ? v->lv->inner : v->sync, &q->child);
}

static void view_close(struct bd *bd) {
  struct cview *v = bd->priv;
  if (!v) /* a take that failed */
    return;
  struct live *lv = v->lv;
  struct bd *twin = v->sync; /* no request in flight: nothing uses it */
  v->sync = NULL;
  twin->priv = NULL;
  bd_close(twin);
  pthread_mutex_lock(&lv->lock);
  for (struct cview **p = &lv->views; *p; p = &(*p)->next)
    if (*p == v) {
      *p = v->next;
      break;
    }
  if (!v->broken)
    atomic_fetch_sub(&lv->nviews, 1);
  v->closed = true;
  drop_fleece(v);
  v->ck->view = NULL;
  if (v->prev) { /* its bitmap was for this view only */
    free(v->prev->bm);
    v->prev->bm = NULL;
    ckpt_gc(lv, v->prev);
  }
  ckpt_gc(lv, v->ck);
  lv_wake(lv);
  bool last = view_unref(v);
  pthread_mutex_unlock(&lv->lock);
  if (last)
    lv_free(lv);
}

int ckpt_view_release(struct bd *bd) {
  if (!bd || bd->ops != &view_ops || !bd->priv)
    return -EINVAL;
  struct cview *v = bd->priv;
  struct live *lv = v->lv;
  pthread_mutex_lock(&lv->lock);
  if (!v->broken && !v->closed) {
    snprintf(v->reason, sizeof v->reason, "released");
    v->broken = true;
    atomic_fetch_sub(&lv->nviews, 1);
    drop_fleece(v);
    lv_wake(lv);
  }
  pthread_mutex_unlock(&lv->lock);
  return 0;
}

static const struct bd_ops view_ops = {
    .name = "checkpoint-view", .submit = view_submit, .close = view_close};
static const struct bd_ops view_sync_ops = {.name = "checkpoint-view-sync",
                                            .pread = view_pread,
                                            .extents = view_extents,
                                            .context_extents =
                                                view_context_extents};

/* The fleece file: unlinked from the start, so nothing outlives us. */
static int fleece_open(const char *dir) {
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0)
    return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
    return -errno;
  size_t n = strlen(dir) + 32;
  char *path = malloc(n);
  if (!path)
    return -ENOMEM;
  snprintf(path, n, "%s/blockport-fleece-XXXXXX", dir);
  fd = mkostemp(path, O_CLOEXEC);
  int err = errno;
  if (fd >= 0)
    unlink(path);
  free(path);
  return fd >= 0 ? fd : -err;
}

static int check_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0) {
    bd_set_error("a checkpoint name cannot be empty");
    return -EINVAL;
  }
  if (n > CKPT_NAME_MAX) {
    bd_set_error("checkpoint name of %zu bytes is longer than %d", n,
                 CKPT_NAME_MAX);
    return -EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c == 0x7f || c == '@') {
      bd_set_error("checkpoint name '%s' holds %s", name,
                   c == '@' ? "'@'" : "a control character");
      return -EINVAL;
    }
  }
  return 0;
}

static struct ckpt *ckpt_find(struct live *lv, const char *name) {
  for (struct ckpt *c = lv->ckpts; c; c = c->next)
    if (!strcmp(c->name, name))
      return c;
  return NULL;
}

static struct ckpt *ckpt_last(struct live *lv) {
  struct ckpt *c = lv->ckpts;
  while (c && c->next)
    c = c->next;
  return c;
}

/* Under the lock, which it releases: the end of a checkpoint's pause.
 * Returns the writes queued meanwhile. */
static struct lreq *unpause(struct live *lv) {
  struct lreq *q = lv->queued;
  lv->queued = NULL;
  lv->qtail = &lv->queued;
  atomic_store(&lv->paused, false);
  lv->taking = false;
  lv_wake(lv);
  pthread_mutex_unlock(&lv->lock);
  return q;
}

/* Writes submitted during the pause: after the checkpoint. */
static void readmit(struct live *lv, struct lreq *q) {
  while (q) {
    struct lreq *next = q->next;
    struct bd_req *req = q->req;
    free(q);
    write_admit(lv, req);
    q = next;
  }
}

int ckpt_take(struct bd *live, const char *name, struct bd **view) {
  *view = NULL;
  if (!ckpt_is_live(live)) {
    bd_set_error("checkpoints are taken on a live device (ckpt_live_open)");
    return -EINVAL;
  }
  struct live *lv = bd_filter_state(live);
  int r = check_name(name);
  if (r < 0)
    return r;
  if (live->caps.readonly) {
    bd_set_error("%s: the device is read-only: no checkpoint",
                 live->description);
    return -EROFS;
  }
  pthread_mutex_lock(&lv->lock);
  while (lv->taking)
    lv_wait(lv);
  if (ckpt_find(lv, name)) {
    pthread_mutex_unlock(&lv->lock);
    bd_set_error("checkpoint '%s' exists", name);
    return -EEXIST;
  }
  lv->taking = true;
  struct ckpt *prev = ckpt_last(lv);
  char *prev_name = prev ? strdup(prev->name) : NULL;
  pthread_mutex_unlock(&lv->lock);

  /* Everything that can fail, before writes pause. */
  struct ckpt *c = calloc(1, sizeof *c);
  struct cview *v = calloc(1, sizeof *v);
  struct cbm *bm = cbm_new(lv->ngran);
  size_t dn = strlen(live->description) + strlen(name) + 32;
  char *desc = malloc(dn);
  struct bd *vbd = NULL;
  int fd = -1;
  r = c && v && bm && desc && (!prev || prev_name) ? 0 : -ENOMEM;
  if (r == 0 && !(c->name = strdup(name)))
    r = -ENOMEM;
  if (r == 0) {
    snprintf(desc, dn, "%s@%s", live->description, name);
    if (!(vbd = bd_new(&view_ops, "checkpoint", desc)) ||
        !(v->sync = bd_new(&view_sync_ops, "checkpoint", desc)))
      r = -ENOMEM;
  }
  if (r == 0 && prev) {
    size_t pn = strlen(BD_CTX_BITMAP_PREFIX) + strlen(prev->name) + 1;
    char *ctx = malloc(pn);
    if (ctx) {
      snprintf(ctx, pn, "%s%s", BD_CTX_BITMAP_PREFIX, prev->name);
      r = bd_add_context(vbd, ctx);
      if (r == 0)
        r = bd_add_context(v->sync, ctx);
      free(ctx);
    } else {
      r = -ENOMEM;
    }
  }
  if (r < 0)
    bd_set_error("checkpoint '%s': out of memory", name);
  if (r == 0 && (fd = fleece_open(lv->fleece_dir)) < 0) {
    r = fd;
    bd_set_error("checkpoint '%s': cannot make a fleece file in %s: %s", name,
                 lv->fleece_dir, strerror(-r));
  }
  free(desc);
  if (r < 0) {
    if (fd >= 0)
      close(fd);
    bd_close(vbd);
    if (v)
      bd_close(v->sync);
    free(bm);
    free(v);
    if (c)
      free(c->name);
    free(c);
    free(prev_name);
    pthread_mutex_lock(&lv->lock);
    lv->taking = false;
    lv_wake(lv);
    pthread_mutex_unlock(&lv->lock);
    return r;
  }
  c->prev = prev_name;
  c->bm = bm;
  c->view = v;
  v->lv = lv;
  v->ck = c;
  v->prev = prev;
  v->refs = 1;
  v->fd = fd;
  vbd->priv = v;
  vbd->size = live->size;
  struct bd_caps ic = lv->inner->caps;
  vbd->caps = (struct bd_caps){.readonly = true,
                               .can_extents = true,
                               .multi_conn = true,
                               .transient_eio = ic.transient_eio,
                               .aligned_only = ic.aligned_only,
                               .contexts_nowait = true,
                               .min_block = ic.min_block,
                               .pref_block = ic.pref_block,
                               .max_block = ic.max_block};
  vbd->exec = BD_EXEC_ASYNC;
  vbd->conc = BD_CONC_PARALLEL;
  v->sync->priv = v;
  v->sync->size = vbd->size;
  v->sync->caps = vbd->caps;
  v->sync->exec = BD_EXEC_POOL;
  v->sync->conc = BD_CONC_PARALLEL;

  /* The instant: no write in flight, new ones queued. */
  atomic_store(&lv->paused, true);
  pthread_mutex_lock(&lv->lock);
  while (atomic_load(&lv->inflight) > 0)
    lv_wait(lv);
  if (lv->persist) { /* writes stay queued while INNER's bitmaps switch */
    pthread_mutex_unlock(&lv->lock);
    r = persist_switch(lv, prev, name);
    pthread_mutex_lock(&lv->lock);
  }
  if (r < 0) {
    c->view = NULL;
    v->fd = -1;
    vbd->priv = NULL; /* view_close() then has nothing to drop */
    v->sync->priv = NULL;
    readmit(lv, unpause(lv));
    close(fd);
    bd_close(vbd);
    bd_close(v->sync);
    free(bm);
    free(v);
    free(c->name);
    free(c);
    free(prev_name);
    return r;
  }
  c->persistent = lv->persist;
  struct ckpt **tail = &lv->ckpts;
  while (*tail)
    tail = &(*tail)->next;
  *tail = c;
  atomic_store(&lv->rec, bm); /* the previous one is frozen */
  v->next = lv->views;
  lv->views = v;
  lv->refs++;
  atomic_fetch_add(&lv->nviews, 1);
  readmit(lv, unpause(lv));
  *view = vbd;
  return 0;
}

/* ---- listing ---- */

int ckpt_list(struct bd *live, struct ckpt_info **out, size_t *n,
              uint64_t *fleece_used) {
  *out = NULL;
  *n = 0;
  if (!ckpt_is_live(live)) {
    bd_set_error("not a live device");
    return -EINVAL;
  }
  struct live *lv = bd_filter_state(live);
  pthread_mutex_lock(&lv->lock);
  size_t k = 0;
  for (struct ckpt *c = lv->ckpts; c; c = c->next)
    k++;
  struct ckpt_info *v = calloc(k ? k : 1, sizeof *v);
  int r = v ? 0 : -ENOMEM;
  size_t i = 0;
  struct cbm *rec = atomic_load(&lv->rec);
  for (struct ckpt *c = lv->ckpts; c && r == 0; c = c->next, i++) {
    struct ckpt_info *f = &v[i];
    if (!(f->name = strdup(c->name)) ||
        (c->prev && !(f->prev = strdup(c->prev))))
      r = -ENOMEM;
    f->view_open = c->view != NULL;
    if (c->view) {
      f->broken = c->view->broken;
      f->fleece = c->view->fleece;
      f->granules = c->view->map.n;
      if (f->broken && !(f->reason = strdup(c->view->reason)))
        r = -ENOMEM;
    }
    f->has_bitmap = c->bm != NULL;
    f->recording = c->bm && c->bm == rec;
    if (c->bm) {
      uint64_t bits = cbm_count(c->bm);
      f->dirty = bits * lv->gran;
      if (bits && cbm_bit(c->bm, lv->ngran - 1))
        f->dirty -= lv->gran - glen(lv, lv->ngran - 1);
    }
  }
  if (fleece_used)
    *fleece_used = lv->used;
  pthread_mutex_unlock(&lv->lock);
  if (r < 0) {
    ckpt_info_free(v, k);
    bd_set_error("out of memory");
    return r;
  }
  if (k == 0) {
    free(v);
    v = NULL;
  }
  *out = v;
  *n = k;
  return 0;
}

void ckpt_info_free(struct ckpt_info *v, size_t n) {
  if (!v)
    return;
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].prev);
    free(v[i].reason);
  }
  free(v);
}
