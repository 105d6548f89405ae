/* SPDX-License-Identifier: BSD-3-Clause */
/* Copying ranges between images with many requests in flight
 * (layer-copy.h).  Each slot reads a chunk from the source (and in
 * compare mode the same range of the image to compare with), then writes
 * it, or the runs of grains that differ, one after another. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "layer-copy.h"
#include "progress.h"

#define CHUNK (2u << 20) /* bytes per request */
#define MAX_ZERO (1ull << 30)
#define WALK (1ull << 30) /* block status asked per step */

enum phase { READ_SRC, READ_CMP, WRITING };

struct lcopy_slot {
  struct bd_req req; /* first: completions find the slot */
  struct lcopy *c;
  uint8_t *buf, *cbuf;
  enum phase phase;
  bool data; /* a copy of data (else a zero write) */
  uint64_t start, len, pos;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool all_zero(const uint8_t *p, uint64_t n) {
  return n == 0 || (p[0] == 0 && !memcmp(p, p + 1, n - 1));
}

/* The end of the grain POS is in, or END. */
static uint64_t grain_end(const struct lcopy *c, uint64_t pos, uint64_t end) {
  uint64_t e = (pos / c->grain + 1) * c->grain;
  return e < end ? e : end;
}

static bool same_at(const struct lcopy_slot *s, uint64_t a, uint64_t b) {
  return !memcmp(s->buf + (a - s->start), s->cbuf + (a - s->start), b - a);
}

/* The next run of grains from S->pos on where source and comparison
 * differ, as [*A, *B); false when none is left. */
static bool next_diff(const struct lcopy_slot *s, uint64_t *a, uint64_t *b) {
  uint64_t pos = s->pos, end = s->start + s->len;
  while (pos < end && same_at(s, pos, grain_end(s->c, pos, end)))
    pos = grain_end(s->c, pos, end);
  if (pos == end)
    return false;
  *a = pos;
  while (pos < end && !same_at(s, pos, grain_end(s->c, pos, end)))
    pos = grain_end(s->c, pos, end);
  *b = pos;
  return true;
}

/* Submit the next write of S; false when S has written everything. */
static bool write_next(struct lcopy_slot *s) {
  struct lcopy *c = s->c;
  uint64_t a = s->pos, b = s->start + s->len;
  if (a >= b || (c->compare && !next_diff(s, &a, &b)))
    return false;
  uint8_t *p = s->buf + (a - s->start);
  bool zero = c->compare && all_zero(p, b - a);
  s->phase = WRITING;
  s->pos = b;
  s->req = (struct bd_req){.cmd = zero ? BD_ZERO : BD_WRITE,
                           .flags = zero ? c->zero_flags : 0,
                           .offset = a,
                           .length = b - a,
                           .buf = p,
                           .done = s->req.done};
  bd_submit(c->dst, &s->req);
  return true;
}

/* Compare mode, the source read: read what CMP has there (zeroes past its
 * end, or without one).  False when there is nothing to read. */
static bool read_cmp(struct lcopy_slot *s) {
  struct lcopy *c = s->c;
  uint64_t csize = c->cmp ? c->cmp->size : 0;
  uint64_t have = s->start >= csize           ? 0
                  : csize - s->start < s->len ? csize - s->start
                                              : s->len;
  memset(s->cbuf + have, 0, s->len - have);
  if (have == 0)
    return false;
  s->phase = READ_CMP;
  s->req = (struct bd_req){.cmd = BD_READ,
                           .offset = s->start,
                           .length = have,
                           .buf = s->cbuf,
                           .done = s->req.done};
  bd_submit(c->cmp, &s->req);
  return true;
}

static const char *phase_name(const struct lcopy_slot *s) {
  return s->phase == READ_SRC   ? "read"
         : s->phase == READ_CMP ? "read of the new backing file"
                                : "write";
}

static void slot_done(struct bd_req *req, int err) {
  struct lcopy_slot *s = (struct lcopy_slot *)req;
  struct lcopy *c = s->c;
  if (err == 0 && s->phase == READ_SRC && c->compare && s->data && read_cmp(s))
    return;
  if (err == 0 && s->data && write_next(s))
    return;
  pthread_mutex_lock(&c->lock);
  if (err < 0 && c->err == 0) {
    c->err = err;
    snprintf(c->errmsg, sizeof c->errmsg, "%s at offset %llu: %s",
             phase_name(s), (unsigned long long)req->offset, req->errmsg);
  }
  if (err == 0)
    c->done += s->len;
  c->free[c->nfree++] = s;
  pthread_cond_signal(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

/* A free slot, once the rate limit allows LEN more bytes; NULL after an
 * error. */
static struct lcopy_slot *get_slot(struct lcopy *c, uint64_t len) {
  if (c->rate) {
    uint64_t due = c->t0_ns + c->submitted * 1000000000ull / c->rate;
    uint64_t now = now_ns();
    if (due > now) {
      struct timespec ts = {(time_t)((due - now) / 1000000000ull),
                            (long)((due - now) % 1000000000ull)};
      nanosleep(&ts, NULL);
    }
    c->submitted += len;
  }
  pthread_mutex_lock(&c->lock);
  while (c->nfree == 0)
    pthread_cond_wait(&c->cond, &c->lock);
  struct lcopy_slot *s = c->err ? NULL : c->free[--c->nfree];
  pthread_mutex_unlock(&c->lock);
  return s;
}

int lcopy_start(struct lcopy *c) {
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  c->chunk = c->grain > CHUNK ? c->grain : CHUNK;
  c->nslots =
      c->slots_max && c->slots_max < LCOPY_SLOTS ? c->slots_max : LCOPY_SLOTS;
  c->slots = calloc(c->nslots, sizeof *c->slots);
  if (!c->slots)
    return -ENOMEM;
  c->t0_ns = now_ns();
  for (unsigned i = 0; i < c->nslots; i++) {
    struct lcopy_slot *s = &c->slots[i];
    s->c = c;
    /* Page-aligned for -t none (O_DIRECT). */
    void *p = NULL, *q = NULL;
    if (posix_memalign(&p, 4096, c->chunk) ||
        (c->compare && posix_memalign(&q, 4096, c->chunk))) {
      free(p);
      c->nslots = c->nfree; /* what lcopy_finish() waits for */
      return -ENOMEM;
    }
    s->buf = p;
    s->cbuf = q;
    c->free[c->nfree++] = s;
  }
  return 0;
}

int lcopy_data(struct lcopy *c, uint64_t off, uint64_t len) {
  while (len > 0) {
    uint64_t n = c->chunk - off % c->chunk;
    n = len < n ? len : n;
    struct lcopy_slot *s = get_slot(c, n);
    if (!s)
      return c->err;
    s->phase = READ_SRC;
    s->data = true;
    s->start = s->pos = off;
    s->len = n;
    s->req = (struct bd_req){.cmd = BD_READ,
                             .offset = off,
                             .length = n,
                             .buf = s->buf,
                             .done = slot_done};
    bd_submit(c->src, &s->req);
    off += n;
    len -= n;
  }
  return 0;
}

/* One zero write of [OFF, OFF+LEN) on DST, through a slot. */
static int zero_range(struct lcopy *c, uint64_t off, uint64_t len) {
  while (len > 0) {
    uint64_t n = len < MAX_ZERO ? len : MAX_ZERO;
    struct lcopy_slot *s = get_slot(c, 0);
    if (!s)
      return c->err;
    s->data = false; /* done when the zero write is */
    s->phase = WRITING;
    s->start = s->pos = off;
    s->len = n;
    s->req = (struct bd_req){.cmd = BD_ZERO,
                             .flags = c->zero_flags,
                             .offset = off,
                             .length = n,
                             .done = slot_done};
    bd_submit(c->dst, &s->req);
    off += n;
    len -= n;
  }
  return 0;
}

/* Compare mode: where CMP does not read as zeroes in [OFF, OFF+LEN). */
static int zero_where_cmp_differs(struct lcopy *c, uint64_t off, uint64_t len) {
  uint64_t csize = c->cmp ? c->cmp->size : 0;
  uint64_t stop = off + len, end = stop < csize ? stop : csize;
  end = end < off ? off : end; /* all of it past CMP's end */
  struct bd_extents ext;
  bd_extents_init(&ext, off, 256);
  int r = 0;
  while (r == 0 && off < end) {
    bd_extents_reset(&ext, off, 256);
    struct bd_req bs = {.cmd = BD_BLOCK_STATUS,
                        .offset = off,
                        .length = end - off,
                        .extents = &ext};
    r = bd_run(c->cmp, &bs);
    if (r < 0)
      snprintf(c->errmsg, sizeof c->errmsg,
               "block status of the new backing file: %s", bs.errmsg);
    if (r == 0 && ext.n == 0)
      r = -EIO;
    for (size_t i = 0; r == 0 && i < ext.n && off < end; i++) {
      uint64_t n = ext.v[i].length < end - off ? ext.v[i].length : end - off;
      if (!(ext.v[i].flags & BD_EXT_ZERO))
        r = zero_range(c, off, n);
      else
        lcopy_skip(c, n);
      off += n;
    }
  }
  bd_extents_free(&ext);
  if (r == 0)
    lcopy_skip(c, stop - end); /* zeroes there on both sides */
  return r;
}

int lcopy_zero(struct lcopy *c, uint64_t off, uint64_t len) {
  return c->compare ? zero_where_cmp_differs(c, off, len)
                    : zero_range(c, off, len);
}

void lcopy_skip(struct lcopy *c, uint64_t len) {
  pthread_mutex_lock(&c->lock);
  c->done += len;
  pthread_mutex_unlock(&c->lock);
}

uint64_t lcopy_done(struct lcopy *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t d = c->done;
  pthread_mutex_unlock(&c->lock);
  return d;
}

int lcopy_finish(struct lcopy *c) {
  pthread_mutex_lock(&c->lock);
  while (c->nfree < c->nslots)
    pthread_cond_wait(&c->cond, &c->lock);
  int r = c->err;
  pthread_mutex_unlock(&c->lock);
  for (unsigned i = 0; c->slots && i < c->nslots; i++) {
    free(c->slots[i].buf);
    free(c->slots[i].cbuf);
  }
  free(c->slots);
  c->slots = NULL;
  pthread_cond_destroy(&c->cond);
  pthread_mutex_destroy(&c->lock);
  return r;
}

/* One step's extents, from OFF. */
static int copy_picked(struct lcopy *c, const struct bd_extents *ext,
                       uint64_t off, lcopy_pick_fn *pick, const void *opaque,
                       struct progress *prog, uint64_t size) {
  int r = 0;
  for (size_t i = 0; r == 0 && i < ext->n; i++) {
    const struct bd_extent *e = &ext->v[i];
    if (!pick(opaque, e->depth))
      lcopy_skip(c, e->length);
    else if (e->flags & BD_EXT_ZERO)
      r = lcopy_zero(c, off, e->length);
    else
      r = lcopy_data(c, off, e->length);
    off += e->length;
    progress_at(prog, lcopy_done(c), size);
  }
  return r;
}

/* Block status of [OFF, OFF+LEN) into EXT, with the message on failure. */
static int walk_step(struct bd *walked, const char *cmd, const char *bs_what,
                     struct bd_extents *ext, uint64_t off, uint64_t len) {
  bd_extents_reset(ext, off, 1024);
  struct bd_req bs = {
      .cmd = BD_BLOCK_STATUS, .offset = off, .length = len, .extents = ext};
  int r = bd_run(walked, &bs);
  if (r < 0 && bs_what)
    cli_error(cmd, NULL, "%s: %s", bs_what, bs.errmsg);
  else if (r < 0)
    cli_error(cmd, NULL, "block status at offset %llu: %s",
              (unsigned long long)off, bs.errmsg);
  else if (ext->n == 0 || ext->end > walked->size) {
    /* An answer that covers nothing or runs past the end: no progress to
     * be made from it. */
    cli_error(cmd, NULL, "block status at offset %llu: no usable extent",
              (unsigned long long)off);
    r = -EIO;
  }
  return r;
}

int lcopy_walk(struct lcopy *c, struct bd *walked, const char *cmd,
               const char *bs_what, lcopy_pick_fn *pick, const void *opaque,
               struct progress *prog) {
  int r = lcopy_start(c);
  struct bd_extents ext;
  bd_extents_init(&ext, 0, 1024);
  uint64_t off = 0, size = walked->size;
  while (r == 0 && off < size) {
    uint64_t len = size - off < WALK ? size - off : WALK;
    r = walk_step(walked, cmd, bs_what, &ext, off, len);
    if (r == 0)
      r = copy_picked(c, &ext, off, pick, opaque, prog, size);
    off = ext.end;
  }
  bd_extents_free(&ext);
  int f = lcopy_finish(c);
  if (f < 0 && r == 0)
    cli_error(cmd, NULL, "%s", c->errmsg);
  return r < 0 ? r : f;
}
