/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 refcounts and host cluster allocation.  Everything here runs with
 * the image's metadata lock held.
 *
 * Allocation is at the end of the image (alloc_end); freed clusters are
 * punched out of the file and stay free.  A missing refcount block is
 * placed at the end too, where it usually describes itself; a refcount
 * table that is too small is copied to a larger one at the end, which the
 * header then points at.  Each step writes what others depend on first, so
 * an interrupted process leaves leaks at worst: a block before the table
 * entry that points at it, a refcount before the L2 entry that uses it. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/log.h"
#include "guard.h"
#include "qcow2-internal.h"

/* Where the refcount of CLUSTER lives: block index, and the byte offset and
 * bit shift of its entry inside the block. */
static void locate(const struct qcow2dev *q, uint64_t cluster, uint64_t *ti,
                   uint64_t *byte, unsigned *shift) {
  uint64_t i = cluster % q->rb_entries;
  *ti = cluster / q->rb_entries;
  *byte = i * q->rc_bits / 8;
  *shift = (unsigned)(i * q->rc_bits % 8);
}

/* Sub-byte refcounts are packed from the least significant bit; wider
 * ones are big-endian. */
static uint64_t decode_entry(const struct qcow2dev *q, const uint8_t *b,
                             unsigned shift) {
  if (q->rc_bits < 8)
    return (b[0] >> shift) & ((1u << q->rc_bits) - 1);
  uint64_t v = 0;
  for (unsigned i = 0; i < q->rc_bits / 8; i++)
    v = (v << 8) | b[i];
  return v;
}

static int read_entry(struct qcow2dev *q, uint64_t block, uint64_t byte,
                      unsigned shift, uint64_t *val) {
  unsigned nbytes = q->rc_bits < 8 ? 1 : q->rc_bits / 8;
  uint8_t b[8];
  int r = io_pread_zero(q->fd, b, nbytes, block + byte);
  if (r == 0)
    *val = decode_entry(q, b, shift);
  return r;
}

/* Store VAL into the entry at B (sub-byte ones: the other bits kept). */
static void encode_entry(const struct qcow2dev *q, uint8_t *b, unsigned shift,
                         uint64_t val) {
  unsigned nbytes = q->rc_bits / 8;
  if (q->rc_bits < 8) {
    uint8_t mask = (uint8_t)(((1u << q->rc_bits) - 1) << shift);
    b[0] = (uint8_t)((b[0] & ~mask) | ((val << shift) & mask));
  } else {
    for (unsigned i = 0; i < nbytes; i++)
      b[nbytes - 1 - i] = (uint8_t)(val >> (8 * i));
  }
}

static int write_entry(struct qcow2dev *q, uint64_t block, uint64_t byte,
                       unsigned shift, uint64_t val) {
  uint8_t b[8];
  unsigned nbytes = q->rc_bits < 8 ? 1 : q->rc_bits / 8;
  if (q->rc_bits < 8) {
    int r = io_pread_zero(q->fd, b, 1, block + byte);
    if (r < 0)
      return r;
  }
  encode_entry(q, b, shift, val);
  return qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_BLOCK, b, nbytes,
                            block + byte);
}

static uint64_t rc_max(const struct qcow2dev *q) {
  return q->rc_bits == 64 ? UINT64_MAX : (1ull << q->rc_bits) - 1;
}

static bool in_range(const struct qcow2dev *q, uint64_t val, int64_t delta) {
  return delta < 0 ? val >= (uint64_t)-delta
                   : rc_max(q) - val >= (uint64_t)delta;
}

/* Bits 0-8 of a refcount table entry are reserved. */
#define REFT_OFFSET_MASK 0xfffffffffffffe00ull

int qcow2_rc_get(struct qcow2dev *q, uint64_t cluster, uint64_t *val) {
  uint64_t ti, byte;
  unsigned shift;
  locate(q, cluster, &ti, &byte, &shift);
  uint64_t block =
      ti < q->reftable_entries ? q->reftable[ti] & REFT_OFFSET_MASK : 0;
  *val = 0;
  if (block == 0)
    return 0;
  /* Only a table loaded for check may hold such entries. */
  if (block & (q->csize - 1)) {
    bd_set_error("qcow2 %s: refcount block 0x%llx is unaligned", q->path,
                 (unsigned long long)block);
    return -EIO;
  }
  return read_entry(q, block, byte, shift, val);
}

static int grow_table(struct qcow2dev *q, uint64_t need);

