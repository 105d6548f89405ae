/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal snapshots of a qcow2 image: create, delete, apply (see
 * snapshot-edit.h for the refcount rules and the order on disk).  The
 * trees are walked on the file, under the metadata lock; the L2 slices the
 * cache holds for the active image follow every entry changed here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"
#include "snapshot-edit.h"
#include "snapshot.h"

#define NAME_MAX_BYTES 255 /* QEMU keeps names in 256 bytes */
#define L2_KINDS (QCOW2_OL_ACTIVE_L2 | QCOW2_OL_INACTIVE_L2)

bool qcow2_entry_extent(unsigned cluster_bits, bool extended_l2, uint64_t entry,
                        uint64_t *off, uint64_t *len, bool *has_copied) {
  *has_copied = false;
  if (entry & QCOW2_L2_COMPRESSED) {
    unsigned x = 62 - (cluster_bits - 8);
    uint64_t coff = entry & ((1ull << x) - 1);
    uint64_t nsect = (entry >> x) & ((1ull << (cluster_bits - 8)) - 1);
    *off = coff;
    *len = (nsect + 1) * 512 - (coff & 511);
    return coff != 0;
  }
  (void)extended_l2; /* the zero flag keeps the offset either way */
  *off = entry & QCOW2_OFFSET_MASK;
  *len = 1ull << cluster_bits;
  *has_copied = true;
  return *off != 0;
}

uint64_t qcow2_entry_copied(uint64_t entry, uint64_t refcount) {
  return refcount == 1 ? entry | QCOW2_L2_COPIED : entry & ~QCOW2_L2_COPIED;
}

static int invalid(struct qcow2dev *q, const char *what, uint64_t v) {
  bd_set_error("qcow2 %s: %s 0x%llx is invalid", q->path, what,
               (unsigned long long)v);
  return -EIO;
}

static uint64_t clusters_for(const struct qcow2dev *q, uint64_t bytes) {
  return (bytes + q->csize - 1) >> q->h.cluster_bits;
}

/* Inside what the image allocated. */
static bool extent_ok(const struct qcow2dev *q, uint64_t off, uint64_t len) {
  return len <= q->alloc_end && off <= q->alloc_end - len;
}

/* One reference more (ADDEND 1) or less (-1) on every cluster of the
 * extent.  Dropping the last one of metadata takes KINDS off the guard's
 * map first (it refuses to free metadata otherwise); data is punched. */
static int ref_extent(struct qcow2dev *q, uint64_t off, uint64_t len,
                      int addend, unsigned kinds, bool punch) {
  uint64_t first = off >> q->h.cluster_bits;
  uint64_t last = (off + len - 1) >> q->h.cluster_bits;
  if (addend < 0) {
    uint64_t rc = 0;
    int r = qcow2_rc_get(q, first, &rc);
    if (r == 0 && rc == 1 && kinds)
      qcow2_guard_unmark(q, kinds, off, len);
    return r < 0 ? r : qcow2_free_range(q, off, len, punch);
  }
  for (uint64_t c = first; c <= last; c++) {
    int r = qcow2_rc_update(q, c, addend);
    if (r < 0)
      return r;
  }
  return 0;
}

static int refuse_data_file(struct qcow2dev *q) {
  if (!q->g.data_file)
    return 0;
  bd_set_error("qcow2 %s: internal snapshots are not supported with an "
               "external data file",
               q->path);
  return -ENOTSUP;
}

/* A tree walk: ADDEND on every L2 table and data cluster the L1 table
 * (L1, host-endian, N entries) reaches; with ACTIVE, the COPIED flags of
 * the active image's L1 and L2 entries recomputed and written. */
struct walk {
  struct qcow2dev *q;
  const uint64_t *l1;
  uint32_t n;
  int addend;
  bool active;
  uint8_t *tbl; /* one L2 table */
};

/* The cached slice of the entry I of the active L2 table at L2OFF. */
static void follow_cache(struct qcow2dev *q, uint64_t l2off, uint64_t i,
                         uint64_t value) {
  size_t idx;
  uint64_t key = qcow2_slice_key(q, l2off, i, &idx);
  l2cache_set(q->cache, key, idx, value);
}

