/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing a qcow2 image's persistent bitmaps, as qemu-img bitmap does
 * (see bitmap-edit.h).  The bitmaps live in memory while the operations
 * run, as in QEMU, where they are stored when the image closes; a bitmap
 * whose bits change (add, clear, merge) gets new data clusters and a new
 * table at commit, the others keep theirs and only their directory entry
 * changes.  Order on disk: data and tables, the new directory (all in new
 * clusters, referenced first), fdatasync; then the header points at the
 * directory; then the old directory and tables are freed.  A crash before
 * the header leaks the new clusters, after it the old ones; never more. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap-dir.h"
#include "bitmap-edit.h"
#include "bitmap.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "dirty-bitmaps.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"

struct ebm {
  char *name;
  unsigned gran_bits;
  uint32_t flags;
  uint64_t table_off; /* on disk; 0 for a new bitmap */
  uint32_t table_size;
  bool on_disk;  /* in the directory the image has now */
  uint8_t *bits; /* table_size clusters of bits, once loaded */
  bool rewrite;  /* the bits changed: new data and table at commit */
};

/* A table (and the data it points at) freed once nothing points at it. */
struct old_table {
  uint64_t off;
  uint32_t size;
};

struct qcow2_bm_edit {
  struct qcow2dev *q;
  struct ebm *b;
  uint32_t n;
  /* The image's directory as QEMU counts it when it adds one: removals
   * go to disk at once there, additions at close. */
  uint32_t stored;
  uint64_t stored_size;
  struct old_table *old;
  size_t nold;
  bool changed;
};

bool qcow2_bm_supported(const struct bd *bd) {
  if (strcmp(bd->format, "qcow2"))
    return false;
  const struct qcow2dev *q = bd->priv;
  return q->h.version >= 3;
}

static int not_found(const char *name) {
  bd_set_error("Dirty bitmap '%s' not found", name);
  return -ENOENT;
}

static struct ebm *find(struct qcow2_bm_edit *e, const char *name) {
  for (uint32_t i = 0; i < e->n; i++)
    if (!strcmp(e->b[i].name, name))
      return &e->b[i];
  return NULL;
}

/* In use: left so by a writer that did not close; QEMU refuses it. */
static int usable(const struct ebm *b) {
  if (!(b->flags & QCOW2_BME_IN_USE))
    return 0;
  bd_set_error("Bitmap '%s' is inconsistent and cannot be used\n"
               "Try block-dirty-bitmap-remove to delete this bitmap from disk",
               b->name);
  return -EINVAL;
}

static int append(struct qcow2_bm_edit *e, struct ebm *b) {
  struct ebm *nb = realloc(e->b, (e->n + 1) * sizeof *nb);
  if (!nb)
    return -ENOMEM;
  e->b = nb;
  nb[e->n++] = *b;
  return 0;
}

static int load_dir(struct qcow2_bm_edit *e) {
  struct qcow2dev *q = e->q;
  uint32_t nb = q->h.bitmaps_nb;
  size_t len = (size_t)q->h.bitmaps_dir_size;
  if (nb == 0)
    return 0;
  uint8_t *raw = malloc(len ? len : 1);
  struct qcow2_bitmap *dir = NULL;
  int r =
      raw ? io_pread_zero(q->fd, raw, len, q->h.bitmaps_dir_offset) : -ENOMEM;
  if (r == 0)
    r = qcow2_parse_bitmap_dir(raw, len, nb, q->h.cluster_bits, q->h.size,
                               &dir);
  for (uint32_t i = 0; r == 0 && i < nb; i++) {
    struct ebm b = {.name = dir[i].name,
                    .gran_bits = dir[i].granularity_bits,
                    .flags = dir[i].flags,
                    .table_off = dir[i].table_offset,
                    .table_size = dir[i].table_size,
                    .on_disk = true};
    r = append(e, &b);
    if (r == 0)
      dir[i].name = NULL; /* now e's */
  }
  e->stored = nb;
  e->stored_size = len;
  qcow2_free_bitmaps(dir, nb);
  free(raw);
  return r;
}

