/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 image creation.  The layout is computed first (no I/O), then the
 * clusters are written in file order: header, refcount table, refcount
 * blocks, L1 table, and with preallocation the L2 tables and data area. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/byteorder.h"
#include "core/io.h"
#include "create.h"
#include "qcow2.h"

static uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}
static uint64_t align8(uint64_t n) {
  return (n + 7) & ~7ull;
}

/* The feature name table, as QEMU writes it. */
static const struct {
  uint8_t type, bit;
  const char *name;
} features[] = {
    {0, 0, "dirty bit"},
    {0, 1, "corrupt bit"},
    {0, 2, "external data file"},
    {0, 3, "compression type"},
    {0, 4, "extended L2 entries"},
    {1, 0, "lazy refcounts"},
    {2, 0, "bitmaps"},
    {2, 1, "raw external data"},
};
#define NFEATURES (sizeof features / sizeof features[0])
#define FEATURE_TABLE_BYTES (8 + QCOW2_FEATURE_TABLE_LEN)
_Static_assert(NFEATURES * 48 == QCOW2_FEATURE_TABLE_LEN, "feature table");

/* A raw data file is mapped whole from the start. */
static enum qcow2_prealloc prealloc_of(const struct qcow2_create_opts *o) {
  if (o->data_file_raw && o->prealloc == QCOW2_PREALLOC_OFF)
    return QCOW2_PREALLOC_METADATA;
  return o->prealloc;
}

static int check_opts(const struct qcow2_create_opts *o) {
  if (o->version != 2 && o->version != 3)
    return qcow2_err(-EINVAL, "unsupported qcow2 version %u", o->version);
  if (o->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
      o->cluster_bits > QCOW2_MAX_CLUSTER_BITS)
    return qcow2_err(-EINVAL,
                     "cluster size must be a power of two between 512 and 2M");
  if (o->refcount_order > 6)
    return qcow2_err(-EINVAL,
                     "refcount width must be a power of two up to 64 bits");
  if (o->size % 512)
    return qcow2_err(-EINVAL, "virtual size must be a multiple of 512 bytes");
  if (o->size > (1ull << 56))
    return qcow2_err(-EFBIG, "virtual size is too large (max 64 PiB)");
  if (o->version == 2) {
    if (o->refcount_order != 4)
      return qcow2_err(-EINVAL,
                       "refcount widths other than 16 bits need compat=1.1");
    if (o->extended_l2)
      return qcow2_err(-EINVAL, "extended L2 entries need compat=1.1");
    if (o->lazy_refcounts)
      return qcow2_err(-EINVAL, "lazy refcounts need compat=1.1");
    if (o->compression_type != 0)
      return qcow2_err(-EINVAL,
                       "compression types other than zlib need compat=1.1");
  }
  if (o->compression_type > 1)
    return qcow2_err(-EINVAL, "unknown compression type %u",
                     o->compression_type);
  if (o->extended_l2 && o->cluster_bits < 14)
    return qcow2_err(-EINVAL,
                     "extended L2 entries need a cluster size of at least 16k");
  if (o->backing_file &&
      (!o->backing_file[0] || strlen(o->backing_file) > QCOW2_MAX_BACKING_NAME))
    return qcow2_err(-EINVAL, "backing file name must be 1 to %d bytes long",
                     QCOW2_MAX_BACKING_NAME);
  if (o->backing_fmt &&
      (!o->backing_file || !o->backing_fmt[0] || strlen(o->backing_fmt) > 31))
    return qcow2_err(-EINVAL, o->backing_file
                                  ? "invalid backing format name"
                                  : "a backing format needs a backing file");
  if (o->data_file && o->version < 3)
    return qcow2_err(-EINVAL, "an external data file needs compat=1.1");
  if (o->data_file &&
      (!o->data_file[0] || strlen(o->data_file) > QCOW2_MAX_BACKING_NAME))
    return qcow2_err(-EINVAL, "data file name must be 1 to %d bytes long",
                     QCOW2_MAX_BACKING_NAME);
  if (o->data_file_raw && !o->data_file)
    return qcow2_err(-EINVAL, "data_file_raw needs data_file");
  /* Preallocated clusters of a standard L2 entry would hide the backing
   * file; extended L2 entries keep them with no subcluster allocated. */
  if (o->backing_file && prealloc_of(o) != QCOW2_PREALLOC_OFF &&
      !o->extended_l2)
    return qcow2_err(-EINVAL, "backing file and preallocation can only be "
                              "used at the same time if extended_l2 is on");
  return 0;
}

