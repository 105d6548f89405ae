/* SPDX-License-Identifier: BSD-3-Clause */
/* Persistent bitmaps started, stopped and read while the image is written:
 * the bd_ops bitmap_* of a qcow2 image (core/blockdev.h), for the
 * checkpoints of `serve --control` (core/checkpoint.h).
 *
 * Starting a bitmap adds it to the directory at once, as QEMU's
 * block-dirty-bitmap-add with persistent=on does at close, but durably
 * before any write it records: a table of zero entries (all clean) in new
 * clusters, a new directory with the entry appended (QEMU's order:
 * creation), flags AUTO and IN_USE, then the header switched to it (one
 * write of the bitmaps extension, or the extensions rebuilt with the
 * autoclear bit off meanwhile, bitmap-edit.c), then the old directory
 * freed.  A crash before the switch leaks the new clusters; after it,
 * the bitmap is there and inconsistent.  From then on dirty-bitmaps.c
 * tracks it as a bitmap tracked since open: bits in memory, stored and
 * IN_USE cleared at close.
 *
 * Stopping (and restarting) a bitmap only changes memory: the AUTO flag
 * of the directory as it is written at close.  The directory on disk says
 * IN_USE until then, so a crash leaves the bitmap inconsistent whatever
 * its flag. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap-dir.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/log.h"
#include "core/source.h"
#include "dirty-bitmaps.h"
#include "guard.h"
#include "overlap.h"

/* The image behind BD, when this opening keeps bitmaps; else a reason. */
static struct qcow2dev *keeper(struct bd *bd, int *err) {
  struct qcow2dev *q = bd->priv;
  *err = 0;
  if (!q->writable)
    *err = -EROFS;
  else if (q->h.version < 3)
    *err = -ENOTSUP;
  if (*err)
    bd_set_error("qcow2 %s: %s: it keeps no persistent bitmaps", q->path,
                 q->writable ? "a version 2 image" : "opened read-only");
  return *err ? NULL : q;
}

static struct tracked *find_tracked(struct qcow2dev *q, const char *name) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  for (uint32_t i = 0; bm && i < bm->nt; i++)
    if (!strcmp(bm->t[i].b->name, name))
      return &bm->t[i];
  bd_set_error("qcow2 %s: no bitmap '%s' recording in this opening", q->path,
               name);
  return NULL;
}

/* ---- resume ---- */

int qcow2_bitmap_resume(struct bd *bd, char **name) {
  int r;
  struct qcow2dev *q = keeper(bd, &r);
  *name = NULL;
  if (!q)
    return r;
  const struct qcow2_bitmaps *bm = q->bitmaps;
  const struct qcow2_bitmap *last = NULL;
  for (uint32_t i = 0; bm && i < q->h.bitmaps_nb; i++)
    if (bm->dir[i].flags & QCOW2_BME_AUTO)
      last = &bm->dir[i];
  /* Without q->bitmaps nothing was tracked: none enabled and consistent. */
  if (!last || (last->flags & QCOW2_BME_IN_USE)) {
    if (!bm && q->h.bitmaps_nb)
      log_info("qcow2 %s: no consistent enabled bitmap to resume", q->path);
    else if (last)
      log_warn("qcow2 %s: bitmap '%s' is inconsistent (its writer did not "
               "close the image): not resumed",
               q->path, last->name);
    bd_set_error("qcow2 %s: no bitmap to resume", q->path);
    return -ENOENT;
  }
  if (!find_tracked(q, last->name))
    return -ENOENT;
  *name = strdup(last->name);
  return *name ? 0 : -ENOMEM;
}

/* ---- enable, disable ---- */

int qcow2_bitmap_enable(struct bd *bd, const char *name, bool on) {
  int r;
  struct qcow2dev *q = keeper(bd, &r);
  struct tracked *t = q ? find_tracked(q, name) : NULL;
  if (!t)
    return q ? -ENOENT : r;
  struct qcow2_bitmaps *bm = q->bitmaps;
  struct qcow2_bitmap *b = &bm->dir[t->b - bm->dir];
  uint8_t *f = bm->raw + b->dir_pos + 12;
  uint32_t flags = get_be32(f);
  put_be32(f, on ? flags | QCOW2_BME_AUTO : flags & ~QCOW2_BME_AUTO);
  b->flags = on ? b->flags | QCOW2_BME_AUTO : b->flags & ~QCOW2_BME_AUTO;
  t->enabled = on;
  return 0;
}

/* ---- the bits ---- */

/* Data cluster C of T as stored, the bits set since open ORed in. */
static int cluster_bits(struct qcow2dev *q, const struct tracked *t, uint32_t c,
                        uint8_t *buf) {
  uint64_t e = t->table[c], off = e & QCOW2_OFFSET_MASK;
  int r = 0;
  if (off) /* checked at tracking: valid and the bitmap's own */
    r = io_pread_zero(q->fd, buf, q->csize, off);
  else
    memset(buf, e & QCOW2_BITMAP_ALL_ONES ? 0xff : 0, q->csize);
  const uint64_t *w = t->bits + (uint64_t)c * (q->csize / 8);
  for (uint64_t i = 0; i < q->csize; i++) /* little-endian bit order */
    buf[i] |= (uint8_t)(w[i / 8] >> (8 * (i % 8)));
  return r;
}

