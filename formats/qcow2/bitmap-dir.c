/* SPDX-License-Identifier: BSD-3-Clause */
/* The pure parts of changing persistent bitmaps (see bitmap-dir.h). */
#include <errno.h>
#include <string.h>

#include "bitmap-dir.h"
#include "bitmap.h"
#include "core/byteorder.h"
#include "qcow2.h"

uint64_t qcow2_bitmap_default_granularity(unsigned cluster_bits) {
  uint64_t g = 1ull << cluster_bits;
  return g < 4096 ? 4096 : g > 65536 ? 65536 : g;
}

static unsigned log2u(uint64_t v) {
  unsigned b = 0;
  while (v > 1) {
    v >>= 1;
    b++;
  }
  return b;
}

/* QEMU's check_constraints_on_bitmap() and can_store_new_dirty_bitmap(),
 * in their order. */
const char *qcow2_bitmap_refuse_new(const char *name, uint64_t granularity,
                                    uint64_t size, unsigned cluster_bits,
                                    uint32_t version, uint32_t nb,
                                    uint64_t dir_size) {
  unsigned g = log2u(granularity);
  if (version < 3)
    return "Cannot store dirty bitmaps in qcow2 v2 files";
  if (g > QCOW2_BITMAP_MAX_GRAN)
    return "Granularity exceeds maximum (2147483648 bytes)";
  if (g < QCOW2_BITMAP_MIN_GRAN)
    return "Granularity is under minimum (512 bytes)";
  /* Shifts that would overflow 64 bits cannot be exceeded by a size. */
  bool phys = g < 35 && size > ((uint64_t)QCOW2_BITMAP_MAX_BYTES << g);
  unsigned tb = cluster_bits + g;
  bool table = tb < 37 && size > ((uint64_t)QCOW2_BITMAP_MAX_TABLE << tb);
  if (phys || table)
    return "Too much space will be occupied by the bitmap. Use larger "
           "granularity";
  if (strlen(name) > QCOW2_BITMAP_MAX_NAME)
    return "Name length exceeds maximum (1023 characters)";
  if (nb >= QCOW2_MAX_BITMAPS)
    return "Maximum number of persistent bitmaps is already reached";
  if (nb &&
      dir_size + qcow2_bitmap_entry_size(strlen(name)) > QCOW2_MAX_BITMAP_DIR)
    return "Not enough space in the bitmap directory";
  return NULL;
}

size_t qcow2_bitmap_entry_size(size_t name_len) {
  return (24 + name_len + 7) & ~(size_t)7;
}

size_t qcow2_bitmap_dir_write(const struct qcow2_bitmap_entry *e, uint32_t nb,
                              uint8_t *out) {
  size_t pos = 0;
  for (uint32_t i = 0; i < nb; i++) {
    size_t nlen = strlen(e[i].name), len = qcow2_bitmap_entry_size(nlen);
    uint8_t *p = out + pos;
    memset(p, 0, len);
    put_be64(p, e[i].table_offset);
    put_be32(p + 8, e[i].table_size);
    put_be32(p + 12, e[i].flags);
    p[16] = 1; /* type: dirty tracking bitmap */
    p[17] = (uint8_t)e[i].granularity_bits;
    put_be16(p + 18, (uint16_t)nlen);
    /* bytes 20-23: no extra data */
    memcpy(p + 24, e[i].name, nlen);
    pos += len;
  }
  return pos;
}

/* One extension of TYPE with LEN bytes of DATA at OUT + *POS, padded to 8
 * bytes, if it fits in CAP. */
static int put_ext(uint8_t *out, size_t cap, size_t *pos, uint32_t type,
                   const uint8_t *data, uint32_t len) {
  size_t padded = ((size_t)len + 7) & ~(size_t)7;
  if (*pos + 8 + padded > cap)
    return -ENOSPC;
  put_be32(out + *pos, type);
  put_be32(out + *pos + 4, len);
  memcpy(out + *pos + 8, data, len);
  *pos += 8 + padded;
  return 0;
}

/* The extensions of HDR other than the bitmaps one, copied to OUT. */
static int copy_exts(const uint8_t *hdr, size_t len, uint32_t header_length,
                     uint8_t *out, size_t *pos) {
  size_t off = header_length;
  while (off + 8 <= len) {
    uint32_t type = get_be32(hdr + off), elen = get_be32(hdr + off + 4);
    off += 8;
    if (type == QCOW2_EXT_END)
      return 0;
    if (elen > len - off)
      return -EINVAL;
    int r = type == QCOW2_EXT_BITMAPS
                ? 0
                : put_ext(out, len, pos, type, hdr + off, elen);
    if (r < 0)
      return r;
    off += ((size_t)elen + 7) & ~(size_t)7;
  }
  return 0; /* no end marker in the cluster: QEMU tolerates it too */
}

int qcow2_rebuild_extensions(const uint8_t *hdr, size_t len,
                             uint32_t header_length, uint64_t backing_offset,
                             uint32_t backing_size, const uint8_t *ext,
                             uint8_t *out, size_t *used) {
  if (header_length > len ||
      (backing_size &&
       (backing_offset > len || backing_size > len - backing_offset)))
    return -EINVAL;
  memset(out, 0, len);
  memcpy(out, hdr, header_length);
  size_t pos = header_length;
  int r = copy_exts(hdr, len, header_length, out, &pos);
  if (r == 0 && ext)
    r = put_ext(out, len, &pos, QCOW2_EXT_BITMAPS, ext, 24);
  if (r == 0 && pos + 8 + backing_size > len)
    r = -ENOSPC;
  if (r < 0)
    return r;
  pos += 8; /* the end marker: zeroes */
  if (backing_size) {
    memcpy(out + pos, hdr + backing_offset, backing_size);
    put_be64(out + 8, pos);
    pos += backing_size;
  }
  *used = pos;
  return 0;
}

static void set_bits(uint8_t *bits, uint64_t first, uint64_t last) {
  for (uint64_t i = first; i <= last; i++) {
    if (i % 8 == 0 && i + 7 <= last) {
      uint64_t bytes = (last + 1 - i) / 8;
      memset(bits + i / 8, 0xff, bytes);
      i += bytes * 8 - 1;
      continue;
    }
    bits[i / 8] |= (uint8_t)(1u << (i % 8));
  }
}

void qcow2_bitmap_merge_bits(uint8_t *dst, unsigned dg, const uint8_t *src,
                             unsigned sg, uint64_t size) {
  uint64_t nbits = (size >> sg) + !!(size & ((1ull << sg) - 1));
  for (uint64_t i = 0; i < nbits; i++) {
    if (i % 8 == 0 && src[i / 8] == 0) {
      i += 7; /* a clean byte: eight clean bits */
      continue;
    }
    if (!(src[i / 8] >> (i % 8) & 1))
      continue;
    uint64_t start = i << sg, end = (i + 1) << sg;
    if (end > size)
      end = size;
    set_bits(dst, start >> dg, (end - 1) >> dg);
  }
}
