/* SPDX-License-Identifier: BSD-3-Clause */
/* Downgrading a qcow2 image to version 2 (amend compat=0.10), with QEMU's
 * refusals in its order.  Version 2 has no zero flag: every zero cluster
 * of the image and of its snapshots becomes what reads the same in
 * version 2 (see expand_entry()).  A changed L2 table may be shared by
 * several L1 tables (snapshots): an entry there stands for as many
 * references as there are L1 entries pointing at the table, and the
 * refcounts move by that many.
 *
 * Order on disk, per L2 table: the new data clusters, zeroed and counted,
 * then the table, then the old clusters' references dropped (a crash
 * leaks at worst).  The header comes last; the persistent bitmaps, which
 * version 2 cannot keep, are removed before it (QEMU leaves them behind,
 * stale, their clusters leaked). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "amend.h"
#include "bitmap-edit.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"
#include "refs.h"
#include "snapshot.h"

/* An L2 table and the L1 entries pointing at it. */
struct l2use {
  uint64_t off;
  uint32_t refs;
  bool active;
};

struct expand {
  struct qcow2dev *q;
  struct l2use *t;
  size_t n, cap;
  uint8_t *zero, *tbl; /* a cluster of zeroes; the table being changed */
  uint64_t *drop;      /* clusters whose references went down */
  size_t ndrop, capdrop;
  bool compressed; /* the active image has compressed clusters */
};

static int add_l2(struct expand *x, uint64_t off, bool active) {
  for (size_t i = 0; i < x->n; i++)
    if (x->t[i].off == off) {
      x->t[i].refs++;
      x->t[i].active |= active;
      return 0;
    }
  if (x->n == x->cap) {
    size_t cap = x->cap ? 2 * x->cap : 64;
    struct l2use *t = realloc(x->t, cap * sizeof *t);
    if (!t)
      return -ENOMEM;
    x->t = t;
    x->cap = cap;
  }
  x->t[x->n++] = (struct l2use){off, 1, active};
  return 0;
}

static int add_l1(struct expand *x, const uint64_t *l1, uint32_t size,
                  bool big_endian, bool active) {
  int r = 0;
  for (uint32_t i = 0; r == 0 && i < size; i++) {
    uint64_t e = big_endian ? get_be64(&l1[i]) : l1[i];
    uint64_t off = e & QCOW2_OFFSET_MASK;
    if (off && off % x->q->csize == 0 && off < x->q->file_size)
      r = add_l2(x, off, active);
  }
  return r;
}

/* Every L2 table of the image and its snapshots. */
static int collect(struct expand *x) {
  struct qcow2dev *q = x->q;
  int r = add_l1(x, q->l1, q->h.l1_size, false, true);
  if (r < 0 || q->h.nb_snapshots == 0)
    return r;
  struct qcow2_snapshot *sn = NULL;
  size_t used = 0;
  r = qcow2_read_snapshots(q->fd, q->file_size, &q->h, true, &sn, &used);
  for (uint32_t i = 0; r == 0 && i < q->h.nb_snapshots; i++) {
    uint64_t bytes = (uint64_t)sn[i].l1_size * 8;
    uint64_t *l1 = malloc(bytes ? bytes : 1);
    r = l1 ? io_pread_zero(q->fd, l1, bytes, sn[i].l1_offset) : -ENOMEM;
    if (r == 0)
      r = add_l1(x, l1, sn[i].l1_size, true, false);
    free(l1);
  }
  if (sn)
    qcow2_free_snapshots(sn, q->h.nb_snapshots);
  return r;
}

static int note_drop(struct expand *x, uint64_t host) {
  if (x->ndrop == x->capdrop) {
    size_t cap = x->capdrop ? 2 * x->capdrop : 64;
    uint64_t *d = realloc(x->drop, cap * sizeof *d);
    if (!d)
      return -ENOMEM;
    x->drop = d;
    x->capdrop = cap;
  }
  x->drop[x->ndrop++] = host;
  return 0;
}

/* A new data cluster of zeroes, referenced REFS times. */
static int zeroed_cluster(struct expand *x, uint32_t refs, uint64_t *host) {
  struct qcow2dev *q = x->q;
  int r = qcow2_alloc_cluster(q, host);
  if (r == 0 && refs > 1)
    r = qcow2_rc_update(q, *host >> q->h.cluster_bits, (int64_t)refs - 1);
  if (r == 0)
    r = qcow2_data_pwrite(q, x->zero, q->csize, *host);
  return r;
}

