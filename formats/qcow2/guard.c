/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 metadata guard (see guard.h): the overlap map built from a walk of
 * the metadata at open, the checks before writes, and what a hit does. */
#include "guard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/log.h"
#include "qcow2-internal.h"
#include "snapshot.h"

/* QEMU's limits for persistent bitmaps. */
#define BITMAP_DIR_MAX (1024u * 65535)
#define BITMAP_TABLE_MAX 0x8000000u /* entries */
#define BITMAP_ENTRY_FIXED 24

/* ---- building the map ---- */

struct walk {
  struct qcow2dev *q;
  struct qcow2_ol *ol;
  uint64_t end; /* where the file's clusters end */
};

/* Metadata of KIND at [off, off+len): marked inside the file; what lies
 * beyond it makes everything from there on count as metadata. */
static int note(struct walk *w, unsigned kind, uint64_t off, uint64_t len) {
  if (len == 0)
    return 0;
  if (off >= w->end) {
    qcow2_ol_far(w->ol, off, kind);
    return 0;
  }
  if (len > w->end - off) {
    qcow2_ol_far(w->ol, w->end, kind);
    len = w->end - off;
  }
  return qcow2_ol_mark(w->ol, off, len, kind);
}

/* One cluster of KIND at each offset held by the N 8-byte entries of the
 * table at OFF (L1 tables, bitmap tables); unaligned offsets are corrupt
 * entries that the read path refuses, not metadata. */
static int note_entries(struct walk *w, unsigned kind, uint64_t off,
                        uint64_t n) {
  struct qcow2dev *q = w->q;
  const uint64_t per = 8192;
  uint8_t *buf = malloc(per * 8);
  int r = buf ? 0 : -ENOMEM;
  for (uint64_t done = 0; r == 0 && done < n; done += per) {
    uint64_t k = n - done < per ? n - done : per;
    r = io_pread_zero(q->fd, buf, k * 8, off + done * 8);
    for (uint64_t i = 0; r == 0 && i < k; i++) {
      uint64_t at = get_be64(buf + i * 8) & QCOW2_OFFSET_MASK;
      if (at && !(at & (q->csize - 1)))
        r = note(w, kind, at, q->csize);
    }
  }
  free(buf);
  return r;
}

static int refuse(struct qcow2dev *q, const char *what, const char *why) {
  bd_set_error("%s: cannot open for writing: %s: %s (serve it with "
               "--readonly)",
               q->path, what, why);
  return -EINVAL;
}

static int read_snapshots(struct qcow2dev *q, struct qcow2_snapshot **snaps,
                          size_t *used) {
  int r = qcow2_read_snapshots(q->fd, q->file_size, &q->h, true, snaps, used);
  if (r == -ENOSPC || r == -EINVAL || r == -EFBIG) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    return refuse(q, "snapshot table", why);
  }
  return r;
}

static int walk_snapshots(struct walk *w) {
  struct qcow2dev *q = w->q;
  if (q->h.nb_snapshots == 0)
    return 0;
  struct qcow2_snapshot *s = NULL;
  size_t used = 0;
  int r = read_snapshots(q, &s, &used);
  if (r == 0)
    r = note(w, QCOW2_OL_SNAPSHOT_TABLE, q->h.snapshots_offset, used);
  for (uint32_t i = 0; r == 0 && i < q->h.nb_snapshots; i++) {
    r = note(w, QCOW2_OL_INACTIVE_L1, s[i].l1_offset, s[i].l1_size * 8ull);
    if (r == 0)
      r = note_entries(w, QCOW2_OL_INACTIVE_L2, s[i].l1_offset, s[i].l1_size);
  }
  qcow2_free_snapshots(s, q->h.nb_snapshots);
  return r;
}

/* The bitmaps header extension: 0 and the directory's place, 1 if there
 * is none. */
