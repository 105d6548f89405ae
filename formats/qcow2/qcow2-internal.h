/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 internals shared by the files of formats/qcow2/. */
#ifndef BLOCKPORT_QCOW2_INTERNAL_H
#define BLOCKPORT_QCOW2_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/blockdev.h"
#include "core/source.h"
#include "core/uring.h"
#include "qcow2.h"

struct bd;
struct l2cache;
struct qcow2_ol;
struct qcow2_bitmaps;
struct qcow2_contexts;

/* An opened qcow2 image. */
struct qcow2dev {
  int fd;      /* the image */
  int data_fd; /* guest data: the image, or an external data file */
  /* --cache none / directsync: data_fd opened again with O_DIRECT, for
   * guest data (metadata stays in the page cache); -1 otherwise. */
  int dio_fd;
  bool ring; /* --aio io_uring: data of mapped clusters through a ring */
  uint32_t dio_align, dio_mem; /* what it needs: file offsets, memory */
  uint64_t file_size, data_size;
  struct qcow2_header h;
  struct qcow2_geom g;
  uint64_t csize;
  unsigned l2_bits; /* log2 of entries per L2 table */
  /* L2 entry bits that send a lookup to the full check (qcow2.c):
   * reserved ones, offset bits below a cluster, the compressed flag. */
  uint64_t l2_check_bits;
  uint64_t *l1; /* host-endian copy of the active L1 table */
  struct l2cache *cache;
  struct bd *backing; /* NULL without a backing file */
  char *path;
  char *data_path; /* the external data file's, or NULL */
  bool share;      /* -U: lock nothing out, backing and data file included */

  /* Writing (refcount.c, write.c).  The metadata lock serialises
   * allocation decisions and metadata updates; data I/O runs outside it. */
  bool writable;
  bool for_check; /* opened by check.c: malformed entries are its to judge */
  bool broken;    /* metadata state unknown after a failed update: no writes */
  bool no_flush;  /* --cache unsafe: sync points write, never fdatasync */
  /* Metadata guard (guard.c): the overlap map of a writable image, and
   * whether a write on metadata was refused (atomic; then no writes). */
  struct qcow2_ol *ol;
  bool corrupt;
  bool bad_logged; /* a malformed entry of a read-only image was logged */
  pthread_mutex_t meta;
  pthread_cond_t alloc_done;
  struct inflight *inflight; /* guest clusters being allocated */
  uint64_t *reftable;        /* host-endian copy of the refcount table */
  uint64_t reftable_entries;
  unsigned rc_bits;    /* refcount width */
  uint64_t rb_entries; /* refcounts per block */
  uint64_t alloc_end;  /* next host cluster to allocate */
  /* Compressed clusters are packed one after another from cpos, as long as
   * nothing else was allocated since (cpos_end == alloc_end). */
  uint64_t cpos, cpos_end;
  /* Metadata updates not yet on disk (see write.c): L1 indices, L2 entries
   * (their slices pinned in the cache) and clusters to free. */
  struct pending *pend_l2;
  size_t npend_l2, cap_pend_l2;
  size_t pend_slices; /* distinct slices pinned by pend_l2 */
  uint64_t *pend_l1;
  size_t npend_l1, cap_pend_l1;
  struct pending *pend_free;
  size_t npend_free, cap_pend_free;
  /* Persistent bitmaps tracking writes (dirty-bitmaps.c), or NULL. */
  struct qcow2_bitmaps *bitmaps;
  /* Bitmaps offered as block-status contexts (bitmap-context.c), or NULL. */
  struct qcow2_contexts *contexts;
};

struct pending {
  uint64_t a, b;       /* L2: file offset of the slice | free: range */
  struct l2slice *pin; /* L2: the cached slice holding the entry */
  bool keep;           /* free: punch no hole (see qcow2_free_range) */
};

struct inflight {
  uint64_t cluster;
  struct inflight *next;
};

/* compress.c: TYPE 0 deflate, 1 zstd.  Returns 0 or -EIO. */
int qcow2_decompress(unsigned type, const uint8_t *in, size_t inlen,
                     uint8_t *out, size_t outlen);
/* Compress one cluster into OUT (OUTLEN bytes).  Returns the compressed
 * size, 0 if it does not fit, or -errno. */
long qcow2_compress(unsigned type, const uint8_t *in, size_t inlen,
                    uint8_t *out, size_t outlen);

/* l2cache.c: L2 tables cached in slices, shared by all threads; hits,
 * misses and evictions count in STATS (core/stats.h; NULL: nowhere). */
