/* qcow2 consistency: count every reference to every host cluster by
 * walking the metadata (header, L1 and L2 tables of the active image and of
 * each snapshot, snapshot table, refcount structures, data), compare with
 * the stored refcounts, and rebuild the refcount structures from the counts
 * when asked (a dirty image left by lazy refcounts, or a repair).
 *
 * Runs single-threaded, on an image nobody else is writing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../core/blockdev.h"
#include "../../core/io.h"
#include "../../core/log.h"
#include "../../server/wire.h"
#include "../formats.h"
#include "check.h"
#include "guard.h"
#include "qcow2-internal.h"
#include "snapshot.h"

struct refs {
  uint32_t *n;     /* references per host cluster (saturating) */
  uint64_t count;  /* clusters covered */
  uint64_t errors; /* references outside the file or unaligned */
  FILE *report;
  struct qcow2dev *q;
};

static void problem(struct refs *r, const char *what, unsigned long long v) {
  r->errors++;
  if (r->report)
    fprintf(r->report, "ERROR: %s (0x%llx)\n", what, v);
}

/* One reference to each cluster of [off, off+len). */
static void ref_range(struct refs *r, uint64_t off, uint64_t len) {
  if (len == 0)
    return;
  uint64_t first = off >> r->q->h.cluster_bits;
  uint64_t last = (off + len - 1) >> r->q->h.cluster_bits;
  if (last >= r->count) {
    problem(r, "reference beyond the end of the file", (unsigned long long)off);
    return;
  }
  for (uint64_t c = first; c <= last; c++)
    if (r->n[c] != UINT32_MAX)
      r->n[c]++;
}

/* The L2 table at L2OFF and the clusters its entries hold. */
static int walk_l2(struct refs *r, uint64_t l2off, uint8_t *tbl) {
  struct qcow2dev *q = r->q;
  if (l2off & (q->csize - 1) || l2off >= q->file_size) {
    problem(r, "invalid L2 table offset", (unsigned long long)l2off);
    return 0;
  }
  ref_range(r, l2off, q->csize);
  int e = io_pread_zero(q->fd, tbl, q->csize, l2off);
  if (e < 0)
    return e;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  for (uint64_t i = 0; i < q->csize / esize; i++) {
    uint64_t entry = get_be64(tbl + i * esize);
    uint64_t bitmap = q->g.extended_l2 ? get_be64(tbl + i * esize + 8) : 0;
    struct qcow2_run run;
    if (qcow2_decode_l2(&q->g, entry, bitmap, 0, (uint32_t)q->csize, &run) <
        0) {
      problem(r, "invalid L2 entry", (unsigned long long)entry);
      continue;
    }
    if (entry & QCOW2_L2_COMPRESSED) {
      ref_range(r, run.coffset, run.csize);
    } else if (!q->g.data_file && (entry & QCOW2_OFFSET_MASK)) {
      /* Data clusters, and preallocated zero clusters, are referenced. */
      ref_range(r, entry & QCOW2_OFFSET_MASK, q->csize);
    }
  }
  return 0;
}

/* An L1 table and everything below it. */
static int walk_l1(struct refs *r, uint64_t l1off, uint32_t l1size,
                   uint8_t *tbl) {
  struct qcow2dev *q = r->q;
  uint64_t bytes = (uint64_t)l1size * 8;
  if (l1size == 0)
    return 0;
  if (l1off & (q->csize - 1) || l1off > q->file_size ||
      bytes > q->file_size - l1off || bytes > QCOW2_MAX_L1_BYTES) {
    problem(r, "invalid L1 table offset", (unsigned long long)l1off);
    return 0;
  }
  ref_range(r, l1off, bytes);
  uint8_t *l1 = malloc(bytes);
  int e = l1 ? io_pread_zero(q->fd, l1, bytes, l1off) : -ENOMEM;
  for (uint32_t i = 0; e == 0 && i < l1size; i++) {
    uint64_t l2off = get_be64(l1 + i * 8) & QCOW2_OFFSET_MASK;
    if (l2off)
      e = walk_l2(r, l2off, tbl);
  }
  free(l1);
  return e;
}

