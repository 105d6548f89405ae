/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 as a block device: open (header, L1, backing chain, external data
 * file), reads and block status; writes are in write.c and refcount.c.
 * Reads of allocated clusters take no image-wide lock: an L2 lookup pins
 * one cached slice, and data is read with pread outside any lock. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backing-path.h"
#include "bitmap-context.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/fault.h"
#include "core/filelock.h"
#include "core/io.h"
#include "core/log.h"
#include "core/source.h"
#include "dirty-bitmaps.h"
#include "formats/formats.h"
#include "formats/map.h"
#include "guard.h"
#include "qcow2-internal.h"

#define MAX_CHAIN 256

/* ---- I/O helpers ---- */

static int corrupt(struct qcow2dev *q, const char *what, uint64_t value) {
  bd_set_error("qcow2 %s: corrupt image: %s (0x%llx)", q->path, what,
               (unsigned long long)value);
  log_warn("%s", bd_errmsg());
  return -EIO;
}

/* ---- mapping ---- */

int qcow2_load_slice(void *ctx, uint64_t key, uint64_t *entries, size_t n) {
  struct qcow2dev *q = ctx;
  int r = io_pread_zero(q->fd, entries, n * 8, key);
  if (r < 0)
    return r;
  for (size_t i = 0; i < n; i++)
    entries[i] = get_be64((const uint8_t *)&entries[i]);
  return 0;
}

/* The file grows as clusters are allocated; readers see the new size
 * before any entry that points past the old one is published. */
static uint64_t file_limit(const struct qcow2dev *q) {
  return __atomic_load_n(&q->file_size, __ATOMIC_ACQUIRE);
}

uint64_t qcow2_slice_key(const struct qcow2dev *q, uint64_t l2off, uint64_t l2i,
                         size_t *idx) {
  unsigned esize = q->g.extended_l2 ? 2 : 1; /* u64 words per entry */
  uint64_t per_slice = 4096 / 8 / esize;
  if (per_slice > (1ull << q->l2_bits))
    per_slice = 1ull << q->l2_bits;
  *idx = (size_t)((l2i % per_slice) * esize);
  return l2off + (l2i / per_slice) * per_slice * esize * 8;
}

/* What is wrong with the L2 entry (and subcluster bitmap) of guest
 * CLUSTER, by QEMU's rules: reserved bits, an unaligned offset, subcluster
 * bits that contradict each other or the entry, a compressed descriptor
 * where none may be, a data file cluster away from its guest offset.  NULL
 * when it is well formed. */
static const char *entry_fault(const struct qcow2dev *q, uint64_t cluster,
                               uint64_t entry, uint64_t bitmap) {
  struct qcow2_run run;
  uint64_t host = entry & QCOW2_OFFSET_MASK;
  if (qcow2_decode_l2(&q->g, entry, bitmap, 0, 1, &run) < 0)
    return (entry & QCOW2_L2_COMPRESSED) ? "invalid compressed cluster entry"
           : host & (q->csize - 1)       ? "cluster offset unaligned"
                                         : "invalid L2 entry";
  bool allocated = host || (q->g.data_file && (entry & QCOW2_L2_COPIED));
  if (q->g.data_file && allocated && host != cluster << q->h.cluster_bits)
    return "data file cluster not at its guest offset";
  return NULL;
}

/* Whether an entry is well formed at a glance: a plain cluster, free of
 * any bit that needs a closer look, and with extended L2 a bitmap that
 * neither allocates and zeroes one subcluster nor allocates in a cluster
 * without a host offset.  The full check takes the rest. */
static bool entry_plain(const struct qcow2dev *q, uint64_t entry,
                        uint64_t bitmap) {
  if (entry & q->l2_check_bits)
    return false;
  uint32_t alloc = (uint32_t)bitmap;
  return !q->g.extended_l2 || ((alloc & (uint32_t)(bitmap >> 32)) == 0 &&
                               (alloc == 0 || (entry & QCOW2_OFFSET_MASK)));
}

/* L2 entry bits entry_plain() leaves to the full check.  An external data
 * file's entries all take it (their offsets must match the guest's). */
static uint64_t l2_check_bits(const struct qcow2dev *q) {
  if (q->g.data_file)
    return ~0ull;
  uint64_t bits = QCOW2_L2_COMPRESSED | QCOW2_L2_STD_RESERVED |
                  ((q->csize - 1) & QCOW2_OFFSET_MASK);
  /* Bit 0, the zero flag, exists in version 3 standard entries only. */
  return bits | (q->g.v3 && !q->g.extended_l2 ? 0 : QCOW2_L2_ZERO);
}

/* The cached slice holding an entry, kept pinned for a look at the
 * entries after it (map_run()). */
struct slice_view {
  const uint64_t *e; /* the slice's words; NULL: nothing pinned */
  size_t idx, words; /* the entry's first word, the slice's word count */
  struct l2slice *pin;
};

/* The L2 entry (and subcluster bitmap) of guest CLUSTER, checked; with
 * NOWAIT only from a cached slice, and -EAGAIN for anything the careful
 * path must report.  With VIEW, a well-formed entry's slice stays pinned
 * there for the caller to put. */