struct bd_stat_scope;
struct l2cache *l2cache_new(size_t slice_bytes, size_t total_bytes,
                            struct bd_stat_scope *stats);
void l2cache_free(struct l2cache *c);
struct l2slice;
/* The slice at host offset KEY, loaded with LOAD on a miss.  Returns its
 * entries (host-endian) and pins it in *PIN, or NULL with *ERR set. */
typedef int l2_load_fn(void *ctx, uint64_t key, uint64_t *entries, size_t n);
const uint64_t *l2cache_get(struct l2cache *c, uint64_t key, l2_load_fn *load,
                            void *ctx, struct l2slice **pin, int *err);
void l2cache_put(struct l2cache *c, struct l2slice *pin);
const uint64_t *qcow2_slice_entries(const struct l2slice *pin);
/* Count a pending update on a pinned slice (DELTA +1 or -1); true when it
 * is the slice's first. */
bool l2cache_mark_dirty(struct l2cache *c, struct l2slice *sl, int delta);
/* qcow2.c: the loader of L2 slices for l2cache_get(). */
int qcow2_load_slice(void *ctx, uint64_t key, uint64_t *entries, size_t n);
/* The slice at KEY if it is cached and loaded (pinned), else NULL. */
const uint64_t *l2cache_peek(struct l2cache *c, uint64_t key,
                             struct l2slice **pin);
/* Update entry I of the cached slice at KEY, if cached (after a load in
 * flight finishes, so the load cannot overwrite it). */
void l2cache_set(struct l2cache *c, uint64_t key, size_t i, uint64_t value);

/* snapshot-view.c: with a snapshot named by the options O ("snapshot",
 * "snapshot.id", "snapshot.name"), its L1 table in place of the active
 * one (read-only openings only).  0 or -errno with bd_errmsg() set. */
struct bd_open_opts;
int qcow2_snapshot_view(struct qcow2dev *q, const struct bd_open_opts *o);

/* qcow2.c */
/* Open for check.c: FLAGS as qcow2_open()'s (read-write to repair), but
 * not prepared for writes (no refcounts loaded, no dirty repair, no
 * overlap map, corrupt images accepted). */
struct bd *qcow2_open_check(const char *path, unsigned flags);
int qcow2_read(struct qcow2dev *q, uint8_t *buf, uint64_t len, uint64_t off);
/* write.c: DATA, the whole of guest CLUSTER as read from the backing file,
 * written into the image if the cluster still shows the backing file (a
 * write since the read has newer data).  0 or -errno. */
int qcow2_copy_on_read(struct qcow2dev *q, uint64_t cluster,
                       const uint8_t *data);
/* Whether guest CLUSTER shows the backing file: no data, zero flag or
 * subcluster of this image's (a lookup). */
bool qcow2_cluster_unallocated(struct qcow2dev *q, uint64_t cluster);
/* The L2 entry of guest CLUSTER: *L2OFF is 0 if there is no L2 table. */
int qcow2_lookup(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                 uint64_t *entry, uint64_t *bitmap);
/* The same from cached slices only: -EAGAIN when it would read the file. */
int qcow2_lookup_nowait(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                        uint64_t *entry, uint64_t *bitmap);
uint64_t qcow2_slice_key(const struct qcow2dev *q, uint64_t l2off, uint64_t l2i,
                         size_t *idx);

/* refcount.c (metadata lock held) */
int qcow2_rc_init(struct qcow2dev *q);
/* The same for check.c: a damaged table is loaded as it is. */
int qcow2_rc_init_check(struct qcow2dev *q);
int qcow2_rc_get(struct qcow2dev *q, uint64_t cluster, uint64_t *val);
int qcow2_rc_update(struct qcow2dev *q, uint64_t cluster, int64_t delta);
/* The same for N adjacent clusters, each block's entries in one write;
 * within a block all or none change. */
int qcow2_rc_update_run(struct qcow2dev *q, uint64_t first, uint64_t n,
                        int64_t delta);
int qcow2_alloc_cluster(struct qcow2dev *q, uint64_t *host);
/* NCLUSTERS adjacent data clusters at the end of the image, referenced.
 * On failure the image is marked broken and the range leaks. */
int qcow2_alloc_run(struct qcow2dev *q, uint64_t nclusters, uint64_t *host);
/* NCLUSTERS adjacent clusters at the end of the image for a table that
 * must not be split (an L1 or bitmap table), referenced and marked as
 * metadata of KIND (overlap.h) in the guard.  *HOST is set even on
 * failure: at worst the range leaks. */