/* The snapshot table: its own clusters, and each snapshot's L1 tree. */
static int walk_snapshots(struct refs *r, uint8_t *tbl) {
  struct qcow2dev *q = r->q;
  if (q->h.nb_snapshots == 0)
    return 0;
  uint64_t avail = q->file_size - q->h.snapshots_offset; /* header checked */
  size_t len = 64 * 1024;
  for (;;) {
    if (len > avail)
      len = (size_t)avail;
    uint8_t *buf = malloc(len ? len : 1);
    int e =
        buf ? io_pread_zero(q->fd, buf, len, q->h.snapshots_offset) : -ENOMEM;
    struct qcow2_snapshot *snaps = NULL;
    size_t used = 0;
    char err[160];
    if (e == 0)
      e = qcow2_parse_snapshots(buf, len, q->h.nb_snapshots, q->csize,
                                q->file_size, &snaps, &used, err, sizeof err);
    free(buf);
    if (e == -ENOSPC && len < avail && len < QCOW2_MAX_SNAPSHOTS_BYTES) {
      len *= 4; /* the table is longer: read more */
      continue;
    }
    if (e == -EINVAL || e == -ENOSPC) {
      problem(r, "invalid snapshot table", q->h.snapshots_offset);
      return 0;
    }
    for (uint32_t i = 0; e == 0 && i < q->h.nb_snapshots; i++)
      e = walk_l1(r, snaps[i].l1_offset, snaps[i].l1_size, tbl);
    if (e == 0)
      ref_range(r, q->h.snapshots_offset, used);
    qcow2_free_snapshots(snaps, q->h.nb_snapshots);
    return e;
  }
}

static int count_refs(struct qcow2dev *q, struct refs *r, bool with_reftable) {
  r->q = q;
  r->count = (q->file_size + q->csize - 1) >> q->h.cluster_bits;
  r->n = calloc(r->count ? r->count : 1, sizeof *r->n);
  uint8_t *tbl = malloc(q->csize);
  if (!r->n || !tbl) {
    free(tbl);
    return -ENOMEM;
  }
  ref_range(r, 0, q->csize); /* header, extensions, backing file name */
  int e = walk_l1(r, q->h.l1_offset, q->h.l1_size, tbl);
  if (e == 0)
    e = walk_snapshots(r, tbl);
  if (e == 0 && with_reftable) {
    ref_range(r, q->h.reftable_offset,
              (uint64_t)q->h.reftable_clusters << q->h.cluster_bits);
    for (uint64_t i = 0; i < q->reftable_entries; i++)
      if (q->reftable[i])
        ref_range(r, q->reftable[i], q->csize);
  }
  free(tbl);
  return e;
}

/* Compare the counts with the stored refcounts. */
static int compare(struct qcow2dev *q, struct refs *r,
                   struct qcow2_check_result *res) {
  uint64_t end = r->count;
  /* Refcounts beyond the end of the file count too (they are leaks). */
  uint64_t covered = q->reftable_entries * q->rb_entries;
  for (uint64_t c = 0; c < (covered > end ? covered : end); c++) {
    uint64_t rc;
    if (c >= end && q->reftable[c / q->rb_entries] == 0) {
      c += q->rb_entries - 1 - c % q->rb_entries;
      continue;
    }
    int e = qcow2_rc_get(q, c, &rc);
    if (e < 0)
      return e;
    uint64_t refs = c < end ? r->n[c] : 0;
    if (refs)
      res->allocated++;
    if (rc > refs) {
      res->leaks++;
      if (r->report)
        fprintf(r->report, "Leaked cluster %llu refcount=%llu reference=%llu\n",
                (unsigned long long)c, (unsigned long long)rc,
                (unsigned long long)refs);
    } else if (rc < refs) {
      res->corruptions++;
      if (r->report)
        fprintf(r->report, "ERROR cluster %llu refcount=%llu reference=%llu\n",
                (unsigned long long)c, (unsigned long long)rc,
                (unsigned long long)refs);
    }
  }
  res->corruptions += r->errors;
  return 0;
}

/* COPIED must be set exactly on the active image's entries whose cluster
 * has one reference.  Counted as corruptions; FIX rewrites the flags. */
static bool copied_wrong(const struct refs *r, uint64_t entry, uint64_t host) {
  uint64_t c = host >> r->q->h.cluster_bits;
  bool want = c < r->count && r->n[c] == 1;
  return want != !!(entry & QCOW2_L2_COPIED);
}