/* Header, extensions and backing file name in cluster 0. */
static int layout_header(const struct qcow2_create_opts *o,
                         struct qcow2_layout *l) {
  l->header_length = o->version == 3 ? 112 : 72;
  uint64_t off = l->header_length;
  if (o->backing_fmt)
    off += 8 + align8(strlen(o->backing_fmt));
  if (o->data_file)
    off += 8 + align8(strlen(o->data_file));
  uint64_t bslen = o->backing_file ? strlen(o->backing_file) : 0;
  uint64_t need = off + 8 + bslen; /* + end of extensions */
  if (need > l->csize)
    return qcow2_err(
        -EINVAL,
        "backing file name does not fit in the first cluster (%llu "
        "bytes); use a larger cluster size",
        (unsigned long long)l->csize);
  l->feature_table = o->version == 3 && need + FEATURE_TABLE_BYTES <= l->csize;
  if (l->feature_table)
    off += FEATURE_TABLE_BYTES;
  off += 8;
  l->backing_offset = bslen ? off : 0;
  l->backing_size = (uint32_t)bslen;
  return 0;
}

int qcow2_create_layout(const struct qcow2_create_opts *o,
                        struct qcow2_layout *l) {
  memset(l, 0, sizeof *l);
  int r = check_opts(o);
  if (r < 0)
    return r;
  unsigned cb = o->cluster_bits;
  l->csize = 1ull << cb;
  l->l2_bits = cb - (o->extended_l2 ? 4 : 3);
  r = layout_header(o, l);
  if (r < 0)
    return r;

  uint64_t per_l1 = 1ull << (cb + l->l2_bits);
  uint64_t l1_size = div_up(o->size, per_l1);
  if (l1_size * 8 > QCOW2_MAX_L1_BYTES)
    return qcow2_err(
        -EFBIG,
        "virtual size %llu needs an L1 table of %llu bytes (max %u); "
        "use a larger cluster size",
        (unsigned long long)o->size, (unsigned long long)l1_size * 8,
        QCOW2_MAX_L1_BYTES);
  l->l1_size = (uint32_t)l1_size;
  /* A size of 0 has no L1 table at all (offset 0), as qemu-img makes it:
   * a cluster for it would be one that nothing references. */
  l->l1_clusters = div_up(l1_size * 8, l->csize);

  l->prealloc = prealloc_of(o);
  l->data_external = o->data_file != NULL;
  if (l->prealloc != QCOW2_PREALLOC_OFF) {
    l->data_clusters = div_up(o->size, l->csize);
    l->l2_tables = div_up(l->data_clusters, 1ull << l->l2_bits);
    if (l->l2_tables > QCOW2_CREATE_MAX_METADATA >> cb)
      return qcow2_err(
          -EFBIG,
          "preallocation would write %llu L2 tables of %llu bytes "
          "(max %llu bytes of metadata); use a larger cluster size",
          (unsigned long long)l->l2_tables, (unsigned long long)l->csize,
          (unsigned long long)QCOW2_CREATE_MAX_METADATA);
  }

  /* Refcount blocks cover every cluster in use, themselves and the
   * refcount table included: grow both until they cover the total. */
  uint64_t rb_entries = (l->csize * 8) >> o->refcount_order;
  uint64_t rb = 1, rt = 1, total;
  for (;;) {
    total = 1 + rt + rb + l->l1_clusters + l->l2_tables +
            (l->data_external ? 0 : l->data_clusters);
    uint64_t nrb = div_up(total, rb_entries);
    uint64_t nrt = div_up(nrb * 8, l->csize);
    if (nrb <= rb && nrt <= rt)
      break;
    rb = nrb > rb ? nrb : rb;
    rt = nrt > rt ? nrt : rt;
    if (rt > QCOW2_MAX_REFTABLE_BYTES >> cb ||
        rb > QCOW2_CREATE_MAX_METADATA >> cb)
      return qcow2_err(
          -EFBIG, "the refcount structures for this size are too large; use "
                  "a larger cluster size or wider refcounts");
  }
  l->reftable_offset = l->csize;
  l->reftable_clusters = (uint32_t)rt;
  l->refblock_offset = l->reftable_offset + rt * l->csize;
  l->refblocks = rb;
  uint64_t after_refblocks = l->refblock_offset + rb * l->csize;
  l->l1_offset = l->l1_size ? after_refblocks : 0;
  l->l2_offset = after_refblocks + l->l1_clusters * l->csize;
  l->data_offset =
      l->data_external ? 0 : l->l2_offset + l->l2_tables * l->csize;
  l->clusters = total;
  if (total > (QCOW2_OFFSET_MASK >> cb))
    return qcow2_err(-EFBIG, "image file would be too large");
  l->file_size = total << cb;
  return 0;
}

