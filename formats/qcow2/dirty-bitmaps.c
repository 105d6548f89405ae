/* SPDX-License-Identifier: BSD-3-Clause */
/* Persistent dirty bitmaps of a qcow2 image opened for writing, kept as
 * QEMU keeps them (block/qcow2-bitmap.c):
 *   - at open, each enabled bitmap that is consistent (not IN_USE) is
 *     tracked: IN_USE is set in the directory, durably, before any write;
 *     disabled bitmaps do not change, and bitmaps already IN_USE (left so
 *     by a crash) stay inconsistent, as QEMU leaves them;
 *   - every write, zero and trim range sets its bits in memory;
 *   - at close, after the final flush, the bits are merged into the bitmap
 *     data clusters (in place; a new cluster where the table said "all
 *     zeroes"), the tables are written, and IN_USE is cleared.
 * A crash in between leaves IN_USE set: the bitmap is then known to be
 * inconsistent, never silently wrong.  The directory is rewritten in place
 * the way QEMU does it: the BITMAPS autoclear bit is cleared first, so a
 * torn directory is never taken for a valid one.  A bitmap blockport cannot
 * keep (malformed, or its clusters' refcounts wrong) makes the image
 * refuse writes, with the reason.
 *
 * A resize (resize.c) takes every consistent bitmap into tracking,
 * disabled ones too, and gives each a table for the new size: new
 * clusters, referenced from the directory only when it is stored at
 * close; the old table and the data clusters past the new end are freed
 * after that.  As with qemu-img resize, the grown area is clean, and bits
 * past the old or new end are cleared on disk. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap-context.h"
#include "bitmap.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/log.h"
#include "dirty-bitmaps.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"

static void free_all(struct qcow2dev *q, struct qcow2_bitmaps *bm) {
  for (uint32_t i = 0; i < bm->nt; i++) {
    free(bm->t[i].table);
    free(bm->t[i].bits);
    free(bm->t[i].touched);
  }
  free(bm->t);
  free(bm->raw);
  free(bm->stale);
  qcow2_free_bitmaps(bm->dir, q->h.bitmaps_nb);
  free(bm);
}

static int cannot_keep(struct qcow2dev *q, const char *name, const char *why) {
  bd_set_error("qcow2 %s: cannot keep persistent bitmap%s%s%s consistent: %s; "
               "open it read-only (--readonly), or check it (`blockport "
               "check`)",
               q->path, name ? " '" : "s", name ? name : "", name ? "'" : "",
               why);
  return -ENOTSUP;
}

/* The cluster at OFF must be in the file and belong to the bitmap alone. */
static bool owned(struct qcow2dev *q, uint64_t off) {
  uint64_t rc;
  return off < q->file_size &&
         qcow2_rc_get(q, off >> q->h.cluster_bits, &rc) == 0 && rc == 1;
}

static int load_table(struct qcow2dev *q, struct tracked *t) {
  const struct qcow2_bitmap *b = t->b;
  uint64_t bytes = (uint64_t)b->table_size * 8;
  if (b->table_size != qcow2_bitmap_table_entries(
                           q->h.size, b->granularity_bits, q->h.cluster_bits))
    return cannot_keep(q, b->name, "its table does not fit the image size");
  if (b->table_offset > q->file_size || bytes > q->file_size - b->table_offset)
    return cannot_keep(q, b->name, "its table is past the end of the file");
  t->table = malloc(bytes);
  if (!t->table)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, t->table, bytes, b->table_offset);
  for (uint64_t c = 0; r == 0 && c < (bytes + q->csize - 1) / q->csize; c++)
    if (!owned(q, b->table_offset + c * q->csize))
      r = cannot_keep(q, b->name, "its table's refcount is not 1");
  for (uint32_t i = 0; r == 0 && i < b->table_size; i++) {
    uint64_t e = t->table[i] = get_be64((uint8_t *)&t->table[i]);
    uint64_t off = e & QCOW2_OFFSET_MASK;
    if (!qcow2_bitmap_entry_ok(e, q->h.cluster_bits))
      r = cannot_keep(q, b->name, "its table has an invalid entry");
    else if (off && !owned(q, off))
      r = cannot_keep(q, b->name, "a data cluster's refcount is not 1");
  }
  return r;
}