static int bitmaps_ext(struct qcow2dev *q, uint32_t *nb, uint64_t *dir_size,
                       uint64_t *dir_off) {
  size_t len = q->file_size < q->csize ? (size_t)q->file_size : q->csize;
  uint8_t *b = malloc(len);
  int r = b ? io_pread_zero(q->fd, b, len, 0) : -ENOMEM;
  size_t off = q->h.header_length;
  bool found = false;
  while (r == 0 && !found && off + 8 <= len) {
    uint32_t type = get_be32(b + off), elen = get_be32(b + off + 4);
    off += 8;
    if (type == QCOW2_EXT_END || elen > len - off)
      break; /* header.c has seen the extensions already */
    if (type == QCOW2_EXT_BITMAPS && elen >= 24) {
      *nb = get_be32(b + off);
      *dir_size = get_be64(b + off + 8);
      *dir_off = get_be64(b + off + 16);
      found = true;
    }
    off += ((size_t)elen + 7) & ~(size_t)7;
  }
  free(b);
  return r < 0 ? r : found ? 0 : 1;
}

/* One directory entry at D (AVAIL bytes left): its table and the clusters
 * the table points at.  Sets *LEN to the entry's size. */
static int walk_bitmap(struct walk *w, const uint8_t *d, uint64_t avail,
                       uint64_t *len) {
  struct qcow2dev *q = w->q;
  if (avail < BITMAP_ENTRY_FIXED)
    return refuse(q, "bitmap directory", "truncated entry");
  uint64_t toff = get_be64(d);
  uint32_t tsize = get_be32(d + 8);
  uint64_t elen = BITMAP_ENTRY_FIXED + get_be16(d + 18) + get_be32(d + 20);
  *len = (elen + 7) & ~7ull;
  if (elen > avail)
    return refuse(q, "bitmap directory", "truncated entry");
  if (toff & (q->csize - 1) || tsize > BITMAP_TABLE_MAX ||
      toff > q->file_size || tsize * 8ull > q->file_size - toff)
    return refuse(q, "bitmap table", "unaligned, too large or past the end");
  int r = note(w, QCOW2_OL_BITMAPS, toff, tsize * 8ull);
  return r == 0 ? note_entries(w, QCOW2_OL_BITMAPS, toff, tsize) : r;
}

/* Persistent bitmaps, when the header says they are valid (autoclear bit
 * 0): directory, tables and data. */
static int walk_bitmaps(struct walk *w) {
  struct qcow2dev *q = w->q;
  if (!q->h.has_bitmaps || !(q->h.autoclear & QCOW2_AUTOCLEAR_BITMAPS))
    return 0;
  uint32_t nb = 0;
  uint64_t size = 0, off = 0;
  int r = bitmaps_ext(q, &nb, &size, &off);
  if (r != 0)
    return r < 0 ? r : 0;
  if (nb == 0 || size > BITMAP_DIR_MAX || off & (q->csize - 1) ||
      off > q->file_size || size > q->file_size - off)
    return refuse(q, "bitmap directory", "invalid size or place");
  uint8_t *dir = malloc(size ? size : 1);
  r = dir ? io_pread_zero(q->fd, dir, size, off) : -ENOMEM;
  if (r == 0)
    r = note(w, QCOW2_OL_BITMAPS, off, size);
  uint64_t at = 0;
  for (uint32_t i = 0; r == 0 && i < nb; i++) {
    uint64_t len = 0;
    if (at > size)
      r = refuse(q, "bitmap directory", "truncated entry");
    else
      r = walk_bitmap(w, dir + at, size - at, &len);
    at += len;
  }
  free(dir);
  return r;
}

/* The active L1 table, its L2 tables, the refcount table and blocks. */
static int walk_active(struct walk *w) {
  struct qcow2dev *q = w->q;
  int r = note(w, QCOW2_OL_ACTIVE_L1, q->h.l1_offset, q->h.l1_size * 8ull);
  for (uint32_t i = 0; r == 0 && i < q->h.l1_size; i++) {
    uint64_t l2 = q->l1[i] & QCOW2_OFFSET_MASK;
    if (l2 && !(l2 & (q->csize - 1)))
      r = note(w, QCOW2_OL_ACTIVE_L2, l2, q->csize);
  }
  if (r == 0)
    r = note(w, QCOW2_OL_REFCOUNT_TABLE, q->h.reftable_offset,
             (uint64_t)q->h.reftable_clusters << q->h.cluster_bits);
  for (uint64_t i = 0; r == 0 && i < q->reftable_entries; i++)
    if (q->reftable[i])
      r = note(w, QCOW2_OL_REFCOUNT_BLOCK, q->reftable[i], q->csize);
  return r;
}

