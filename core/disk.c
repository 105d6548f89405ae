/* SPDX-License-Identifier: BSD-3-Clause */
/* Byte-granular requests over a block device: see disk.h. */
#include "disk.h"

#include "source.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct disk_piece {
  struct bd_req req; /* first: completions find the piece */
  struct disk_req *r;
};

enum phase {
  PH_PIECES,      /* the request's own pieces: done when they are */
  PH_READ_BOUNCE, /* aligned read into the bounce buffer, then copy out */
  PH_RMW_READ,    /* partial edge blocks read; write them back next */
};

static bool is_write(enum bd_cmd cmd) {
  return cmd == BD_WRITE || cmd == BD_ZERO || cmd == BD_TRIM;
}

static uint64_t align_down(const struct disk *d, uint64_t x) {
  return x - x % d->align;
}

/* Rounded up, but never past the end of the disk (whose size need not be a
 * multiple of the block). */
static uint64_t align_up(const struct disk *d, uint64_t x) {
  uint64_t r = x % d->align;
  uint64_t up = r ? x + (d->align - r) : x;
  return up < d->size ? up : (x > d->size ? x : d->size);
}

/* Bounce buffers start on a page, so that a device reading or writing
 * with O_DIRECT takes them as they are. */
static uint8_t *bounce_alloc(size_t len) {
  void *p = NULL;
  return posix_memalign(&p, 4096, len ? len : 1) == 0 ? p : NULL;
}

/* ---- range locks (align > 1 only) ---- */

static bool overlaps(const struct disk_req *a, const struct disk_req *b) {
  return a->lstart < b->lend && b->lstart < a->lend;
}

/* Does R overlap anything on LIST before STOP? */
static bool conflicts(const struct disk_req *list, const struct disk_req *stop,
                      const struct disk_req *r) {
  for (const struct disk_req *p = list; p && p != stop; p = p->lnext)
    if (overlaps(p, r))
      return true;
  return false;
}

/* Take the lock on [lstart, lend), or queue R behind whoever holds an
 * overlapping one (and behind earlier waiters, so nobody starves).
 * Returns false when R was queued: lock_release() starts it later. */
static bool lock_acquire(struct disk *d, struct disk_req *r) {
  pthread_mutex_lock(&d->lock);
  bool wait = conflicts(d->locked, NULL, r) || conflicts(d->waiting, NULL, r);
  r->lnext = NULL;
  if (wait) {
    struct disk_req **pp = &d->waiting;
    while (*pp)
      pp = &(*pp)->lnext;
    *pp = r;
  } else {
    r->lnext = d->locked;
    d->locked = r;
  }
  pthread_mutex_unlock(&d->lock);
  return !wait;
}

static void write_start(struct disk *d, struct disk_req *r);

static void lock_release(struct disk *d, struct disk_req *r) {
  struct disk_req *ready = NULL, **tail = &ready;
  pthread_mutex_lock(&d->lock);
  struct disk_req **pp = &d->locked;
  while (*pp != r)
    pp = &(*pp)->lnext;
  *pp = r->lnext;
  /* Waiters, in order, that now overlap nobody ahead of them. */
  pp = &d->waiting;
  while (*pp) {
    struct disk_req *w = *pp;
    if (conflicts(d->locked, NULL, w) || conflicts(d->waiting, w, w)) {
      pp = &w->lnext;
      continue;
    }
    *pp = w->lnext;
    w->lnext = d->locked;
    d->locked = w;
    w->rnext = NULL;
    *tail = w;
    tail = &w->rnext;
  }
  pthread_mutex_unlock(&d->lock);
  while (ready) {
    struct disk_req *w = ready;
    ready = w->rnext;
    write_start(d, w);
  }
}

/* ---- completion ---- */

static void finish(struct disk_req *r, int err) {
  struct disk *d = r->disk;
  free(r->bounce);
  r->bounce = NULL;
  if (d->align > 1 && (r->cmd == BD_WRITE || r->cmd == BD_ZERO))
    lock_release(d, r);
  if (err == 0 && is_write(r->cmd))
    atomic_fetch_add(&d->writes, 1);
  if (err < 0 && !r->errmsg[0]) /* failed here, not in the device */
    snprintf(r->errmsg, sizeof r->errmsg, "%s", strerror(-err));
  r->done(r, err);
}

static void one_done(struct bd_req *req, int err) {
  struct disk_req *r =
      (struct disk_req *)((char *)req - offsetof(struct disk_req, one));
  if (err < 0)
    memcpy(r->errmsg, req->errmsg, sizeof r->errmsg);
  finish(r, err);
}