static int lookup_mode(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                       uint64_t *entry, uint64_t *bitmap, bool nowait,
                       struct slice_view *view) {
  uint64_t l1i = cluster >> q->l2_bits, guest = cluster << q->h.cluster_bits;
  uint64_t l1e =
      l1i < q->h.l1_size ? __atomic_load_n(&q->l1[l1i], __ATOMIC_ACQUIRE) : 0;
  *l2off = l1e & QCOW2_OFFSET_MASK;
  *entry = *bitmap = 0;
  if (*l2off == 0)
    return 0;
  if (*l2off & (q->csize - 1))
    return nowait
               ? -EAGAIN
               : qcow2_bad_entry(q, "L2 table offset unaligned", *l2off, guest);
  if (*l2off >= file_limit(q))
    return nowait ? -EAGAIN
                  : corrupt(q, "L2 table past the end of the file", *l2off);
  size_t idx;
  uint64_t key =
      qcow2_slice_key(q, *l2off, cluster & ((1ull << q->l2_bits) - 1), &idx);
  struct l2slice *pin;
  int err = -EAGAIN;
  const uint64_t *e =
      nowait ? l2cache_peek(q->cache, key, &pin)
             : l2cache_get(q->cache, key, qcow2_load_slice, q, &pin, &err);
  if (!e)
    return err;
  *entry = __atomic_load_n(&e[idx], __ATOMIC_ACQUIRE);
  if (q->g.extended_l2)
    *bitmap = __atomic_load_n(&e[idx + 1], __ATOMIC_ACQUIRE);
  const char *bad = entry_plain(q, *entry, *bitmap)
                        ? NULL
                        : entry_fault(q, cluster, *entry, *bitmap);
  if (view && !bad) {
    size_t words = q->csize < 4096 ? q->csize / 8 : 512; /* as slice_key */
    *view = (struct slice_view){e, idx, words, pin};
    return 0;
  }
  l2cache_put(q->cache, pin);
  if (bad)
    return nowait ? -EAGAIN : qcow2_bad_entry(q, bad, *entry, guest);
  return 0;
}

static int lookup(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                  uint64_t *entry, uint64_t *bitmap) {
  return lookup_mode(q, cluster, l2off, entry, bitmap, false, NULL);
}

int qcow2_lookup(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                 uint64_t *entry, uint64_t *bitmap) {
  return lookup(q, cluster, l2off, entry, bitmap);
}

int qcow2_lookup_nowait(struct qcow2dev *q, uint64_t cluster, uint64_t *l2off,
                        uint64_t *entry, uint64_t *bitmap) {
  return lookup_mode(q, cluster, l2off, entry, bitmap, true, NULL);
}

/* Whole clusters after RUN's, from the entries that follow in the pinned
 * slice V, that continue it: unallocated or zero without a host cluster
 * (which qemu-img map would show), or data next on the host.  Up to LEN
 * bytes in all.  One cache lookup per slice instead of one per cluster,
 * which is what a block status walk over a large sparse image costs. */
static void extend_in_slice(const struct qcow2dev *q,
                            const struct slice_view *v, uint64_t entry,
                            uint64_t len, struct qcow2_run *run) {
  if (run->kind == QCOW2_COMPRESSED || q->g.data_file ||
      (run->kind != QCOW2_DATA && (entry & QCOW2_OFFSET_MASK)))
    return;
  unsigned esize = q->g.extended_l2 ? 2 : 1;
  for (size_t i = v->idx + esize; i < v->words && run->length < len;
       i += esize) {
    uint64_t e = __atomic_load_n(&v->e[i], __ATOMIC_ACQUIRE);
    uint64_t bm =
        esize == 2 ? __atomic_load_n(&v->e[i + 1], __ATOMIC_ACQUIRE) : 0;
    struct qcow2_run next;
    /* Anything that needs a closer look ends the run: the next lookup
     * checks it. */
    if (!entry_plain(q, e, bm) ||
        qcow2_decode_l2(&q->g, e, bm, 0, (uint32_t)q->csize, &next) < 0 ||
        next.kind != run->kind || next.length != q->csize)
      return;
    if (run->kind == QCOW2_DATA ? next.host != run->host + run->length
                                : (e & QCOW2_OFFSET_MASK) != 0)
      return;
    uint64_t left = len - run->length;
    run->length += left < q->csize ? left : q->csize;
  }
}

/* The run of one kind that starts at guest offset OFF, at most LEN long. */
static int map_run(struct qcow2dev *q, uint64_t off, uint64_t len,
                   struct qcow2_run *run) {
  uint64_t cluster = off >> q->h.cluster_bits;
  uint32_t in = (uint32_t)(off & (q->csize - 1));
  uint64_t l2off, entry, bitmap;
  struct slice_view view = {.e = NULL};
  int r = lookup_mode(q, cluster, &l2off, &entry, &bitmap, false, &view);
  if (r < 0)
    return r;
  if (l2off == 0) {
    /* No L2 table: the rest of its coverage is unallocated. */
    uint64_t l1i = cluster >> q->l2_bits;
    uint64_t cover = ((l1i + 1) << (q->l2_bits + q->h.cluster_bits)) - off;
    *run = (struct qcow2_run){QCOW2_UNALLOCATED, 0, cover < len ? cover : len,
                              0, 0};
    return 0;
  }
  uint32_t max =
      len < q->csize - in ? (uint32_t)len : (uint32_t)(q->csize - in);
  /* The entry was checked by the lookup.  Data past the end of the file
   * reads as zeroes, as in QEMU. */
  r = qcow2_decode_l2(&q->g, entry, bitmap, in, max, run);
  if (r == 0 && in + run->length == q->csize)
    extend_in_slice(q, &view, entry, len, run);
  l2cache_put(q->cache, view.pin);
  if (r < 0)
    return corrupt(q, "L2 entry", entry);
  if (run->kind == QCOW2_COMPRESSED && run->coffset >= file_limit(q))
    return corrupt(q, "compressed cluster past the end of the file",
                   run->coffset);
  return 0;
}

/* ---- reads ---- */