int qcow2_guard_init(struct qcow2dev *q) {
  struct walk w = {q, qcow2_ol_new(q->h.cluster_bits),
                   (q->file_size + q->csize - 1) & ~(q->csize - 1)};
  int r = w.ol ? walk_active(&w) : -ENOMEM;
  if (r == 0)
    r = walk_snapshots(&w);
  if (r == 0)
    r = walk_bitmaps(&w);
  if (r == -ENOMEM)
    bd_set_error("%s: out of memory for the metadata map", q->path);
  if (r < 0) {
    qcow2_ol_free(w.ol);
    return r;
  }
  q->ol = w.ol;
  return 0;
}

void qcow2_guard_free(struct qcow2dev *q) {
  qcow2_ol_free(q->ol);
  q->ol = NULL;
}

/* ---- a hit ---- */

bool qcow2_is_corrupt(const struct qcow2dev *q) {
  return __atomic_load_n(&q->corrupt, __ATOMIC_ACQUIRE);
}

/* Set incompatible bit 1 in the header, durably.  Version 2 headers have
 * no such field: the image is then refused writes until reopened only. */
static int record_corrupt(struct qcow2dev *q) {
  if (q->h.version < 3)
    return -ENOTSUP;
  uint8_t b[8];
  put_be64(b, q->h.incompatible | QCOW2_INCOMPAT_CORRUPT);
  int r = io_pwrite_all(q->fd, b, 8, 72);
  return r < 0 ? r : io_fdatasync(q->fd);
}

/* The first corruption found in an image open for writing marks it
 * corrupt (durably where the header can say so) and is logged with WHY;
 * from then on writes are refused while reads go on. */
static void mark_corrupt(struct qcow2dev *q, const char *why) {
  if (__atomic_exchange_n(&q->corrupt, true, __ATOMIC_ACQ_REL))
    return;
  int r = record_corrupt(q);
  const char *no = r == -ENOTSUP ? "version 2 images have no corrupt bit"
                   : r < 0       ? strerror(-r)
                                 : NULL;
  log_error("qcow2 %s: marking image as corrupt: %s; writes are refused from "
            "now on%s%s%s",
            q->path, why, no ? " (not recorded in the header: " : "",
            no ? no : "", no ? ")" : "");
}

/* Refuse a write (WHAT: "write on", "free of") that would hit metadata of
 * KINDS at [off, off+len).  The first one marks the image corrupt and is
 * logged; every one fails with EIO. */
static int signal_corruption(struct qcow2dev *q, const char *what, uint64_t off,
                             uint64_t len, unsigned kinds) {
  const char *name = qcow2_ol_name(kinds);
  char why[256];
  snprintf(why, sizeof why,
           "preventing invalid %s metadata (overlaps with %s) at offset "
           "0x%llx, %llu bytes",
           what, name, (unsigned long long)off, (unsigned long long)len);
  mark_corrupt(q, why);
  bd_set_error("qcow2 %s: preventing invalid %s metadata (overlaps with %s)",
               q->path, what, name);
  return -EIO;
}

int qcow2_bad_entry(struct qcow2dev *q, const char *what, uint64_t value,
                    uint64_t guest) {
  char why[256];
  snprintf(why, sizeof why, "%s 0x%llx (guest offset 0x%llx)", what,
           (unsigned long long)value, (unsigned long long)guest);
  /* As QEMU: only an image open for writing is marked; a read-only one
   * fails the request and says so once. */
  if (q->ol)
    mark_corrupt(q, why);
  else if (!__atomic_exchange_n(&q->bad_logged, true, __ATOMIC_ACQ_REL))
    log_warn("qcow2 %s: corrupt image: %s", q->path, why);
  bd_set_error("qcow2 %s: corrupt image: %s", q->path, why);
  return -EIO;
}

