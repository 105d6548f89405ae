/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 writes: in-place writes to clusters this image owns alone, and
 * allocating writes everywhere else (unallocated, zero, compressed, or
 * shared with a snapshot).
 *
 * An allocating write marks its guest cluster as in flight, decides under
 * the metadata lock where the new cluster goes, and then, without the
 * lock, builds the whole cluster (old contents, from whatever layer holds
 * them, overlaid with the new bytes) and writes it.  Only then is the L2
 * entry pointed at it, and only after that are the old clusters' refcounts
 * dropped.  A write to a cluster in flight waits for it.  Order on disk:
 * refcount (+1) before the L2 entry that uses it, data before the L2 entry,
 * L2 entry before the refcount (-1), new L2 table before its L1 entry;
 * the sync point below makes that order hold across power loss. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/log.h"
#include "guard.h"
#include "qcow2-internal.h"

/* ---- clusters in flight ---- */

static bool in_flight(struct qcow2dev *q, uint64_t cluster) {
  for (struct inflight *f = q->inflight; f; f = f->next)
    if (f->cluster == cluster)
      return true;
  return false;
}

/* Wait (metadata lock held) until nobody allocates CLUSTER. */
static void wait_cluster(struct qcow2dev *q, uint64_t cluster) {
  while (in_flight(q, cluster))
    pthread_cond_wait(&q->alloc_done, &q->meta);
}

static void finish_cluster(struct qcow2dev *q, struct inflight *f) {
  for (struct inflight **pp = &q->inflight; *pp; pp = &(*pp)->next) {
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  }
  pthread_cond_broadcast(&q->alloc_done);
}

/* ---- metadata updates (metadata lock held) ---- */

static void grow_file(struct qcow2dev *q) {
  if (q->alloc_end > q->file_size)
    __atomic_store_n(&q->file_size, q->alloc_end, __ATOMIC_RELEASE);
}

/* ---- deferred metadata ----
 *
 * L1 and L2 updates take effect in memory at once (readers see them) and
 * reach the file at the next sync point, together with the refcount
 * decreases they allow.  A sync point orders everything for power loss:
 *   1. fdatasync: data, refcount increases and new L2 tables are durable;
 *   2. write the L1 entries and each dirty L2 slice whole, fdatasync;
 *   3. drop the refcounts of clusters no longer referenced.
 * It runs on FLUSH (and FUA), at close, and when too much is pending (2048
 * pinned slices, or 262144 updates).  A
 * crash before it loses the unflushed allocations, which leak. */

/* What may pend between sync points: slices kept pinned (8 MiB of
 * cache), and updates of any kind. */
#define MAX_PENDING_SLICES 2048
#define MAX_PENDING 262144

static int push(void *arrp, size_t *n, size_t *cap, size_t size,
                const void *item) {
  void **arr = arrp;
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 64;
    void *na = realloc(*arr, nc * size);
    if (!na)
      return -ENOMEM;
    *arr = na;
    *cap = nc;
  }
  memcpy((char *)*arr + *n * size, item, size);
  (*n)++;
  return 0;
}

static int set_l1(struct qcow2dev *q, uint64_t l1i, uint64_t value) {
  int r = qcow2_guard_meta(q, QCOW2_OL_ACTIVE_L1, q->h.l1_offset + l1i * 8, 8);
  if (r == 0)
    r = push(&q->pend_l1, &q->npend_l1, &q->cap_pend_l1, sizeof l1i, &l1i);
  if (r == 0)
    __atomic_store_n(&q->l1[l1i], value, __ATOMIC_RELEASE);
  return r;
}

/* The entry (and, with extended L2, its subcluster bitmap) is set in a
 * cached slice that stays pinned until the sync point writes it whole:
 * one pending record per slice, however many of its entries change. */
static int set_l2(struct qcow2dev *q, uint64_t l2off, uint64_t cluster,
                  uint64_t value, uint64_t bitmap) {
  uint64_t l2i = cluster & ((1ull << q->l2_bits) - 1);
  size_t idx;
  struct pending p = {.a = qcow2_slice_key(q, l2off, l2i, &idx)};
  /* Refused here already, so that the write that needs it fails. */
  int err = qcow2_guard_meta(q, QCOW2_OL_ACTIVE_L2, p.a, 8);
  uint64_t *e = err ? NULL
                    : (uint64_t *)l2cache_get(q->cache, p.a, qcow2_load_slice,
                                              q, &p.pin, &err);
  if (!e)
    return err;
  if (q->g.extended_l2)
    __atomic_store_n(&e[idx + 1], bitmap, __ATOMIC_RELEASE);
  __atomic_store_n(&e[idx], value, __ATOMIC_RELEASE);
  if (l2cache_mark_dirty(q->cache, p.pin, 1)) {
    err = push(&q->pend_l2, &q->npend_l2, &q->cap_pend_l2, sizeof p, &p);
    if (err == 0) {
      q->pend_slices++;
      return 0;
    }
  }
  /* Already pending (or out of memory): drop this pin and mark. */
  l2cache_mark_dirty(q->cache, p.pin, -1);
  l2cache_put(q->cache, p.pin);
  return err;
}

/* Write the cached slice PIN at file offset KEY. */
static int write_slice(struct qcow2dev *q, uint64_t key,
                       const struct l2slice *pin, uint8_t *buf) {
  size_t bytes = q->csize < 4096 ? q->csize : 4096; /* as qcow2_slice_key */
  const uint64_t *e = qcow2_slice_entries(pin);
  for (size_t i = 0; i < bytes / 8; i++)
    put_be64(buf + i * 8, __atomic_load_n(&e[i], __ATOMIC_ACQUIRE));
  return qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L2, buf, bytes, key);
}

static int defer_free(struct qcow2dev *q, uint64_t host, uint64_t len,
                      bool punch) {
  struct pending p = {.a = host, .b = len, .keep = !punch};
  return push(&q->pend_free, &q->npend_free, &q->cap_pend_free, sizeof p, &p);
}