int qcow2_bitmaps_track(struct qcow2dev *q, struct tracked *t,
                        const struct qcow2_bitmap *b) {
  t->b = b;
  t->enabled = b->flags & QCOW2_BME_AUTO;
  t->size = b->table_size;
  t->table_off = b->table_offset;
  t->zero_from = UINT64_MAX;
  int r = load_table(q, t);
  if (r < 0)
    return r;
  uint64_t gran = 1ull << b->granularity_bits;
  t->nbits = q->h.size / gran + !!(q->h.size % gran);
  /* Whole clusters of bits, as they are stored (zero-filled pages cost
   * nothing until a write sets a bit in them). */
  t->bits = calloc(b->table_size, q->csize);
  t->touched = calloc(b->table_size, 1);
  return t->bits && t->touched ? 0 : -ENOMEM;
}

static int write_autoclear(struct qcow2dev *q, uint64_t v) {
  uint8_t b[8];
  put_be64(b, v);
  int r = io_pwrite_all(q->fd, b, 8, 88);
  return r < 0 ? r : io_fdatasync(q->fd);
}

/* The directory in place, with IN_USE set (or cleared) on the tracked
 * bitmaps; the autoclear bit is off while it is being written. */
static int store_dir(struct qcow2dev *q, struct qcow2_bitmaps *bm,
                     bool in_use) {
  for (uint32_t i = 0; i < bm->nt; i++) {
    uint8_t *f = bm->raw + bm->t[i].b->dir_pos + 12;
    uint32_t flags = get_be32(f);
    put_be32(f, in_use ? flags | QCOW2_BME_IN_USE : flags & ~QCOW2_BME_IN_USE);
  }
  uint64_t ac = q->h.autoclear;
  int r = write_autoclear(q, ac & ~QCOW2_AUTOCLEAR_BITMAPS);
  if (r == 0)
    r = io_pwrite_all(q->fd, bm->raw, q->h.bitmaps_dir_size,
                      q->h.bitmaps_dir_offset);
  if (r == 0)
    r = io_fdatasync(q->fd);
  return r < 0 ? r : write_autoclear(q, ac);
}

static int read_dir(struct qcow2dev *q, struct qcow2_bitmaps *bm) {
  size_t len = (size_t)q->h.bitmaps_dir_size;
  bm->raw = malloc(len ? len : 1);
  if (!bm->raw)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, bm->raw, len, q->h.bitmaps_dir_offset);
  if (r == 0)
    r = qcow2_parse_bitmap_dir(bm->raw, len, q->h.bitmaps_nb, q->h.cluster_bits,
                               q->h.size, &bm->dir);
  if (r == -EINVAL) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    return cannot_keep(q, NULL, why);
  }
  return r;
}

static int open_bitmaps(struct qcow2dev *q, struct qcow2_bitmaps *bm) {
  int r = read_dir(q, bm);
  bm->t = r == 0 ? calloc(q->h.bitmaps_nb, sizeof *bm->t) : NULL;
  if (r == 0 && !bm->t)
    r = -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < q->h.bitmaps_nb; i++) {
    const struct qcow2_bitmap *b = &bm->dir[i];
    /* Disabled bitmaps do not change; in-use ones are already known to be
     * inconsistent. */
    if ((b->flags & QCOW2_BME_AUTO) && !(b->flags & QCOW2_BME_IN_USE))
      r = qcow2_bitmaps_track(q, &bm->t[bm->nt++], b);
  }
  if (r == 0 && bm->nt)
    r = store_dir(q, bm, true);
  return r;
}

int qcow2_bitmaps_open(struct qcow2dev *q) {
  if (q->h.bitmaps_nb == 0)
    return 0;
  struct qcow2_bitmaps *bm = calloc(1, sizeof *bm);
  if (!bm)
    return -ENOMEM;
  int r = open_bitmaps(q, bm);
  if (r < 0 || bm->nt == 0) {
    free_all(q, bm);
    return r;
  }
  q->bitmaps = bm;
  log_info("qcow2 %s: tracking writes in %u persistent bitmap%s", q->path,
           bm->nt, bm->nt == 1 ? "" : "s");
  return 0;
}