int qcow2_bm_open(struct bd *bd, struct qcow2_bm_edit **out) {
  *out = NULL;
  if (strcmp(bd->format, "qcow2")) {
    bd_set_error("%s: a %s image has no persistent bitmaps", bd->description,
                 bd->format);
    return -ENOTSUP;
  }
  struct qcow2dev *q = bd->priv;
  /* Opening for writing took the enabled bitmaps into tracking (in use on
   * disk); nothing was written since, so storing them now only marks them
   * consistent again, and the directory is ours. */
  if (q->bitmaps)
    qcow2_bitmaps_close(q, true);
  struct qcow2_bm_edit *e = calloc(1, sizeof *e);
  if (!e)
    return -ENOMEM;
  e->q = q;
  int r = load_dir(e);
  if (r < 0) {
    qcow2_bm_close(e);
    return r;
  }
  *out = e;
  return 0;
}

static void free_ebm(struct ebm *b) {
  free(b->name);
  free(b->bits);
}

void qcow2_bm_close(struct qcow2_bm_edit *e) {
  if (!e)
    return;
  for (uint32_t i = 0; i < e->n; i++)
    free_ebm(&e->b[i]);
  free(e->b);
  free(e->old);
  free(e);
}

uint32_t qcow2_bm_count(const struct qcow2_bm_edit *e) {
  return e->n;
}

void qcow2_bm_get(const struct qcow2_bm_edit *e, uint32_t i,
                  struct qcow2_bm_info *info) {
  const struct ebm *b = &e->b[i];
  *info = (struct qcow2_bm_info){b->name, 1ull << b->gran_bits,
                                 b->flags & QCOW2_BME_AUTO,
                                 b->flags & QCOW2_BME_IN_USE};
}

/* ---- the bits ---- */

static uint32_t entries_for(const struct qcow2dev *q, unsigned g) {
  return (uint32_t)qcow2_bitmap_table_entries(q->h.size, g, q->h.cluster_bits);
}

/* Data cluster I of B's table entry E into DST. */
static int load_cluster(struct qcow2dev *q, const struct ebm *b, uint64_t e,
                        uint8_t *dst) {
  uint64_t off = e & QCOW2_OFFSET_MASK;
  if (!qcow2_bitmap_entry_ok(e, q->h.cluster_bits) ||
      (off && (off > q->file_size || q->file_size - off < q->csize))) {
    bd_set_error("qcow2 %s: bitmap '%s' has an invalid table entry 0x%llx",
                 q->path, b->name, (unsigned long long)e);
    return -EINVAL;
  }
  if (!off) {
    memset(dst, e & QCOW2_BITMAP_ALL_ONES ? 0xff : 0, q->csize);
    return 0;
  }
  return io_pread_zero(q->fd, dst, q->csize, off);
}

static int load_bits(struct qcow2dev *q, struct ebm *b) {
  if (b->bits)
    return 0;
  if (b->table_size != entries_for(q, b->gran_bits) ||
      b->table_off > q->file_size ||
      (uint64_t)b->table_size * 8 > q->file_size - b->table_off) {
    bd_set_error("qcow2 %s: bitmap '%s': its table does not fit the image",
                 q->path, b->name);
    return -EINVAL;
  }
  uint64_t *t = malloc((size_t)b->table_size * 8);
  b->bits = malloc((size_t)b->table_size * q->csize);
  int r = t && b->bits ? 0 : -ENOMEM;
  if (r == 0)
    r = io_pread_zero(q->fd, t, (size_t)b->table_size * 8, b->table_off);
  for (uint32_t i = 0; r == 0 && i < b->table_size; i++)
    r = load_cluster(q, b, get_be64(&t[i]), b->bits + i * q->csize);
  free(t);
  if (r < 0) {
    free(b->bits);
    b->bits = NULL;
  }
  return r;
}

/* B's bits from now on all clear, in new clusters at commit. */
static int fresh_bits(struct qcow2_bm_edit *e, struct ebm *b) {
  struct qcow2dev *q = e->q;
  uint32_t n = entries_for(q, b->gran_bits);
  uint8_t *bits = calloc(n ? n : 1, q->csize);
  if (!bits)
    return -ENOMEM;
  free(b->bits);
  b->bits = bits;
  b->rewrite = true;
  e->changed = true;
  return 0;
}

/* ---- the operations ---- */