/* 8 bytes of metadata of KIND (overlap.h). */
static int write_be64(struct qcow2dev *q, unsigned kind, uint64_t off,
                      uint64_t value) {
  uint8_t e[8];
  put_be64(e, value);
  return qcow2_guard_pwrite(q, kind, e, 8, off);
}

/* In unsafe mode as in QEMU's: metadata reaches the file, nothing waits
 * for the disk (not even at close). */
static int datasync(struct qcow2dev *q) {
  int r = q->data_fd != q->fd ? qcow2_fdatasync(q, q->data_fd) : 0;
  return r < 0 ? r : qcow2_fdatasync(q, q->fd);
}

/* Metadata lock held. */
static int sync_metadata(struct qcow2dev *q) {
  int r = datasync(q);
  for (size_t i = 0; r == 0 && i < q->npend_l1; i++) {
    uint64_t l1i = q->pend_l1[i];
    r = write_be64(q, QCOW2_OL_ACTIVE_L1, q->h.l1_offset + l1i * 8, q->l1[l1i]);
  }
  uint8_t buf[4096];
  for (size_t i = 0; i < q->npend_l2; i++) {
    struct pending *p = &q->pend_l2[i];
    if (r == 0)
      r = write_slice(q, p->a, p->pin, buf);
    l2cache_mark_dirty(q->cache, p->pin, -1);
    l2cache_put(q->cache, p->pin);
  }
  q->npend_l1 = q->npend_l2 = q->pend_slices = 0;
  if (r == 0 && q->npend_free)
    r = datasync(q);
  for (size_t i = 0; r == 0 && i < q->npend_free; i++)
    r = qcow2_free_range(q, q->pend_free[i].a, q->pend_free[i].b,
                         !q->pend_free[i].keep);
  q->npend_free = 0;
  return r < 0 ? qcow2_mark_broken(q, r, "writing metadata") : 0;
}

static int maybe_sync(struct qcow2dev *q) {
  if (q->pend_slices < MAX_PENDING_SLICES &&
      q->npend_l2 + q->npend_l1 + q->npend_free < MAX_PENDING)
    return 0;
  return sync_metadata(q);
}

/* Drop the host clusters an L2 entry holds (at the next sync point).
 * BOUND is where allocation stood when the entry was looked up: a damaged
 * entry that reaches past it (a compressed extent running off the end of
 * the file, a data cluster far past it) holds nothing it may free, since
 * what lies there now was allocated since, for live data.  It leaks. */
static int release_entry(struct qcow2dev *q, uint64_t entry, uint64_t bound) {
  if (q->g.data_file)
    return 0; /* the data file's clusters have no refcounts */
  uint64_t host = entry & QCOW2_OFFSET_MASK, len = q->csize;
  bool compressed = entry & QCOW2_L2_COMPRESSED;
  if (compressed) {
    struct qcow2_run run;
    if (qcow2_decode_l2(&q->g, entry, 0, 0, 1, &run) < 0)
      return -EIO;
    host = run.coffset;
    len = run.csize;
  }
  if (host == 0)
    return 0;
  if (host >= bound || len > bound - host) {
    log_warn("qcow2 %s: L2 entry 0x%llx reaches past the allocated end of "
             "the image: its clusters are left alone (leaked)",
             q->path, (unsigned long long)entry);
    return 0;
  }
  return defer_free(q, host, len, !compressed);
}

/* Copy an L2 table shared with a snapshot.  The clusters it references
 * already count one reference per L1 table that reaches them (that is how
 * QEMU's snapshots count), so only the tables' refcounts change: the copy
 * gets one, the shared table loses the active image's. */
static int cow_l2(struct qcow2dev *q, uint64_t l1i, uint64_t old,
                  uint64_t *l2off) {
  uint64_t nl2 = 0;
  uint8_t *t = malloc(q->csize);
  int r = t ? qcow2_alloc_cluster(q, &nl2) : -ENOMEM;
  if (r == 0 && pread(q->fd, t, q->csize, (off_t)old) != (ssize_t)q->csize)
    r = -EIO;
  grow_file(q);
  if (r == 0)
    r = qcow2_guard_mark(q, QCOW2_OL_ACTIVE_L2, nl2, q->csize);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L2, t, q->csize, nl2);
  if (r == 0)
    r = set_l1(q, l1i, nl2 | QCOW2_L2_COPIED);
  if (r == 0) {
    qcow2_guard_l2_replaced(q, old);
    r = defer_free(q, old, q->csize, true);
  }
  free(t);
  *l2off = nl2;
  return r;
}

/* The L2 table for CLUSTER, allocated or unshared as needed. */
static int writable_l2(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off) {
  uint64_t l1i = cluster >> q->l2_bits;
  uint64_t l1e = q->l1[l1i], old = l1e & QCOW2_OFFSET_MASK;
  if (old && (l1e & QCOW2_L2_COPIED)) {
    *l2off = old;
    return 0;
  }
  if (old)
    return cow_l2(q, l1i, old, l2off);
  uint64_t nl2;
  int r = qcow2_alloc_cluster(q, &nl2);
  uint8_t *zero = r == 0 ? calloc(1, q->csize) : NULL;
  if (r == 0 && !zero)
    r = -ENOMEM;
  grow_file(q);
  /* The new table is written before the L1 entry points at it. */
  if (r == 0)
    r = qcow2_guard_mark(q, QCOW2_OL_ACTIVE_L2, nl2, q->csize);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_ACTIVE_L2, zero, q->csize, nl2);
  free(zero);
  if (r == 0)
    r = set_l1(q, l1i, nl2 | QCOW2_L2_COPIED);
  *l2off = nl2;
  return r;
}

/* ---- writing one cluster ---- */

#define EXT_ALL_ALLOCATED 0x00000000ffffffffull
#define EXT_ALL_ZERO 0xffffffff00000000ull

/* Subclusters [in, in+n) of a cluster, as a mask of bits 0-31. */
static uint64_t sc_mask(const struct qcow2dev *q, uint32_t in, uint64_t n) {
  return qcow2_sc_mask(q->h.cluster_bits, in, n);
}