static int check_copied_l2(struct refs *r, uint64_t l2off, uint8_t *tbl,
                           bool fix, uint64_t *bad) {
  struct qcow2dev *q = r->q;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  int e = io_pread_zero(q->fd, tbl, q->csize, l2off);
  for (uint64_t i = 0; e == 0 && i < q->csize / esize; i++) {
    uint64_t entry = get_be64(tbl + i * esize);
    uint64_t host = entry & QCOW2_OFFSET_MASK;
    if ((entry & QCOW2_L2_COMPRESSED) || !host || q->g.data_file ||
        !copied_wrong(r, entry, host))
      continue;
    (*bad)++;
    if (r->report)
      fprintf(r->report, "ERROR OFLAG_COPIED data cluster: l2_entry=%llx\n",
              (unsigned long long)entry);
    if (fix) {
      uint8_t b[8];
      put_be64(b, entry ^ QCOW2_L2_COPIED);
      e = io_pwrite_all(q->fd, b, 8, l2off + i * esize);
    }
  }
  return e;
}

static int check_copied(struct refs *r, bool fix, uint64_t *bad) {
  struct qcow2dev *q = r->q;
  uint8_t *tbl = malloc(q->csize);
  int e = tbl ? 0 : -ENOMEM;
  for (uint32_t i = 0; e == 0 && i < q->h.l1_size; i++) {
    uint64_t l1e = q->l1[i], l2off = l1e & QCOW2_OFFSET_MASK;
    if (!l2off || l2off & (q->csize - 1) || l2off >= q->file_size)
      continue;
    if (copied_wrong(r, l1e, l2off)) {
      (*bad)++;
      if (r->report)
        fprintf(r->report, "ERROR OFLAG_COPIED L2 cluster: l1_index=%u\n", i);
      if (fix) {
        q->l1[i] = l1e ^ QCOW2_L2_COPIED;
        uint8_t b[8];
        put_be64(b, q->l1[i]);
        e = io_pwrite_all(q->fd, b, 8, q->h.l1_offset + i * 8ull);
      }
    }
    if (e == 0)
      e = check_copied_l2(r, l2off, tbl, fix, bad);
  }
  free(tbl);
  return e;
}

int qcow2_check(struct qcow2dev *q, FILE *report,
                struct qcow2_check_result *res) {
  memset(res, 0, sizeof *res);
  if (!q->reftable) {
    int e = qcow2_rc_init(q);
    if (e < 0)
      return e;
  }
  struct refs r = {.report = report};
  int e = count_refs(q, &r, true);
  if (e == 0)
    e = compare(q, &r, res);
  if (e == 0)
    e = check_copied(&r, false, &res->corruptions);
  res->clusters = r.count;
  free(r.n);
  return e;
}

/* ---- rebuilding ---- */

static void put_refcount(const struct qcow2dev *q, uint8_t *blk, uint64_t i,
                         uint64_t v) {
  uint64_t bit = i * q->rc_bits;
  if (q->rc_bits < 8) {
    unsigned shift = (unsigned)(bit % 8);
    uint8_t mask = (uint8_t)(((1u << q->rc_bits) - 1) << shift);
    blk[bit / 8] = (uint8_t)((blk[bit / 8] & ~mask) | ((v << shift) & mask));
    return;
  }
  for (unsigned k = 0; k < q->rc_bits / 8; k++)
    blk[bit / 8 + q->rc_bits / 8 - 1 - k] = (uint8_t)(v >> (8 * k));
}

/* New refcount blocks and table at the end of the file, sized so that
 * they also describe themselves. */