/* The runs of set bits of BUF, bits [FIRST, END) of the bitmap, through
 * DIRTY as byte ranges. */
static int report_runs(const struct qcow2dev *q, const struct tracked *t,
                       const uint8_t *buf, uint64_t first, uint64_t end,
                       int (*dirty)(void *, uint64_t, uint64_t), void *opaque) {
  unsigned g = t->b->granularity_bits;
  int r = 0;
  for (uint64_t i = first; r == 0 && i < end; i++) {
    uint64_t k = i - first;
    if (k % 8 == 0 && buf[k / 8] == 0 && i + 8 <= end) {
      i += 7;
      continue;
    }
    if (!(buf[k / 8] >> (k % 8) & 1))
      continue;
    uint64_t j = i + 1;
    while (j < end && (buf[(j - first) / 8] >> ((j - first) % 8) & 1))
      j++;
    uint64_t from = i << g, to = j << g;
    r = dirty(opaque, from, (to > q->h.size ? q->h.size : to) - from);
    i = j;
  }
  return r;
}

int qcow2_bitmap_bits(struct bd *bd, const char *name,
                      int (*dirty)(void *opaque, uint64_t off, uint64_t len),
                      void *opaque) {
  int r;
  struct qcow2dev *q = keeper(bd, &r);
  const struct tracked *t = q ? find_tracked(q, name) : NULL;
  if (!t)
    return q ? -ENOENT : r;
  uint8_t *buf = malloc(q->csize);
  r = buf ? 0 : -ENOMEM;
  uint64_t per = q->csize * 8;
  for (uint32_t c = 0; r == 0 && c < t->size && c * per < t->nbits; c++) {
    r = cluster_bits(q, t, c, buf);
    uint64_t end = (c + 1) * per < t->nbits ? (c + 1) * per : t->nbits;
    if (r == 0)
      r = report_runs(q, t, buf, c * per, end, dirty, opaque);
  }
  free(buf);
  if (r < 0 && r != -ENOMEM)
    bd_set_error("qcow2 %s: reading bitmap '%s': %s", q->path, name,
                 strerror(-r));
  return r;
}

/* ---- start ---- */

/* What a start prepares before anything is written, so that once the
 * header points at the new directory nothing can fail. */
struct start {
  const char *name;
  unsigned g;
  uint32_t entries;   /* table entries */
  uint8_t *raw;       /* the new directory */
  size_t size;        /* its bytes */
  uint64_t table_off; /* where things went */
  uint64_t dir_off;
  struct qcow2_header h; /* the header after the switch */
};

static int refuse(struct qcow2dev *q, const char *name, uint64_t gran) {
  const struct qcow2_bitmaps *bm = q->bitmaps;
  for (uint32_t i = 0; bm && i < q->h.bitmaps_nb; i++)
    if (!strcmp(bm->dir[i].name, name)) {
      bd_set_error("the image has a bitmap '%s' already (remove it with "
                   "`blockport bitmap --remove` while it is not served)",
                   name);
      return -EEXIST;
    }
  if (gran < 512 || (gran & (gran - 1))) {
    bd_set_error("bitmap granularity %llu is not a power of two of at least "
                 "512",
                 (unsigned long long)gran);
    return -EINVAL;
  }
  const char *why = qcow2_bitmap_refuse_new(
      name, gran, q->h.size, q->h.cluster_bits, q->h.version, q->h.bitmaps_nb,
      q->h.bitmaps_dir_size);
  if (why) {
    bd_set_error("Can't make bitmap '%s' persistent in '%s': %s", name, q->path,
                 why);
    return -EINVAL;
  }
  if (q->broken || qcow2_is_corrupt(q)) {
    bd_set_error("qcow2 %s: the image takes no more writes", q->path);
    return -EIO;
  }
  return 0;
}

/* Room in memory for one more bitmap: the directory array (T's pointers
 * into it follow it) and the tracked array. */
static int grow_arrays(struct qcow2dev *q) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  uint32_t nb = q->h.bitmaps_nb;
  uintptr_t base = (uintptr_t)bm->dir;
  struct qcow2_bitmap *d = realloc(bm->dir, (nb + 1) * sizeof *d);
  if (d) {
    bm->dir = d;
    d[nb] = (struct qcow2_bitmap){0};
    for (uint32_t i = 0; i < bm->nt; i++)
      bm->t[i].b = d + ((uintptr_t)bm->t[i].b - base) / sizeof *d;
  }
  struct tracked *t = d ? realloc(bm->t, (nb + 1) * sizeof *t) : NULL;
  if (!t)
    return -ENOMEM;
  bm->t = t;
  memset(&t[bm->nt], 0, (nb + 1 - bm->nt) * sizeof *t);
  return 0;
}