/* Whether ENTRY points at a host cluster: in an external data file host
 * offset 0 is one (guest cluster 0), marked by the COPIED bit. */
static bool has_host(const struct qcow2dev *q, uint64_t entry) {
  return (entry & QCOW2_OFFSET_MASK) ||
         (q->g.data_file && (entry & QCOW2_L2_COPIED));
}

/* A host cluster for guest CLUSTER's data: allocated in the image, or in
 * an external data file the one at the guest offset (metadata lock held). */
static int alloc_data(struct qcow2dev *q, uint64_t cluster, uint64_t *host) {
  if (q->g.data_file) {
    *host = cluster << q->h.cluster_bits;
    return 0;
  }
  return qcow2_alloc_cluster(q, host);
}

/* Undo alloc_data() for a cluster never published. */
static void unalloc_data(struct qcow2dev *q, uint64_t host) {
  if (!q->g.data_file)
    qcow2_free_range(q, host, q->csize, true);
}

/* Whether ENTRY's host cluster lies where the image allocated (metadata
 * lock held).  One past that is no cluster of the image's (a damaged
 * entry): written in place it would meet the next allocation there. */
static bool allocated_here(const struct qcow2dev *q, uint64_t entry) {
  return q->g.data_file || (entry & QCOW2_OFFSET_MASK) < q->alloc_end;
}

/* A cluster the image owns alone, whose bytes [in, in+n) can be written in
 * place (with extended L2: their subclusters are allocated).  N 0 asks
 * only whether the image owns the cluster.  Metadata lock held. */
static bool owned_data(const struct qcow2dev *q, uint64_t entry,
                       uint64_t bitmap, uint32_t in, uint64_t n) {
  if ((entry & QCOW2_L2_COMPRESSED) || !has_host(q, entry) ||
      !(entry & QCOW2_L2_COPIED) || !allocated_here(q, entry))
    return false;
  if (!q->g.extended_l2)
    return !(entry & QCOW2_L2_ZERO);
  uint64_t need = n ? sc_mask(q, in, n) : 0;
  return (bitmap & need) == need;
}

/* New contents for guest CLUSTER: its current contents with BUF laid over
 * [in, in+n). */
static int build_cluster(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                         const uint8_t *buf, uint64_t n, uint8_t *out) {
  if (n < q->csize) {
    int r = qcow2_read(q, out, q->csize, cluster << q->h.cluster_bits);
    if (r < 0)
      return r;
  }
  if (buf)
    memcpy(out + in, buf, n);
  else
    memset(out + in, 0, n);
  return 0;
}

/* Whether guest CLUSTER, mapped by ENTRY and BITMAP, reads as zeroes
 * throughout. */
static bool reads_zero(const struct qcow2dev *q, uint64_t cluster,
                       uint64_t entry, uint64_t bitmap) {
  if (entry & QCOW2_L2_COMPRESSED)
    return false;
  bool no_backing =
      !q->backing || (cluster << q->h.cluster_bits) >= q->backing->size;
  if (q->g.extended_l2) {
    if (bitmap & EXT_ALL_ALLOCATED)
      return false;
    return (bitmap & EXT_ALL_ZERO) == EXT_ALL_ZERO || no_backing;
  }
  if ((entry & QCOW2_L2_ZERO) && q->g.v3)
    return true;
  return !has_host(q, entry) && no_backing;
}

static int allocate_write(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                          const uint8_t *buf, uint64_t n, uint64_t entry,
                          uint64_t bitmap) {
  struct inflight f = {cluster, q->inflight};
  q->inflight = &f;
  uint64_t l2off, host = 0, bound = q->alloc_end;
  int r = writable_l2(q, cluster, &l2off);
  bool fresh = r == 0 && !q->g.data_file, got = false;
  if (r == 0)
    got = (r = alloc_data(q, cluster, &host)) == 0;
  grow_file(q);
  pthread_mutex_unlock(&q->meta);

  /* A failed data write changes no metadata once its cluster is given
   * back (say ENOSPC on a full disk): the image stays writable. */
  bool data_phase = r == 0;
  if (r == 0 && fresh && reads_zero(q, cluster, entry, bitmap)) {
    /* A fresh cluster at the end of the file already reads as zeroes:
     * write only the new bytes. */
    r = qcow2_guard_data(q, host + in, n);
    if (r == 0)
      r = qcow2_data_pwrite(q, buf, n, host + in);
  } else if (r == 0) {
    uint8_t *data = malloc(q->csize);
    r = data ? build_cluster(q, cluster, in, buf, n, data) : -ENOMEM;
    if (r == 0)
      r = qcow2_guard_data(q, host, q->csize);
    if (r == 0)
      r = qcow2_data_pwrite(q, data, q->csize, host);
    free(data);
  }
  bool data_failed = data_phase && r < 0;

  pthread_mutex_lock(&q->meta);
  /* With extended L2 the whole new cluster was written: every subcluster
   * is allocated. */
  if (r == 0)
    r = set_l2(q, l2off, cluster, host | QCOW2_L2_COPIED,
               q->g.extended_l2 ? EXT_ALL_ALLOCATED : 0);
  else if (got)
    unalloc_data(q, host); /* never published */
  if (r == 0)
    r = release_entry(q, entry, bound);
  if (r == 0)
    r = maybe_sync(q);
  if (r < 0 && !data_failed)
    qcow2_mark_broken(q, r, "updating metadata");
  finish_cluster(q, &f);
  return r;
}

/* ---- runs of whole clusters ----
 *
 * A write covering several whole clusters that all need allocating (a
 * copy into a fresh image, a flatten) gets one run of adjacent host
 * clusters and one data write, then its L2 entries together: the same
 * order as allocate_write(), without a round trip per cluster.  Only in
 * the image itself, without extended L2 (whose subcluster path differs). */

#define RUN_MAX 512 /* clusters per run: 32 MiB at 64 KiB */

struct run {
  uint64_t first, n, host, bound;
  struct inflight f[RUN_MAX];
  uint64_t entry[RUN_MAX], l2off[RUN_MAX];
};