void qcow2_bitmaps_mark(struct qcow2dev *q, uint64_t off, uint64_t len) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  if (!bm || len == 0)
    return;
  for (uint32_t i = 0; i < bm->nt; i++) {
    struct tracked *t = &bm->t[i];
    unsigned g = t->b->granularity_bits;
    uint64_t first = off >> g, last = (off + len - 1) >> g;
    if (!t->enabled || first >= t->nbits)
      continue;
    if (last >= t->nbits)
      last = t->nbits - 1;
    for (uint64_t w = first / 64; w <= last / 64; w++) {
      uint64_t lo = w * 64 > first ? 0 : first % 64;
      uint64_t hi = w * 64 + 63 < last ? 63 : last % 64;
      uint64_t mask = (~0ull >> (63 - hi)) & (~0ull << lo);
      if ((__atomic_load_n(&t->bits[w], __ATOMIC_RELAXED) & mask) != mask)
        __atomic_fetch_or(&t->bits[w], mask, __ATOMIC_RELAXED);
    }
    uint64_t per = q->csize * 8; /* bits per data cluster */
    for (uint64_t c = first / per; c <= last / per; c++)
      if (!__atomic_load_n(&t->touched[c], __ATOMIC_RELAXED))
        __atomic_store_n(&t->touched[c], 1, __ATOMIC_RELAXED);
  }
}

/* Data cluster C of T with the bits set since open merged in: in place,
 * or in a new cluster (the table's entry is then updated in memory). */
static int store_cluster(struct qcow2dev *q, struct tracked *t, uint64_t c,
                         uint8_t *buf) {
  uint64_t e = t->table[c], off = e & QCOW2_OFFSET_MASK;
  uint64_t per = q->csize * 8, from = t->zero_from;
  bool cut = from / per == c; /* an old or new end falls in this cluster */
  bool ones = !off && (e & QCOW2_BITMAP_ALL_ONES);
  if (ones && !cut)
    return 0; /* already all ones */
  int r = off ? io_pread_zero(q->fd, buf, q->csize, off) : 0;
  if (!off)
    memset(buf, ones ? 0xff : 0, q->csize);
  if (cut) {
    uint64_t b = from % per;
    if (b % 8)
      buf[b / 8] &= (uint8_t)((1u << (b % 8)) - 1);
    memset(buf + (b + 7) / 8, 0, q->csize - (b + 7) / 8);
  }
  const uint64_t *w = t->bits + c * (q->csize / 8);
  for (uint64_t i = 0; i < q->csize; i++) /* little-endian bit order */
    buf[i] |= (uint8_t)(w[i / 8] >> (8 * (i % 8)));
  if (r == 0 && !off)
    r = qcow2_alloc_cluster(q, &off);
  if (r == 0)
    r = io_pwrite_all(q->fd, buf, q->csize, off);
  if (r == 0)
    t->table[c] = off;
  return r;
}

static int store_bitmap(struct qcow2dev *q, struct tracked *t, uint8_t *buf) {
  int r = 0;
  bool table_changed = t->moved;
  for (uint32_t c = 0; r == 0 && c < t->size; c++) {
    if (!t->touched[c])
      continue;
    uint64_t before = t->table[c];
    r = store_cluster(q, t, c, buf);
    table_changed |= t->table[c] != before;
  }
  if (r == 0 && table_changed) {
    /* New data clusters (and their refcounts) before the table entries
     * that point at them. */
    size_t bytes = (size_t)t->size * 8;
    uint8_t *tb = malloc(bytes);
    r = tb ? io_fdatasync(q->fd) : -ENOMEM;
    for (uint32_t c = 0; r == 0 && c < t->size; c++)
      put_be64(tb + c * 8ull, t->table[c]);
    if (r == 0)
      r = io_pwrite_all(q->fd, tb, bytes, t->table_off);
    free(tb);
  }
  return r;
}

static void free_stale(struct qcow2dev *q, struct qcow2_bitmaps *bm);

void qcow2_bitmaps_close(struct qcow2dev *q, bool store) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  if (!bm)
    return;
  q->bitmaps = NULL;
  if (!store) {
    free_all(q, bm);
    return;
  }
  int r = q->broken ? -EIO : 0;
  uint8_t *buf = r == 0 ? malloc(q->csize) : NULL;
  if (r == 0 && !buf)
    r = -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < bm->nt; i++)
    r = store_bitmap(q, &bm->t[i], buf);
  free(buf);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0)
    r = store_dir(q, bm, false);
  if (r < 0)
    log_error("qcow2 %s: persistent bitmaps not stored (%s): they stay "
              "marked in use, so known to be inconsistent",
              q->path, strerror(-r));
  else
    free_stale(q, bm);
  free_all(q, bm);
}