int qcow2_bm_add(struct qcow2_bm_edit *e, const char *name,
                 uint64_t granularity, bool disabled) {
  struct qcow2dev *q = e->q;
  if (!name[0]) {
    bd_set_error("Bitmap name cannot be empty");
    return -EINVAL;
  }
  if (!granularity)
    granularity = qcow2_bitmap_default_granularity(q->h.cluster_bits);
  if (granularity < 512 || (granularity & (granularity - 1))) {
    bd_set_error("Granularity must be power of 2 and at least 512");
    return -EINVAL;
  }
  const char *why =
      qcow2_bitmap_refuse_new(name, granularity, q->h.size, q->h.cluster_bits,
                              q->h.version, e->stored, e->stored_size);
  if (why) {
    bd_set_error("Can't make bitmap '%s' persistent in '%s': %s", name, q->path,
                 why);
    return -EINVAL;
  }
  if (find(e, name)) {
    bd_set_error("Bitmap already exists: %s", name);
    return -EEXIST;
  }
  unsigned g = 0;
  while ((1ull << g) < granularity)
    g++;
  struct ebm b = {.name = strdup(name),
                  .gran_bits = g,
                  .flags = disabled ? 0 : QCOW2_BME_AUTO};
  int r = b.name ? fresh_bits(e, &b) : -ENOMEM;
  b.table_size = entries_for(q, g);
  if (r == 0)
    r = append(e, &b);
  if (r < 0)
    free_ebm(&b);
  return r;
}

static int forget_table(struct qcow2_bm_edit *e, const struct ebm *b) {
  if (!b->table_off)
    return 0;
  struct old_table *o = realloc(e->old, (e->nold + 1) * sizeof *o);
  if (!o)
    return -ENOMEM;
  e->old = o;
  o[e->nold++] = (struct old_table){b->table_off, b->table_size};
  return 0;
}

/* As QEMU: an inconsistent bitmap may be removed (its clusters freed). */
int qcow2_bm_remove(struct qcow2_bm_edit *e, const char *name) {
  struct ebm *b = find(e, name);
  if (!b)
    return not_found(name);
  int r = forget_table(e, b);
  if (r < 0)
    return r;
  if (b->on_disk) {
    e->stored--;
    e->stored_size -= qcow2_bitmap_entry_size(strlen(b->name));
  }
  free_ebm(b);
  uint32_t i = (uint32_t)(b - e->b);
  memmove(b, b + 1, (e->n - i - 1) * sizeof *b);
  e->n--;
  e->changed = true;
  return 0;
}

int qcow2_bm_clear(struct qcow2_bm_edit *e, const char *name) {
  struct ebm *b = find(e, name);
  int r = b ? usable(b) : not_found(name);
  return r < 0 ? r : fresh_bits(e, b);
}

int qcow2_bm_enable(struct qcow2_bm_edit *e, const char *name, bool on) {
  struct ebm *b = find(e, name);
  int r = b ? usable(b) : not_found(name);
  if (r < 0)
    return r;
  b->flags = on ? b->flags | QCOW2_BME_AUTO : b->flags & ~QCOW2_BME_AUTO;
  e->changed = true;
  return 0;
}

int qcow2_bm_merge(struct qcow2_bm_edit *e, const char *name,
                   struct qcow2_bm_edit *src, const char *src_name) {
  struct ebm *d = find(e, name);
  int r = d ? usable(d) : not_found(name);
  if (r < 0)
    return r;
  struct ebm *s = find(src, src_name);
  r = s ? usable(s) : not_found(src_name);
  if (r < 0)
    return r;
  uint64_t dsize = e->q->h.size, ssize = src->q->h.size;
  if (dsize != ssize) {
    bd_set_error("Bitmaps are of different sizes (destination size is %llu, "
                 "source size is %llu) and can't be merged",
                 (unsigned long long)dsize, (unsigned long long)ssize);
    return -EINVAL;
  }
  r = load_bits(src->q, s);
  if (r == 0)
    r = load_bits(e->q, d);
  if (r < 0)
    return r;
  qcow2_bitmap_merge_bits(d->bits, d->gran_bits, s->bits, s->gran_bits, dsize);
  d->rewrite = true;
  e->changed = true;
  return 0;
}

/* ---- writing ---- */

static uint64_t clusters_for(const struct qcow2dev *q, uint64_t bytes) {
  return (bytes + q->csize - 1) / q->csize;
}