/* Make sure a refcount block covers CLUSTER; returns its offset. */
static int ensure_block(struct qcow2dev *q, uint64_t ti, uint64_t *block) {
  if (ti >= q->reftable_entries) {
    int r = grow_table(q, ti + 1);
    if (r < 0)
      return r;
  }
  if (q->reftable[ti]) {
    *block = q->reftable[ti];
    return 0;
  }
  /* A new block at the end of the image, zeroed; if it lies in the range
   * it covers, it holds its own refcount. */
  uint64_t b = q->alloc_end;
  q->alloc_end += q->csize;
  uint8_t *zero = calloc(1, q->csize);
  int r = zero ? qcow2_guard_mark(q, QCOW2_OL_REFCOUNT_BLOCK, b, q->csize)
               : -ENOMEM;
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_BLOCK, zero, q->csize, b);
  free(zero);
  if (r < 0)
    return r;
  uint64_t bcluster = b >> q->h.cluster_bits;
  bool self = bcluster / q->rb_entries == ti;
  if (self) {
    uint64_t t2, byte;
    unsigned shift;
    locate(q, bcluster, &t2, &byte, &shift);
    r = write_entry(q, b, byte, shift, 1);
  }
  /* The block is durable before the table entry that points at it. */
  if (r == 0)
    r = qcow2_fdatasync(q, q->fd);
  if (r == 0) {
    uint8_t e[8];
    put_be64(e, b);
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_TABLE, e, 8,
                           q->h.reftable_offset + ti * 8);
  }
  if (r < 0)
    return r;
  q->reftable[ti] = b;
  if (!self)
    r = qcow2_rc_update(q, bcluster, 1);
  *block = b;
  return r;
}

int qcow2_rc_update(struct qcow2dev *q, uint64_t cluster, int64_t delta) {
  uint64_t ti, byte, block, val;
  unsigned shift;
  locate(q, cluster, &ti, &byte, &shift);
  int r = ensure_block(q, ti, &block);
  if (r == 0)
    r = read_entry(q, block, byte, shift, &val);
  if (r != 0) /* not only r < 0: VAL is set only when r == 0 */
    return r;
  if (!in_range(q, val, delta)) {
    bd_set_error("qcow2 %s: refcount of cluster %llu out of range", q->path,
                 (unsigned long long)cluster);
    return -EIO;
  }
  return write_entry(q, block, byte, shift, val + (uint64_t)delta);
}

/* Add DELTA to the refcounts of clusters [first, first+n), all in refcount
 * block TI: one read and one write of their entries, none changed unless
 * all stay in range. */
static int update_span(struct qcow2dev *q, uint64_t ti, uint64_t first,
                       uint64_t n, int64_t delta) {
  uint64_t block, t, byte, last_byte;
  unsigned shift, last_shift;
  int r = ensure_block(q, ti, &block);
  if (r < 0)
    return r;
  locate(q, first, &t, &byte, &shift);
  locate(q, first + n - 1, &t, &last_byte, &last_shift);
  uint64_t span = last_byte + (q->rc_bits < 8 ? 1 : q->rc_bits / 8) - byte;
  uint8_t *buf = malloc(span);
  r = buf ? io_pread_zero(q->fd, buf, span, block + byte) : -ENOMEM;
  for (uint64_t c = first; r == 0 && c < first + n; c++) {
    uint64_t cb;
    locate(q, c, &t, &cb, &shift);
    uint64_t val = decode_entry(q, buf + (cb - byte), shift);
    if (!in_range(q, val, delta)) {
      bd_set_error("qcow2 %s: refcount of cluster %llu out of range", q->path,
                   (unsigned long long)c);
      r = -EIO;
    } else {
      encode_entry(q, buf + (cb - byte), shift, val + (uint64_t)delta);
    }
  }
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_BLOCK, buf, span, block + byte);
  free(buf);
  return r;
}

int qcow2_rc_update_run(struct qcow2dev *q, uint64_t first, uint64_t n,
                        int64_t delta) {
  int r = 0;
  while (r == 0 && n > 0) {
    uint64_t ti = first / q->rb_entries;
    uint64_t k = q->rb_entries - first % q->rb_entries;
    if (k > n)
      k = n;
    r = update_span(q, ti, first, k, delta);
    first += k;
    n -= k;
  }
  return r;
}