static int read_compressed(struct qcow2dev *q, const struct qcow2_run *run,
                           uint32_t in, uint8_t *buf, uint64_t n) {
  uint64_t csize = run->csize;
  uint64_t limit = file_limit(q);
  if (csize > limit - run->coffset)
    csize = limit - run->coffset;
  uint8_t *cbuf = malloc(csize ? csize : 1);
  uint8_t *cluster = malloc(q->csize);
  int r = cbuf && cluster ? 0 : -ENOMEM;
  if (r == 0)
    r = io_pread_zero(q->fd, cbuf, csize, run->coffset);
  if (r == 0 &&
      qcow2_decompress(q->h.compression_type, cbuf, csize, cluster, q->csize))
    r = corrupt(q, "compressed cluster does not decompress", run->coffset);
  if (r == 0)
    memcpy(buf, cluster + in, n);
  free(cbuf);
  free(cluster);
  return r;
}

static int read_backing(struct qcow2dev *q, uint8_t *buf, uint64_t n,
                        uint64_t off) {
  uint64_t bsize = q->backing ? q->backing->size : 0;
  uint64_t have = off >= bsize ? 0 : bsize - off < n ? bsize - off : n;
  if (have < n)
    memset(buf + have, 0, n - have);
  return have ? bd_pread(q->backing, buf, have, off) : 0;
}

/* The unallocated run of N bytes at OFF extended over the following
 * unallocated clusters, up to LEN and the backing device's largest
 * request: one request to the backing file instead of one per cluster (a
 * round trip each when the backing file is an NBD export). */
static uint64_t extend_unallocated(struct qcow2dev *q, uint64_t off,
                                   uint64_t len, uint64_t n) {
  uint64_t cap = q->backing->caps.max_block;
  struct qcow2_run next;
  while (n < len && map_run(q, off + n, len - n, &next) == 0 &&
         next.kind == QCOW2_UNALLOCATED && n + next.length <= cap)
    n += next.length;
  return n;
}

int qcow2_read(struct qcow2dev *q, uint8_t *p, uint64_t len, uint64_t off) {
  while (len > 0) {
    struct qcow2_run run;
    int r = map_run(q, off, len, &run);
    if (r < 0)
      return r;
    uint64_t n = run.length;
    if (run.kind == QCOW2_DATA) {
      /* Extend over following clusters that are contiguous on the host. */
      struct qcow2_run next;
      while (n < len && map_run(q, off + n, len - n, &next) == 0 &&
             next.kind == QCOW2_DATA && next.host == run.host + n)
        n += next.length;
      r = qcow2_data_pread(q, p, n, run.host);
      if (r < 0)
        bd_set_error("qcow2 %s: read: %s", q->path, strerror(-r));
    } else if (run.kind == QCOW2_COMPRESSED) {
      r = read_compressed(q, &run, (uint32_t)(off & (q->csize - 1)), p, n);
    } else if (run.kind == QCOW2_UNALLOCATED && q->backing) {
      n = extend_unallocated(q, off, len, n);
      r = read_backing(q, p, n, off);
    } else {
      memset(p, 0, n);
    }
    if (r < 0)
      return r;
    p += n;
    off += n;
    len -= n;
  }
  return 0;
}

/* ---- block status ---- */

static int backing_extents(struct qcow2dev *q, uint64_t n, uint64_t off,
                           uint32_t flags, struct bd_extents *ext) {
  uint64_t bsize = q->backing ? q->backing->size : 0;
  uint64_t have = off >= bsize ? 0 : bsize - off < n ? bsize - off : n;
  if (have > 0) {
    struct bd_extents sub;
    bd_extents_init(&sub, off, ext->max);
    struct bd_req req = {.cmd = BD_BLOCK_STATUS,
                         .offset = off,
                         .length = have,
                         .flags = flags,
                         .extents = &sub};
    int r = bd_run(q->backing, &req);
    uint64_t got = 0;
    for (size_t i = 0; r == 0 && i < sub.n && got < have; i++) {
      const struct bd_extent *e = &sub.v[i];
      uint64_t l = e->length < have - got ? e->length : have - got;
      r = bd_extents_add(ext, l, e->flags, e->depth ? e->depth + 1 : 0);
      got += l;
    }
    bd_extents_free(&sub);
    if (r != 0 || got < have)
      return r < 0 ? r : 1; /* full, or the backing answered less */
  }
  /* Past the end of a shorter backing file the backing layer answers
   * (zeroes), as QEMU's qemu:allocation-depth says: depth 2, not absent. */
  if (have < n)
    return bd_extents_add(ext, n - have, BD_EXT_HOLE | BD_EXT_ZERO,
                          q->backing ? 2 : 0);
  return 0;
}

/* Allocated clusters whose host bytes are a hole in the file (say, after
 * preallocation=metadata) read as zeroes: report them as allocated data
 * that is zero, as QEMU does (NBD: ZERO without HOLE). */
static int host_extents(struct qcow2dev *q, uint64_t host, uint64_t n,
                        struct bd_extents *ext) {
  uint64_t end = host + n;
  while (host < end) {
    off_t d = lseek(q->data_fd, (off_t)host, SEEK_DATA);
    if (d < 0 && errno != ENXIO) /* no SEEK_DATA: call it all data */
      return bd_extents_add(ext, end - host, 0, 1);
    uint64_t data = d < 0 || (uint64_t)d > end ? end : (uint64_t)d;
    int r = data > host ? bd_extents_add(ext, data - host, BD_EXT_ZERO, 1) : 0;
    if (r != 0 || data == end)
      return r;
    off_t h = lseek(q->data_fd, (off_t)data, SEEK_HOLE);
    uint64_t hole = h < 0 || (uint64_t)h > end ? end : (uint64_t)h;
    r = bd_extents_add(ext, hole - data, 0, 1);
    if (r != 0)
      return r;
    host = hole;
  }
  return 0;
}