static int walk_entry(struct walk *w, uint64_t l2off, uint64_t i, bool *dirty) {
  struct qcow2dev *q = w->q;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  uint64_t entry = get_be64(w->tbl + i * esize), off, len;
  bool has_copied;
  if (!qcow2_entry_extent(q->h.cluster_bits, q->g.extended_l2, entry, &off,
                          &len, &has_copied))
    return 0;
  if (!extent_ok(q, off, len))
    return invalid(q, "L2 entry", entry);
  int r = w->addend ? ref_extent(q, off, len, w->addend, 0, has_copied) : 0;
  if (r < 0 || !w->active || !has_copied)
    return r;
  uint64_t rc = 0;
  r = qcow2_rc_get(q, off >> q->h.cluster_bits, &rc);
  uint64_t ne = qcow2_entry_copied(entry, rc);
  if (r == 0 && ne != entry) {
    put_be64(w->tbl + i * esize, ne);
    follow_cache(q, l2off, i, ne);
    *dirty = true;
  }
  return r;
}

static int walk_l2(struct walk *w, uint64_t l2off) {
  struct qcow2dev *q = w->q;
  int r = io_pread_zero(q->fd, w->tbl, q->csize, l2off);
  bool dirty = false;
  uint64_t n = q->csize / (q->g.extended_l2 ? 16 : 8);
  for (uint64_t i = 0; r == 0 && i < n; i++)
    r = walk_entry(w, l2off, i, &dirty);
  if (r == 0 && dirty)
    r = qcow2_guard_pwrite(q, L2_KINDS, w->tbl, q->csize, l2off);
  return r;
}

/* The L2 table of L1 entry I: its entries, then the table itself. */
static int walk_l1_entry(struct walk *w, uint32_t i, uint64_t *out) {
  struct qcow2dev *q = w->q;
  uint64_t l1e = w->l1[i], l2off = l1e & QCOW2_OFFSET_MASK;
  *out = l1e;
  if (!l2off)
    return 0;
  if ((l2off & (q->csize - 1)) || !extent_ok(q, l2off, q->csize))
    return invalid(q, "L1 entry", l1e);
  int r = walk_l2(w, l2off);
  if (r == 0 && w->addend > 0) /* now in a snapshot's tree too */
    r = qcow2_guard_mark(q, QCOW2_OL_INACTIVE_L2, l2off, q->csize);
  if (r == 0 && w->addend)
    r = ref_extent(q, l2off, q->csize, w->addend, L2_KINDS, true);
  uint64_t rc = 0;
  if (r == 0 && w->active)
    r = qcow2_rc_get(q, l2off >> q->h.cluster_bits, &rc);
  if (r == 0 && w->active)
    *out = qcow2_entry_copied(l1e, rc);
  return r;
}

static int walk_tree(struct walk *w) {
  struct qcow2dev *q = w->q;
  int r = refuse_data_file(q); /* its clusters have no refcounts */
  if (r < 0)
    return r;
  w->tbl = malloc(q->csize);
  r = w->tbl ? 0 : -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < w->n; i++) {
    uint64_t ne;
    r = walk_l1_entry(w, i, &ne);
    if (r == 0 && w->active && ne != q->l1[i]) {
      uint8_t b[8];
      put_be64(b, ne);
      r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L1, b, 8,
                             q->h.l1_offset + i * 8ull);
      if (r == 0)
        q->l1[i] = ne;
    }
  }
  free(w->tbl);
  return r;
}

static int walk_active(struct qcow2dev *q, int addend) {
  struct walk w = {q, q->l1, q->h.l1_size, addend, true, NULL};
  return walk_tree(&w);
}

/* ADDEND on the tree of the L1 table of N entries at OFF on disk (or,
 * with L1 non-NULL, that copy of it). */
static int walk_other(struct qcow2dev *q, uint64_t off, uint32_t n,
                      const uint64_t *l1, int addend) {
  uint64_t *t = NULL;
  if (!l1 && n) {
    if ((off & (q->csize - 1)) || !extent_ok(q, off, n * 8ull))
      return invalid(q, "snapshot L1 table offset", off);
    t = malloc(n * 8ull);
    int r = t ? io_pread_zero(q->fd, t, n * 8ull, off) : -ENOMEM;
    for (uint32_t i = 0; r == 0 && i < n; i++)
      t[i] = get_be64(&t[i]);
    if (r < 0) {
      free(t);
      return r;
    }
    l1 = t;
  }
  struct walk w = {q, l1, n, addend, false, NULL};
  int r = walk_tree(&w);
  free(t);
  return r;
}