/* ---- resizing ---- */

/* What the directory pointed at before a resize: free now that it does
 * not.  A failure here only leaks. */
static void free_stale(struct qcow2dev *q, struct qcow2_bitmaps *bm) {
  int r = 0;
  for (size_t i = 0; r == 0 && i < bm->nstale; i++) {
    /* No longer metadata: the overlap guard lets them go. */
    qcow2_guard_unmark(q, QCOW2_OL_BITMAPS, bm->stale[i].off, bm->stale[i].len);
    r = qcow2_free_range(q, bm->stale[i].off, bm->stale[i].len, true);
  }
  if (r == 0 && bm->nstale)
    r = io_fdatasync(q->fd);
  if (r < 0)
    log_error("qcow2 %s: the old bitmap clusters were not freed (%s): "
              "`blockport check -r leaks` reclaims them",
              q->path, strerror(-r));
}

static int add_stale(struct qcow2_bitmaps *bm, uint64_t off, uint64_t len) {
  struct stale *s = realloc(bm->stale, (bm->nstale + 1) * sizeof *s);
  if (!s)
    return -ENOMEM;
  bm->stale = s;
  s[bm->nstale++] = (struct stale){off, len};
  return 0;
}

int qcow2_bitmaps_load(struct qcow2dev *q) {
  if (q->bitmaps)
    return 0;
  struct qcow2_bitmaps *bm = calloc(1, sizeof *bm);
  if (!bm)
    return -ENOMEM;
  uint32_t nb = q->h.bitmaps_nb;
  int r = nb ? read_dir(q, bm) : 0;
  bm->t = r == 0 ? calloc(nb ? nb : 1, sizeof *bm->t) : NULL;
  if (r == 0 && !bm->t)
    r = -ENOMEM;
  if (r < 0) {
    free_all(q, bm);
    return r;
  }
  q->bitmaps = bm;
  return 0;
}

static bool is_tracked(const struct qcow2_bitmaps *bm,
                       const struct qcow2_bitmap *b) {
  for (uint32_t i = 0; i < bm->nt; i++)
    if (bm->t[i].b == b)
      return true;
  return false;
}

int qcow2_bitmaps_prepare_resize(struct qcow2dev *q) {
  if (q->h.bitmaps_nb == 0)
    return 0;
  int r = qcow2_bitmaps_load(q);
  struct qcow2_bitmaps *bm = q->bitmaps;
  /* The flags as they were at open: IN_USE there means inconsistent. */
  for (uint32_t i = 0; r == 0 && i < q->h.bitmaps_nb; i++)
    if (bm->dir[i].flags & QCOW2_BME_IN_USE) {
      bd_set_error("qcow2 %s: bitmap '%s' is inconsistent and cannot be "
                   "used; remove it (qemu-img bitmap --remove) to resize",
                   q->path, bm->dir[i].name);
      r = -ENOTSUP;
    }
  uint32_t before = r == 0 ? bm->nt : 0;
  for (uint32_t i = 0; r == 0 && i < q->h.bitmaps_nb; i++)
    if (!is_tracked(bm, &bm->dir[i]))
      r = qcow2_bitmaps_track(q, &bm->t[bm->nt++], &bm->dir[i]);
  /* The newly tracked ones are in use, durably, before they change. */
  if (r == 0 && bm->nt > before)
    r = store_dir(q, bm, true);
  return r;
}

static uint64_t nbits_for(uint64_t size, unsigned g) {
  return (size >> g) + !!(size & ((1ull << g) - 1));
}

/* T's arrays for N table entries (new ones zero). */
static int resize_arrays(struct qcow2dev *q, struct tracked *t, uint32_t n) {
  uint64_t *table = realloc(t->table, (size_t)n * 8);
  if (table)
    t->table = table;
  uint64_t *bits = table ? realloc(t->bits, (size_t)n * q->csize) : NULL;
  if (bits)
    t->bits = bits;
  uint8_t *touched = bits ? realloc(t->touched, n) : NULL;
  if (!touched)
    return -ENOMEM;
  t->touched = touched;
  if (n > t->size) {
    memset(t->table + t->size, 0, (size_t)(n - t->size) * 8);
    memset((uint8_t *)t->bits + (size_t)t->size * q->csize, 0,
           (size_t)(n - t->size) * q->csize);
    memset(t->touched + t->size, 0, n - t->size);
  }
  return 0;
}