void qcow2_feature_table(uint8_t *out) {
  memset(out, 0, NFEATURES * 48);
  for (size_t i = 0; i < NFEATURES; i++) {
    out[i * 48] = features[i].type;
    out[i * 48 + 1] = features[i].bit;
    memcpy(out + i * 48 + 2, features[i].name, strlen(features[i].name));
  }
}

static void put_ext(uint8_t *buf, uint64_t *off, uint32_t type,
                    const void *data, uint32_t len) {
  put_be32(buf + *off, type);
  put_be32(buf + *off + 4, len);
  memcpy(buf + *off + 8, data, len);
  *off += 8 + align8(len);
}

void qcow2_create_header(const struct qcow2_create_opts *o,
                         const struct qcow2_layout *l, uint8_t *buf) {
  memset(buf, 0, l->csize);
  put_be32(buf, QCOW2_MAGIC);
  put_be32(buf + 4, o->version);
  put_be64(buf + 8, l->backing_offset);
  put_be32(buf + 16, l->backing_size);
  put_be32(buf + 20, o->cluster_bits);
  put_be64(buf + 24, o->size);
  put_be32(buf + 36, l->l1_size);
  put_be64(buf + 40, l->l1_offset);
  put_be64(buf + 48, l->reftable_offset);
  put_be32(buf + 56, l->reftable_clusters);
  if (o->version == 3) {
    uint64_t incompat = (o->extended_l2 ? QCOW2_INCOMPAT_EXTL2 : 0) |
                        (o->compression_type ? QCOW2_INCOMPAT_COMPRESSION : 0) |
                        (o->data_file ? QCOW2_INCOMPAT_DATA_FILE : 0);
    put_be64(buf + 72, incompat);
    if (o->data_file_raw)
      put_be64(buf + 88, QCOW2_AUTOCLEAR_DATA_FILE_RAW);
    put_be64(buf + 80, o->lazy_refcounts ? QCOW2_COMPAT_LAZY_REFCOUNTS : 0);
    put_be32(buf + 96, o->refcount_order);
    put_be32(buf + 100, l->header_length);
    buf[104] = (uint8_t)o->compression_type;
  }
  uint64_t off = l->header_length;
  if (o->backing_fmt)
    put_ext(buf, &off, QCOW2_EXT_BACKING_FORMAT, o->backing_fmt,
            (uint32_t)strlen(o->backing_fmt));
  if (o->data_file)
    put_ext(buf, &off, QCOW2_EXT_DATA_FILE, o->data_file,
            (uint32_t)strlen(o->data_file));
  if (l->feature_table) {
    uint8_t t[NFEATURES * 48];
    qcow2_feature_table(t);
    put_ext(buf, &off, QCOW2_EXT_FEATURE_TABLE, t, sizeof t);
  }
  off += 8; /* end of extensions: already zero */
  if (l->backing_size)
    memcpy(buf + l->backing_offset, o->backing_file, l->backing_size);
}

