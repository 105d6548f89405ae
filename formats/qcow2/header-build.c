/* SPDX-License-Identifier: BSD-3-Clause */
/* The first cluster of a qcow2 image, rebuilt (see header-build.h).  The
 * extensions come in QEMU's order: backing format, data file, feature
 * names, bitmaps, then the unknown ones as they were; the backing file
 * name follows the end marker. */
#include "header-build.h"

#include <errno.h>
#include <string.h>

#include "core/byteorder.h"
#include "create.h"

struct hbuf {
  uint8_t *b;
  size_t cap, off;
};

static int put_ext(struct hbuf *o, uint32_t type, const void *data,
                   uint32_t len) {
  size_t padded = ((size_t)len + 7) & ~(size_t)7;
  if (o->off + 8 + padded > o->cap)
    return -EFBIG;
  put_be32(o->b + o->off, type);
  put_be32(o->b + o->off + 4, len);
  memcpy(o->b + o->off + 8, data, len);
  o->off += 8 + padded;
  return 0;
}

static void put_fixed(const struct qcow2_header *h, uint8_t *b) {
  put_be32(b, QCOW2_MAGIC);
  put_be32(b + 4, h->version);
  put_be32(b + 20, h->cluster_bits);
  put_be64(b + 24, h->size);
  put_be32(b + 32, h->crypt_method);
  put_be32(b + 36, h->l1_size);
  put_be64(b + 40, h->l1_offset);
  put_be64(b + 48, h->reftable_offset);
  put_be32(b + 56, h->reftable_clusters);
  put_be32(b + 60, h->nb_snapshots);
  put_be64(b + 64, h->snapshots_offset);
  if (h->version < 3)
    return;
  put_be64(b + 72, h->incompatible);
  put_be64(b + 80, h->compatible);
  put_be64(b + 88, h->autoclear);
  put_be32(b + 96, h->refcount_order);
  put_be32(b + 100, 112);
  b[104] = h->compression_type;
}

static bool known(uint32_t type) {
  return type == QCOW2_EXT_BACKING_FORMAT || type == QCOW2_EXT_DATA_FILE ||
         type == QCOW2_EXT_FEATURE_TABLE || type == QCOW2_EXT_BITMAPS;
}

/* The extensions of OLD it does not rebuild, as they were. */
static int copy_unknown(struct hbuf *o, const struct qcow2_header *h_old,
                        const uint8_t *old, size_t len) {
  size_t off = h_old->header_length;
  while (off + 8 <= len) {
    uint32_t type = get_be32(old + off), elen = get_be32(old + off + 4);
    off += 8;
    if (type == QCOW2_EXT_END || elen > len - off)
      return 0;
    if (!known(type) && put_ext(o, type, old + off, elen) < 0)
      return -EFBIG;
    off += ((size_t)elen + 7) & ~(size_t)7;
  }
  return 0;
}

static int put_extensions(struct hbuf *o, const struct qcow2_header *h,
                          const struct qcow2_header *h_old, const uint8_t *old,
                          size_t len) {
  int r = 0;
  if (h->backing_format[0])
    r = put_ext(o, QCOW2_EXT_BACKING_FORMAT, h->backing_format,
                (uint32_t)strlen(h->backing_format));
  if (r == 0 && h->version >= 3 && (h->incompatible & QCOW2_INCOMPAT_DATA_FILE))
    r = put_ext(o, QCOW2_EXT_DATA_FILE, h->data_file,
                (uint32_t)strlen(h->data_file));
  if (r == 0 && h->version >= 3) {
    uint8_t t[QCOW2_FEATURE_TABLE_LEN];
    qcow2_feature_table(t);
    /* Optional: left out when the backing file name would not fit. */
    size_t room = o->off + 8 + sizeof t + 8 + h_old->backing_size;
    if (room <= o->cap)
      r = put_ext(o, QCOW2_EXT_FEATURE_TABLE, t, sizeof t);
  }
  if (r == 0 && h->version >= 3 && h->bitmaps_nb &&
      (h->autoclear & QCOW2_AUTOCLEAR_BITMAPS)) {
    uint8_t e[24] = {0};
    put_be32(e, h->bitmaps_nb);
    put_be64(e + 8, h->bitmaps_dir_size);
    put_be64(e + 16, h->bitmaps_dir_offset);
    r = put_ext(o, QCOW2_EXT_BITMAPS, e, sizeof e);
  }
  return r == 0 ? copy_unknown(o, h_old, old, len) : r;
}

int qcow2_build_header(const struct qcow2_header *h,
                       const struct qcow2_header *h_old, const uint8_t *old,
                       size_t len, uint8_t *out, size_t csize) {
  memset(out, 0, csize);
  struct hbuf o = {out, csize, h->version >= 3 ? 112 : 72};
  if (o.off > csize || len > csize)
    return qcow2_err(-EFBIG, "the header does not fit in a cluster");
  put_fixed(h, out);
  int r = put_extensions(&o, h, h_old, old, len);
  uint32_t bs = h_old->backing_offset ? h_old->backing_size : 0;
  if (r == 0 && o.off + 8 + bs > csize)
    r = -EFBIG;
  if (r < 0)
    return qcow2_err(-EFBIG, "the header extensions and the backing file "
                             "name do not fit in the first cluster");
  o.off += 8; /* the end marker: zeroes */
  if (bs) {
    memcpy(out + o.off, old + h_old->backing_offset, bs);
    put_be64(out + 8, o.off);
    put_be32(out + 16, bs);
  }
  return 0;
}