static void finish_run(struct qcow2dev *q, struct run *w) {
  for (uint64_t i = 0; i < w->n; i++)
    finish_cluster(q, &w->f[i]);
}

/* Mark the leading clusters of [first, first+max) that need allocating and
 * are not in flight; metadata lock held.  Stops at the first that would
 * wait, so a run never waits while holding clusters. */
static int claim_run(struct qcow2dev *q, struct run *w, uint64_t max) {
  w->n = 0;
  w->bound = q->alloc_end;
  for (uint64_t c = w->first; w->n < max && !in_flight(q, c); c++) {
    uint64_t l2off, entry, bitmap;
    int r = qcow2_lookup(q, c, &l2off, &entry, &bitmap);
    if (r < 0)
      return r;
    if (owned_data(q, entry, bitmap, 0, q->csize))
      break; /* written in place */
    w->entry[w->n] = entry;
    w->f[w->n] = (struct inflight){c, q->inflight};
    q->inflight = &w->f[w->n++];
  }
  return 0;
}

/* Publish the run written at w->host: its L2 entries, then the old
 * clusters released.  Metadata lock held. */
static int publish_run(struct qcow2dev *q, struct run *w) {
  int r = 0;
  for (uint64_t i = 0; r == 0 && i < w->n; i++)
    r = set_l2(q, w->l2off[i], w->first + i,
               (w->host + i * q->csize) | QCOW2_L2_COPIED, 0);
  for (uint64_t i = 0; r == 0 && i < w->n; i++)
    r = release_entry(q, w->entry[i], w->bound);
  return r == 0 ? maybe_sync(q) : r;
}

/* Write whole clusters from FIRST (at most MAX) as one run; metadata lock
 * held on entry and exit.  Returns the clusters written, 0 when fewer than
 * two could be claimed (the caller writes cluster by cluster). */
static int64_t write_run(struct qcow2dev *q, struct run *w, const uint8_t *buf,
                         uint64_t max) {
  w->n = 0; /* nothing claimed yet, whatever the last run left */
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = claim_run(q, w, max);
  if (r < 0 || w->n < 2) {
    finish_run(q, w);
    return r;
  }
  /* The tables first, so that the data run is not split by one. */
  for (uint64_t i = 0; r == 0 && i < w->n; i++)
    r = writable_l2(q, w->first + i, &w->l2off[i]);
  bool got = r == 0 && (r = qcow2_alloc_run(q, w->n, &w->host)) == 0;
  grow_file(q);
  pthread_mutex_unlock(&q->meta);

  uint64_t len = w->n * q->csize;
  bool data_phase = r == 0; /* as in allocate_write() */
  if (r == 0)
    r = qcow2_guard_data(q, w->host, len);
  if (r == 0)
    r = qcow2_data_pwrite(q, buf, len, w->host);
  bool data_failed = data_phase && r < 0;

  pthread_mutex_lock(&q->meta);
  if (r == 0)
    r = publish_run(q, w);
  else if (got)
    qcow2_free_range(q, w->host, len, true); /* never published */
  if (r < 0 && !data_failed)
    qcow2_mark_broken(q, r, "updating metadata");
  finish_run(q, w);
  return r < 0 ? r : (int64_t)w->n;
}

/* ---- subclusters (extended L2) ----
 *
 * A write into subclusters that are not allocated yet, in a cluster the
 * image owns or that has no host cluster at all, writes only the
 * subclusters it touches (the rest of a partially covered one comes from
 * wherever it reads now) and then sets their allocation bits: no copy of
 * the whole cluster from the backing file. */

/* Whether the write can take the subcluster path. */
static bool subcluster_writable(const struct qcow2dev *q, uint64_t entry,
                                uint64_t bitmap) {
  if (!q->g.extended_l2 || (entry & QCOW2_L2_COMPRESSED))
    return false;
  if (has_host(q, entry))
    return (entry & QCOW2_L2_COPIED) && allocated_here(q, entry);
  return !(bitmap & EXT_ALL_ALLOCATED); /* else corrupt: the read fails */
}

/* A write of at most this many bytes that needs both ends of its span
 * filled reads the span in one go, the written bytes included: one round
 * trip to a remote backing file instead of two. */
#define SPAN_ONE_READ_MAX (64 * 1024)

/* Bytes [lo, hi) of guest CLUSTER, the subclusters [in, in+n) touches,
 * with BUF (or zeroes) laid over [in, in+n), into OUT. */
static int build_span(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                      const uint8_t *buf, uint64_t n, uint32_t lo, uint32_t hi,
                      uint8_t *out) {
  uint64_t base = cluster << q->h.cluster_bits;
  bool head = lo < in, tail = in + n < hi;
  int r = 0;
  if (head && tail && n <= SPAN_ONE_READ_MAX)
    r = qcow2_read(q, out, hi - lo, base + lo);
  else if (head)
    r = qcow2_read(q, out, in - lo, base + lo);
  if (r == 0 && tail && !(head && n <= SPAN_ONE_READ_MAX))
    r = qcow2_read(q, out + (in - lo) + n, hi - in - n, base + in + n);
  if (buf)
    memcpy(out + (in - lo), buf, n);
  else
    memset(out + (in - lo), 0, n);
  return r;
}