/* Copy the refcount table to a larger one at the end of the image. */
static int grow_table(struct qcow2dev *q, uint64_t need) {
  uint64_t per_cluster = q->csize / 8;
  uint64_t entries =
      q->reftable_entries * 2 > need ? q->reftable_entries * 2 : need;
  /* Room also for the blocks covering the new table itself. */
  entries += 2 + entries * 8 / q->csize / q->rb_entries;
  uint64_t nclusters = (entries + per_cluster - 1) / per_cluster;
  entries = nclusters * per_cluster;
  if (entries * 8 > QCOW2_MAX_REFTABLE_BYTES) {
    bd_set_error("qcow2 %s: refcount table would exceed %u bytes", q->path,
                 QCOW2_MAX_REFTABLE_BYTES);
    return -ENOSPC;
  }
  uint64_t *nt = calloc(entries, 8);
  if (!nt)
    return -ENOMEM;
  memcpy(nt, q->reftable, q->reftable_entries * 8);
  uint64_t old_off = q->h.reftable_offset,
           old_clusters = q->h.reftable_clusters;
  uint64_t t = q->alloc_end;
  q->alloc_end += nclusters * q->csize;
  /* From here on entries are written into the new table's place. */
  free(q->reftable);
  q->reftable = nt;
  q->reftable_entries = entries;
  q->h.reftable_offset = t;
  int r = qcow2_guard_mark(q, QCOW2_OL_REFCOUNT_TABLE, t, nclusters * q->csize);
  for (uint64_t c = 0; r == 0 && c < nclusters; c++)
    r = qcow2_rc_update(q, (t >> q->h.cluster_bits) + c, 1);
  uint8_t *buf = r == 0 ? malloc(entries * 8) : NULL;
  if (r == 0 && !buf)
    r = -ENOMEM;
  for (uint64_t i = 0; r == 0 && i < entries; i++)
    put_be64(buf + i * 8, nt[i]);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_REFCOUNT_TABLE, buf, entries * 8, t);
  free(buf);
  /* The new table is durable before the header points at it. */
  if (r == 0)
    r = qcow2_fdatasync(q, q->fd);
  uint8_t hdr[12];
  put_be64(hdr, t);
  put_be32(hdr + 8, (uint32_t)nclusters);
  if (r == 0)
    r = io_pwrite_all(q->fd, hdr, 12, 48);
  if (r == 0)
    r = qcow2_fdatasync(q, q->fd);
  if (r < 0)
    return qcow2_mark_broken(q, r, "growing the refcount table");
  q->h.reftable_clusters = (uint32_t)nclusters;
  qcow2_guard_unmark(q, QCOW2_OL_REFCOUNT_TABLE, old_off,
                     (uint64_t)old_clusters << q->h.cluster_bits);
  for (uint64_t c = 0; r == 0 && c < old_clusters; c++)
    r = qcow2_rc_update(q, (old_off >> q->h.cluster_bits) + c, -1);
  return r;
}

int qcow2_fdatasync(struct qcow2dev *q, int fd) {
  return q->no_flush ? 0 : io_fdatasync(fd);
}

int qcow2_mark_broken(struct qcow2dev *q, int err, const char *what) {
  if (!q->broken && !qcow2_is_corrupt(q)) /* that one was logged */
    log_error("qcow2 %s: %s failed (%s); refusing further writes", q->path,
              what, strerror(-err));
  q->broken = true;
  return err;
}

int qcow2_alloc_cluster(struct qcow2dev *q, uint64_t *host) {
  int r = qcow2_writes_refused(q);
  if (r < 0)
    return r;
  uint64_t h = q->alloc_end;
  q->alloc_end += q->csize;
  r = qcow2_rc_update(q, h >> q->h.cluster_bits, 1);
  if (r < 0)
    return qcow2_mark_broken(q, r, "allocating a cluster");
  *host = h;
  return 0;
}

int qcow2_alloc_run(struct qcow2dev *q, uint64_t nclusters, uint64_t *host) {
  int r = qcow2_writes_refused(q);
  if (r < 0)
    return r;
  /* The whole run first: a refcount block the updates below need goes
   * after it, not into it. */
  uint64_t h = q->alloc_end;
  q->alloc_end += nclusters * q->csize;
  r = qcow2_rc_update_run(q, h >> q->h.cluster_bits, nclusters, 1);
  if (r < 0)
    return qcow2_mark_broken(q, r, "allocating clusters");
  *host = h;
  return 0;
}

int qcow2_alloc_contiguous(struct qcow2dev *q, uint64_t nclusters,
                           unsigned kind, uint64_t *host) {
  uint64_t h = q->alloc_end, bytes = nclusters * q->csize;
  q->alloc_end += bytes;
  int r = qcow2_guard_mark(q, kind, h, bytes);
  if (r == 0)
    r = qcow2_rc_update_run(q, h >> q->h.cluster_bits, nclusters, 1);
  if (q->alloc_end > q->file_size)
    q->file_size = q->alloc_end;
  *host = h;
  return r;
}

/* Whether every cluster from FIRST to LAST has a reference to drop.  A
 * free that would take one below zero means the refcounts and the entry
 * disagree already: dropping the others' could free live data (the
 * entry reaching into clusters allocated since), so none is dropped. */
static int free_allowed(struct qcow2dev *q, uint64_t first, uint64_t last,
                        bool *ok) {
  *ok = true;
  for (uint64_t c = first; c <= last; c++) {
    uint64_t val;
    int r = qcow2_rc_get(q, c, &val);
    if (r < 0)
      return r;
    if (val == 0) {
      log_warn("qcow2 %s: freeing cluster %llu, whose refcount is 0 already: "
               "the range 0x%llx-0x%llx is left alone (leaked)",
               q->path, (unsigned long long)c,
               (unsigned long long)(first << q->h.cluster_bits),
               (unsigned long long)((last + 1) << q->h.cluster_bits));
      *ok = false;
      return 0;
    }
  }
  return 0;
}