static int write_structures(struct qcow2dev *q, struct refs *r) {
  uint64_t start = r->count, nblocks = 0, ntable = 1;
  for (;;) { /* fixpoint: the structures need refcounts too */
    uint64_t total = start + nblocks + ntable;
    uint64_t nb = (total + q->rb_entries - 1) / q->rb_entries;
    uint64_t nt = (nb * 8 + q->csize - 1) / q->csize;
    if (nb == nblocks && nt == ntable)
      break;
    nblocks = nb;
    ntable = nt;
  }
  uint64_t total = start + nblocks + ntable;
  if (ntable * q->csize > QCOW2_MAX_REFTABLE_BYTES)
    return -EFBIG;
  uint32_t *n = realloc(r->n, total * sizeof *n);
  if (!n)
    return -ENOMEM;
  r->n = n;
  for (uint64_t c = start; c < total; c++)
    n[c] = 1;
  uint8_t *blk = malloc(q->csize);
  uint8_t *table = calloc(ntable, q->csize);
  int e = blk && table ? 0 : -ENOMEM;
  uint64_t rcmax = q->rc_bits == 64 ? UINT64_MAX : (1ull << q->rc_bits) - 1;
  for (uint64_t b = 0; e == 0 && b < nblocks; b++) {
    memset(blk, 0, q->csize);
    for (uint64_t i = 0; i < q->rb_entries; i++) {
      uint64_t c = b * q->rb_entries + i;
      if (c < total && n[c])
        put_refcount(q, blk, i, n[c] < rcmax ? n[c] : rcmax);
    }
    uint64_t at = (start + b) << q->h.cluster_bits;
    put_be64(table + b * 8, at);
    e = io_pwrite_all(q->fd, blk, q->csize, at);
  }
  uint64_t toff = (start + nblocks) << q->h.cluster_bits;
  if (e == 0)
    e = io_pwrite_all(q->fd, table, ntable * q->csize, toff);
  if (e == 0)
    e = io_fdatasync(q->fd);
  uint8_t hdr[12];
  put_be64(hdr, toff);
  put_be32(hdr + 8, (uint32_t)ntable);
  if (e == 0)
    e = io_pwrite_all(q->fd, hdr, 12, 48);
  if (e == 0)
    e = io_fdatasync(q->fd);
  free(blk);
  free(table);
  if (e == 0) {
    q->h.reftable_offset = toff;
    q->h.reftable_clusters = (uint32_t)ntable;
    q->file_size = total << q->h.cluster_bits;
  }
  return e;
}

int qcow2_rebuild_refcounts(struct qcow2dev *q) {
  if (q->h.has_bitmaps) {
    bd_set_error("qcow2 %s: cannot rebuild the refcounts of an image with "
                 "persistent bitmaps",
                 q->path);
    return -ENOTSUP;
  }
  q->rc_bits = 1u << q->h.refcount_order;
  q->rb_entries = q->csize * 8 / q->rc_bits;
  struct refs r = {0};
  int e = count_refs(q, &r, false);
  if (e == 0 && r.errors) {
    bd_set_error("qcow2 %s: %llu invalid references; cannot rebuild "
                 "refcounts",
                 q->path, (unsigned long long)r.errors);
    e = -EIO;
  }
  uint64_t fixed = 0;
  if (e == 0)
    e = write_structures(q, &r);
  if (e == 0)
    e = check_copied(&r, true, &fixed);
  free(r.n);
  if (e == 0) {
    free(q->reftable);
    q->reftable = NULL;
    e = qcow2_rc_init(q);
  }
  if (e == 0)
    log_info("qcow2 %s: refcounts rebuilt", q->path);
  return e;
}

int qcow2_check_path(const char *path, enum qcow2_repair repair, bool share,
                     FILE *report, struct qcow2_check_result *res) {
  unsigned flags = BD_OPEN_READONLY | (share ? BD_OPEN_SHARE : 0);
  struct bd *bd = repair == QCOW2_REPAIR_NONE ? qcow2_open(path, flags)
                                              : qcow2_open_for_repair(path);
  if (!bd)
    return -EINVAL;
  struct qcow2dev *q = bd->priv;
  int e = qcow2_check(q, repair ? NULL : report, res);
  /* Leaks and refcount errors are both mended by a rebuild; a repair of
   * leaks only leaves images with corruptions alone. */
  bool mend = e == 0 && repair != QCOW2_REPAIR_NONE &&
              (res->leaks || res->corruptions) &&
              (repair == QCOW2_REPAIR_ALL || res->corruptions == 0);
  if (mend) {
    fprintf(report, "Repairing %llu leaked and %llu corrupted clusters\n",
            (unsigned long long)res->leaks,
            (unsigned long long)res->corruptions);
    e = qcow2_rebuild_refcounts(q);
  }
  if (e == 0 && repair != QCOW2_REPAIR_NONE)
    e = qcow2_check(q, report, res);
  /* As qemu-img: a repair that leaves no corruption clears the corrupt
   * bit (set when a write on metadata was refused). */
  if (e == 0 && repair != QCOW2_REPAIR_NONE && res->corruptions == 0)
    e = qcow2_mark_consistent(q);
  int c = bd_close(bd);
  return e < 0 ? e : c;
}