/* The first run of a map, as qemu-img map reports it: allocated data with
 * its host offset (and zero over a hole in the host file), zero clusters,
 * compressed clusters (no offset), and unallocated ranges from the backing
 * chain one layer down. */
int qcow2_map(struct bd *bd, unsigned depth, uint64_t off, uint64_t len,
              struct map_entry *e) {
  struct qcow2dev *q = bd->priv;
  struct qcow2_run run;
  int r = map_run(q, off, len, &run);
  if (r < 0)
    return r;
  e->length = run.length;
  switch (run.kind) {
  case QCOW2_DATA: {
    struct bd_extents ext;
    bd_extents_init(&ext, off, 1);
    /* qemu-img looks into the host file for holes, not into a data file. */
    if (!q->g.data_file)
      r = host_extents(q, run.host, run.length, &ext);
    /* 1: the list (of one) is full, the first extent is what counts. */
    if (r >= 0 && ext.n > 0) {
      e->length = ext.v[0].length;
      e->zero = ext.v[0].flags & BD_EXT_ZERO;
    }
    bd_extents_free(&ext);
    e->present = e->data = e->has_offset = true;
    e->offset = run.host;
    if (q->data_path) /* the offset is the data file's, as qemu-img says */
      e->file = q->data_path;
    return r < 0 ? r : 0;
  }
  case QCOW2_COMPRESSED: e->present = e->data = true; return 0;
  case QCOW2_ZERO: e->present = e->zero = true; break;
  case QCOW2_UNALLOCATED:
    if (q->backing)
      return map_first(q->backing, depth + 1, off, run.length, e);
    e->zero = true;
    break;
  }
  /* A zero or unallocated (sub)cluster may still sit in a host cluster
   * (preallocation, extended L2): qemu-img map shows its offset. */
  uint64_t l2off, entry, bitmap;
  if (lookup(q, off >> q->h.cluster_bits, &l2off, &entry, &bitmap) == 0 &&
      (entry & QCOW2_OFFSET_MASK) && !(entry & QCOW2_L2_COMPRESSED)) {
    e->has_offset = true;
    e->offset = (entry & QCOW2_OFFSET_MASK) + (off & (q->csize - 1));
    if (q->data_path)
      e->file = q->data_path;
  }
  return 0;
}

static int q_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct qcow2dev *q = bd->priv;
  return qcow2_read(q, buf, len, off);
}

bool qcow2_cluster_unallocated(struct qcow2dev *q, uint64_t cluster) {
  uint64_t l2off, entry = 0, bitmap = 0;
  if (qcow2_lookup(q, cluster, &l2off, &entry, &bitmap) < 0)
    return false;
  return l2off == 0 || (entry == 0 && bitmap == 0);
}

/* The run at guest offset OFF (at most LEN) as the cached L2 slices map
 * it, without waiting: -EAGAIN when a slice would have to be loaded, the
 * entry does not decode, or data lies past the end of the image file (the
 * careful path handles loads and errors). */
static int map_run_nowait(struct qcow2dev *q, uint64_t off, uint64_t len,
                          struct qcow2_run *run) {
  uint64_t cluster = off >> q->h.cluster_bits, l2off, entry, bitmap;
  uint32_t in = (uint32_t)(off & (q->csize - 1));
  if (qcow2_lookup_nowait(q, cluster, &l2off, &entry, &bitmap) < 0)
    return -EAGAIN;
  uint32_t max =
      len < q->csize - in ? (uint32_t)len : (uint32_t)(q->csize - in);
  if (l2off == 0)
    *run = (struct qcow2_run){.kind = QCOW2_UNALLOCATED, .length = max};
  else if (qcow2_decode_l2(&q->g, entry, bitmap, in, max, run) < 0)
    return -EAGAIN;
  if (run->kind == QCOW2_DATA && q->data_fd == q->fd &&
      run->host - in >= file_limit(q))
    return -EAGAIN;
  return 0;
}

/* Whether RUN reads as zeroes without any I/O. */
static bool run_is_zero(const struct qcow2dev *q, const struct qcow2_run *run) {
  return run->kind == QCOW2_ZERO ||
         (run->kind == QCOW2_UNALLOCATED && !q->backing);
}

/* A read whose L2 slices are cached and whose data is in the page cache
 * completes in the caller's thread (see try_nowait in core/blockdev.h). */
static int read_nowait(struct qcow2dev *q, uint8_t *p, uint64_t len,
                       uint64_t off) {
  while (len > 0) {
    struct qcow2_run run;
    if (map_run_nowait(q, off, len, &run) < 0)
      return -EAGAIN;
    if (run_is_zero(q, &run)) {
      memset(p, 0, run.length);
    } else if (run.kind == QCOW2_DATA && q->data_fd == q->fd) {
      struct iovec iov = {p, run.length};
      if (preadv2(q->fd, &iov, 1, (off_t)run.host, RWF_NOWAIT) !=
          (ssize_t)run.length)
        return -EAGAIN;
    } else {
      return -EAGAIN;
    }
    p += run.length;
    off += run.length;
    len -= run.length;
  }
  return 0;
}

/* A large page-aligned write into clusters the image owns alone, for a
 * caller with threads to spare (BD_F_INLINE_BIG): the segments as the
 * ring would write them, written here.  Anything else, or a short write,
 * goes to the careful path (writing the same bytes twice is harmless). */
static int write_big_nowait(struct qcow2dev *q, const uint8_t *buf,
                            uint64_t len, uint64_t off) {
  struct ring_segs rs = {.n = 0};
  if (fault_active() || (off | len) % 4096 != 0 ||
      qcow2_write_segs(q, &rs, buf, len, off) < 0)
    return -EAGAIN;
  qcow2_bitmaps_mark(q, off, len);
  for (unsigned i = 0; i < rs.n; i++)
    if (pwrite(q->data_fd, rs.v[i].buf, rs.v[i].len, (off_t)rs.v[i].off) !=
        (ssize_t)rs.v[i].len)
      return -EAGAIN;
  return 0;
}

