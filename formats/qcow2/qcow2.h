/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2: on-disk structures and the pure parts of the format (header
 * parsing and validation, L2 entry decoding), kept free of I/O so the unit
 * tests and the fuzzer can drive them.  See qemu/qemu
 * docs/interop/qcow2.rst. */
#ifndef BLOCKPORT_QCOW2_H
#define BLOCKPORT_QCOW2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCOW2_MAGIC 0x514649fbu /* "QFI\xfb" */

/* Incompatible feature bits. */
#define QCOW2_INCOMPAT_DIRTY (1ull << 0)
#define QCOW2_INCOMPAT_CORRUPT (1ull << 1)
#define QCOW2_INCOMPAT_DATA_FILE (1ull << 2)
#define QCOW2_INCOMPAT_COMPRESSION (1ull << 3)
#define QCOW2_INCOMPAT_EXTL2 (1ull << 4)
#define QCOW2_INCOMPAT_KNOWN 0x1full
/* Compatible and autoclear bits. */
#define QCOW2_COMPAT_LAZY_REFCOUNTS (1ull << 0)
#define QCOW2_AUTOCLEAR_BITMAPS (1ull << 0)
#define QCOW2_AUTOCLEAR_DATA_FILE_RAW (1ull << 1)

/* Header extension types. */
#define QCOW2_EXT_END 0x00000000u
#define QCOW2_EXT_BACKING_FORMAT 0xe2792acau
#define QCOW2_EXT_FEATURE_TABLE 0x6803f857u
#define QCOW2_EXT_BITMAPS 0x23852875u
#define QCOW2_EXT_CRYPTO 0x0537be77u
#define QCOW2_EXT_DATA_FILE 0x44415441u

/* Implementation limits, as QEMU's. */
#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32u * 1024 * 1024)
#define QCOW2_MAX_REFTABLE_BYTES (8u * 1024 * 1024)
#define QCOW2_MAX_SNAPSHOTS 65536
#define QCOW2_MAX_BACKING_NAME 1023
#define QCOW2_MAX_BITMAPS 65535
#define QCOW2_MAX_BITMAP_DIR (1024u * QCOW2_MAX_BITMAPS)
/* Host offsets: bits 9-55. */
#define QCOW2_OFFSET_MASK 0x00fffffffffffe00ull
#define QCOW2_L1_RESERVED 0x7f000000000001ffull
#define QCOW2_L2_COPIED (1ull << 63)
#define QCOW2_L2_COMPRESSED (1ull << 62)
#define QCOW2_L2_ZERO 1ull
#define QCOW2_L2_STD_RESERVED 0x3f000000000001feull

struct qcow2_header {
  uint32_t version;
  uint64_t backing_offset;
  uint32_t backing_size;
  uint32_t cluster_bits;
  uint64_t size;
  uint32_t crypt_method;
  uint32_t l1_size;
  uint64_t l1_offset;
  uint64_t reftable_offset;
  uint32_t reftable_clusters;
  uint32_t nb_snapshots;
  uint64_t snapshots_offset;
  uint64_t incompatible, compatible, autoclear;
  uint32_t refcount_order;
  uint32_t header_length;
  uint8_t compression_type; /* 0 deflate, 1 zstd */
  /* From header extensions. */
  char backing_format[32];
  char data_file[QCOW2_MAX_BACKING_NAME + 1];
  bool has_bitmaps; /* a bitmaps extension is present */
  /* The bitmaps extension, when the BITMAPS autoclear bit vouches for it
   * (else bitmaps_nb is 0: the bitmaps are stale, as QEMU treats them). */
  uint32_t bitmaps_nb;
  uint64_t bitmaps_dir_size, bitmaps_dir_offset;
  uint32_t bitmaps_ext_pos; /* file offset of the extension's data */
};

/* Parse and validate the header and its extensions from BUF (the start of
 * the file, LEN bytes, at least min(file size, one cluster)), for a file of
 * FILE_SIZE bytes.  Returns 0, or -EINVAL / -ENOTSUP (unknown features,
 * encryption) with a reason in bd_errmsg(). */
int qcow2_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                       struct qcow2_header *h);

/* Set the per-thread message (bd_errmsg()) and return CODE: how the
 * parsers refuse. */
int qcow2_err(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What one guest range maps to. */
enum qcow2_kind {
  QCOW2_UNALLOCATED, /* backing file, or zeroes */
  QCOW2_ZERO,        /* reads as zeroes */
  QCOW2_DATA,        /* host bytes at .host */
  QCOW2_COMPRESSED,  /* a whole compressed cluster */
};

struct qcow2_geom {
  unsigned cluster_bits;
  bool extended_l2; /* 32 subclusters per cluster */
  bool v3;          /* zero flag valid in standard entries */
  bool data_file;   /* guest data lives in an external data file */
};

struct qcow2_run {
  enum qcow2_kind kind;
  uint64_t host;   /* DATA: host offset of the run's first byte */
  uint64_t length; /* bytes of the cluster covered, from the start offset */
  uint64_t coffset, csize; /* COMPRESSED: where and how much to read */
};

/* Decode the L2 entry (and, with extended L2, its subcluster bitmap) for
 * the guest bytes starting at offset IN (within the cluster) and up to
 * MAX bytes: the longest run of one kind.  Returns 0, or -EIO if the entry
 * is malformed (reserved bits, unaligned offsets, inconsistent bitmap). */
int qcow2_decode_l2(const struct qcow2_geom *g, uint64_t entry, uint64_t bitmap,
                    uint32_t in, uint32_t max, struct qcow2_run *run);

/* Extended L2 subcluster bitmaps: allocation bits 0-31, zero bits 32-63.
 * The mask (in bits 0-31) of the subclusters [in, in+n) touches, n > 0. */
uint64_t qcow2_sc_mask(unsigned cluster_bits, uint32_t in, uint64_t n);
/* The bitmap after the subclusters of MASK get data, or read as zeroes. */
uint64_t qcow2_sc_allocate(uint64_t bitmap, uint64_t mask);
uint64_t qcow2_sc_zero(uint64_t bitmap, uint64_t mask);

#endif