/* ---- the snapshot table ---- */

struct table {
  struct qcow2_snapshot *s;
  uint32_t n;
};

static int read_table(struct qcow2dev *q, struct table *t) {
  size_t used;
  t->s = NULL;
  t->n = q->h.nb_snapshots;
  if (!t->n)
    return 0;
  int r = qcow2_read_snapshots(q->fd, q->file_size, &q->h, true, &t->s, &used);
  if (r < 0)
    t->n = 0;
  return r == -ENOSPC ? -EINVAL : r;
}

/* T as the image's table: in new clusters, flushed, then the header's two
 * fields in one write, then the old table freed. */
static int write_table(struct qcow2dev *q, const struct table *t) {
  size_t bytes = qcow2_snapshot_table_size(t->s, t->n);
  if (bytes > QCOW2_MAX_SNAPSHOTS_BYTES) {
    bd_set_error("qcow2 %s: the snapshot table would exceed %u bytes", q->path,
                 QCOW2_MAX_SNAPSHOTS_BYTES);
    return -EFBIG;
  }
  uint64_t nc = clusters_for(q, bytes), off = 0;
  uint8_t *buf = calloc(nc ? nc : 1, q->csize);
  int r = buf ? 0 : -ENOMEM;
  if (r == 0 && nc) {
    qcow2_snapshot_table_write(t->s, t->n, buf);
    r = qcow2_alloc_contiguous(q, nc, QCOW2_OL_SNAPSHOT_TABLE, &off);
    if (r == 0)
      r = qcow2_guard_pwrite(q, QCOW2_OL_SNAPSHOT_TABLE, buf, nc * q->csize,
                             off);
  }
  free(buf);
  if (r == 0) /* the table and every refcount before the header */
    r = io_fdatasync(q->fd);
  uint8_t h[12];
  put_be32(h, t->n);
  put_be64(h + 4, off);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, h, 12, 60);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r < 0)
    return r;
  uint64_t old = q->h.snapshots_offset;
  size_t old_bytes = 0;
  if (q->h.nb_snapshots) {
    struct qcow2_snapshot *s;
    if (qcow2_read_snapshots(q->fd, q->file_size, &q->h, false, &s,
                             &old_bytes) == 0)
      qcow2_free_snapshots(s, q->h.nb_snapshots);
  }
  q->h.nb_snapshots = t->n;
  q->h.snapshots_offset = off;
  if (!old_bytes || !extent_ok(q, old, old_bytes))
    return 0; /* nothing to free, or not ours to: it leaks */
  uint64_t ob = clusters_for(q, old_bytes) * q->csize;
  return ref_extent(q, old, ob, -1, QCOW2_OL_SNAPSHOT_TABLE, true);
}

/* ---- create ---- */

/* The active L1 table, copied to new clusters: *OFF. */
static int copy_active_l1(struct qcow2dev *q, uint64_t *off) {
  uint64_t bytes = q->h.l1_size * 8ull, nc = clusters_for(q, bytes);
  *off = 0;
  if (!nc)
    return 0;
  uint8_t *b = calloc(nc, q->csize);
  int r =
      b ? qcow2_alloc_contiguous(q, nc, QCOW2_OL_INACTIVE_L1, off) : -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < q->h.l1_size; i++)
    put_be64(b + i * 8ull, q->l1[i]);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_INACTIVE_L1, b, nc * q->csize, *off);
  free(b);
  return r;
}

static int add_entry(struct qcow2dev *q, struct table *t, const char *name,
                     uint32_t sec, uint32_t nsec, uint64_t l1off) {
  struct qcow2_snapshot *ns = realloc(t->s, (t->n + 1) * sizeof *ns);
  if (!ns)
    return -ENOMEM;
  t->s = ns;
  char id[32];
  qcow2_snapshot_next_id(ns, t->n, id, sizeof id);
  struct qcow2_snapshot *s = &ns[t->n];
  *s = (struct qcow2_snapshot){.l1_offset = l1off,
                               .l1_size = q->h.l1_size,
                               .id = strdup(id),
                               .name = strndup(name, NAME_MAX_BYTES),
                               .date_sec = sec,
                               .date_nsec = nsec,
                               .disk_size = q->h.size,
                               .icount = 0};
  t->n++;
  return s->id && s->name ? 0 : -ENOMEM;
}

