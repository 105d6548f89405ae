/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2 image's backing file in its header (set-backing.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/byteorder.h"
#include "core/io.h"
#include "qcow2-internal.h"
#include "set-backing.h"

static uint64_t pad8(uint64_t n) {
  return (n + 7) & ~7ull;
}

/* Append extension TYPE with LEN bytes of DATA at *POS: -ENOSPC when the
 * cluster (and room for the end marker) is too small. */
static int add_ext(uint8_t *out, size_t csize, size_t *pos, uint32_t type,
                   const uint8_t *data, uint32_t len) {
  if (*pos + 8 + pad8(len) + 8 > csize)
    return -ENOSPC;
  put_be32(out + *pos, type);
  put_be32(out + *pos + 4, len);
  memcpy(out + *pos + 8, data, len);
  *pos += 8 + pad8(len);
  return 0;
}

/* Copy OLD's extensions but the backing format (up to the end marker, the
 * backing name or the end of the cluster). */
static int copy_exts(const uint8_t *old, size_t csize,
                     const struct qcow2_header *h, uint8_t *out, size_t *pos,
                     uint32_t *bitmaps_pos) {
  size_t off = h->header_length;
  size_t end = h->backing_offset > off && h->backing_offset < csize
                   ? (size_t)h->backing_offset
                   : csize;
  while (off + 8 <= end) {
    uint32_t type = get_be32(old + off), len = get_be32(old + off + 4);
    if (type == QCOW2_EXT_END)
      return 0;
    if (len > end - off - 8)
      return -EINVAL;
    if (type == QCOW2_EXT_BITMAPS)
      *bitmaps_pos = (uint32_t)(*pos + 8);
    int r = type == QCOW2_EXT_BACKING_FORMAT
                ? 0
                : add_ext(out, csize, pos, type, old + off + 8, len);
    if (r < 0)
      return r;
    off += 8 + pad8(len);
  }
  return 0;
}

int qcow2_header_set_backing(const uint8_t *old, size_t csize,
                             const struct qcow2_header *h, const char *name,
                             const char *fmt, uint8_t *out,
                             uint32_t *bitmaps_pos) {
  size_t nlen = name ? strlen(name) : 0;
  if (nlen > QCOW2_MAX_BACKING_NAME || h->header_length > csize)
    return -EINVAL;
  memset(out, 0, csize);
  memcpy(out, old, h->header_length);
  size_t pos = h->header_length;
  *bitmaps_pos = 0;
  int r = 0;
  if (name && fmt)
    r = add_ext(out, csize, &pos, QCOW2_EXT_BACKING_FORMAT,
                (const uint8_t *)fmt, (uint32_t)strlen(fmt));
  if (r == 0)
    r = copy_exts(old, csize, h, out, &pos, bitmaps_pos);
  if (r < 0)
    return r;
  pos += 8; /* the end marker: zeroes */
  if (pos + nlen > csize)
    return -ENOSPC;
  memcpy(out + pos, name ? name : "", nlen);
  put_be64(out + 8, name ? pos : 0);
  put_be32(out + 16, (uint32_t)nlen);
  return 0;
}

int qcow2_change_backing(struct bd *bd, const char *name, const char *fmt) {
  if (strcmp(bd->format, "qcow2") || !bd->priv || bd->caps.readonly) {
    bd_set_error("%s", strerror(ENOTSUP));
    return -ENOTSUP;
  }
  struct qcow2dev *q = bd->priv;
  /* A raw data file alone must make sense of the image: no backing file. */
  if (name && (q->h.autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW)) {
    bd_set_error("%s", strerror(EINVAL));
    return -EINVAL;
  }
  int r = qcow2_flush(bd);
  uint8_t *old = malloc(q->csize), *out = malloc(q->csize);
  uint32_t bpos = 0;
  if (r == 0)
    r = old && out ? io_pread_zero(q->fd, old, q->csize, 0) : -ENOMEM;
  if (r == 0)
    r = qcow2_header_set_backing(old, q->csize, &q->h, name, fmt, out, &bpos);
  if (r == 0)
    r = io_pwrite_all(q->fd, out, q->csize, 0);
  if (r == 0)
    r = io_fdatasync(q->fd);
  if (r == 0) {
    q->h.backing_offset = get_be64(out + 8);
    q->h.backing_size = get_be32(out + 16);
    snprintf(q->h.backing_format, sizeof q->h.backing_format, "%s",
             name && fmt ? fmt : "");
    q->h.bitmaps_ext_pos = bpos;
  } else {
    bd_set_error("%s", strerror(-r));
  }
  free(old);
  free(out);
  return r;
}