static int q_try_nowait(struct bd *bd, struct bd_req *req) {
  struct qcow2dev *q = bd->priv;
  if (q->dio_fd >= 0)
    return -EAGAIN; /* direct I/O always waits for the device */
  if (req->cmd == BD_READ)
    return read_nowait(q, req->buf, req->length, req->offset);
  if (!q->writable)
    return -EAGAIN;
  if (req->length > 65536 && (req->flags & BD_F_INLINE_BIG))
    return write_big_nowait(q, req->buf, req->length, req->offset);
  return qcow2_try_write_nowait(q, req->buf, req->length, req->offset);
}

static bool dio_ok(const struct qcow2dev *q, uint64_t len, uint64_t host);

int qcow2_ring_add(struct ring_segs *rs, void *buf, uint64_t host,
                   uint64_t len) {
  struct uring_seg *last = rs->n ? &rs->v[rs->n - 1] : NULL;
  if (last && last->off + last->len == host &&
      (uint8_t *)last->buf + last->len == (uint8_t *)buf &&
      last->len + len <= BD_MAX_IO) {
    last->len += (uint32_t)len;
    return 0;
  }
  if (rs->n == URING_MAX_SEGS)
    return -EAGAIN;
  rs->v[rs->n++] = (struct uring_seg){buf, host, (uint32_t)len};
  return 0;
}

/* The data segments of a read whose L2 slices are cached; zero clusters
 * are filled here.  -EAGAIN for anything else: compressed clusters, the
 * backing file, a slice to load. */
static int read_segs(struct qcow2dev *q, struct ring_segs *rs, uint8_t *p,
                     uint64_t len, uint64_t off) {
  while (len > 0) {
    struct qcow2_run run;
    if (map_run_nowait(q, off, len, &run) < 0)
      return -EAGAIN;
    if (run_is_zero(q, &run))
      memset(p, 0, run.length);
    else if (run.kind != QCOW2_DATA ||
             qcow2_ring_add(rs, p, run.host, run.length) < 0)
      return -EAGAIN;
    p += run.length;
    off += run.length;
    len -= run.length;
  }
  return 0;
}

/* The segments go to the ring on the direct descriptor when all of them
 * are aligned for it, on the buffered one without direct I/O. */
static int ring_start(struct qcow2dev *q, struct bd_req *req, enum uring_op op,
                      struct ring_segs *rs) {
  if (rs->n == 0) {
    req->done(req, 0); /* all zeroes, filled already */
    return 0;
  }
  if (q->dio_fd < 0)
    return uring_start(req, op, q->data_fd, false, rs->v, rs->n);
  for (unsigned i = 0; i < rs->n; i++)
    if (!dio_ok(q, rs->v[i].len, rs->v[i].off) ||
        (uintptr_t)rs->v[i].buf % q->dio_mem)
      return -EAGAIN;
  return uring_start(req, op, q->dio_fd, true, rs->v, rs->n);
}

/* --aio io_uring: reads and writes of clusters the L2 cache maps to
 * plain data go to a ring (core/uring.h); everything else, metadata and
 * its ordering included, stays on the worker pool's careful path. */
static int q_submit_async(struct bd *bd, struct bd_req *req) {
  struct qcow2dev *q = bd->priv;
  if (!q->ring || fault_active() ||
      (req->cmd != BD_READ && req->cmd != BD_WRITE))
    return -EAGAIN;
  struct ring_segs rs = {.n = 0};
  if (req->cmd == BD_READ) {
    if (read_segs(q, &rs, req->buf, req->length, req->offset) < 0)
      return -EAGAIN;
    return ring_start(q, req, URING_READ, &rs);
  }
  /* FUA may need metadata written first: the careful path. */
  if (!q->writable || (req->flags & BD_F_FUA) ||
      qcow2_write_segs(q, &rs, req->buf, req->length, req->offset) < 0)
    return -EAGAIN;
  qcow2_bitmaps_mark(q, req->offset, req->length);
  return ring_start(q, req, URING_WRITE, &rs);
}

static int q_extents(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags,
                     struct bd_extents *ext) {
  struct qcow2dev *q = bd->priv;
  while (len > 0) {
    struct qcow2_run run;
    int r = map_run(q, off, len, &run);
    if (r < 0)
      return r;
    uint64_t n = run.length;
    switch (run.kind) {
    case QCOW2_DATA: r = host_extents(q, run.host, n, ext); break;
    case QCOW2_COMPRESSED: r = bd_extents_add(ext, n, 0, 1); break;
    case QCOW2_ZERO:
      r = bd_extents_add(ext, n, BD_EXT_HOLE | BD_EXT_ZERO, 1);
      break;
    case QCOW2_UNALLOCATED:
      r = q->backing ? backing_extents(q, n, off, flags, ext)
                     : bd_extents_add(ext, n, BD_EXT_HOLE | BD_EXT_ZERO, 0);
      break;
    }
    /* 1: the list is full or the backing file answered short. */
    if (r != 0 || (flags & BD_F_REQ_ONE))
      return r < 0 ? r : 0;
    off += n;
    len -= n;
  }
  return 0;
}

static int q_context_extents(struct bd *bd, size_t ctx, uint64_t len,
                             uint64_t off, uint32_t flags,
                             struct bd_extents *ext) {
  struct qcow2dev *q = bd->priv;
  return qcow2_contexts_extents(q->contexts, ctx, len, off, flags, ext);
}