/* ---- the checks ---- */

bool qcow2_guard_would_hit(const struct qcow2dev *q, uint64_t off,
                           uint64_t len) {
  return q->ol && q->data_fd == q->fd && qcow2_ol_check(q->ol, off, len, 0);
}

int qcow2_guard_data(struct qcow2dev *q, uint64_t off, uint64_t len) {
  /* Guest data in an external data file cannot reach the metadata. */
  if (!q->ol || q->data_fd != q->fd)
    return 0;
  unsigned k = qcow2_ol_check(q->ol, off, len, 0);
  return k ? signal_corruption(q, "write on", off, len, k) : 0;
}

int qcow2_guard_meta(struct qcow2dev *q, unsigned kind, uint64_t off,
                     uint64_t len) {
  /* Header fields are written at their fixed offsets, as QEMU does, even
   * when a corrupt image has put a table in the first cluster: the
   * corrupt bit must get there. */
  if (kind == QCOW2_OL_HEADER)
    return 0;
  unsigned k = q->ol ? qcow2_ol_check(q->ol, off, len, kind) : 0;
  return k ? signal_corruption(q, "write on", off, len, k) : 0;
}

int qcow2_guard_pwrite(struct qcow2dev *q, unsigned kind, const void *buf,
                       uint64_t len, uint64_t off) {
  int r = qcow2_guard_meta(q, kind, off, len);
  return r < 0 ? r : io_pwrite_all(q->fd, buf, len, off);
}

int qcow2_guard_mark(struct qcow2dev *q, unsigned kind, uint64_t off,
                     uint64_t len) {
  return q->ol ? qcow2_ol_mark(q->ol, off, len, kind) : 0;
}

void qcow2_guard_unmark(struct qcow2dev *q, unsigned kind, uint64_t off,
                        uint64_t len) {
  if (q->ol)
    qcow2_ol_unmark(q->ol, off, len, kind);
}

void qcow2_guard_l2_replaced(struct qcow2dev *q, uint64_t l2off) {
  for (uint32_t i = 0; i < q->h.l1_size; i++)
    if ((q->l1[i] & QCOW2_OFFSET_MASK) == l2off)
      return;
  qcow2_guard_unmark(q, QCOW2_OL_ACTIVE_L2, l2off, q->csize);
}

int qcow2_guard_release(struct qcow2dev *q, uint64_t cluster) {
  uint64_t off = cluster << q->h.cluster_bits, val;
  if (!q->ol || !qcow2_ol_check(q->ol, off, q->csize, 0))
    return 0;
  int r = qcow2_rc_get(q, cluster, &val);
  if (r < 0)
    return r;
  unsigned k = qcow2_ol_check(q->ol, off, q->csize, 0);
  return val > 1 ? 0 : signal_corruption(q, "free of", off, q->csize, k);
}

int qcow2_writes_refused(struct qcow2dev *q) {
  if (qcow2_is_corrupt(q)) {
    bd_set_error("qcow2 %s: the image is corrupt: writes are refused "
                 "(blockport check --repair all mends it)",
                 q->path);
    return -EROFS;
  }
  if (q->broken) {
    bd_set_error("qcow2 %s: a metadata update failed: writes are refused "
                 "until the image is reopened",
                 q->path);
    return -EIO;
  }
  return 0;
}

int qcow2_mark_consistent(struct qcow2dev *q) {
  if (!(q->h.incompatible & QCOW2_INCOMPAT_CORRUPT))
    return 0;
  /* The repair is durable before the header says it is done. */
  uint8_t b[8];
  put_be64(b, q->h.incompatible & ~QCOW2_INCOMPAT_CORRUPT);
  int r = io_fdatasync(q->fd);
  if (r == 0)
    r = io_pwrite_all(q->fd, b, 8, 72);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0)
    q->h.incompatible &= ~QCOW2_INCOMPAT_CORRUPT;
  return r;
}
