/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 references: walk the metadata (header, L1 and L2 tables of the
 * active image and of each snapshot, snapshot table, refcount table and
 * blocks, bitmap directory, tables and data) and count the references to
 * every host cluster, reporting malformed metadata on the way, with the
 * verdicts and messages of QEMU's check (block/qcow2-refcount.c,
 * calculate_refcounts()) so that `blockport check` and `qemu-img check`
 * agree.  Runs single-threaded, on an image nobody else is writing. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "qcow2-internal.h"
#include "refs.h"
#include "snapshot.h"

#define EXT_ALL_ALLOCATED 0x00000000ffffffffull
#define REFT_RESERVED 0x1ffull

void qcow2_say(const struct refs *r, const char *fmt, ...) {
  if (!r->report)
    return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(r->report, fmt, ap);
  va_end(ap);
  fputc('\n', r->report);
}

#define corrupt(r, ...) ((r)->res->corruptions++, qcow2_say((r), __VA_ARGS__))

static unsigned long long ull(uint64_t v) {
  return (unsigned long long)v;
}

/* Metadata of KIND at [off, off+len), in R->ol as far as it lies inside
 * the file (only the repairs' writes, all inside, are looked up). */
static void mark(struct refs *r, unsigned kind, uint64_t off, uint64_t len) {
  uint64_t end = r->count << r->q->h.cluster_bits;
  if (len == 0 || off >= end)
    return;
  if (len > end - off)
    len = end - off;
  if (qcow2_ol_mark(r->ol, off, len, kind) < 0)
    r->nomem = true;
}

/* One reference to each cluster [off, off+len) touches.  The last cluster
 * of a file may end early; a range that goes a cluster or more past the
 * end is an error and counts nothing. */
static void ref_range(struct refs *r, uint64_t off, uint64_t len) {
  struct qcow2dev *q = r->q;
  if (len == 0)
    return;
  if (off > UINT64_MAX - len ||
      (off + len > q->file_size && off + len - q->file_size >= q->csize)) {
    corrupt(r,
            "ERROR: counting reference for region exceeding the end of the "
            "file by one cluster or more: offset 0x%llx size 0x%llx",
            ull(off), ull(len));
    return;
  }
  uint64_t first = off >> q->h.cluster_bits;
  uint64_t last = (off + len - 1) >> q->h.cluster_bits;
  for (uint64_t c = first; c <= last; c++) {
    if (r->n[c] >= r->max) {
      corrupt(r, "ERROR: overflow cluster offset=0x%llx",
              ull(c << q->h.cluster_bits));
      continue;
    }
    r->n[c]++;
  }
  if (last + 1 > r->used)
    r->used = last + 1;
}

enum qcow2_l2_type qcow2_l2_type(const struct qcow2dev *q, uint64_t entry) {
  if (entry & QCOW2_L2_COMPRESSED)
    return L2_COMPRESSED;
  bool off = entry & QCOW2_OFFSET_MASK;
  if ((entry & QCOW2_L2_ZERO) && !q->g.extended_l2)
    return off ? L2_ZERO_ALLOC : L2_ZERO_PLAIN;
  /* Offset 0 is a cluster only in an external data file, marked COPIED. */
  if (!off && !(q->g.data_file && (entry & QCOW2_L2_COPIED)))
    return L2_UNALLOCATED;
  return L2_NORMAL;
}

static void count_compressed(struct refs *r, uint64_t i, uint64_t entry,
                             uint64_t bitmap, bool active) {
  struct qcow2dev *q = r->q;
  unsigned x = 62 - (q->h.cluster_bits - 8);
  uint64_t coff = entry & ((1ull << x) - 1);
  uint64_t nsect = ((entry >> x) & ((1ull << (q->h.cluster_bits - 8)) - 1));
  if (entry & QCOW2_L2_COPIED)
    corrupt(r,
            "ERROR: coffset=0x%llx: copied flag must never be set for "
            "compressed clusters",
            ull(coff));
  if (q->g.data_file) {
    corrupt(r, "ERROR compressed cluster %llu with data file, entry=0x%llx",
            ull(i), ull(entry));
    return;
  }
  if (bitmap) {
    corrupt(r,
            "ERROR compressed cluster %llu with non-zero subcluster "
            "allocation bitmap, entry=0x%llx",
            ull(i), ull(entry));
    return;
  }
  ref_range(r, coff, (nsect + 1) * 512 - (coff & 511));
  if (active) {
    r->res->allocated++;
    r->res->compressed++;
    r->res->fragmented++; /* compressed clusters are, by nature */
  }
}