static int prepare(struct qcow2dev *q, struct start *s) {
  int r = grow_arrays(q);
  size_t old = (size_t)q->h.bitmaps_dir_size;
  s->size = old + qcow2_bitmap_entry_size(strlen(s->name));
  s->raw = r == 0 ? malloc(s->size) : NULL;
  if (!s->raw)
    return -ENOMEM;
  if (old)
    memcpy(s->raw, q->bitmaps->raw, old);
  s->entries =
      (uint32_t)qcow2_bitmap_table_entries(q->h.size, s->g, q->h.cluster_bits);
  return 0;
}

/* The table and directory in new clusters, then the header: under the
 * metadata lock. */
static int write_out(struct qcow2dev *q, struct start *s) {
  uint8_t *zero = calloc(s->entries ? s->entries : 1, 8);
  int r = zero ? qcow2_bm_write_new(q, zero, s->entries * 8ull, &s->table_off)
               : -ENOMEM;
  free(zero);
  struct qcow2_bitmap_entry e = {s->table_off, s->entries,
                                 QCOW2_BME_AUTO | QCOW2_BME_IN_USE, s->g,
                                 s->name};
  if (r == 0) {
    qcow2_bitmap_dir_write(&e, 1, s->raw + q->h.bitmaps_dir_size);
    r = qcow2_bm_write_new(q, s->raw, s->size, &s->dir_off);
  }
  if (r == 0) /* table, directory and their refcounts before the header */
    r = io_fdatasync(q->fd);
  if (r < 0)
    return r; /* the new clusters leak: `check -r leaks` reclaims them */
  r = qcow2_bm_write_header(q, q->h.bitmaps_nb + 1, s->size, s->dir_off, &s->h);
  if (r < 0) /* the header may be half-switched */
    return qcow2_mark_broken(q, r, "switching to a new bitmap directory");
  return 0;
}

/* After the switch: memory follows the file; the old directory is freed. */
static void switch_memory(struct qcow2dev *q, struct start *s) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  uint32_t nb = q->h.bitmaps_nb;
  uint64_t old_off = q->h.bitmaps_dir_offset, old_size = q->h.bitmaps_dir_size;
  bm->dir[nb] = (struct qcow2_bitmap){.table_offset = s->table_off,
                                      .table_size = s->entries,
                                      .flags = QCOW2_BME_AUTO,
                                      .granularity_bits = s->g,
                                      .dir_pos = (uint32_t)old_size};
  free(bm->raw);
  bm->raw = s->raw;
  s->raw = NULL;
  q->h.has_bitmaps = s->h.has_bitmaps;
  q->h.bitmaps_ext_pos = s->h.bitmaps_ext_pos;
  q->h.bitmaps_nb = s->h.bitmaps_nb;
  q->h.bitmaps_dir_size = s->h.bitmaps_dir_size;
  q->h.bitmaps_dir_offset = s->h.bitmaps_dir_offset;
  q->h.autoclear = s->h.autoclear;
  q->h.backing_offset = s->h.backing_offset;
  if (nb) { /* a failure only leaks */
    uint64_t bytes = (old_size + q->csize - 1) / q->csize * q->csize;
    qcow2_guard_unmark(q, QCOW2_OL_BITMAPS, old_off, bytes);
    qcow2_free_range(q, old_off, bytes, true);
  }
}

/* Takes the new bitmap, last in the directory, into tracking. */
static int track_new(struct qcow2dev *q, char *name) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  struct qcow2_bitmap *b = &bm->dir[q->h.bitmaps_nb - 1];
  struct tracked *t = &bm->t[bm->nt];
  b->name = name;
  int r = qcow2_bitmaps_track(q, t, b);
  if (r == 0) {
    bm->nt++;
    return 0;
  }
  /* Untracked, it stays IN_USE on disk: known to be inconsistent. */
  free(t->table);
  free(t->bits);
  free(t->touched);
  *t = (struct tracked){0};
  return r;
}

int qcow2_bitmap_start(struct bd *bd, const char *name, uint32_t granularity) {
  int r;
  struct qcow2dev *q = keeper(bd, &r);
  if (!q)
    return r;
  struct start s = {.name = name};
  while ((1ull << s.g) < granularity)
    s.g++;
  pthread_mutex_lock(&q->meta);
  r = qcow2_bitmaps_load(q);
  bool refused = r == 0 && (r = refuse(q, name, granularity)) < 0;
  char *copy = r == 0 ? strdup(name) : NULL;
  if (r == 0)
    r = copy ? prepare(q, &s) : -ENOMEM;
  if (r == 0)
    r = write_out(q, &s);
  if (r == 0) {
    switch_memory(q, &s);
    r = track_new(q, copy);
    copy = NULL;
  }
  pthread_mutex_unlock(&q->meta);
  free(copy);
  free(s.raw);
  if (r < 0 && !refused)
    bd_set_error("qcow2 %s: adding bitmap '%s': %s", q->path, name,
                 strerror(-r));
  return r;
}