/* Sizes QEMU did not record are the image's now, as QEMU reads them. */
static void known_sizes(struct qcow2dev *q, struct table *t) {
  for (uint32_t i = 0; i < t->n; i++)
    if (t->s[i].disk_size == UINT64_MAX)
      t->s[i].disk_size = q->h.size;
}

static int create(struct qcow2dev *q, const char *name, uint32_t sec,
                  uint32_t nsec) {
  struct table t;
  int r = refuse_data_file(q);
  if (r == 0 && q->h.nb_snapshots >= QCOW2_MAX_SNAPSHOTS)
    r = -EFBIG;
  if (r == 0)
    r = read_table(q, &t);
  if (r < 0)
    return r;
  known_sizes(q, &t);
  uint64_t l1off = 0;
  r = copy_active_l1(q, &l1off);
  if (r == 0)
    r = walk_active(q, 1);
  if (r == 0)
    r = add_entry(q, &t, name, sec, nsec, l1off);
  if (r == 0)
    r = write_table(q, &t);
  qcow2_free_snapshots(t.s, t.n);
  return r;
}

/* ---- delete ---- */

static int not_found(void) {
  bd_set_error("snapshot not found");
  return -ENOENT;
}

static int delete (struct qcow2dev *q, const char *name) {
  struct table t;
  int r = read_table(q, &t);
  if (r < 0)
    return r;
  int i = qcow2_snapshot_find(t.s, t.n, name, false);
  r = i < 0 ? not_found() : refuse_data_file(q);
  if (r < 0) {
    qcow2_free_snapshots(t.s, t.n);
    return r;
  }
  known_sizes(q, &t);
  struct qcow2_snapshot gone = t.s[i];
  memmove(&t.s[i], &t.s[i + 1], (t.n - (uint32_t)i - 1) * sizeof *t.s);
  t.n--;
  r = write_table(q, &t);
  /* No longer in the table: its tree loses its references. */
  if (r == 0)
    r = walk_other(q, gone.l1_offset, gone.l1_size, NULL, -1);
  if (r == 0 && gone.l1_size)
    r = ref_extent(q, gone.l1_offset,
                   clusters_for(q, gone.l1_size * 8ull) * q->csize, -1,
                   QCOW2_OL_INACTIVE_L1, true);
  if (r == 0)
    r = walk_active(q, 0);
  free(gone.id);
  free(gone.name);
  free(gone.extra);
  qcow2_free_snapshots(t.s, t.n);
  return r;
}

/* ---- apply ---- */

/* The snapshot's L1 table, as long as the active one. */
static int read_snapshot_l1(struct qcow2dev *q, const struct qcow2_snapshot *s,
                            uint64_t **out) {
  if (s->l1_size > q->h.l1_size) {
    bd_set_error("qcow2 %s: the snapshot's L1 table is larger than the "
                 "image's",
                 q->path);
    return -EFBIG;
  }
  if (s->l1_size && ((s->l1_offset & (q->csize - 1)) ||
                     !extent_ok(q, s->l1_offset, s->l1_size * 8ull)))
    return invalid(q, "snapshot L1 table offset", s->l1_offset);
  uint64_t *t = calloc(q->h.l1_size ? q->h.l1_size : 1, 8);
  int r =
      t ? io_pread_zero(q->fd, t, s->l1_size * 8ull, s->l1_offset) : -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < s->l1_size; i++)
    t[i] = get_be64(&t[i]);
  if (r < 0) {
    free(t);
    return r;
  }
  *out = t;
  return 0;
}

/* The active L1 table becomes NL1 (the snapshot's): its tree gains a
 * reference before the active table changes on disk, the old tree loses
 * its own after, and the COPIED flags follow the new tree. */
static int switch_l1(struct qcow2dev *q, uint64_t *nl1) {
  uint32_t n = q->h.l1_size;
  int r = walk_other(q, 0, n, nl1, 1);
  uint8_t *b = r == 0 ? malloc(n ? n * 8ull : 1) : NULL;
  if (r == 0 && !b)
    r = -ENOMEM;
  for (uint32_t i = 0; r == 0 && i < n; i++)
    put_be64(b + i * 8ull, nl1[i]);
  if (r == 0 && n)
    r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L1, b, n * 8ull, q->h.l1_offset);
  if (r == 0)
    r = io_fdatasync(q->fd);
  free(b);
  if (r < 0)
    return r;
  uint64_t *old = q->l1;
  q->l1 = nl1;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t l2off = old[i] & QCOW2_OFFSET_MASK;
    if (l2off)
      qcow2_guard_l2_replaced(q, l2off);
  }
  r = walk_other(q, 0, n, old, -1);
  free(old);
  for (uint32_t i = 0; r == 0 && i < n; i++) {
    uint64_t l2off = nl1[i] & QCOW2_OFFSET_MASK;
    if (l2off)
      r = qcow2_guard_mark(q, QCOW2_OL_ACTIVE_L2, l2off, q->csize);
  }
  return r == 0 ? walk_active(q, 0) : r;
}