static void submit_one(struct disk_req *r, uint64_t off, uint64_t len) {
  r->one = (struct bd_req){.cmd = r->cmd,
                           .flags = r->flags | BD_F_ALIGNED,
                           .offset = off,
                           .length = len,
                           .buf = r->buf,
                           .extents = r->extents,
                           .done = one_done};
  bd_submit(r->disk->bd, &r->one);
}

/* ---- pieces: several device requests that complete together ---- */

static void rmw_write(struct disk_req *r);

static void phase_end(struct disk_req *r) {
  int err = atomic_load(&r->err);
  free(r->pieces);
  r->pieces = NULL;
  if (err < 0) {
    finish(r, err);
    return;
  }
  switch (r->phase) {
  case PH_READ_BOUNCE:
    memcpy(r->buf, r->bounce + (r->offset - r->lstart), r->length);
    finish(r, 0);
    return;
  case PH_RMW_READ: rmw_write(r); return;
  default: finish(r, 0);
  }
}

static void piece_put(struct disk_req *r) {
  if (atomic_fetch_sub(&r->pending, 1) == 1)
    phase_end(r);
}

static void piece_done(struct bd_req *req, int err) {
  struct disk_req *r = ((struct disk_piece *)req)->r;
  int none = 0;
  /* The first failure says why: its message is written before the last
   * piece_put() makes it visible to the thread that finishes R. */
  if (err < 0 && atomic_compare_exchange_strong(&r->err, &none, err))
    memcpy(r->errmsg, req->errmsg, sizeof r->errmsg);
  piece_put(r);
}

/* Reads and writes are cut at the device's maximum; the others (zero)
 * go in one piece. */
static uint64_t split_max(const struct disk *d, enum bd_cmd cmd) {
  return cmd == BD_READ || cmd == BD_WRITE ? d->maxio : 0;
}

static size_t pieces_for(const struct disk *d, enum bd_cmd cmd, uint64_t len) {
  return bd_split_count(len, split_max(d, cmd));
}

static int plan(struct disk_req *r, enum phase phase, size_t cap) {
  r->phase = phase;
  r->npieces = 0;
  r->pieces = calloc(cap ? cap : 1, sizeof *r->pieces);
  return r->pieces ? 0 : -ENOMEM;
}

/* Add a range, split at the device's maximum for reads and writes. */
static void plan_add(struct disk_req *r, enum bd_cmd cmd, uint32_t flags,
                     uint64_t off, uint64_t len, uint8_t *buf) {
  uint64_t max = split_max(r->disk, cmd);
  size_t n = bd_split_count(len, max);
  for (size_t i = 0; i < n; i++) {
    struct bd_split p = bd_split_piece(off, len, max, i);
    r->pieces[r->npieces++] =
        (struct disk_piece){.req = {.cmd = cmd,
                                    .flags = flags | BD_F_ALIGNED,
                                    .offset = p.offset,
                                    .length = p.length,
                                    .buf = buf ? buf + p.skip : NULL,
                                    .done = piece_done},
                            .r = r};
  }
}

/* Submit every piece.  The extra count keeps the phase open (and the
 * array alive) until the last one is submitted. */
static void plan_launch(struct disk_req *r) {
  size_t n = r->npieces;
  atomic_store(&r->pending, (int)n + 1);
  for (size_t i = 0; i < n; i++)
    bd_submit(r->disk->bd, &r->pieces[i].req);
  piece_put(r);
}

/* ---- reads ---- */

static void read_start(struct disk *d, struct disk_req *r) {
  uint64_t end = r->offset + r->length;
  uint64_t s = align_down(d, r->offset), e = align_up(d, end);
  bool aligned = s == r->offset && e == end;
  if (aligned && r->length <= d->maxio) {
    submit_one(r, r->offset, r->length);
    return;
  }
  uint8_t *dst = r->buf;
  enum phase ph = PH_PIECES;
  if (!aligned) {
    r->lstart = s;
    r->bounce = bounce_alloc(e - s);
    dst = r->bounce;
    ph = PH_READ_BOUNCE;
  }
  if ((!aligned && !r->bounce) || plan(r, ph, pieces_for(d, BD_READ, e - s))) {
    finish(r, -ENOMEM);
    return;
  }
  plan_add(r, BD_READ, 0, s, e - s, dst);
  plan_launch(r);
}

/* ---- writes and zeroes ---- */

/* The partial blocks at the edges of R: [hs, he) when the start is not
 * aligned, [ts, te) when the end is not (and it is another block). */
struct edges {
  bool head, tail;
  uint64_t hs, he, ts, te;
};

