/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 image creation: compute the layout of a new image from its options
 * (pure, unit-tested), then write it to a file descriptor. */
#ifndef BLOCKPORT_QCOW2_CREATE_H
#define BLOCKPORT_QCOW2_CREATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qcow2_prealloc {
  QCOW2_PREALLOC_OFF,
  QCOW2_PREALLOC_METADATA, /* L2 tables and data clusters allocated */
  QCOW2_PREALLOC_FALLOC,   /* ... and the data area fallocated */
  QCOW2_PREALLOC_FULL,     /* ... and the data area written with zeroes */
};

struct qcow2_create_opts {
  uint64_t size;             /* virtual size, rounded up to 512 */
  unsigned version;          /* 2 (compat=0.10) or 3 (compat=1.1) */
  unsigned cluster_bits;     /* 9..21 */
  unsigned refcount_order;   /* 0..6; v2: 4 */
  bool extended_l2;          /* v3, cluster_bits >= 14 */
  bool lazy_refcounts;       /* v3 */
  unsigned compression_type; /* 0 zlib, 1 zstd (v3) */
  const char *backing_file;  /* NULL: none */
  const char *backing_fmt;   /* NULL: no backing format extension */
  enum qcow2_prealloc prealloc;
  /* An external data file (its name as the header records it, relative to
   * the image's directory), made by the caller: guest cluster i lives at
   * offset i * cluster size there.  RAW: it is kept a raw image of the
   * disk (data_file_raw=on; the mapping preallocated, as qemu-img makes
   * it). */
  const char *data_file;
  bool data_file_raw;
};

/* Where everything goes.  All offsets are cluster aligned; the regions
 * follow each other in this order, from cluster 0 (the header). */
struct qcow2_layout {
  uint64_t csize;
  unsigned l2_bits;        /* log2 of entries per L2 table */
  uint32_t header_length;  /* 72 (v2) or 112 (v3) */
  bool feature_table;      /* the feature name table fits in cluster 0 */
  uint64_t backing_offset; /* of the backing file name, 0 if none */
  uint32_t backing_size;
  uint64_t reftable_offset;
  uint32_t reftable_clusters;
  uint64_t refblock_offset;
  uint64_t refblocks;
  uint64_t l1_offset;
  uint32_t l1_size; /* entries */
  uint64_t l1_clusters;
  uint64_t l2_offset; /* preallocation: L2 table i at l2_offset + i*csize */
  uint64_t l2_tables;
  uint64_t data_offset; /* preallocation: guest cluster i at + i*csize */
  bool data_external;   /* ... in the data file, at 0 + i*csize */
  enum qcow2_prealloc prealloc; /* in effect (data_file_raw: metadata) */
  uint64_t data_clusters;
  uint64_t clusters;  /* in use, all with refcount 1: [0, clusters) */
  uint64_t file_size; /* clusters * csize */
};

/* Most metadata (L2 tables and refcount blocks) that preallocation may
 * write: beyond this the options are refused as absurd. */
#define QCOW2_CREATE_MAX_METADATA (4ull << 30)

/* Validate O and compute its layout.  Returns 0, or -EINVAL / -EFBIG with a
 * reason in bd_errmsg(). */
int qcow2_create_layout(const struct qcow2_create_opts *o,
                        struct qcow2_layout *l);

/* The first cluster: header, extensions, backing file name.  BUF holds
 * L->csize bytes. */
void qcow2_create_header(const struct qcow2_create_opts *o,
                         const struct qcow2_layout *l, uint8_t *buf);

/* The feature name table extension's data, as QEMU writes it: OUT holds
 * QCOW2_FEATURE_TABLE_LEN bytes. */
#define QCOW2_FEATURE_TABLE_LEN (8 * 48)
void qcow2_feature_table(uint8_t *out);

/* Set the refcount of entry I of the refcount block BUF to VALUE. */
void qcow2_set_refcount(uint8_t *buf, unsigned refcount_order, uint64_t i,
                        uint64_t value);

/* Write a new image of layout L to FD (an empty, writable file).  Returns
 * 0 or -errno with a reason in bd_errmsg(). */
int qcow2_create_write(int fd, const struct qcow2_create_opts *o,
                       const struct qcow2_layout *l);

#endif