/* Metadata lock held on entry and exit; ENTRY and BITMAP as looked up. */
static int subcluster_write(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                            const uint8_t *buf, uint64_t n, uint64_t entry,
                            uint64_t bitmap) {
  struct inflight f = {cluster, q->inflight};
  q->inflight = &f;
  uint64_t l2off, host = entry & QCOW2_OFFSET_MASK;
  bool fresh = !has_host(q, entry);
  int r = writable_l2(q, cluster, &l2off);
  if (r == 0 && fresh)
    r = alloc_data(q, cluster, &host);
  grow_file(q);
  pthread_mutex_unlock(&q->meta);

  /* Partly covered subclusters at either end are filled in, unless they
   * are allocated already: their other bytes may be under an in-place
   * write right now, and must not be written back. */
  uint32_t sc = (uint32_t)(q->csize >> 5), bits = q->h.cluster_bits - 5;
  uint32_t lo = in / sc * sc;
  uint32_t hi = (uint32_t)((in + n + sc - 1) / sc * sc);
  if (bitmap & (1ull << (in >> bits)))
    lo = in;
  if (bitmap & (1ull << ((in + n - 1) >> bits)))
    hi = (uint32_t)(in + n);
  uint8_t *span = r == 0 ? malloc(hi - lo) : NULL;
  if (r == 0 && !span)
    r = -ENOMEM;
  bool data_phase = r == 0; /* as in allocate_write() */
  if (r == 0)
    r = build_span(q, cluster, in, buf, n, lo, hi, span);
  if (r == 0)
    r = qcow2_guard_data(q, host + lo, hi - lo);
  if (r == 0)
    r = qcow2_data_pwrite(q, span, hi - lo, host + lo);
  free(span);
  bool data_failed = data_phase && r < 0;

  pthread_mutex_lock(&q->meta);
  /* Data before the bitmap that exposes it: set_l2 reaches the file only
   * after the sync point's fdatasync. */
  uint64_t mask = sc_mask(q, in, n);
  bool published = false;
  if (r == 0)
    published = (r = set_l2(q, l2off, cluster, host | QCOW2_L2_COPIED,
                            qcow2_sc_allocate(bitmap, mask))) == 0;
  if (r == 0)
    r = maybe_sync(q);
  else if (fresh && host && !published)
    unalloc_data(q, host); /* never published */
  if (r < 0 && !data_failed)
    qcow2_mark_broken(q, r, "updating metadata");
  finish_cluster(q, &f);
  return r;
}

int qcow2_copy_on_read(struct qcow2dev *q, uint64_t cluster,
                       const uint8_t *data) {
  pthread_mutex_lock(&q->meta);
  wait_cluster(q, cluster);
  uint64_t l2off, entry = 0, bitmap = 0;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  if (r == 0 && (l2off == 0 || (entry == 0 && bitmap == 0)))
    r = allocate_write(q, cluster, 0, data, q->csize, entry, bitmap);
  pthread_mutex_unlock(&q->meta);
  return r;
}

/* Write [in, in+n) of guest CLUSTER; BUF NULL writes zeroes. */
static int write_cluster(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                         const uint8_t *buf, uint64_t n) {
  pthread_mutex_lock(&q->meta);
  wait_cluster(q, cluster);
  uint64_t l2off, entry, bitmap;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  if (r == 0 && owned_data(q, entry, bitmap, in, n)) {
    pthread_mutex_unlock(&q->meta);
    uint64_t host = (entry & QCOW2_OFFSET_MASK) + in;
    r = qcow2_guard_data(q, host, n);
    if (r < 0)
      return r;
    if (buf)
      return qcow2_data_pwrite(q, buf, n, host);
    uint8_t *z = calloc(1, n);
    r = z ? qcow2_data_pwrite(q, z, n, host) : -ENOMEM;
    free(z);
    return r;
  }
  if (r == 0 && !buf && reads_zero(q, cluster, entry, bitmap))
    r = 0; /* zeroes over zeroes: nothing to do */
  else if (r == 0 && subcluster_writable(q, entry, bitmap))
    r = subcluster_write(q, cluster, in, buf, n, entry, bitmap);
  else if (r == 0)
    r = allocate_write(q, cluster, in, buf, n, entry, bitmap);
  pthread_mutex_unlock(&q->meta);
  return r;
}

/* A small page-aligned write into a cluster the image owns alone, whose
 * L2 slice is cached, completes in the caller's thread; anything that
 * would wait (an allocation in flight, a slice to load) says -EAGAIN. */
int qcow2_try_write_nowait(struct qcow2dev *q, const uint8_t *buf, uint64_t len,
                           uint64_t off) {
  uint64_t cluster = off >> q->h.cluster_bits;
  uint32_t in = (uint32_t)(off & (q->csize - 1));
  if (len > 65536 || (off | len) % 4096 != 0 || in + len > q->csize)
    return -EAGAIN;
  uint64_t l2off, entry = 0, bitmap = 0;
  pthread_mutex_lock(&q->meta);
  int r = q->broken || qcow2_is_corrupt(q) || in_flight(q, cluster)
              ? -EAGAIN
              : qcow2_lookup_nowait(q, cluster, &l2off, &entry, &bitmap);
  bool owned = r == 0 && owned_data(q, entry, bitmap, in, len);
  pthread_mutex_unlock(&q->meta);
  uint64_t host = (entry & QCOW2_OFFSET_MASK) + in;
  /* A write on metadata is refused on the careful path. */
  if (!owned || qcow2_guard_would_hit(q, host, len))
    return -EAGAIN;
  qcow2_bitmaps_mark(q, off, len);
  return qcow2_data_pwrite(q, buf, len, host);
}

int qcow2_write_segs(struct qcow2dev *q, struct ring_segs *rs,
                     const uint8_t *buf, uint64_t len, uint64_t off) {
  pthread_mutex_lock(&q->meta);
  int r = q->broken || qcow2_is_corrupt(q) ? -EAGAIN : 0;
  while (r == 0 && len > 0) {
    uint64_t cluster = off >> q->h.cluster_bits, l2off, entry = 0, bitmap = 0;
    uint32_t in = (uint32_t)(off & (q->csize - 1));
    uint64_t n = q->csize - in < len ? q->csize - in : len;
    r = in_flight(q, cluster)
            ? -EAGAIN
            : qcow2_lookup_nowait(q, cluster, &l2off, &entry, &bitmap);
    uint64_t host = (entry & QCOW2_OFFSET_MASK) + in;
    /* A write on metadata is refused on the careful path. */
    if (r < 0 || !owned_data(q, entry, bitmap, in, n) ||
        qcow2_guard_would_hit(q, host, n) ||
        qcow2_ring_add(rs, (void *)buf, host, n) < 0)
      r = -EAGAIN;
    buf += n;
    off += n;
    len -= n;
  }
  pthread_mutex_unlock(&q->meta);
  return r < 0 ? -EAGAIN : 0;
}