/* A preallocated zero cluster at an unaligned offset becomes a plain zero
 * cluster (it holds no data), as QEMU's fix_l2_entry_by_zero() does.
 * Returns 0 when fixed. */
static int zero_entry(struct refs *r, uint64_t at, uint64_t bitmap) {
  struct qcow2dev *q = r->q;
  uint8_t e[16];
  put_be64(e, q->g.extended_l2 ? 0 : QCOW2_L2_ZERO);
  put_be64(e + 8, (bitmap | bitmap << 32) & ~EXT_ALL_ALLOCATED);
  int err = io_pwrite_all(q->fd, e, q->g.extended_l2 ? 16 : 8, at);
  if (err == 0)
    err = io_fdatasync(q->fd);
  if (err < 0) {
    qcow2_say(r, "ERROR: Failed to overwrite L2 table entry: %s",
              strerror(-err));
    r->res->check_errors++;
    return err;
  }
  r->res->corruptions--;
  r->res->corruptions_fixed++;
  return 0;
}

/* A cluster with a host offset (data, or preallocated zeroes) whose entry
 * lies at AT. */
static void count_allocated(struct refs *r, uint64_t at, uint64_t entry,
                            uint64_t bitmap, bool active, uint64_t *next) {
  struct qcow2dev *q = r->q;
  uint64_t off = entry & QCOW2_OFFSET_MASK;
  if ((bitmap >> 32) & bitmap)
    corrupt(r,
            "ERROR offset=%llx: Allocated cluster has corrupted subcluster "
            "allocation bitmap",
            ull(off));
  if (off & (q->csize - 1)) {
    bool data = q->g.extended_l2 ? bitmap & EXT_ALL_ALLOCATED
                                 : !(entry & QCOW2_L2_ZERO);
    bool fix = !data && (r->fix & QCOW2_REPAIR_ERRORS);
    corrupt(r,
            "%s offset=%llx: %s cluster is not properly aligned; L2 entry "
            "corrupted.",
            fix ? "Repairing" : "ERROR", ull(off),
            data ? "Data" : "Preallocated");
    if (fix && zero_entry(r, at, bitmap) == 0)
      return; /* no longer a reference */
  }
  if (active) {
    r->res->allocated++;
    if (*next && off != *next)
      r->res->fragmented++;
    *next = off + q->csize;
  }
  if (!q->g.data_file)
    ref_range(r, off, q->csize);
}

/* The entries of the L2 table at L2OFF (the table itself is counted by
 * the caller). */
static int walk_l2(struct refs *r, uint64_t l2off, bool active) {
  struct qcow2dev *q = r->q;
  int e = io_pread_zero(q->fd, r->tbl, q->csize, l2off);
  if (e < 0) {
    r->res->check_errors++;
    bd_set_error("qcow2 %s: reading the L2 table at 0x%llx: %s", q->path,
                 ull(l2off), strerror(-e));
    return e;
  }
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  uint64_t next = 0;
  for (uint64_t i = 0; i < q->csize / esize; i++) {
    uint64_t entry = get_be64(r->tbl + i * esize);
    uint64_t bitmap = q->g.extended_l2 ? get_be64(r->tbl + i * esize + 8) : 0;
    enum qcow2_l2_type t = qcow2_l2_type(q, entry);
    if (t != L2_COMPRESSED && (entry & QCOW2_L2_STD_RESERVED))
      corrupt(r, "ERROR found l2 entry with reserved bits set: %llx",
              ull(entry));
    if (t == L2_COMPRESSED)
      count_compressed(r, i, entry, bitmap, active);
    else if (t == L2_NORMAL || t == L2_ZERO_ALLOC)
      count_allocated(r, l2off + i * esize, entry, bitmap, active, &next);
    else if (t == L2_UNALLOCATED && (bitmap & EXT_ALL_ALLOCATED))
      corrupt(r, "ERROR: Unallocated cluster has non-zero subcluster "
                 "allocation map");
  }
  return 0;
}