/* All or none, as QEMU undoes a partial decrease. */
int qcow2_free_range(struct qcow2dev *q, uint64_t host, uint64_t len,
                     bool punch) {
  uint64_t first = host >> q->h.cluster_bits;
  uint64_t last = (host + len - 1) >> q->h.cluster_bits;
  bool ok;
  int r = free_allowed(q, first, last, &ok);
  if (r < 0 || !ok)
    return r < 0 ? qcow2_mark_broken(q, r, "freeing a cluster") : 0;
  for (uint64_t c = first; c <= last; c++) {
    r = qcow2_guard_release(q, c);
    if (r == 0)
      r = qcow2_rc_update(q, c, -1);
    uint64_t val = 1;
    if (r == 0)
      r = qcow2_rc_get(q, c, &val);
    if (r < 0)
      return qcow2_mark_broken(q, r, "freeing a cluster");
    if (val == 0 && punch)
      fallocate(q->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                (off_t)(c << q->h.cluster_bits), (off_t)q->csize);
  }
  return 0;
}

/* The last cluster with a refcount in the block at B (index I) bounds
 * what may be allocated: raise *END past it. */
static int scan_block(struct qcow2dev *q, uint64_t i, uint64_t b, uint8_t *blk,
                      uint64_t *end) {
  int r = io_pread_zero(q->fd, blk, q->csize, b);
  for (uint64_t j = q->rb_entries; r == 0 && j-- > 0;) {
    uint64_t t, byte;
    unsigned shift;
    locate(q, j, &t, &byte, &shift);
    if (decode_entry(q, blk + byte, shift)) {
      uint64_t used = ((i * q->rb_entries + j) + 1) << q->h.cluster_bits;
      if (used > *end)
        *end = used;
      break;
    }
  }
  return r;
}

int qcow2_rc_used_end(struct qcow2dev *q, uint64_t *end) {
  uint8_t *blk = malloc(q->csize);
  int r = blk ? 0 : -ENOMEM;
  *end = 0;
  for (uint64_t i = q->reftable_entries; r == 0 && *end == 0 && i-- > 0;)
    if (q->reftable[i])
      r = scan_block(q, i, q->reftable[i], blk, end);
  free(blk);
  return r;
}

static int bad_table(struct qcow2dev *q, const char *what, uint64_t v) {
  bd_set_error("qcow2 %s: corrupt refcount table: %s (0x%llx); `blockport "
               "check --repair all` rebuilds it",
               q->path, what, (unsigned long long)v);
  return -EIO;
}

/* Load the refcount table and find the end of what is in use.  STRICT (for
 * writing) refuses a table that is empty, past the end of the file, or
 * with an entry that is malformed or past the end; otherwise (for check)
 * the entries are kept as they are for check.c to judge. */
static int rc_load(struct qcow2dev *q, bool strict) {
  q->rc_bits = 1u << q->h.refcount_order;
  q->rb_entries = q->csize * 8 / q->rc_bits;
  q->reftable_entries = (uint64_t)q->h.reftable_clusters * q->csize / 8;
  uint64_t bytes = q->reftable_entries * 8;
  if (strict && (bytes == 0 || q->h.reftable_offset > q->file_size ||
                 bytes > q->file_size - q->h.reftable_offset))
    return bad_table(q, "empty or past the end of the file",
                     q->h.reftable_offset);
  free(q->reftable);
  q->reftable = calloc(q->reftable_entries ? q->reftable_entries : 1, 8);
  uint8_t *blk = malloc(q->csize);
  int r = q->reftable && blk ? 0 : -ENOMEM;
  if (r == 0)
    r = io_pread_zero(q->fd, q->reftable, bytes, q->h.reftable_offset);
  uint64_t end = (q->file_size + q->csize - 1) & ~(q->csize - 1);
  for (uint64_t i = 0; r == 0 && i < q->reftable_entries; i++) {
    uint64_t b = q->reftable[i] = get_be64((uint8_t *)&q->reftable[i]);
    bool bad = b & (q->csize - 1) || b >= q->file_size;
    if (b == 0 || (bad && !strict))
      continue;
    r = bad ? bad_table(q, "entry", b) : scan_block(q, i, b, blk, &end);
  }
  free(blk);
  q->alloc_end = end;
  return r;
}

int qcow2_rc_init(struct qcow2dev *q) {
  return rc_load(q, true);
}

int qcow2_rc_init_check(struct qcow2dev *q) {
  return rc_load(q, false);
}