/* Split [off, off+len) at cluster boundaries. */
static int for_each_cluster(struct qcow2dev *q, uint64_t off, uint64_t len,
                            int (*fn)(struct qcow2dev *, uint64_t, uint32_t,
                                      uint64_t, const uint8_t *, uint32_t),
                            const uint8_t *buf, uint32_t flags) {
  while (len > 0) {
    uint64_t cluster = off >> q->h.cluster_bits;
    uint32_t in = (uint32_t)(off & (q->csize - 1));
    uint64_t n = q->csize - in < len ? q->csize - in : len;
    int r = fn(q, cluster, in, n, buf, flags);
    if (r < 0)
      return r;
    off += n;
    len -= n;
    if (buf)
      buf += n;
  }
  return 0;
}

/* ---- compressed clusters ---- */

/* Room for N compressed bytes: packed after the previous compressed
 * cluster while nothing else was allocated since, else in a new cluster.
 * Each host cluster the bytes touch gains a reference. */
static int alloc_compressed(struct qcow2dev *q, uint64_t n, uint64_t *start) {
  int r = 0;
  uint64_t host;
  if (q->cpos == 0 || q->cpos_end != q->alloc_end) {
    r = qcow2_alloc_cluster(q, &host);
    q->cpos = host;
  } else if (q->cpos & (q->csize - 1)) {
    r = qcow2_rc_update(q, q->cpos >> q->h.cluster_bits, 1);
  }
  *start = q->cpos;
  while (r == 0 && q->cpos + n > q->alloc_end)
    r = qcow2_alloc_cluster(q, &host);
  q->cpos += n;
  q->cpos_end = q->alloc_end;
  grow_file(q);
  return r;
}

/* Store guest CLUSTER compressed, if the cluster reads as zeroes now (a
 * fresh destination) and compression gains at least a sector.  Returns 1
 * when it did nothing, so the caller writes the cluster plainly. */
static int write_compressed(struct qcow2dev *q, uint64_t cluster,
                            const uint8_t *buf) {
  uint8_t *out = malloc(q->csize);
  if (!out)
    return -ENOMEM;
  long n =
      qcow2_compress(q->h.compression_type, buf, q->csize, out, q->csize - 512);
  if (n <= 0) {
    free(out);
    return n < 0 ? (int)n : 1;
  }
  pthread_mutex_lock(&q->meta);
  wait_cluster(q, cluster);
  uint64_t l2off, entry, bitmap, start = 0, bound = q->alloc_end;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  if (r == 0 && !reads_zero(q, cluster, entry, bitmap))
    r = 1;
  struct inflight f = {cluster, q->inflight};
  if (r == 0) {
    q->inflight = &f;
    r = writable_l2(q, cluster, &l2off);
    if (r == 0)
      r = alloc_compressed(q, (uint64_t)n, &start);
    pthread_mutex_unlock(&q->meta);
    if (r == 0)
      r = qcow2_guard_data(q, start, (uint64_t)n);
    if (r == 0)
      r = io_pwrite_all(q->fd, out, (size_t)n, start);
    pthread_mutex_lock(&q->meta);
    /* x = 62 - (cluster_bits - 8): offset below, extra sectors above. */
    unsigned x = 62 - (q->h.cluster_bits - 8);
    uint64_t nsect = ((start & 511) + (uint64_t)n + 511) / 512 - 1;
    if (r == 0)
      r = set_l2(q, l2off, cluster, QCOW2_L2_COMPRESSED | start | (nsect << x),
                 0);
    if (r == 0)
      r = release_entry(q, entry, bound);
    if (r == 0)
      r = maybe_sync(q);
    finish_cluster(q, &f);
  }
  pthread_mutex_unlock(&q->meta);
  free(out);
  return r;
}

static int compress_piece(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                          uint64_t n, const uint8_t *buf, uint32_t flags) {
  (void)flags;
  /* External data files hold no compressed clusters. */
  int r =
      n == q->csize && !q->g.data_file ? write_compressed(q, cluster, buf) : 1;
  return r == 1 ? write_cluster(q, cluster, in, buf, n) : r;
}

/* Write BUF over [off, off+len), whole clusters in runs where it can. */
static int write_plain(struct qcow2dev *q, const uint8_t *buf, uint64_t len,
                       uint64_t off) {
  bool runs = !q->g.extended_l2 && !q->g.data_file;
  struct run *w = NULL;
  int r = 0;
  while (r == 0 && len > 0) {
    uint64_t whole = (off & (q->csize - 1)) ? 0 : len >> q->h.cluster_bits;
    int64_t done = 0;
    if (runs && whole >= 2 && (w || (w = malloc(sizeof *w)))) {
      w->first = off >> q->h.cluster_bits;
      pthread_mutex_lock(&q->meta);
      done = write_run(q, w, buf, whole < RUN_MAX ? whole : RUN_MAX);
      pthread_mutex_unlock(&q->meta);
    }
    uint64_t n = (uint64_t)done << q->h.cluster_bits;
    if (done == 0) {
      uint32_t in = (uint32_t)(off & (q->csize - 1));
      n = q->csize - in < len ? q->csize - in : len;
      done = write_cluster(q, off >> q->h.cluster_bits, in, buf, n);
    }
    r = done < 0 ? (int)done : 0;
    buf += n;
    off += n;
    len -= n;
  }
  free(w);
  return r;
}

int qcow2_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                 uint32_t flags) {
  struct qcow2dev *q = bd->priv;
  qcow2_bitmaps_mark(q, off, len);
  /* Compressed clusters are whole clusters written once: BD_F_COMPRESS
   * compresses the whole clusters of a write into clusters that read as
   * zeroes; everything else is written plainly. */
  int r = (flags & BD_F_COMPRESS)
              ? for_each_cluster(q, off, len, compress_piece, buf, 0)
              : write_plain(q, buf, len, off);
  if (r < 0)
    bd_set_error("qcow2 %s: write at %llu failed: %s", q->path,
                 (unsigned long long)off, strerror(-r));
  if (r == 0 && (flags & BD_F_FUA))
    r = qcow2_flush(bd);
  return r;
}