int qcow2_bm_write_new(struct qcow2dev *q, const void *buf, uint64_t bytes,
                       uint64_t *off) {
  uint64_t n = clusters_for(q, bytes);
  uint8_t *c = calloc(n, q->csize);
  int r = c ? qcow2_alloc_contiguous(q, n, QCOW2_OL_BITMAPS, off) : -ENOMEM;
  if (r == 0) {
    memcpy(c, buf, bytes);
    r = qcow2_guard_pwrite(q, QCOW2_OL_BITMAPS, c, n * q->csize, *off);
  }
  free(c);
  return r;
}

static bool all_zero(const uint8_t *p, uint64_t n) {
  return p[0] == 0 && !memcmp(p, p + 1, n - 1);
}

/* B's bits in new data clusters (none for a clean one, as QEMU stores
 * them) and a new table. */
static int write_bitmap(struct qcow2_bm_edit *e, struct ebm *b) {
  struct qcow2dev *q = e->q;
  uint32_t n = entries_for(q, b->gran_bits);
  uint8_t *t = calloc(n ? n : 1, 8);
  int r = t ? forget_table(e, b) : -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < n; i++) {
    const uint8_t *c = b->bits + (uint64_t)i * q->csize;
    uint64_t off = 0;
    if (!all_zero(c, q->csize))
      r = qcow2_bm_write_new(q, c, q->csize, &off);
    put_be64(t + i * 8ull, off);
  }
  uint64_t toff = 0;
  if (r == 0)
    r = qcow2_bm_write_new(q, t, n * 8ull, &toff);
  if (r == 0) {
    b->table_off = toff;
    b->table_size = n;
    b->rewrite = false;
  }
  free(t);
  return r;
}

/* The directory of E's bitmaps in new clusters: *SIZE bytes at *OFF. */
static int write_dir(struct qcow2_bm_edit *e, uint64_t *size, uint64_t *off) {
  struct qcow2_bitmap_entry *d = calloc(e->n ? e->n : 1, sizeof *d);
  if (!d)
    return -ENOMEM;
  size_t bytes = 0;
  for (uint32_t i = 0; i < e->n; i++) {
    const struct ebm *b = &e->b[i];
    d[i] = (struct qcow2_bitmap_entry){b->table_off, b->table_size, b->flags,
                                       b->gran_bits, b->name};
    bytes += qcow2_bitmap_entry_size(strlen(b->name));
  }
  uint8_t *buf = malloc(bytes ? bytes : 1);
  int r = buf ? 0 : -ENOMEM;
  if (r == 0 && e->n) {
    *size = qcow2_bitmap_dir_write(d, e->n, buf);
    r = qcow2_bm_write_new(e->q, buf, *size, off);
  }
  free(buf);
  free(d);
  return r;
}

static int write_autoclear(struct qcow2dev *q, uint64_t v) {
  uint8_t b[8];
  put_be64(b, v);
  int r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, b, 8, 88);
  return r < 0 ? r : io_fdatasync(q->fd);
}

/* The header extensions rebuilt with EXT as the bitmaps extension (or
 * none): the BITMAPS autoclear bit is off meanwhile, so that a torn write
 * leaves stale bitmaps (leaked clusters), never a wrong directory. */
static int rebuild_header(struct qcow2dev *q, const uint8_t *ext) {
  size_t len = q->file_size < q->csize ? (size_t)q->file_size : q->csize;
  uint8_t *hdr = malloc(len), *out = malloc(len);
  size_t used = 0;
  int r = hdr && out ? 0 : -ENOMEM;
  uint64_t ac = q->h.autoclear & ~QCOW2_AUTOCLEAR_BITMAPS;
  if (r == 0 && (q->h.autoclear & QCOW2_AUTOCLEAR_BITMAPS))
    r = write_autoclear(q, ac);
  if (r == 0)
    r = io_pread_zero(q->fd, hdr, len, 0);
  if (r == 0)
    r = qcow2_rebuild_extensions(hdr, len, q->h.header_length,
                                 q->h.backing_offset, q->h.backing_size, ext,
                                 out, &used);
  if (r == -ENOSPC)
    bd_set_error("qcow2 %s: no room for the bitmaps extension in the header "
                 "cluster",
                 q->path);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, out, len, 0);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0 && ext)
    r = write_autoclear(q, ac | QCOW2_AUTOCLEAR_BITMAPS);
  free(hdr);
  free(out);
  return r;
}