/* An L1 table and everything below it. */
static int walk_l1(struct refs *r, uint64_t l1off, uint32_t l1size,
                   bool active) {
  struct qcow2dev *q = r->q;
  uint64_t bytes = (uint64_t)l1size * 8;
  if (bytes == 0)
    return 0;
  ref_range(r, l1off, bytes);
  if (active)
    mark(r, QCOW2_OL_ACTIVE_L1, l1off, bytes);
  uint8_t *l1 = malloc(bytes);
  int e = l1 ? io_pread_zero(q->fd, l1, bytes, l1off) : -ENOMEM;
  if (e < 0) {
    r->res->check_errors++;
    bd_set_error("qcow2 %s: reading the L1 table at 0x%llx: %s", q->path,
                 ull(l1off), strerror(-e));
  }
  for (uint32_t i = 0; e == 0 && i < l1size; i++) {
    uint64_t l1e = get_be64(l1 + i * 8), l2off = l1e & QCOW2_OFFSET_MASK;
    if (l1e & QCOW2_L1_RESERVED)
      corrupt(r, "ERROR found L1 entry with reserved bits set: %llx", ull(l1e));
    if (!l2off)
      continue;
    ref_range(r, l2off, q->csize);
    mark(r, active ? QCOW2_OL_ACTIVE_L2 : QCOW2_OL_INACTIVE_L2, l2off,
         q->csize);
    if (l2off & (q->csize - 1))
      corrupt(r,
              "ERROR l2_offset=%llx: Table is not cluster aligned; L1 entry "
              "corrupted",
              ull(l2off));
    e = walk_l2(r, l2off, active);
  }
  free(l1);
  return e;
}

/* A snapshot table that starts at or past the end of the file: nothing of
 * it can be read (QEMU reads zeroes: an empty, incomplete entry per
 * snapshot, whose 40 bytes it counts past the end, a second corruption).
 * --repair all drops it from the header (QEMU writes the empty entries
 * back); the snapshots' clusters, already unreferenced, leak.  1 when
 * done with the table, 0 when it is to be read, or -errno. */
static int snapshots_past_end(struct refs *r) {
  struct qcow2dev *q = r->q;
  uint64_t off = q->h.snapshots_offset, size = 40ull * q->h.nb_snapshots;
  if (off < q->file_size && size <= q->file_size - off)
    return 0;
  if (off < q->file_size) { /* partly inside: refused, as at any open */
    r->res->check_errors++;
    bd_set_error("qcow2 %s: invalid snapshot table", q->path);
    return -EINVAL;
  }
  bool fix = r->fix & QCOW2_REPAIR_ERRORS;
  corrupt(r,
          "%s snapshot table (0x%llx, %u snapshots) is past the end of "
          "the file",
          fix ? "Repairing" : "ERROR", ull(off), q->h.nb_snapshots);
  if (!fix) {
    ref_range(r, off, size);
    return 1;
  }
  uint8_t none[12] = {0}; /* nb_snapshots, snapshots_offset */
  int e = io_pwrite_all(q->fd, none, sizeof none, 60);
  if (e == 0)
    e = io_fdatasync(q->fd);
  if (e < 0) {
    r->res->check_errors++;
    bd_set_error("qcow2 %s: dropping the snapshot table: %s", q->path,
                 strerror(-e));
    return e;
  }
  q->h.nb_snapshots = 0;
  q->h.snapshots_offset = 0;
  r->res->corruptions--;
  r->res->corruptions_fixed++;
  return 1;
}

/* Why the snapshot table could not be parsed (E): a corruption (its
 * snapshots are not walked), or the end of the check (-errno). */
static int snapshot_table_error(struct refs *r, int e) {
  struct qcow2dev *q = r->q;
  char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
  snprintf(why, sizeof why, "%s", e < 0 ? bd_errmsg() : "");
  if (e == -EINVAL || e == -ENOSPC) {
    corrupt(r, "ERROR invalid snapshot table (0x%llx): %s",
            ull(q->h.snapshots_offset), why);
    return 0;
  }
  if (e < 0) {
    /* Too much extra data in an entry (-EFBIG): QEMU cannot read the
     * table either, and stops (only its -r all tries to drop the extra
     * data, and fails on its way). */
    r->res->check_errors++;
    bd_set_error("qcow2 %s: failed to read the snapshot table: %s", q->path,
                 e == -EFBIG ? why : strerror(-e));
  }
  return e;
}