static struct edges edges_of(const struct disk *d, const struct disk_req *r) {
  uint64_t end = r->offset + r->length;
  struct edges g = {0};
  g.hs = align_down(d, r->offset);
  g.he = align_up(d, g.hs + 1);
  g.head = g.hs != r->offset;
  g.te = align_up(d, end);
  g.ts = align_down(d, end);
  if (g.ts == g.te) /* end at the (unaligned) end of the disk */
    g.ts = align_down(d, end - 1);
  g.tail = g.te != end && !(g.head && g.ts == g.hs);
  return g;
}

/* The bounce buffer of a read-modify-write: for a write the whole aligned
 * range; for a zero just the edge blocks (head first). */
static uint8_t *edge_buf(struct disk_req *r, const struct edges *g, bool head) {
  if (r->cmd == BD_WRITE)
    return r->bounce + ((head ? g->hs : g->ts) - r->lstart);
  return r->bounce + (head || !g->head ? 0 : r->disk->align);
}

static void write_start(struct disk *d, struct disk_req *r) {
  struct edges g = edges_of(d, r);
  if (!g.head && !g.tail) {
    if (r->cmd == BD_ZERO || r->length <= d->maxio) {
      submit_one(r, r->offset, r->length);
      return;
    }
    if (plan(r, PH_PIECES, pieces_for(d, BD_WRITE, r->length)) < 0) {
      finish(r, -ENOMEM);
      return;
    }
    plan_add(r, BD_WRITE, r->flags, r->offset, r->length, r->buf);
    plan_launch(r);
    return;
  }
  /* Read the partial blocks first. */
  size_t blen = r->cmd == BD_WRITE ? r->lend - r->lstart : 2 * d->align;
  r->bounce = bounce_alloc(blen);
  if (!r->bounce || plan(r, PH_RMW_READ, 2) < 0) {
    finish(r, -ENOMEM);
    return;
  }
  if (g.head)
    plan_add(r, BD_READ, 0, g.hs, g.he - g.hs, edge_buf(r, &g, true));
  if (g.tail)
    plan_add(r, BD_READ, 0, g.ts, g.te - g.ts, edge_buf(r, &g, false));
  plan_launch(r);
}

/* The edge blocks are in: patch them and write everything back. */
static void rmw_write(struct disk_req *r) {
  struct disk *d = r->disk;
  struct edges g = edges_of(d, r);
  uint64_t end = r->offset + r->length;
  if (r->cmd == BD_WRITE) {
    memcpy(r->bounce + (r->offset - r->lstart), r->buf, r->length);
    if (plan(r, PH_PIECES, pieces_for(d, BD_WRITE, r->lend - r->lstart)) < 0)
      goto nomem;
    plan_add(r, BD_WRITE, r->flags, r->lstart, r->lend - r->lstart, r->bounce);
    plan_launch(r);
    return;
  }
  /* Zero: the edge blocks with their part zeroed, the aligned middle with
   * the device's own zeroing. */
  uint32_t wflags = r->flags & BD_F_FUA;
  if (plan(r, PH_PIECES, 3) < 0)
    goto nomem;
  if (g.head) {
    uint8_t *b = edge_buf(r, &g, true);
    uint64_t zend = end < g.he ? end : g.he;
    memset(b + (r->offset - g.hs), 0, zend - r->offset);
    plan_add(r, BD_WRITE, wflags, g.hs, g.he - g.hs, b);
  }
  if (g.tail) {
    uint8_t *b = edge_buf(r, &g, false);
    uint64_t zstart = r->offset > g.ts ? r->offset : g.ts;
    memset(b + (zstart - g.ts), 0, end - zstart);
    plan_add(r, BD_WRITE, wflags, g.ts, g.te - g.ts, b);
  }
  uint64_t ms = g.head ? g.he : r->offset, me = g.tail ? g.ts : end;
  if (ms < me)
    plan_add(r, BD_ZERO, r->flags, ms, me - ms, NULL);
  plan_launch(r);
  return;
nomem:
  finish(r, -ENOMEM);
}

/* ---- entry points ---- */

int disk_init(struct disk *d, struct bd *bd) {
  memset(d, 0, sizeof *d);
  uint32_t a = bd->caps.min_block ? bd->caps.min_block : 1;
  if (a > DISK_MAX_ALIGN) {
    bd_set_error("%s: a minimum block size of %u bytes is not supported "
                 "(at most %u)",
                 bd->description, a, DISK_MAX_ALIGN);
    return -EINVAL;
  }
  uint64_t m = bd->caps.max_block ? bd->caps.max_block : BD_MAX_IO;
  if (m > BD_MAX_IO)
    m = BD_MAX_IO;
  m -= m % a;
  d->bd = bd;
  d->size = bd->size;
  d->align = a;
  d->maxio = m < a ? a : (uint32_t)m;
  atomic_init(&d->writes, 0);
  pthread_mutex_init(&d->lock, NULL);
  return 0;
}