int qcow2_bm_write_header(struct qcow2dev *q, uint32_t nb, uint64_t size,
                          uint64_t off, struct qcow2_header *h) {
  uint8_t ext[24] = {0};
  put_be32(ext, nb);
  put_be64(ext + 8, size);
  put_be64(ext + 16, off);
  int r;
  /* Valid already: one write of 24 bytes switches directories. */
  if (nb && q->h.has_bitmaps && (q->h.autoclear & QCOW2_AUTOCLEAR_BITMAPS)) {
    r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, ext, 24, q->h.bitmaps_ext_pos);
    if (r == 0)
      r = io_fdatasync(q->fd);
  } else {
    r = rebuild_header(q, nb ? ext : NULL);
  }
  if (r < 0)
    return r;
  /* The header as it is now, for whoever looks at it next. */
  uint8_t *b = malloc(q->csize);
  size_t len = q->file_size < q->csize ? (size_t)q->file_size : q->csize;
  r = b ? io_pread_zero(q->fd, b, len, 0) : -ENOMEM;
  if (r == 0)
    r = qcow2_parse_header(b, len, q->file_size, h);
  free(b);
  return r;
}

/* A table no longer referenced: its data clusters (those that are plainly
 * its own: a valid entry, refcount 1) and itself.  Anything doubtful is
 * left allocated: a leak, which check -r leaks reclaims. */
static void free_table(struct qcow2dev *q, const struct old_table *o) {
  uint64_t *t = malloc((size_t)o->size * 8);
  if (!t || io_pread_zero(q->fd, t, (size_t)o->size * 8, o->off) < 0) {
    free(t);
    return;
  }
  for (uint32_t i = 0; i < o->size; i++) {
    uint64_t e = get_be64(&t[i]), off = e & QCOW2_OFFSET_MASK, rc = 0;
    if (!off || !qcow2_bitmap_entry_ok(e, q->h.cluster_bits) ||
        off >= q->file_size ||
        qcow2_rc_get(q, off >> q->h.cluster_bits, &rc) < 0 || rc != 1)
      continue;
    qcow2_guard_unmark(q, QCOW2_OL_BITMAPS, off, q->csize);
    qcow2_free_range(q, off, q->csize, true);
  }
  uint64_t bytes = clusters_for(q, (uint64_t)o->size * 8) * q->csize;
  qcow2_guard_unmark(q, QCOW2_OL_BITMAPS, o->off, bytes);
  qcow2_free_range(q, o->off, bytes, true);
  free(t);
}

static int commit(struct qcow2_bm_edit *e) {
  struct qcow2dev *q = e->q;
  int r = 0;
  for (uint32_t i = 0; r == 0 && i < e->n; i++)
    if (e->b[i].rewrite)
      r = write_bitmap(e, &e->b[i]);
  uint64_t size = 0, off = 0;
  if (r == 0)
    r = write_dir(e, &size, &off);
  if (r == 0) /* all of it, and its refcounts, before the header */
    r = io_fdatasync(q->fd);
  uint64_t old_off = q->h.bitmaps_dir_offset, old_size = q->h.bitmaps_dir_size;
  bool had_dir = q->h.bitmaps_nb != 0;
  if (r == 0)
    r = qcow2_bm_write_header(q, e->n, size, off, &q->h);
  if (r < 0)
    return r;
  for (size_t i = 0; i < e->nold; i++)
    free_table(q, &e->old[i]);
  e->nold = 0;
  if (had_dir) {
    uint64_t bytes = clusters_for(q, old_size) * q->csize;
    qcow2_guard_unmark(q, QCOW2_OL_BITMAPS, old_off, bytes);
    qcow2_free_range(q, old_off, bytes, true);
  }
  for (uint32_t i = 0; i < e->n; i++)
    e->b[i].on_disk = true;
  e->stored = e->n;
  e->stored_size = size;
  e->changed = false;
  return io_fdatasync(q->fd);
}

int qcow2_bm_commit(struct qcow2_bm_edit *e) {
  if (!e->changed)
    return 0;
  struct qcow2dev *q = e->q;
  if (!q->writable) {
    bd_set_error("qcow2 %s: opened read-only", q->path);
    return -EROFS;
  }
  pthread_mutex_lock(&q->meta);
  int r = commit(e);
  pthread_mutex_unlock(&q->meta);
  if (r < 0 && r != -EINVAL && r != -ENOSPC)
    bd_set_error("qcow2 %s: storing the bitmaps: %s", q->path, strerror(-r));
  return r;
}
