/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 overlap map: which host clusters of the image file hold metadata,
 * and of which kinds, so that no write lands on metadata it does not mean
 * to change (QEMU's "overlap checks").
 *
 * One byte per host cluster, a bit per kind, in chunks of 4096 clusters
 * allocated when a cluster in them is first marked.  Lookups take no lock
 * and allocate nothing: an acquire load of the chunk directory, one of the
 * chunk, one of the byte.  Marking and unmarking are serialised by the
 * caller (the image's metadata lock, or a single thread at open); a larger
 * directory is published with a release store, and chunks and old
 * directories are only freed with the map.  The directory reaches the
 * highest cluster marked, so callers mark only inside the file (metadata
 * that a corrupt image places beyond it goes to qcow2_ol_far()).  Pure:
 * no I/O, unit-tested. */
#ifndef BLOCKPORT_QCOW2_OVERLAP_H
#define BLOCKPORT_QCOW2_OVERLAP_H

#include <stdint.h>

/* Kinds of metadata, as QEMU names them (the header is not stored: it is
 * the first cluster). */
enum {
  QCOW2_OL_ACTIVE_L1 = 1u << 0,
  QCOW2_OL_ACTIVE_L2 = 1u << 1,
  QCOW2_OL_REFCOUNT_TABLE = 1u << 2,
  QCOW2_OL_REFCOUNT_BLOCK = 1u << 3,
  QCOW2_OL_SNAPSHOT_TABLE = 1u << 4,
  QCOW2_OL_INACTIVE_L1 = 1u << 5,
  QCOW2_OL_INACTIVE_L2 = 1u << 6,
  QCOW2_OL_BITMAPS = 1u << 7, /* bitmap directory, tables and data */
  QCOW2_OL_HEADER = 1u << 8,
};

#define QCOW2_OL_CHUNK_BITS 12

struct qcow2_ol_dir {
  uint64_t len; /* chunks covered */
  struct qcow2_ol_dir *prev;
  uint8_t *chunk[];
};

struct qcow2_ol {
  unsigned cluster_bits;
  struct qcow2_ol_dir *dir; /* atomic */
  /* Metadata referenced beyond the end of the file as it was at open (a
   * corrupt image): every cluster from FAR on counts as that kind, so
   * nothing is ever written there. */
  uint64_t far;
  unsigned far_kind;
};

/* NULL when out of memory. */
struct qcow2_ol *qcow2_ol_new(unsigned cluster_bits);
void qcow2_ol_free(struct qcow2_ol *ol);
/* Add KIND to the clusters [off, off+len) touches.  0 or -ENOMEM. */
int qcow2_ol_mark(struct qcow2_ol *ol, uint64_t off, uint64_t len,
                  unsigned kind);
/* Take KIND off those clusters. */
void qcow2_ol_unmark(struct qcow2_ol *ol, uint64_t off, uint64_t len,
                     unsigned kind);
/* Metadata of KIND at OFF, past the end of the file: see far above. */
void qcow2_ol_far(struct qcow2_ol *ol, uint64_t off, unsigned kind);
/* The kinds of cluster C. */
static inline unsigned qcow2_ol_at(const struct qcow2_ol *ol, uint64_t c) {
  const struct qcow2_ol_dir *d = __atomic_load_n(&ol->dir, __ATOMIC_ACQUIRE);
  uint64_t i = c >> QCOW2_OL_CHUNK_BITS;
  if (!d || i >= d->len)
    return 0;
  const uint8_t *chunk = __atomic_load_n(&d->chunk[i], __ATOMIC_ACQUIRE);
  if (!chunk)
    return 0;
  return __atomic_load_n(&chunk[c & ((1u << QCOW2_OL_CHUNK_BITS) - 1)],
                         __ATOMIC_RELAXED);
}

/* The kinds of metadata, other than those in IGNORE, in the clusters
 * [off, off+len) touches; 0 when a write there is safe.  Beyond FAR every
 * kind counts, IGNORE or not. */
static inline unsigned qcow2_ol_check(const struct qcow2_ol *ol, uint64_t off,
                                      uint64_t len, unsigned ignore) {
  if (len == 0)
    return 0;
  uint64_t c = off >> ol->cluster_bits;
  uint64_t last = (off + len - 1) >> ol->cluster_bits;
  if (last >= ol->far)
    return ol->far_kind;
  unsigned hit = c == 0 ? QCOW2_OL_HEADER : 0;
  for (; c <= last; c++)
    hit |= qcow2_ol_at(ol, c);
  return hit & ~ignore;
}

/* QEMU's name for the first kind in KINDS ("refcount table", ...). */
const char *qcow2_ol_name(unsigned kinds);

#endif
