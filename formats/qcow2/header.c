/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 header and header extensions: parsing and validation.  Every
 * field read from the file is checked before anything is sized or read
 * from it. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "qcow2.h"

int qcow2_err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bd_set_errorv(fmt, ap);
  va_end(ap);
  return code;
}

/* A table of COUNT bytes at OFF must be cluster aligned and inside the
 * file. */
static bool table_ok(uint64_t off, uint64_t bytes, uint64_t csize,
                     uint64_t file_size) {
  return off % csize == 0 && off <= file_size && bytes <= file_size - off;
}

static void parse_fixed(const uint8_t *b, struct qcow2_header *h) {
  h->version = get_be32(b + 4);
  h->backing_offset = get_be64(b + 8);
  h->backing_size = get_be32(b + 16);
  h->cluster_bits = get_be32(b + 20);
  h->size = get_be64(b + 24);
  h->crypt_method = get_be32(b + 32);
  h->l1_size = get_be32(b + 36);
  h->l1_offset = get_be64(b + 40);
  h->reftable_offset = get_be64(b + 48);
  h->reftable_clusters = get_be32(b + 56);
  h->nb_snapshots = get_be32(b + 60);
  h->snapshots_offset = get_be64(b + 64);
}

static int parse_v3(const uint8_t *b, size_t len, struct qcow2_header *h) {
  if (h->version == 2) {
    h->refcount_order = 4;
    h->header_length = 72;
    return 0;
  }
  if (len < 104)
    return qcow2_err(-EINVAL, "version 3 header is truncated");
  h->incompatible = get_be64(b + 72);
  h->compatible = get_be64(b + 80);
  h->autoclear = get_be64(b + 88);
  h->refcount_order = get_be32(b + 96);
  h->header_length = get_be32(b + 100);
  if (h->header_length < 104 || h->header_length % 8 != 0 ||
      h->header_length > len)
    return qcow2_err(-EINVAL, "invalid header length %u", h->header_length);
  if (h->header_length > 104)
    h->compression_type = b[104];
  return 0;
}

static int check_features(struct qcow2_header *h) {
  uint64_t unknown = h->incompatible & ~QCOW2_INCOMPAT_KNOWN;
  if (unknown)
    return qcow2_err(-ENOTSUP, "unsupported incompatible features 0x%llx",
                     (unsigned long long)unknown);
  if (h->crypt_method != 0)
    return qcow2_err(-ENOTSUP,
                     "encrypted images are not supported (crypt_method %u)",
                     h->crypt_method);
  if (h->refcount_order > 6)
    return qcow2_err(-EINVAL, "invalid refcount order %u", h->refcount_order);
  bool ctype = h->incompatible & QCOW2_INCOMPAT_COMPRESSION;
  if (ctype && h->compression_type == 0)
    return qcow2_err(-EINVAL,
                     "compression type bit set with compression type 0");
  if (ctype && h->compression_type != 1)
    return qcow2_err(-ENOTSUP, "unknown compression type %u",
                     h->compression_type);
  if (!ctype && h->compression_type != 0)
    return qcow2_err(-EINVAL, "compression type %u without its feature bit",
                     h->compression_type);
  if ((h->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW) &&
      !(h->incompatible & QCOW2_INCOMPAT_DATA_FILE))
    h->autoclear &= ~QCOW2_AUTOCLEAR_DATA_FILE_RAW; /* meaningless: ignore */
  return 0;
}

static int check_geometry(const struct qcow2_header *h, uint64_t file_size) {
  if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
      h->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
    return qcow2_err(-EINVAL, "invalid cluster_bits %u", h->cluster_bits);
  bool extl2 = h->incompatible & QCOW2_INCOMPAT_EXTL2;
  if (extl2 && h->cluster_bits < 14)
    return qcow2_err(-EINVAL,
                     "extended L2 entries need clusters of at least 16 KiB");
  uint64_t csize = 1ull << h->cluster_bits;
  /* QEMU's rule: the header and its extensions live in cluster 0. */
  if (h->header_length > csize)
    return qcow2_err(-EINVAL, "header exceeds cluster size (header length %u)",
                     h->header_length);
  if (h->size > (1ull << 56))
    return qcow2_err(-EINVAL, "virtual size %llu is too large",
                     (unsigned long long)h->size);
  /* Guest bytes one L1 entry covers. */
  unsigned l2_bits = h->cluster_bits - (extl2 ? 4 : 3);
  uint64_t per_l1 = 1ull << (h->cluster_bits + l2_bits);
  uint64_t need = (h->size + per_l1 - 1) / per_l1;
  if ((uint64_t)h->l1_size * 8 > QCOW2_MAX_L1_BYTES)
    return qcow2_err(-EINVAL, "L1 table of %u entries is too large",
                     h->l1_size);
  if (h->l1_size < need)
    return qcow2_err(-EINVAL, "L1 table of %u entries cannot cover %llu bytes",
                     h->l1_size, (unsigned long long)h->size);
  if (h->l1_size &&
      !table_ok(h->l1_offset, (uint64_t)h->l1_size * 8, csize, file_size))
    return qcow2_err(-EINVAL,
                     "L1 table offset 0x%llx is unaligned or past the end",
                     (unsigned long long)h->l1_offset);
  /* The refcount table may be empty or lie past the end of the file: the
   * image still reads, and `check` reports (and --repair all mends) it as
   * a corruption, as qemu-img does.  Writing needs it (refcount.c). */
  uint64_t rt_bytes = (uint64_t)h->reftable_clusters << h->cluster_bits;
  if (rt_bytes > QCOW2_MAX_REFTABLE_BYTES || h->reftable_offset % csize ||
      h->reftable_offset > (uint64_t)INT64_MAX - rt_bytes)
    return qcow2_err(-EINVAL,
                     "invalid refcount table (0x%llx, %u "
                     "clusters)",
                     (unsigned long long)h->reftable_offset,
                     h->reftable_clusters);
  if (h->nb_snapshots > QCOW2_MAX_SNAPSHOTS ||
      (h->nb_snapshots && !table_ok(h->snapshots_offset,
                                    40ull * h->nb_snapshots, csize, file_size)))
    return qcow2_err(-EINVAL, "invalid snapshot table");
  return 0;
}