/* ---- zero and trim ---- */

/* Replace the entry of a whole guest cluster (zero or unallocated: VALUE
 * and, with extended L2, VBITMAP), dropping what it held unless KEEP asks to
 * keep its own cluster. */
static int replace_entry(struct qcow2dev *q, uint64_t cluster, uint64_t value,
                         uint64_t vbitmap, bool keep) {
  pthread_mutex_lock(&q->meta);
  wait_cluster(q, cluster);
  uint64_t l2off, entry, bitmap, bound = q->alloc_end;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  if (r == 0 && keep && owned_data(q, entry, bitmap, 0, 0))
    value |= entry & (QCOW2_OFFSET_MASK | QCOW2_L2_COPIED);
  if (r == 0 && (entry != value || bitmap != vbitmap)) {
    if (l2off == 0 || !(q->l1[cluster >> q->l2_bits] & QCOW2_L2_COPIED))
      r = writable_l2(q, cluster, &l2off);
    grow_file(q);
    if (r == 0)
      r = set_l2(q, l2off, cluster, value, vbitmap);
    if (r == 0 && !(value & QCOW2_OFFSET_MASK))
      r = release_entry(q, entry, bound);
    if (r == 0)
      r = maybe_sync(q);
  }
  pthread_mutex_unlock(&q->meta);
  return r;
}

/* Set the zero bits of the whole subclusters [in, in+n) of CLUSTER (and
 * clear their allocation bits); a compressed cluster is rewritten. */
static int set_zero_bits(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                         uint64_t n) {
  pthread_mutex_lock(&q->meta);
  wait_cluster(q, cluster);
  uint64_t l2off = 0, entry = 0, bitmap = 0;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  uint64_t mask = sc_mask(q, in, n), nb = qcow2_sc_zero(bitmap, mask);
  if (r == 0 && (entry & QCOW2_L2_COMPRESSED)) {
    r = allocate_write(q, cluster, in, NULL, n, entry, bitmap);
  } else if (r == 0 && nb != bitmap) {
    if (l2off == 0 || !(q->l1[cluster >> q->l2_bits] & QCOW2_L2_COPIED))
      r = writable_l2(q, cluster, &l2off);
    grow_file(q);
    if (r == 0)
      r = set_l2(q, l2off, cluster, entry, nb);
    if (r == 0)
      r = maybe_sync(q);
  }
  pthread_mutex_unlock(&q->meta);
  return r;
}

/* Zero [in, in+n) of an extended-L2 cluster: whole subclusters by their
 * zero bits, partial ones at either end by writing zeroes. */
static int zero_subclusters(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                            uint64_t n) {
  uint32_t sc = (uint32_t)(q->csize >> 5);
  uint32_t a = (in + sc - 1) / sc * sc, b = (uint32_t)((in + n) / sc * sc);
  if (a >= b)
    return write_cluster(q, cluster, in, NULL, n);
  int r = a > in ? write_cluster(q, cluster, in, NULL, a - in) : 0;
  if (r == 0 && in + n > b)
    r = write_cluster(q, cluster, b, NULL, in + n - b);
  return r == 0 ? set_zero_bits(q, cluster, a, b - a) : r;
}

static int zero_piece(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                      uint64_t n, const uint8_t *buf, uint32_t flags) {
  (void)buf;
  if (n < q->csize && q->g.extended_l2)
    return zero_subclusters(q, cluster, in, n);
  if (n < q->csize || !q->g.v3)
    return write_cluster(q, cluster, in, NULL, n);
  bool keep = !(flags & BD_F_MAY_TRIM);
  if (q->g.extended_l2)
    return replace_entry(q, cluster, 0, EXT_ALL_ZERO, keep);
  return replace_entry(q, cluster, QCOW2_L2_ZERO, 0, keep);
}

/* A raw external data file must read like the disk itself: a range that
 * now reads as zeroes is zeroed there too (a hole, or written zeroes). */
static int zero_raw_data(struct qcow2dev *q, uint64_t len, uint64_t off) {
  if (!q->g.data_file || !(q->h.autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW) ||
      len == 0)
    return 0;
  if (fallocate(q->data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                (off_t)off, (off_t)len) == 0)
    return 0;
  uint8_t *z = calloc(1, 1u << 20);
  int r = z ? 0 : -ENOMEM;
  for (uint64_t done = 0; r == 0 && done < len; done += 1u << 20) {
    uint64_t n = len - done < (1u << 20) ? len - done : (1u << 20);
    r = qcow2_data_pwrite(q, z, n, off + done);
  }
  free(z);
  return r;
}

int qcow2_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  struct qcow2dev *q = bd->priv;
  /* Version 2 has no zero flag: zeroing means writing zeroes. */
  if (!q->g.v3 && (flags & BD_F_FAST_ZERO)) {
    bd_set_error("qcow2 %s: version 2 images cannot zero quickly", q->path);
    return -ENOTSUP;
  }
  qcow2_bitmaps_mark(q, off, len);
  int r = for_each_cluster(q, off, len, zero_piece, NULL, flags);
  if (r == 0)
    r = zero_raw_data(q, len, off);
  if (r == 0 && (flags & BD_F_FUA))
    r = qcow2_flush(bd);
  return r;
}

static int trim_piece(struct qcow2dev *q, uint64_t cluster, uint32_t in,
                      uint64_t n, const uint8_t *buf, uint32_t flags) {
  (void)in, (void)buf, (void)flags;
  if (n < q->csize)
    return 0; /* trim is advisory: partial clusters stay */
  /* With a backing file an unallocated cluster would show the backing
   * data again; a zero cluster does not (version 3 only). */
  if (q->backing && !q->g.v3)
    return 0;
  if (q->g.extended_l2)
    return replace_entry(q, cluster, 0, q->backing ? EXT_ALL_ZERO : 0, false);
  return replace_entry(q, cluster, q->backing ? QCOW2_L2_ZERO : 0, 0, false);
}