int qcow2_alloc_contiguous(struct qcow2dev *q, uint64_t nclusters,
                           unsigned kind, uint64_t *host);
/* *END: the end of the last cluster with a reference (0 if none). */
int qcow2_rc_used_end(struct qcow2dev *q, uint64_t *end);
/* After a failed metadata write the image's state in memory may differ
 * from the file: refuse further writes (reads go on), logged once.
 * Returns ERR. */
int qcow2_mark_broken(struct qcow2dev *q, int err, const char *what);
/* An fdatasync that orders writes for power loss: none with --cache
 * unsafe, as QEMU's unsafe mode never waits for the disk. */
int qcow2_fdatasync(struct qcow2dev *q, int fd);
/* Drop a reference to each cluster [host, host+len) touches, all or
 * none.  With PUNCH, clusters left unreferenced are punched out of the
 * file; without it (a compressed extent, which a damaged entry may aim at
 * another entry's data) they keep their bytes: allocation never reuses a
 * freed cluster, so a wrong free then loses nothing. */
int qcow2_free_range(struct qcow2dev *q, uint64_t host, uint64_t len,
                     bool punch);

/* dirty-bitmaps.c: persistent bitmaps of an image opened for writing.
 * Open (refcounts loaded): -ENOTSUP with a reason when they cannot be kept
 * consistent.  Mark: any thread, before writing the range.  Close, after
 * the final flush: STORE them (else they stay marked in use). */
int qcow2_bitmaps_open(struct qcow2dev *q);
void qcow2_bitmaps_mark(struct qcow2dev *q, uint64_t off, uint64_t len);
void qcow2_bitmaps_close(struct qcow2dev *q, bool store);
/* Resizing (resize.c).  Before anything changes: refuse when a bitmap is
 * inconsistent (as QEMU does), and take the disabled ones into tracking,
 * since their tables must follow the size too.  After the new size is
 * written: every table follows it, stored at close. */
int qcow2_bitmaps_prepare_resize(struct qcow2dev *q);
int qcow2_bitmaps_resize(struct qcow2dev *q, uint64_t size);

/* Segments of a request on the data file for the ring (core/uring.h):
 * neighbours on the file and in memory merge. */
struct ring_segs {
  struct uring_seg v[URING_MAX_SEGS];
  unsigned n;
};
int qcow2_ring_add(struct ring_segs *rs, void *buf, uint64_t host,
                   uint64_t len);

/* write.c */
int qcow2_open_writable(struct qcow2dev *q);
int qcow2_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                 uint32_t flags);
int qcow2_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags);
int qcow2_trim(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags);
int qcow2_flush(struct bd *bd);
int qcow2_try_write_nowait(struct qcow2dev *q, const uint8_t *buf, uint64_t len,
                           uint64_t off);
/* --aio io_uring: the data segments of a write into clusters the image
 * owns alone, whose L2 slices are cached (as qcow2_try_write_nowait(),
 * any size), appended to SEGS.  -EAGAIN: the careful path must do it. */
int qcow2_write_segs(struct qcow2dev *q, struct ring_segs *rs,
                     const uint8_t *buf, uint64_t len, uint64_t off);

/* For resize.c.  Unmap guest CLUSTER, whatever it held (no zero flag: it
 * lies past the end).  Drop the L2 table of L1 entry L1I.  Give guest
 * CLUSTER a host cluster of its own if it has none, with
 * io_preallocate(FD_FILL, ..., WRITE_ZEROES) done on it first when FD_FILL
 * is not -1.  Each takes the metadata lock; the changes reach the file at
 * the next sync point. */
int qcow2_unmap_cluster(struct qcow2dev *q, uint64_t cluster);
int qcow2_drop_l2(struct qcow2dev *q, uint64_t l1i);
int qcow2_prealloc_cluster(struct qcow2dev *q, uint64_t cluster, int fd_fill,
                           bool write_zeroes);
/* resize.c: the bd_ops resize of a qcow2 image. */
int qcow2_resize(struct bd *bd, uint64_t size, enum bd_prealloc prealloc);

/* Guest data at HOST in the data file: with O_DIRECT where the range is
 * aligned for it (dio_fd), through the page cache otherwise. */
int qcow2_data_pread(struct qcow2dev *q, void *buf, uint64_t len,
                     uint64_t host);
int qcow2_data_pwrite(struct qcow2dev *q, const void *buf, uint64_t len,
                      uint64_t host);

#endif