void qcow2_set_refcount(uint8_t *buf, unsigned order, uint64_t i,
                        uint64_t value) {
  unsigned bits = 1u << order;
  if (bits < 8) {
    unsigned shift = (unsigned)((i * bits) % 8);
    uint8_t mask = (uint8_t)(((1u << bits) - 1) << shift);
    uint8_t *p = buf + i * bits / 8;
    *p = (uint8_t)((*p & ~mask) | ((value << shift) & mask));
    return;
  }
  unsigned bytes = bits / 8;
  uint8_t *p = buf + i * bytes;
  for (unsigned k = 0; k < bytes; k++)
    p[bytes - 1 - k] = (uint8_t)(value >> (8 * k));
}

static int write_tables(int fd, const struct qcow2_create_opts *o,
                        const struct qcow2_layout *l, uint8_t *c) {
  uint64_t cs = l->csize;
  /* Refcount table. */
  int r = 0;
  for (uint64_t k = 0; r == 0 && k < l->reftable_clusters; k++) {
    memset(c, 0, cs);
    for (uint64_t j = 0; j < cs / 8; j++) {
      uint64_t b = k * (cs / 8) + j;
      if (b < l->refblocks)
        put_be64(c + j * 8, l->refblock_offset + b * cs);
    }
    r = io_pwrite_all(fd, c, cs, l->reftable_offset + k * cs);
  }
  /* Refcount blocks: clusters [0, l->clusters) have refcount 1. */
  uint64_t rb_entries = (cs * 8) >> o->refcount_order;
  for (uint64_t b = 0; r == 0 && b < l->refblocks; b++) {
    memset(c, 0, cs);
    for (uint64_t j = 0; j < rb_entries && b * rb_entries + j < l->clusters;
         j++)
      qcow2_set_refcount(c, o->refcount_order, j, 1);
    r = io_pwrite_all(fd, c, cs, l->refblock_offset + b * cs);
  }
  /* L1 table. */
  for (uint64_t k = 0; r == 0 && k < l->l1_clusters && l->l2_tables; k++) {
    memset(c, 0, cs);
    for (uint64_t j = 0; j < cs / 8; j++) {
      uint64_t t = k * (cs / 8) + j;
      if (t < l->l2_tables)
        put_be64(c + j * 8, (l->l2_offset + t * cs) | QCOW2_L2_COPIED);
    }
    r = io_pwrite_all(fd, c, cs, l->l1_offset + k * cs);
  }
  /* L2 tables. */
  uint64_t per_l2 = 1ull << l->l2_bits;
  size_t esize = o->extended_l2 ? 16 : 8;
  for (uint64_t t = 0; r == 0 && t < l->l2_tables; t++) {
    memset(c, 0, cs);
    for (uint64_t j = 0; j < per_l2 && t * per_l2 + j < l->data_clusters; j++) {
      uint64_t g = t * per_l2 + j;
      /* With extended L2 the bitmap stays 0: the cluster is reserved but
       * its subclusters read as unallocated (zeroes or the backing file)
       * until written, as qemu-img makes it. */
      put_be64(c + j * esize, (l->data_offset + g * cs) | QCOW2_L2_COPIED);
    }
    r = io_pwrite_all(fd, c, cs, l->l2_offset + t * cs);
  }
  return r;
}

static int fill_data(int fd, const struct qcow2_layout *l) {
  if ((l->prealloc != QCOW2_PREALLOC_FALLOC &&
       l->prealloc != QCOW2_PREALLOC_FULL) ||
      l->data_external)
    return 0;
  return io_preallocate(fd, l->data_offset, l->data_clusters * l->csize,
                        l->prealloc == QCOW2_PREALLOC_FULL);
}

int qcow2_create_write(int fd, const struct qcow2_create_opts *o,
                       const struct qcow2_layout *l) {
  uint8_t *c = malloc(l->csize);
  if (!c)
    return qcow2_err(-ENOMEM, "out of memory");
  int r = ftruncate(fd, (off_t)l->file_size) < 0 ? -errno : 0;
  if (r == 0) {
    qcow2_create_header(o, l, c);
    r = io_pwrite_all(fd, c, l->csize, 0);
  }
  if (r == 0)
    r = write_tables(fd, o, l, c);
  free(c);
  if (r == 0)
    r = fill_data(fd, l);
  if (r == 0 && fdatasync(fd) < 0)
    r = -errno;
  if (r < 0)
    return qcow2_err(r, "%s", strerror(-r));
  return 0;
}