static void q_close(struct bd *bd) {
  struct qcow2dev *q = bd->priv;
  qcow2_bitmaps_close(q, q->writable);
  qcow2_contexts_free(q->contexts);
  if (q->writable) {
    pthread_mutex_destroy(&q->meta);
    pthread_cond_destroy(&q->alloc_done);
  }
  qcow2_guard_free(q);
  free(q->reftable);
  free(q->pend_l1);
  free(q->pend_l2);
  free(q->pend_free);
  if (q->backing)
    bd_close(q->backing);
  l2cache_free(q->cache);
  free(q->l1);
  if (q->data_fd >= 0 && q->data_fd != q->fd)
    close(q->data_fd);
  if (q->dio_fd >= 0)
    close(q->dio_fd);
  close(q->fd);
  free(q->path);
  free(q->data_path);
  free(q);
}

static void q_hold_locks(struct bd *bd, bool hold);

/* Plain data clusters of this image, one run at a time. */
static int q_host_range(struct bd *bd, uint64_t off, uint64_t len, int *fd,
                        uint64_t *host, uint64_t *n) {
  struct qcow2dev *q = bd->priv;
  struct qcow2_run run;
  int r = map_run(q, off, len, &run);
  if (r < 0)
    return r;
  if (run.kind != QCOW2_DATA)
    return -ENOTSUP;
  *fd = q->data_fd;
  *host = run.host;
  *n = run.length;
  return 0;
}

static const struct bd_ops qcow2_ops = {
    .name = "qcow2",
    .pread = q_pread,
    .pwrite = qcow2_pwrite,
    .flush = qcow2_flush,
    .trim = qcow2_trim,
    .zero = qcow2_zero,
    .try_nowait = q_try_nowait,
    .submit_async = q_submit_async,
    .extents = q_extents,
    .context_extents = q_context_extents,
    .close = q_close,
    .hold_locks = q_hold_locks,
    .resize = qcow2_resize,
    .host_range = q_host_range,
    .bitmap_resume = qcow2_bitmap_resume,
    .bitmap_start = qcow2_bitmap_start,
    .bitmap_enable = qcow2_bitmap_enable,
    .bitmap_bits = qcow2_bitmap_bits,
};

/* ---- opening ---- */

/* The images opened so far on the way down a backing chain, to refuse
 * loops. */
struct chain {
  dev_t dev;
  ino_t ino;
  const struct chain *next;
  unsigned depth;
};

/* qcow2_open_chain()'s own flag beside BD_OPEN_*: opened by check.c,
 * which judges malformed entries itself and prepares nothing for writing
 * (it repairs what it needs, and refuses nothing). */
#define Q_OPEN_CHECK (1u << 16)

static struct bd *qcow2_open_chain(const char *path,
                                   const struct bd_open_opts *o,
                                   const struct chain *chain);

/* A backing file that a source spec names (an NBD URI): opened through
 * the format table with the image's options, read-only; its data must be
 * a raw image (qcow2_source_backing_format()). */
static struct bd *open_backing_source(struct qcow2dev *q, const char *spec,
                                      const struct bd_open_opts *bo) {
  struct bd_open_opts so = *bo;
  so.format = NULL;
  struct bd *b = bd_open_with(spec, &so);
  if (b && !qcow2_source_backing_format(b, q->h.backing_format)) {
    char why[512]; /* bd_close() may set another message */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    bd_close(b);
    bd_set_error("%s", why);
    b = NULL;
  }
  return b;
}

static struct bd *open_backing_file(struct qcow2dev *q, const char *bpath,
                                    const struct bd_open_opts *bo,
                                    const struct chain *chain) {
  const char *fmt =
      q->h.backing_format[0] ? q->h.backing_format : bd_probe_format(bpath);
  if (!fmt) /* no table installed: what a file without magic is */
    fmt = "raw";
  if (!strcmp(fmt, "qcow2"))
    return qcow2_open_chain(bpath, bo, chain);
  if (!strcmp(fmt, "raw"))
    return raw_open(bpath, bo);
  bd_set_error("backing format '%s' is not supported", fmt);
  return NULL;
}

/* With the image's options O: the L2 cache applies to each image, the NBD
 * connections and time-out to a backing file an NBD URI names. */
static struct bd *open_backing(struct qcow2dev *q, const uint8_t *hdr,
                               const struct bd_open_opts *o,
                               const struct chain *chain) {
  char name[QCOW2_MAX_BACKING_NAME + 1];
  memcpy(name, hdr + q->h.backing_offset, q->h.backing_size);
  name[q->h.backing_size] = 0;
  bool source = bd_spec_is_backing_source(name);
  if (!source && (strstr(name, "://") || strncmp(name, "json:", 5) == 0)) {
    bd_set_error("qcow2 %s: backing file '%s' is neither a local file nor a "
                 "source blockport opens",
                 q->path, name);
    return NULL;
  }
  char *bpath = qcow2_backing_path(q->path, name);
  if (!bpath)
    return NULL;
  /* Read-only, and locked as QEMU locks a backing file: shared with other
   * readers, refusing writers. */
  struct bd_open_opts bo = *o;
  /* The image's options reach its backing file, which takes those its
   * format knows (an NBD URI takes no l2-cache-size). */
  bo.flags = BD_OPEN_READONLY | (q->share ? BD_OPEN_SHARE : 0) |
             BD_OPEN_LENIENT_OPTIONS;
  bo.contexts = NULL; /* the image's bitmaps, not its backing file's */
  bo.ncontexts = 0;
  struct bd *b = source ? open_backing_source(q, bpath, &bo)
                        : open_backing_file(q, bpath, &bo, chain);
  if (!b) { /* the reason, with where it comes from, goes to the caller */
    char why[512]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    /* "base.qcow2: No such file", said once: the path is named here. */
    size_t n = strlen(bpath);
    bool named = !strncmp(why, bpath, n) && !strncmp(why + n, ": ", 2);
    bd_set_error("qcow2 %s: cannot open backing file %s: %s", q->path, bpath,
                 named ? why + n + 2 : why);
  }
  free(bpath);
  return b;
}

