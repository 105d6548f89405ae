/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 bitmap directory parsing (see qcow2.rst, "Bitmaps extension"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "core/byteorder.h"
#include "qcow2.h"

void qcow2_free_bitmaps(struct qcow2_bitmap *b, uint32_t nb) {
  if (!b)
    return;
  for (uint32_t i = 0; i < nb; i++)
    free(b[i].name);
  free(b);
}

bool qcow2_bitmap_entry_ok(uint64_t entry, unsigned cluster_bits) {
  uint64_t off = entry & QCOW2_OFFSET_MASK;
  if (entry & QCOW2_BITMAP_RESERVED)
    return false;
  return off == 0 || (!(entry & QCOW2_BITMAP_ALL_ONES) &&
                      off % (1ull << cluster_bits) == 0);
}

uint64_t qcow2_bitmap_table_entries(uint64_t size, unsigned gran_bits,
                                    unsigned cluster_bits) {
  uint64_t bits = (size >> gran_bits) + !!(size & ((1ull << gran_bits) - 1));
  uint64_t bytes = (bits + 7) / 8, csize = 1ull << cluster_bits;
  return (bytes + csize - 1) / csize;
}

/* The fixed part of one entry, checked as QEMU's check_dir_entry(). */
static int check_entry(const struct qcow2_bitmap *b, const uint8_t *p,
                       unsigned cluster_bits, uint64_t image_size, uint32_t i) {
  uint64_t phys = (uint64_t)b->table_size << cluster_bits;
  bool bad = b->table_size == 0 || b->table_offset == 0 ||
             b->table_offset % (1ull << cluster_bits) ||
             b->table_size > QCOW2_BITMAP_MAX_TABLE ||
             b->granularity_bits < QCOW2_BITMAP_MIN_GRAN ||
             b->granularity_bits > QCOW2_BITMAP_MAX_GRAN ||
             (b->flags & QCOW2_BME_RESERVED) || p[16] != 1 /* dirty tracking */
             || phys > QCOW2_BITMAP_MAX_BYTES;
  /* A consistent bitmap covers the whole image (an in-use one may not,
   * after a resize that did not store it). */
  if (!bad && !(b->flags & QCOW2_BME_IN_USE) &&
      image_size > (phys * 8) << b->granularity_bits)
    bad = true;
  if (bad)
    return qcow2_err(-EINVAL,
                     "bitmap %u ('%s') does not satisfy the constraints", i,
                     b->name);
  return 0;
}

/* Entry I at P, AVAIL bytes to the end of the directory; *ELEN its size. */
static int parse_one(const uint8_t *p, size_t avail, uint32_t i,
                     unsigned cluster_bits, uint64_t image_size,
                     struct qcow2_bitmap *b, size_t *elen) {
  if (avail < 24)
    return qcow2_err(-EINVAL, "bitmap directory is truncated (entry %u)", i);
  b->table_offset = get_be64(p);
  b->table_size = get_be32(p + 8);
  b->flags = get_be32(p + 12);
  b->granularity_bits = p[17];
  uint32_t name_size = get_be16(p + 18), extra = get_be32(p + 20);
  uint64_t total = (24ull + name_size + extra + 7) & ~7ull;
  if (total > avail)
    return qcow2_err(-EINVAL, "bitmap directory is truncated (entry %u)", i);
  if (extra != 0)
    return qcow2_err(-EINVAL,
                     "bitmap %u has extra data, which is not supported", i);
  if (name_size > QCOW2_BITMAP_MAX_NAME)
    return qcow2_err(-EINVAL, "bitmap %u: name too long", i);
  b->name = malloc(name_size + 1u);
  if (!b->name)
    return qcow2_err(-ENOMEM, "out of memory");
  memcpy(b->name, p + 24, name_size);
  b->name[name_size] = 0;
  *elen = (size_t)total;
  return check_entry(b, p, cluster_bits, image_size, i);
}

int qcow2_parse_bitmap_dir(const uint8_t *dir, size_t len, uint32_t nb,
                           unsigned cluster_bits, uint64_t image_size,
                           struct qcow2_bitmap **out) {
  *out = NULL;
  if (len == 0 || len > QCOW2_MAX_BITMAP_DIR || nb == 0 ||
      nb > QCOW2_MAX_BITMAPS)
    return qcow2_err(
        -EINVAL, "invalid bitmap directory (%zu bytes, %u bitmaps)", len, nb);
  struct qcow2_bitmap *b = calloc(nb, sizeof *b);
  if (!b)
    return qcow2_err(-ENOMEM, "out of memory");
  size_t pos = 0;
  uint32_t i = 0;
  int r = 0;
  for (; r == 0 && i < nb && pos < len; i++) {
    size_t elen = 0;
    b[i].dir_pos = (uint32_t)pos;
    r = parse_one(dir + pos, len - pos, i, cluster_bits, image_size, &b[i],
                  &elen);
    pos += elen;
  }
  if (r == 0 && (i != nb || pos != len))
    r = qcow2_err(-EINVAL,
                  "bitmap directory holds %s bitmaps than the %u the header "
                  "names",
                  i < nb ? "fewer" : "more", nb);
  if (r < 0) {
    qcow2_free_bitmaps(b, nb);
    return r;
  }
  *out = b;
  return 0;
}