/* Bits of T at and past N cleared in memory. */
static void clear_from(struct qcow2dev *q, struct tracked *t, uint64_t n) {
  uint64_t words = (uint64_t)t->size * q->csize / 8;
  for (uint64_t w = n / 64; w < words; w++)
    t->bits[w] &= w == n / 64 ? (1ull << (n % 64)) - 1 : 0;
}

/* A new table of N entries for T, at the end of the image. */
static int move_table(struct qcow2dev *q, struct qcow2_bitmaps *bm,
                      struct tracked *t, uint32_t n) {
  uint64_t old_bytes = (uint64_t)t->size * 8, bytes = (uint64_t)n * 8;
  old_bytes = (old_bytes + q->csize - 1) / q->csize * q->csize;
  uint64_t nclusters = (bytes + q->csize - 1) / q->csize;
  uint64_t off;
  pthread_mutex_lock(&q->meta);
  int r = qcow2_alloc_contiguous(q, nclusters, QCOW2_OL_BITMAPS, &off);
  pthread_mutex_unlock(&q->meta);
  if (r == 0)
    r = add_stale(bm, t->table_off, old_bytes);
  if (r < 0)
    return r;
  t->table_off = off;
  t->moved = true;
  uint8_t *e = bm->raw + t->b->dir_pos;
  put_be64(e, off);
  put_be32(e + 8, n);
  return 0;
}

static int resize_one(struct qcow2dev *q, struct qcow2_bitmaps *bm,
                      struct tracked *t, uint64_t size) {
  unsigned g = t->b->granularity_bits;
  uint64_t n = qcow2_bitmap_table_entries(size, g, q->h.cluster_bits);
  if (n > QCOW2_BITMAP_MAX_TABLE || n * q->csize > QCOW2_BITMAP_MAX_BYTES) {
    bd_set_error("qcow2 %s: bitmap '%s' would be too large for %llu bytes",
                 q->path, t->b->name, (unsigned long long)size);
    return -EFBIG;
  }
  int r = 0;
  /* Data clusters past the new end go with the old table. */
  for (uint64_t c = n; r == 0 && c < t->size; c++)
    if (t->table[c] & QCOW2_OFFSET_MASK)
      r = add_stale(bm, t->table[c] & QCOW2_OFFSET_MASK, q->csize);
  if (r == 0 && n != t->size)
    r = move_table(q, bm, t, (uint32_t)n);
  if (r == 0 && n > t->size)
    r = resize_arrays(q, t, (uint32_t)n);
  if (r < 0)
    return r;
  t->size = (uint32_t)n; /* a smaller array keeps its room */
  uint64_t old_bits = t->nbits;
  t->nbits = nbits_for(size, g);
  uint64_t cut = old_bits < t->nbits ? old_bits : t->nbits, per = q->csize * 8;
  clear_from(q, t, cut);
  if (cut < t->zero_from)
    t->zero_from = cut;
  if (cut / per < t->size && t->table[cut / per])
    t->touched[cut / per] = 1; /* its tail is cleared at close */
  return 0;
}

int qcow2_bitmaps_resize(struct qcow2dev *q, uint64_t size) {
  struct qcow2_bitmaps *bm = q->bitmaps;
  int r = 0;
  for (uint32_t i = 0; bm && r == 0 && i < bm->nt; i++)
    r = resize_one(q, bm, &bm->t[i], size);
  return r; /* the grown area is clean, as qemu-img resize leaves it */
}

/* ---- exporting (bitmap-context.c) ---- */

const uint64_t *qcow2_bitmaps_live(const struct qcow2dev *q, const char *name) {
  const struct qcow2_bitmaps *bm = q->bitmaps;
  for (uint32_t i = 0; bm && i < bm->nt; i++)
    if (bm->t[i].enabled && !strcmp(bm->t[i].b->name, name))
      return bm->t[i].bits;
  return NULL;
}