/* How the image and its data file are locked (core/filelock.h): as they
 * were opened, read-only or not. */
static enum filelock_use lock_use(int fd, bool share) {
  if (share)
    return FILELOCK_USE_SHARED;
  bool ro = (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY;
  return ro ? FILELOCK_USE_READ : FILELOCK_USE_WRITE;
}

static int lock_file(int fd, const char *path, bool share) {
  return filelock_take(fd, path, lock_use(fd, share), true);
}

static void q_hold_locks(struct bd *bd, bool hold) {
  struct qcow2dev *q = bd->priv;
  for (int i = 0; i < 2; i++) {
    int fd = i == 0 ? q->fd : q->data_fd;
    if (i == 1 && fd == q->fd)
      break;
    if (hold)
      filelock_retake(fd, lock_use(fd, q->share), true);
    else
      filelock_release(fd);
  }
}

static int open_data_file(struct qcow2dev *q) {
  q->data_fd = q->fd;
  q->data_size = q->file_size;
  if (!(q->h.incompatible & QCOW2_INCOMPAT_DATA_FILE))
    return 0;
  if (!q->h.data_file[0]) {
    bd_set_error("qcow2 %s: external data file without a name", q->path);
    return -EINVAL;
  }
  char *dpath = qcow2_backing_path(q->path, q->h.data_file);
  /* Opened for writing when the image is. */
  int mode = fcntl(q->fd, F_GETFL) & O_ACCMODE;
  q->data_fd = dpath ? open(dpath, mode | O_CLOEXEC) : -1;
  if (q->data_fd < 0) {
    bd_set_error("qcow2 %s: data file %s: %s", q->path, dpath ? dpath : "?",
                 strerror(errno));
    free(dpath);
    return -EIO;
  }
  /* Locked as the image is: a data file is the guest's data. */
  int r = lock_file(q->data_fd, dpath, q->share);
  if (r < 0) {
    close(q->data_fd);
    q->data_fd = q->fd;
    free(dpath);
    return r;
  }
  q->data_path = dpath;
  off_t sz = lseek(q->data_fd, 0, SEEK_END);
  q->data_size = sz < 0 ? 0 : (uint64_t)sz;
  return 0;
}

static bool dio_ok(const struct qcow2dev *q, uint64_t len, uint64_t host) {
  return q->dio_fd >= 0 && (host | len) % q->dio_align == 0;
}

int qcow2_data_pread(struct qcow2dev *q, void *buf, uint64_t len,
                     uint64_t host) {
  return dio_ok(q, len, host)
             ? io_dio_pread(q->dio_fd, buf, len, host, q->dio_mem)
             : io_pread_zero(q->data_fd, buf, len, host);
}

int qcow2_data_pwrite(struct qcow2dev *q, const void *buf, uint64_t len,
                      uint64_t host) {
  return dio_ok(q, len, host)
             ? io_dio_pwrite(q->dio_fd, buf, len, host, q->dio_mem)
             : io_pwrite_all(q->data_fd, buf, len, host);
}

/* --cache none / directsync: the data file once more, with O_DIRECT (the
 * same open file description would switch the metadata too). */
static int open_direct(struct qcow2dev *q, enum bd_cache mode) {
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", q->data_fd);
  int acc = fcntl(q->data_fd, F_GETFL) & O_ACCMODE;
  q->dio_fd = open(self, acc | O_CLOEXEC | O_DIRECT);
  if (q->dio_fd < 0) {
    int e = errno;
    bd_set_error(e == EINVAL ? "qcow2 %s: the file system refuses direct I/O "
                               "(O_DIRECT), which --cache %s needs; use "
                               "--cache writeback or writethrough"
                             : "qcow2 %s: cannot open it again with O_DIRECT "
                               "for --cache %s: %s",
                 q->path, bd_cache_name(mode), strerror(e));
    return -e;
  }
  io_dio_alignment(q->dio_fd, &q->dio_align, &q->dio_mem);
  if (q->dio_align > 64 * 1024 || (q->dio_align & (q->dio_align - 1))) {
    bd_set_error("qcow2 %s: unusable direct I/O alignment %u", q->path,
                 q->dio_align);
    return -EINVAL;
  }
  return 0;
}

static int load_l1(struct qcow2dev *q) {
  size_t n = q->h.l1_size;
  q->l1 = calloc(n ? n : 1, sizeof *q->l1);
  if (!q->l1)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, q->l1, n * 8, q->h.l1_offset);
  for (size_t i = 0; r == 0 && i < n; i++) {
    q->l1[i] = get_be64((const uint8_t *)&q->l1[i]);
    if ((q->l1[i] & QCOW2_L1_RESERVED) && !q->for_check)
      r = corrupt(q, "reserved bits in L1 entry", q->l1[i]);
  }
  return r;
}

static int read_header(struct qcow2dev *q, uint8_t **hdr) {
  struct stat st;
  if (fstat(q->fd, &st) < 0)
    return -errno;
  q->file_size = (uint64_t)st.st_size;
  size_t len = q->file_size < (2u << 20) ? (size_t)q->file_size : (2u << 20);
  *hdr = malloc(len ? len : 1);
  if (!*hdr)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, *hdr, len, 0);
  if (r < 0)
    qcow2_err(r, "%s", strerror(-r));
  else /* check: tables past the end of the file are refs.c's to judge */
    r = qcow2_parse_header(*hdr, len, q->for_check ? UINT64_MAX : q->file_size,
                           &q->h);
  if (r < 0) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", bd_errmsg());
    bd_set_error("qcow2 %s: %s", q->path, why);
  }
  return r;
}

