/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing a qcow2 image's virtual size (`blockport resize`), with no
 * request in flight.
 *
 * Every step leaves an image that is consistent if the power fails after
 * it, at worst with clusters leaked (which `check -r leaks` reclaims):
 *   grow:   a larger L1 table is written and made durable, then the header
 *           points at it, then the old table is freed; the new area is
 *           zeroed where a backing file or an old tail would show through;
 *           the size comes last.
 *   shrink: the clusters past the new end are unmapped and their L2 tables
 *           dropped (durable), then the size is written, then the file is
 *           cut after its last used cluster.
 * Persistent bitmaps are in use (inconsistent, as after a crash) from
 * before the first step until they are stored, resized, at close
 * (dirty-bitmaps.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "guard.h"
#include "overlap.h"
#include "qcow2-internal.h"

static uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

/* Bytes of guest data one L2 table maps. */
static uint64_t l2_span(const struct qcow2dev *q) {
  return 1ull << (q->l2_bits + q->h.cluster_bits);
}

static int fail(struct qcow2dev *q, int r, const char *what) {
  bd_set_error("qcow2 %s: resize: %s: %s", q->path, what, strerror(-r));
  return r;
}

/* Point the header at the L1 table of N entries at OFF: l1_size and
 * l1_table_offset are neighbours (bytes 36-47), so one write of 12 bytes
 * within a sector switches both. */
static int write_l1_pointer(struct qcow2dev *q, uint64_t off, uint32_t n) {
  uint8_t b[12];
  put_be32(b, n);
  put_be64(b + 4, off);
  int r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, b, sizeof b, 36);
  return r < 0 ? r : io_fdatasync(q->fd);
}

/* A copy of the active L1 table with room for N entries, written at the
 * end of the image; the header switches to it once it is durable. */
static int grow_l1(struct qcow2dev *q, uint64_t n) {
  if (n <= q->h.l1_size)
    return 0;
  if (n * 8 > QCOW2_MAX_L1_BYTES) {
    bd_set_error("qcow2 %s: resize: the L1 table would exceed %u bytes; the "
                 "image's cluster size cannot map that much",
                 q->path, QCOW2_MAX_L1_BYTES);
    return -EFBIG;
  }
  uint64_t nclusters = div_up(n * 8, q->csize), bytes = nclusters * q->csize;
  uint64_t *l1 = calloc(bytes / 8, 8);
  uint8_t *buf = calloc(1, bytes);
  int r = l1 && buf ? 0 : -ENOMEM;
  pthread_mutex_lock(&q->meta);
  uint64_t t = 0;
  if (r == 0)
    r = qcow2_alloc_contiguous(q, nclusters, QCOW2_OL_ACTIVE_L1, &t);
  for (uint64_t i = 0; r == 0 && i < q->h.l1_size; i++) {
    l1[i] = q->l1[i];
    put_be64(buf + i * 8, l1[i]);
  }
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L1, buf, bytes, t);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0)
    r = write_l1_pointer(q, t, (uint32_t)n);
  uint64_t old = q->h.l1_offset, old_bytes = q->h.l1_size * 8ull;
  if (r == 0) {
    free(q->l1);
    q->l1 = l1;
    l1 = NULL;
    q->h.l1_offset = t;
    q->h.l1_size = (uint32_t)n;
    if (old_bytes) {
      old_bytes = div_up(old_bytes, q->csize) * q->csize;
      qcow2_guard_unmark(q, QCOW2_OL_ACTIVE_L1, old, old_bytes);
      r = qcow2_free_range(q, old, old_bytes, true);
    }
  }
  pthread_mutex_unlock(&q->meta);
  free(l1);
  free(buf);
  return r < 0 ? fail(q, r, "growing the L1 table") : 0;
}

static int write_size(struct qcow2dev *q, uint64_t size) {
  uint8_t b[8];
  put_be64(b, size);
  int r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, b, sizeof b, 24);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r < 0)
    return fail(q, r, "writing the new size");
  q->h.size = size;
  return 0;
}

/* An external data file follows the virtual size, as qemu-img keeps it. */
static int size_data_file(struct qcow2dev *q, uint64_t size) {
  if (!q->g.data_file)
    return 0;
  if (ftruncate(q->data_fd, (off_t)size) < 0 || fdatasync(q->data_fd) < 0)
    return fail(q, -errno, "resizing the data file");
  q->data_size = size;
  return 0;
}

/* What the grown area [old, size) would show that is not zeroes: the tail
 * of the old last cluster (data written before a shrink stays there), and
 * a backing file longer than the old size.  Returns the end of it. */
static uint64_t stale_end(struct qcow2dev *q, uint64_t old, uint64_t size) {
  uint64_t end = old;
  if (old % q->csize && !qcow2_cluster_unallocated(q, old >> q->h.cluster_bits))
    end = div_up(old, q->csize) * q->csize;
  if (q->backing && q->backing->size > end)
    end = q->backing->size;
  return end < size ? end : size;
}