/* Read and parse the snapshot table into R->snaps, first, as QEMU does. */
static int read_snapshots(struct refs *r) {
  struct qcow2dev *q = r->q;
  if (q->h.nb_snapshots == 0)
    return 0;
  int past = snapshots_past_end(r);
  if (past != 0)
    return past < 0 ? past : 0;
  /* Without the L1 checks: each snapshot's L1 table is judged below. */
  int e = qcow2_read_snapshots(q->fd, q->file_size, &q->h, false, &r->snaps,
                               &r->snaps_used);
  if (e == 0)
    r->nsnaps = q->h.nb_snapshots;
  return snapshot_table_error(r, e);
}

/* Each snapshot's L1 tree, then the table's own clusters.  An L1 table
 * that is unaligned or too large is a corruption of its entry (not
 * walked), as in QEMU. */
static int walk_snapshots(struct refs *r) {
  struct qcow2dev *q = r->q;
  int e = 0;
  for (uint32_t i = 0; e == 0 && i < r->nsnaps; i++) {
    const struct qcow2_snapshot *s = &r->snaps[i];
    /* Where QEMU's overlap checks place it, whether it is walked or not. */
    mark(r, QCOW2_OL_INACTIVE_L1, s->l1_offset, s->l1_size * 8ull);
    if (s->l1_offset & (q->csize - 1))
      corrupt(r,
              "ERROR snapshot %s (%s) l1_offset=%#llx: L1 table is not "
              "cluster aligned; snapshot table entry corrupted",
              s->id, s->name, ull(s->l1_offset));
    else if ((uint64_t)s->l1_size * 8 > QCOW2_MAX_L1_BYTES)
      corrupt(r,
              "ERROR snapshot %s (%s) l1_size=%#x: L1 table is too large; "
              "snapshot table entry corrupted",
              s->id, s->name, s->l1_size);
    else
      e = walk_l1(r, s->l1_offset, s->l1_size, false);
  }
  if (e == 0 && r->snaps) {
    ref_range(r, q->h.snapshots_offset, r->snaps_used);
    mark(r, QCOW2_OL_SNAPSHOT_TABLE, q->h.snapshots_offset, r->snaps_used);
  }
  return e;
}

/* The refcount blocks the table names: each must be a cluster of the file
 * referenced once, or the structure needs rebuilding. */
static void walk_refblocks(struct refs *r) {
  struct qcow2dev *q = r->q;
  for (uint64_t i = 0; i < q->reftable_entries; i++) {
    uint64_t e = q->reftable[i], off = e & ~REFT_RESERVED;
    uint64_t c = off >> q->h.cluster_bits;
    if (e & REFT_RESERVED) {
      corrupt(r, "ERROR refcount table entry %llu has reserved bits set",
              ull(i));
      r->rebuild = true;
    } else if (off & (q->csize - 1)) {
      corrupt(r,
              "ERROR refcount block %llu is not cluster aligned; refcount "
              "table entry corrupted",
              ull(i));
      r->rebuild = true;
    } else if (off && c >= r->count) {
      /* QEMU grows the file to hold it; a rebuild replaces it. */
      corrupt(r, "ERROR refcount block %llu is outside image", ull(i));
      if (r->fix & QCOW2_REPAIR_ERRORS)
        r->rebuild = true;
    } else if (off) {
      ref_range(r, off, q->csize);
      mark(r, QCOW2_OL_REFCOUNT_BLOCK, off, q->csize);
      if (r->n[c] != 1) {
        corrupt(r, "ERROR refcount block %llu refcount=%u", ull(i), r->n[c]);
        r->rebuild = true;
      }
    }
  }
}