void disk_fini(struct disk *d) {
  pthread_mutex_destroy(&d->lock);
}

void disk_submit(struct disk *d, struct disk_req *r) {
  uint64_t end = r->offset + r->length;
  r->disk = d;
  r->pieces = NULL;
  r->bounce = NULL;
  r->errmsg[0] = 0;
  atomic_init(&r->err, 0);
  switch (r->cmd) {
  case BD_READ: read_start(d, r); return;
  case BD_WRITE:
  case BD_ZERO:
    if (d->align > 1) {
      r->lstart = align_down(d, r->offset);
      r->lend = align_up(d, end);
      if (!lock_acquire(d, r))
        return; /* started when the overlapping request finishes */
    }
    write_start(d, r);
    return;
  case BD_TRIM: {
    /* Advisory: only the whole blocks inside the range. */
    uint64_t s = align_up(d, r->offset);
    uint64_t e = end == d->size ? end : align_down(d, end);
    if (s >= e)
      finish(r, 0);
    else
      submit_one(r, s, e - s);
    return;
  }
  case BD_BLOCK_STATUS: {
    uint64_t s = align_down(d, r->offset);
    bd_extents_reset(r->extents, s, r->extents->max);
    submit_one(r, s, align_up(d, end) - s);
    return;
  }
  default: submit_one(r, r->offset, r->length);
  }
}

struct waiter {
  struct disk_req r; /* first */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
};

static void waiter_done(struct disk_req *r, int err) {
  struct waiter *w = (struct waiter *)r;
  pthread_mutex_lock(&w->lock);
  w->done = true;
  w->err = err;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

int disk_run(struct disk *d, struct disk_req *r) {
  struct waiter w = {.r = *r};
  w.r.done = waiter_done;
  pthread_mutex_init(&w.lock, NULL);
  pthread_cond_init(&w.cond, NULL);
  disk_submit(d, &w.r);
  pthread_mutex_lock(&w.lock);
  while (!w.done)
    pthread_cond_wait(&w.cond, &w.lock);
  pthread_mutex_unlock(&w.lock);
  pthread_cond_destroy(&w.cond);
  pthread_mutex_destroy(&w.lock);
  if (w.err < 0) /* for this thread's caller (the convention of run) */
    bd_set_error("%s", w.r.errmsg);
  return w.err;
}

int disk_pread(struct disk *d, void *buf, uint64_t len, uint64_t off) {
  struct disk_req r = {
      .cmd = BD_READ, .offset = off, .length = len, .buf = buf};
  return disk_run(d, &r);
}

/* ---- the core's aligner: a device that takes aligned requests only ---- */

struct aligned {
  struct disk_req r; /* first: the completion finds the rest */
  struct bd_req *orig;
};

bool disk_wants(const struct bd *bd, const struct bd_req *req) {
  const struct disk *d = bd->aligner;
  if (!d || (req->flags & BD_F_ALIGNED))
    return false; /* REQ's range was checked (core/pipeline.c) */
  switch (req->cmd) {
  case BD_WRITE:
  case BD_ZERO: return true; /* all of them: under the range lock */
  case BD_READ:
    return (req->offset | req->length) % d->align != 0 ||
           req->length > d->maxio;
  default: return false; /* trim, block status and flush take any range */
  }
}

static void aligned_done(struct disk_req *r, int err) {
  struct aligned *a = (struct aligned *)r;
  struct bd_req *orig = a->orig;
  if (err < 0)
    memcpy(orig->errmsg, r->errmsg, sizeof orig->errmsg);
  free(a);
  bd_complete(orig, err);
}

void disk_submit_for(struct bd *bd, struct bd_req *req) {
  struct aligned *a = malloc(sizeof *a);
  if (!a) {
    bd_req_set_error(req, "out of memory");
    bd_complete(req, -ENOMEM);
    return;
  }
  a->orig = req;
  a->r = (struct disk_req){.cmd = req->cmd,
                           .flags = req->flags,
                           .offset = req->offset,
                           .length = req->length,
                           .buf = req->buf,
                           .done = aligned_done};
  disk_submit(bd->aligner, &a->r);
}

int disk_run_for(struct bd *bd, struct bd_req *req) {
  struct disk_req r = {.cmd = req->cmd,
                       .flags = req->flags,
                       .offset = req->offset,
                       .length = req->length,
                       .buf = req->buf};
  return disk_run(bd->aligner, &r);
}