/* The version 2 entry for ENTRY, in a table referenced REFS times.
 * Without a backing file an unallocated cluster reads as zeroes; with
 * one, only a data cluster of zeroes does.  A zero cluster with a host
 * cluster keeps it (as QEMU does), zeroed, when no other table shares it;
 * else it gets its own.  *OLD: a host cluster to drop REFS references
 * to once the table is written, or 0. */
static int expand_entry(struct expand *x, uint64_t entry, uint32_t refs,
                        uint64_t *out, uint64_t *old) {
  struct qcow2dev *q = x->q;
  enum qcow2_l2_type t = qcow2_l2_type(q, entry);
  uint64_t host = entry & QCOW2_OFFSET_MASK, rc = 0, copied = 0;
  *old = 0;
  *out = entry;
  if (t == L2_ZERO_PLAIN && !q->backing) {
    *out = 0;
    return 0;
  }
  if (t != L2_ZERO_PLAIN && t != L2_ZERO_ALLOC)
    return 0;
  int r =
      t == L2_ZERO_ALLOC ? qcow2_rc_get(q, host >> q->h.cluster_bits, &rc) : 0;
  if (r == 0 && t == L2_ZERO_ALLOC && rc <= refs) {
    *out = entry & ~QCOW2_L2_ZERO;
    return qcow2_data_pwrite(q, x->zero, q->csize, host);
  }
  *old = t == L2_ZERO_ALLOC ? host : 0;
  uint64_t fresh = 0;
  if (r == 0)
    r = zeroed_cluster(x, refs, &fresh);
  copied = refs == 1 ? QCOW2_L2_COPIED : 0;
  *out = fresh | copied;
  return r;
}

static int expand_table(struct expand *x, const struct l2use *u) {
  struct qcow2dev *q = x->q;
  int r = io_pread_zero(q->fd, x->tbl, q->csize, u->off);
  uint64_t nent = q->csize / 8, *olds = calloc(nent, sizeof *olds);
  bool changed = false;
  r = r < 0 ? r : olds ? 0 : -ENOMEM;
  for (uint64_t i = 0; r == 0 && i < nent; i++) {
    uint64_t e = get_be64(x->tbl + i * 8), ne;
    if (u->active && qcow2_l2_type(q, e) == L2_COMPRESSED)
      x->compressed = true;
    r = expand_entry(x, e, u->refs, &ne, &olds[i]);
    if (r == 0 && ne != e) {
      put_be64(x->tbl + i * 8, ne);
      changed = true;
    }
  }
  if (r == 0 && changed) /* the new clusters before the table */
    r = io_fdatasync(q->fd);
  if (r == 0 && changed)
    r = qcow2_guard_pwrite(
        q, u->active ? QCOW2_OL_ACTIVE_L2 : QCOW2_OL_INACTIVE_L2, x->tbl,
        q->csize, u->off);
  if (r == 0 && changed)
    r = io_fdatasync(q->fd);
  for (uint64_t i = 0; r == 0 && changed && i < nent; i++) {
    size_t idx;
    uint64_t key = qcow2_slice_key(q, u->off, i, &idx);
    l2cache_set(q->cache, key, idx, get_be64(x->tbl + i * 8));
    if (olds[i])
      r = qcow2_rc_update(q, olds[i] >> q->h.cluster_bits, -(int64_t)u->refs);
    if (r == 0 && olds[i])
      r = note_drop(x, olds[i]);
  }
  free(olds);
  return r;
}

/* Entries of the active tables whose cluster lost references: COPIED
 * says whether it is referenced once now. */
static int fix_copied(struct expand *x) {
  struct qcow2dev *q = x->q;
  int r = 0;
  for (size_t t = 0; r == 0 && x->ndrop && t < x->n; t++) {
    if (!x->t[t].active || x->t[t].refs != 1)
      continue;
    r = io_pread_zero(q->fd, x->tbl, q->csize, x->t[t].off);
    bool changed = false;
    for (uint64_t i = 0; r == 0 && i < q->csize / 8; i++) {
      uint64_t e = get_be64(x->tbl + i * 8), host = e & QCOW2_OFFSET_MASK;
      uint64_t rc = 0;
      bool hit = false;
      for (size_t d = 0; host && !hit && d < x->ndrop; d++)
        hit = x->drop[d] == host;
      if (!hit || qcow2_l2_type(q, e) != L2_NORMAL)
        continue;
      r = qcow2_rc_get(q, host >> q->h.cluster_bits, &rc);
      uint64_t ne = rc == 1 ? e | QCOW2_L2_COPIED : e & ~QCOW2_L2_COPIED;
      if (r == 0 && ne != e) {
        put_be64(x->tbl + i * 8, ne);
        size_t idx;
        l2cache_set(q->cache, qcow2_slice_key(q, x->t[t].off, i, &idx), idx,
                    ne);
        changed = true;
      }
    }
    if (r == 0 && changed)
      r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L2, x->tbl, q->csize,
                             x->t[t].off);
  }
  return r;
}