/* A bitmap's table, and the data clusters it names. */
static int walk_bitmap(struct refs *r, const struct qcow2_bitmap *b) {
  struct qcow2dev *q = r->q;
  uint64_t bytes = (uint64_t)b->table_size * 8;
  ref_range(r, b->table_offset, bytes);
  uint8_t *t = malloc(bytes);
  int e = t ? io_pread_zero(q->fd, t, bytes, b->table_offset) : -ENOMEM;
  for (uint32_t i = 0; e == 0 && i < b->table_size; i++) {
    uint64_t entry = get_be64(t + i * 8);
    if (!qcow2_bitmap_entry_ok(entry, q->h.cluster_bits)) {
      r->res->corruptions++;
      bd_set_error("qcow2 %s: bitmap '%s': invalid bitmap table entry 0x%llx",
                   q->path, b->name, ull(entry));
      e = -EINVAL; /* QEMU cannot load it: the check stops */
    } else if (entry & QCOW2_OFFSET_MASK) {
      ref_range(r, entry & QCOW2_OFFSET_MASK, q->csize);
    }
  }
  if (e < 0 && e != -EINVAL)
    bd_set_error("qcow2 %s: reading bitmap '%s': %s", q->path, b->name,
                 strerror(-e));
  free(t);
  return e;
}

/* Persistent bitmaps (when the autoclear bit vouches for them): the
 * directory, and each bitmap.  A directory that does not parse stops the
 * check, as in QEMU, which cannot open such an image. */
static int walk_bitmaps(struct refs *r) {
  struct qcow2dev *q = r->q;
  if (q->h.bitmaps_nb == 0)
    return 0;
  ref_range(r, q->h.bitmaps_dir_offset, q->h.bitmaps_dir_size);
  mark(r, QCOW2_OL_BITMAPS, q->h.bitmaps_dir_offset, q->h.bitmaps_dir_size);
  size_t len = (size_t)q->h.bitmaps_dir_size;
  uint8_t *dir = malloc(len ? len : 1);
  int e =
      dir ? io_pread_zero(q->fd, dir, len, q->h.bitmaps_dir_offset) : -ENOMEM;
  struct qcow2_bitmap *bm = NULL;
  if (e == 0)
    e = qcow2_parse_bitmap_dir(dir, len, q->h.bitmaps_nb, q->h.cluster_bits,
                               q->h.size, &bm);
  else
    qcow2_err(e, "%s", strerror(-e));
  free(dir);
  if (e < 0) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    r->res->corruptions++;
    bd_set_error("qcow2 %s: bitmap directory: %s", q->path, why);
    return e;
  }
  for (uint32_t i = 0; e == 0 && i < q->h.bitmaps_nb; i++)
    e = walk_bitmap(r, &bm[i]);
  qcow2_free_bitmaps(bm, q->h.bitmaps_nb);
  return e;
}

static int setup(struct qcow2dev *q, struct refs *r) {
  r->q = q;
  r->count = (q->file_size + q->csize - 1) >> q->h.cluster_bits;
  r->used = r->count;
  unsigned bits = 1u << q->h.refcount_order;
  r->max = bits >= 32 ? UINT32_MAX : (1u << bits) - 1;
  /* A reference may reach into the cluster after an unaligned end. */
  r->n = calloc(r->count + 1, sizeof *r->n);
  r->tbl = malloc(q->csize);
  r->ol = qcow2_ol_new(q->h.cluster_bits);
  if (!r->n || !r->tbl || !r->ol) {
    r->res->check_errors++;
    bd_set_error("out of memory");
    return -ENOMEM;
  }
  return 0;
}

int qcow2_count_refs(struct qcow2dev *q, struct refs *r, bool refcounts) {
  int e = setup(q, r);
  if (e == 0)
    e = read_snapshots(r);
  if (e == 0) {
    ref_range(r, 0, q->csize); /* header, extensions, backing file name */
    e = walk_l1(r, q->h.l1_offset, q->h.l1_size, true);
  }
  if (e == 0)
    e = walk_snapshots(r);
  if (e == 0 && refcounts) {
    ref_range(r, q->h.reftable_offset, q->reftable_entries * 8);
    mark(r, QCOW2_OL_REFCOUNT_TABLE, q->h.reftable_offset,
         q->reftable_entries * 8);
  }
  if (e == 0)
    e = walk_bitmaps(r);
  if (e == 0 && refcounts)
    walk_refblocks(r);
  if (e == 0 && r->nomem) {
    r->res->check_errors++;
    bd_set_error("out of memory");
    e = -ENOMEM;
  }
  return e;
}

void qcow2_refs_free(struct refs *r) {
  free(r->n);
  free(r->tbl);
  qcow2_free_snapshots(r->snaps, r->nsnaps);
  qcow2_ol_free(r->ol);
  r->ol = NULL;
  r->n = NULL;
  r->tbl = NULL;
  r->snaps = NULL;
  r->nsnaps = 0;
}