int qcow2_trim(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  struct qcow2dev *q = bd->priv;
  qcow2_bitmaps_mark(q, off, len);
  int r = for_each_cluster(q, off, len, trim_piece, NULL, 0);
  /* Only whole clusters were trimmed. */
  uint64_t a = (off + q->csize - 1) & ~(q->csize - 1);
  uint64_t b = (off + len) & ~(q->csize - 1);
  if (r == 0 && b > a && (q->g.v3 || !q->backing))
    r = zero_raw_data(q, b - a, a);
  if (r == 0 && (flags & BD_F_FUA))
    r = qcow2_flush(bd);
  return r;
}

/* ---- resizing (resize.c) ---- */

int qcow2_unmap_cluster(struct qcow2dev *q, uint64_t cluster) {
  return replace_entry(q, cluster, 0, 0, false);
}

int qcow2_drop_l2(struct qcow2dev *q, uint64_t l1i) {
  pthread_mutex_lock(&q->meta);
  uint64_t old = q->l1[l1i] & QCOW2_OFFSET_MASK;
  int r = old ? set_l1(q, l1i, 0) : 0;
  if (r == 0 && old) {
    qcow2_guard_l2_replaced(q, old);
    r = defer_free(q, old, q->csize, true);
  }
  pthread_mutex_unlock(&q->meta);
  return r;
}

int qcow2_prealloc_cluster(struct qcow2dev *q, uint64_t cluster, int fd_fill,
                           bool write_zeroes) {
  pthread_mutex_lock(&q->meta);
  uint64_t l2off, entry, bitmap, host = 0;
  int r = qcow2_writes_refused(q);
  if (r == 0)
    r = qcow2_lookup(q, cluster, &l2off, &entry, &bitmap);
  if (r < 0 || has_host(q, entry)) {
    pthread_mutex_unlock(&q->meta);
    return r;
  }
  if (l2off == 0 || !(q->l1[cluster >> q->l2_bits] & QCOW2_L2_COPIED))
    r = writable_l2(q, cluster, &l2off);
  if (r == 0)
    r = alloc_data(q, cluster, &host);
  grow_file(q);
  /* The cluster holds zeroes before an entry points at it (with extended
   * L2 its subclusters stay unallocated, and the zeroes are for falloc
   * and full only). */
  if (r == 0 && fd_fill >= 0)
    r = io_preallocate(fd_fill, host, q->csize, write_zeroes);
  /* Extended L2: the bitmap stays, zero bits included (they hide a
   * backing file). */
  if (r == 0)
    r = set_l2(q, l2off, cluster, host | QCOW2_L2_COPIED, bitmap);
  if (r == 0)
    r = maybe_sync(q);
  pthread_mutex_unlock(&q->meta);
  return r;
}

int qcow2_flush(struct bd *bd) {
  struct qcow2dev *q = bd->priv;
  if (!q->writable)
    return 0;
  pthread_mutex_lock(&q->meta);
  int r = qcow2_writes_refused(q);
  r = r < 0 ? -EIO : sync_metadata(q);
  pthread_mutex_unlock(&q->meta);
  if (r < 0)
    bd_set_error("qcow2 %s: flush: %s", q->path, strerror(-r));
  return r;
}

/* ---- opening for writing ---- */

static int refuse(struct qcow2dev *q, const char *why) {
  bd_set_error("%s: cannot open for writing: %s (serve it with --readonly)",
               q->path, why);
  return -ENOTSUP;
}

/* Lazy refcounts left dirty by a crash: the refcounts cannot be trusted,
 * so they are repaired from the metadata before anything is written (as
 * `check --repair all` does, which also clears the dirty bit).  An image
 * still corrupt after that is not written. */
static int repair_dirty(struct qcow2dev *q) {
  log_info("qcow2 %s: dirty image (lazy refcounts): repairing the refcounts",
           q->path);
  struct qcow2_check_result res;
  int r = qcow2_check(q, QCOW2_REPAIR_ALL, NULL, &res);
  if (r == 0 && (res.corruptions || res.check_errors)) {
    bd_set_error("qcow2 %s: dirty image: %llu corruptions left after "
                 "repairing it (see `blockport check`)",
                 q->path, (unsigned long long)res.corruptions);
    r = -EIO;
  }
  if (r == 0)
    log_info("qcow2 %s: repaired %llu leaked clusters and %llu corruptions",
             q->path, (unsigned long long)res.leaks_fixed,
             (unsigned long long)res.corruptions_fixed);
  return r;
}

int qcow2_open_writable(struct qcow2dev *q) {
  if (q->h.incompatible & QCOW2_INCOMPAT_CORRUPT)
    return refuse(q, "the image is marked corrupt");
  pthread_mutex_init(&q->meta, NULL);
  pthread_cond_init(&q->alloc_done, NULL);
  int r = (q->h.incompatible & QCOW2_INCOMPAT_DIRTY) ? repair_dirty(q) : 0;
  if (r == 0)
    r = qcow2_rc_init(q);
  if (r == 0)
    r = qcow2_guard_init(q);
  if (r < 0)
    return r;
  /* Persistent bitmaps are kept consistent (dirty-bitmaps.c); other
   * autoclear features we do not maintain must be cleared before the first
   * write, as the spec asks; a raw data file we keep raw. */
  r = qcow2_bitmaps_open(q);
  uint64_t keep = q->h.autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW;
  if (q->h.bitmaps_nb)
    keep |= q->h.autoclear & QCOW2_AUTOCLEAR_BITMAPS;
  if (r == 0 && q->h.version >= 3 && q->h.autoclear != keep) {
    r = write_be64(q, QCOW2_OL_HEADER, 88, keep);
    if (r == 0)
      r = io_fdatasync(q->fd);
    if (r == 0)
      q->h.autoclear = keep;
  }
  if (r < 0) {
    qcow2_bitmaps_close(q, false);
    return r;
  }
  q->writable = true;
  return 0;
}