static int preallocate(struct bd *bd, uint64_t from, uint64_t size,
                       enum bd_prealloc pa) {
  struct qcow2dev *q = bd->priv;
  int fd = pa == BD_PREALLOC_METADATA ? -1 : q->data_fd;
  int r = 0;
  for (uint64_t c = from >> q->h.cluster_bits;
       r == 0 && c < div_up(size, q->csize); c++)
    r = qcow2_prealloc_cluster(q, c, fd, pa == BD_PREALLOC_FULL);
  /* The file covers every cluster that has a reference, as qemu-img check
   * wants (metadata mode wrote nothing to the last ones). */
  struct stat st;
  if (r == 0 && fstat(q->fd, &st) < 0)
    r = -errno;
  if (r == 0 && (uint64_t)st.st_size < q->alloc_end &&
      ftruncate(q->fd, (off_t)q->alloc_end) < 0)
    r = -errno;
  return r < 0 ? fail(q, r, "preallocating") : 0;
}

/* Persistent bitmaps follow the size once it is durable; they stay in use
 * (inconsistent) on disk until the image is closed. */
static int resize_bitmaps(struct qcow2dev *q, uint64_t size) {
  int r = qcow2_bitmaps_resize(q, size);
  if (r < 0 && r != -EFBIG) /* -EFBIG comes with its reason */
    fail(q, r, "resizing the persistent bitmaps");
  return r;
}

static int grow(struct bd *bd, uint64_t size, enum bd_prealloc pa) {
  struct qcow2dev *q = bd->priv;
  uint64_t old = q->h.size;
  int r = grow_l1(q, div_up(size, l2_span(q)));
  if (r == 0)
    r = size_data_file(q, size);
  uint64_t stale = stale_end(q, old, size);
  if (r == 0 && stale > old && (r = qcow2_zero(bd, stale - old, old, 0)) < 0)
    fail(q, r, "zeroing the new area");
  if (r == 0 && pa != BD_PREALLOC_OFF)
    r = preallocate(bd, old, size, pa);
  if (r == 0)
    r = qcow2_flush(bd);
  if (r == 0)
    r = write_size(q, size);
  return r == 0 ? resize_bitmaps(q, size) : r;
}

/* Unmap every cluster wholly past SIZE, skipping L1 entries with no table,
 * then drop the tables wholly past it. */
static int unmap_tail(struct qcow2dev *q, uint64_t size) {
  uint64_t first = div_up(size, q->csize), end = div_up(q->h.size, q->csize);
  uint64_t per_l2 = 1ull << q->l2_bits;
  int r = 0;
  for (uint64_t c = first; r == 0 && c < end;) {
    uint64_t l1i = c >> q->l2_bits, next = (l1i + 1) * per_l2;
    if (q->l1[l1i] & QCOW2_OFFSET_MASK)
      for (; r == 0 && c < next && c < end; c++)
        r = qcow2_unmap_cluster(q, c);
    c = next;
  }
  for (uint64_t i = div_up(size, l2_span(q)); r == 0 && i < q->h.l1_size; i++)
    r = qcow2_drop_l2(q, i);
  return r < 0 ? fail(q, r, "unmapping the clusters past the end") : 0;
}

/* Cut the image after its last used cluster (the freed ones are holes
 * already; this gives back the file's length, as qemu-img does). */
static int cut_file(struct qcow2dev *q) {
  uint64_t end = 0;
  pthread_mutex_lock(&q->meta);
  int r = qcow2_rc_used_end(q, &end);
  if (r == 0 && end && end < q->file_size && ftruncate(q->fd, (off_t)end) < 0)
    r = -errno;
  if (r == 0 && end && end < q->file_size)
    q->file_size = end; /* alloc_end stays: freed offsets are not reused */
  pthread_mutex_unlock(&q->meta);
  return r < 0 ? fail(q, r, "truncating the file") : 0;
}

static int shrink(struct bd *bd, uint64_t size) {
  struct qcow2dev *q = bd->priv;
  int r = unmap_tail(q, size);
  if (r == 0)
    r = qcow2_flush(bd);
  if (r == 0)
    r = write_size(q, size);
  if (r == 0)
    r = resize_bitmaps(q, size);
  if (r == 0)
    r = size_data_file(q, size);
  return r == 0 ? cut_file(q) : r;
}

int qcow2_resize(struct bd *bd, uint64_t size, enum bd_prealloc pa) {
  struct qcow2dev *q = bd->priv;
  if (size % 512) {
    bd_set_error("qcow2 %s: the new size must be a multiple of 512", q->path);
    return -EINVAL;
  }
  int r = qcow2_bitmaps_prepare_resize(q);
  if (r == 0)
    r = qcow2_flush(bd);
  if (r == 0 && size > q->h.size)
    r = grow(bd, size, pa);
  else if (r == 0 && size < q->h.size)
    r = shrink(bd, size);
  return r;
}