static int apply(struct bd *bd, struct qcow2dev *q, const char *id_or_name) {
  struct table t;
  int r = read_table(q, &t);
  if (r < 0)
    return r;
  int i = qcow2_snapshot_find(t.s, t.n, id_or_name, true);
  if (i < 0) {
    qcow2_free_snapshots(t.s, t.n);
    bd_set_error("Failed to load snapshot: %s", strerror(ENOENT));
    return -ENOENT;
  }
  r = refuse_data_file(q); /* before anything changes */
  uint64_t size = t.s[i].disk_size;
  if (r == 0 && size != UINT64_MAX && size != q->h.size) {
    pthread_mutex_unlock(&q->meta);
    r = bd_resize(bd, size, BD_PREALLOC_OFF);
    if (r == 0)
      r = bd_flush(bd);
    pthread_mutex_lock(&q->meta);
  }
  uint64_t *nl1 = NULL;
  if (r == 0)
    r = read_snapshot_l1(q, &t.s[i], &nl1);
  if (r == 0)
    r = switch_l1(q, nl1);
  qcow2_free_snapshots(t.s, t.n);
  return r;
}

/* ---- entry points ---- */

int qcow2_snapshot_list(struct bd *bd, struct qcow2_snapshot **out,
                        uint32_t *n) {
  *out = NULL;
  *n = 0;
  if (strcmp(bd->format, "qcow2"))
    return 0;
  struct table t;
  int r = read_table(bd->priv, &t);
  if (r == 0) {
    *out = t.s;
    *n = t.n;
  }
  return r;
}

static int run(struct bd *bd,
               int (*op)(struct bd *, struct qcow2dev *, const void *,
                         const void *),
               const void *a, const void *b) {
  struct qcow2dev *q = bd->priv;
  if (!q->writable) {
    bd_set_error("qcow2 %s: opened read-only", q->path);
    return -EROFS;
  }
  int r = qcow2_writes_refused(q);
  if (r < 0)
    return r;
  pthread_mutex_lock(&q->meta);
  r = op(bd, q, a, b);
  if (r < 0 && r != -ENOENT && r != -ENOTSUP && r != -EFBIG)
    qcow2_mark_broken(q, r, "changing the snapshots");
  pthread_mutex_unlock(&q->meta);
  return r;
}

struct create_args {
  uint32_t sec, nsec;
};

static int op_create(struct bd *bd, struct qcow2dev *q, const void *a,
                     const void *b) {
  (void)bd;
  const struct create_args *c = b;
  return create(q, a, c->sec, c->nsec);
}

static int op_delete(struct bd *bd, struct qcow2dev *q, const void *a,
                     const void *b) {
  (void)bd;
  (void)b;
  return delete (q, a);
}

static int op_apply(struct bd *bd, struct qcow2dev *q, const void *a,
                    const void *b) {
  (void)b;
  return apply(bd, q, a);
}

static int not_qcow2(struct bd *bd) {
  if (!strcmp(bd->format, "qcow2"))
    return 0;
  bd_set_error("Block driver does not support snapshots");
  return -ENOTSUP;
}

int qcow2_snapshot_create(struct bd *bd, const char *name, uint32_t date_sec,
                          uint32_t date_nsec) {
  struct create_args c = {date_sec, date_nsec};
  int r = not_qcow2(bd);
  return r < 0 ? r : run(bd, op_create, name, &c);
}

int qcow2_snapshot_delete(struct bd *bd, const char *name) {
  int r = not_qcow2(bd);
  return r < 0 ? not_found() : run(bd, op_delete, name, NULL);
}

int qcow2_snapshot_apply(struct bd *bd, const char *id_or_name) {
  int r = not_qcow2(bd);
  return r < 0 ? r : run(bd, op_apply, id_or_name, NULL);
}