static int check_chain(struct qcow2dev *q, const struct chain *chain,
                       struct chain *self) {
  struct stat st;
  if (fstat(q->fd, &st) < 0)
    return -errno;
  *self =
      (struct chain){st.st_dev, st.st_ino, chain, chain ? chain->depth + 1 : 0};
  for (const struct chain *c = chain; c; c = c->next) {
    if (c->dev == st.st_dev && c->ino == st.st_ino) {
      bd_set_error("qcow2 %s: backing file loop", q->path);
      return -ELOOP;
    }
  }
  if (self->depth >= MAX_CHAIN) {
    bd_set_error("qcow2 %s: backing chain deeper than %d", q->path, MAX_CHAIN);
    return -ELOOP;
  }
  return 0;
}

static int setup(struct qcow2dev *q, const struct bd_open_opts *o,
                 const struct chain *chain) {
  struct chain self;
  uint8_t *hdr = NULL;
  int r = check_chain(q, chain, &self);
  if (r == 0)
    r = read_header(q, &hdr);
  if (r == 0) {
    q->csize = 1ull << q->h.cluster_bits;
    q->g = (struct qcow2_geom){
        .cluster_bits = q->h.cluster_bits,
        .extended_l2 = q->h.incompatible & QCOW2_INCOMPAT_EXTL2,
        .v3 = q->h.version >= 3,
        .data_file = q->h.incompatible & QCOW2_INCOMPAT_DATA_FILE};
    q->l2_bits = q->h.cluster_bits - (q->g.extended_l2 ? 4 : 3);
    q->l2_check_bits = l2_check_bits(q);
    size_t slice = q->csize < 4096 ? q->csize : 4096;
    uint64_t l2 = QCOW2_L2_CACHE_DEFAULT;
    r = bd_opt_size(o, "qcow2", "l2-cache-size", QCOW2_L2_CACHE_MIN, &l2);
    if (r == 0) {
      q->cache = l2cache_new(slice, l2, o->stats);
      r = q->cache ? load_l1(q) : -ENOMEM;
    }
  }
  if (r == 0)
    r = qcow2_snapshot_view(q, o);
  if (r == 0)
    r = open_data_file(q);
  /* Before a writable opening marks the tracked bitmaps in use. */
  if (r == 0)
    r = qcow2_contexts_load(q, o, &q->contexts);
  if (r == 0 && bd_cache_direct(o->cache))
    r = open_direct(q, o->cache);
  q->ring = o->aio != BD_AIO_THREADS && uring_available();
  q->no_flush = o->cache == BD_CACHE_UNSAFE;
  if (r == 0 && q->h.backing_offset && !(o->flags & BD_OPEN_NO_BACKING)) {
    q->backing = open_backing(q, hdr, o, &self);
    if (!q->backing)
      r = -EINVAL;
  }
  free(hdr);
  return r;
}

static struct bd *qcow2_open_chain(const char *path,
                                   const struct bd_open_opts *o,
                                   const struct chain *chain) {
  unsigned flags = o->flags;
  bool readonly = flags & (BD_OPEN_READONLY | BD_OPEN_SHARE);
  bool for_check = flags & Q_OPEN_CHECK;
  struct qcow2dev *q = calloc(1, sizeof *q);
  if (!q || !(q->path = strdup(path))) {
    free(q);
    bd_set_error("out of memory");
    return NULL;
  }
  q->data_fd = -1;
  q->dio_fd = -1;
  q->share = flags & BD_OPEN_SHARE;
  q->for_check = flags & Q_OPEN_CHECK;
  q->fd = open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (q->fd < 0 || lock_file(q->fd, path, q->share) < 0) {
    if (q->fd < 0)
      bd_set_error("%s: %s", path, strerror(errno));
    else
      close(q->fd);
    free(q->path);
    free(q->data_path);
    free(q);
    return NULL;
  }
  struct bd *bd = NULL;
  if (setup(q, o, chain) == 0 &&
      (readonly || for_check || qcow2_open_writable(q) == 0))
    bd = bd_new(&qcow2_ops, "qcow2", path);
  if (!bd) {
    struct bd tmp = {.priv = q};
    q_close(&tmp);
    return NULL;
  }
  bd->priv = q;
  bd->size = q->h.size;
  bd->exec = BD_EXEC_POOL;
  bd->caps.readonly = readonly || for_check;
  bd->caps.can_cache = false;
  bd->caps.can_fast_zero = q->g.v3; /* the zero flag */
  if (q->dio_fd >= 0 && q->dio_align > 1) {
    /* Aligned guest requests keep data I/O aligned: clusters are. */
    bd->caps.min_block = q->dio_align;
    bd->caps.aligned_only = true;
  }
  bd->caps.contexts_nowait = true; /* bitmaps are in memory */
  if (qcow2_contexts_attach(q, q->contexts, bd) < 0) {
    bd_close(bd);
    bd_set_error("out of memory");
    return NULL;
  }
  return bd;
}

struct bd *qcow2_open(const char *path, const struct bd_open_opts *o) {
  struct bd_open_opts own = *o;
  own.flags &= ~Q_OPEN_CHECK;
  return qcow2_open_chain(path, &own, NULL);
}

struct bd *qcow2_open_check(const char *path, unsigned flags) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.flags = (flags & ~Q_OPEN_CHECK) | Q_OPEN_CHECK;
  return qcow2_open_chain(path, &o, NULL);
}