static int expand_zero_clusters(struct qcow2dev *q, bool *compressed) {
  struct expand x = {.q = q};
  x.zero = calloc(1, q->csize);
  x.tbl = malloc(q->csize);
  int r = x.zero && x.tbl ? collect(&x) : -ENOMEM;
  pthread_mutex_lock(&q->meta);
  for (size_t i = 0; r == 0 && i < x.n; i++)
    r = expand_table(&x, &x.t[i]);
  if (r == 0)
    r = fix_copied(&x);
  if (r == 0)
    r = io_fdatasync(q->fd);
  pthread_mutex_unlock(&q->meta);
  *compressed = x.compressed;
  free(x.zero);
  free(x.tbl);
  free(x.t);
  free(x.drop);
  return r;
}

/* Snapshots of another size, or with more VM state than version 2's 32
 * bits, are refused as QEMU refuses them. */
static int snapshots_ok(struct qcow2dev *q) {
  if (q->h.nb_snapshots == 0)
    return 0;
  struct qcow2_snapshot *sn = NULL;
  size_t used = 0;
  int r = qcow2_read_snapshots(q->fd, q->file_size, &q->h, false, &sn, &used);
  for (uint32_t i = 0; r == 0 && i < q->h.nb_snapshots; i++)
    if (sn[i].vm_state_size > UINT32_MAX ||
        (sn[i].disk_size != UINT64_MAX && sn[i].disk_size != q->h.size))
      r = qcow2_err(-ENOTSUP, "Internal snapshots prevent downgrade of image");
  if (sn)
    qcow2_free_snapshots(sn, q->h.nb_snapshots);
  return r;
}

static int drop_bitmaps(struct bd *bd) {
  struct qcow2dev *q = bd->priv;
  if (!q->h.bitmaps_nb && !q->bitmaps)
    return 0;
  struct qcow2_bm_edit *e = NULL;
  int r = qcow2_bm_open(bd, &e);
  struct qcow2_bm_info info;
  while (r == 0 && qcow2_bm_count(e)) {
    qcow2_bm_get(e, 0, &info);
    char *name = strdup(info.name);
    r = name ? qcow2_bm_remove(e, name) : -ENOMEM;
    free(name);
  }
  if (r == 0)
    r = qcow2_bm_commit(e);
  qcow2_bm_close(e);
  return r;
}

int qcow2_downgrade(struct bd *bd) {
  struct qcow2dev *q = bd->priv;
  if (q->h.refcount_order != 4)
    return qcow2_err(-ENOTSUP, "compat=0.10 requires refcount_bits=16");
  if (q->h.incompatible & QCOW2_INCOMPAT_DATA_FILE)
    return qcow2_err(-ENOTSUP, "Cannot downgrade an image with a data file");
  int r = snapshots_ok(q);
  if (r < 0)
    return r;
  /* Dirty lazy refcounts were repaired when the image was opened. */
  uint64_t incompat =
      q->h.incompatible & ~(QCOW2_INCOMPAT_COMPRESSION | QCOW2_INCOMPAT_DIRTY);
  if (incompat)
    return qcow2_err(-ENOTSUP,
                     "Cannot downgrade an image with incompatible features "
                     "0x%" PRIx64 " set",
                     incompat);
  bool compressed = false;
  r = expand_zero_clusters(q, &compressed);
  if (r < 0)
    return qcow2_err(r, "Failed to turn zero into data clusters: %s",
                     strerror(-r));
  if ((q->h.incompatible & QCOW2_INCOMPAT_COMPRESSION) && compressed)
    return qcow2_err(-ENOTSUP,
                     "Cannot downgrade an image with zstd compression type "
                     "and existing compressed clusters");
  r = drop_bitmaps(bd);
  if (r < 0)
    return r;
  struct qcow2_header h = q->h;
  h.version = 2;
  h.incompatible = h.compatible = h.autoclear = 0;
  h.compression_type = 0;
  h.bitmaps_nb = 0;
  r = qcow2_write_header(q, &h);
  if (r < 0)
    return r;
  q->g.v3 = false;
  q->l2_check_bits |= QCOW2_L2_ZERO;
  bd->caps.can_fast_zero = false;
  return 0;
}