static int parse_backing_name(const uint8_t *b, size_t len,
                              const struct qcow2_header *h) {
  if (h->backing_offset == 0)
    return 0;
  if (h->backing_size == 0 || h->backing_size > QCOW2_MAX_BACKING_NAME ||
      h->backing_offset > len || h->backing_size > len - h->backing_offset)
    return qcow2_err(-EINVAL, "invalid backing file name location");
  if (memchr(b + h->backing_offset, 0, h->backing_size))
    return qcow2_err(-EINVAL, "backing file name contains NUL");
  return 0;
}

static int copy_string(char *dst, size_t cap, const uint8_t *src, uint32_t len,
                       const char *what) {
  if (len >= cap || memchr(src, 0, len))
    return qcow2_err(-EINVAL, "invalid %s header extension", what);
  memcpy(dst, src, len);
  dst[len] = 0;
  return 0;
}

/* The bitmaps extension (24 bytes): number of bitmaps, reserved, directory
 * size and offset; checked as QEMU checks it when opening an image.  The
 * directory itself is parsed by bitmap.c. */
static int parse_bitmaps_ext(const uint8_t *d, uint32_t len, uint32_t pos,
                             struct qcow2_header *h) {
  if (len != 24)
    return qcow2_err(-EINVAL, "invalid bitmaps header extension (%u bytes)",
                     len);
  h->has_bitmaps = true;
  h->bitmaps_ext_pos = pos;
  if (!(h->autoclear & QCOW2_AUTOCLEAR_BITMAPS))
    return 0; /* written by a program that did not keep them: stale */
  uint32_t nb = get_be32(d);
  uint64_t size = get_be64(d + 8), off = get_be64(d + 16);
  if (get_be32(d + 4) != 0 || nb == 0 || nb > QCOW2_MAX_BITMAPS)
    return qcow2_err(-EINVAL, "invalid bitmaps header extension (%u bitmaps)",
                     nb);
  if (size > QCOW2_MAX_BITMAP_DIR || off % (1ull << h->cluster_bits) ||
      off > (uint64_t)INT64_MAX - size)
    return qcow2_err(-EINVAL, "invalid bitmap directory (0x%llx, %llu bytes)",
                     (unsigned long long)off, (unsigned long long)size);
  h->bitmaps_nb = nb;
  h->bitmaps_dir_size = size;
  h->bitmaps_dir_offset = off;
  return 0;
}

/* Header extensions follow the header, inside the first cluster. */
static int parse_extensions(const uint8_t *b, size_t len,
                            struct qcow2_header *h) {
  size_t end =
      len < (1ull << h->cluster_bits) ? len : (1ull << h->cluster_bits);
  size_t off = h->header_length;
  while (off + 8 <= end) {
    uint32_t type = get_be32(b + off), elen = get_be32(b + off + 4);
    off += 8;
    if (type == QCOW2_EXT_END)
      return 0;
    if (elen > end - off)
      return qcow2_err(-EINVAL, "header extension 0x%x overflows", type);
    const uint8_t *d = b + off;
    int r = 0;
    if (type == QCOW2_EXT_BACKING_FORMAT)
      r = copy_string(h->backing_format, sizeof h->backing_format, d, elen,
                      "backing format");
    else if (type == QCOW2_EXT_DATA_FILE)
      r = copy_string(h->data_file, sizeof h->data_file, d, elen, "data file");
    else if (type == QCOW2_EXT_BITMAPS)
      r = parse_bitmaps_ext(d, elen, (uint32_t)off, h);
    else if (type == QCOW2_EXT_CRYPTO)
      return qcow2_err(-ENOTSUP, "encrypted images are not supported");
    if (r < 0)
      return r;
    off += ((uint64_t)elen + 7) & ~7ull;
  }
  return 0; /* no end marker inside the cluster: tolerated, as QEMU does */
}

int qcow2_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                       struct qcow2_header *h) {
  memset(h, 0, sizeof *h);
  if (len < 72 || get_be32(buf) != QCOW2_MAGIC)
    return qcow2_err(-EINVAL, "not a qcow2 image");
  parse_fixed(buf, h);
  if (h->version != 2 && h->version != 3)
    return qcow2_err(-ENOTSUP, "unsupported qcow2 version %u", h->version);
  int r = parse_v3(buf, len, h);
  if (r == 0)
    r = check_features(h);
  if (r == 0)
    r = check_geometry(h, file_size);
  if (r == 0)
    r = parse_backing_name(buf, len, h);
  if (r == 0)
    r = parse_extensions(buf, len, h);
  if (r == 0 && h->backing_offset &&
      (h->incompatible & QCOW2_INCOMPAT_DATA_FILE) &&
      (h->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW))
    r = qcow2_err(-EINVAL,
                  "a raw external data file cannot have a backing file");
  return r;
}
