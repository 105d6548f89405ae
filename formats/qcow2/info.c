/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 facts for `blockport info`: the header, snapshot table and bitmap
 * directory, through the same parsers the source and `check` use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/cleanup.h"
#include "core/io.h"
#include "info.h"

/* Bytes of the file read for the header and its extensions. */
#define HEADER_READ (2u << 20)

static int read_snapshots(int fd, uint64_t file_size,
                          const struct qcow2_header *h,
                          struct qcow2_info *out) {
  if (!h->nb_snapshots)
    return 0;
  size_t used;
  int r = qcow2_read_snapshots(fd, file_size, h, true, &out->snaps, &used);
  if (r == 0) {
    out->nsnaps = h->nb_snapshots;
    return 0;
  }
  if (r == -ENOMEM)
    return r;    /* said */
  char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
  snprintf(why, sizeof why, "%s", bd_errmsg());
  return qcow2_err(r == -ENOSPC ? -EINVAL : r, "corrupt snapshot table: %s%s",
                   why, r == -ENOSPC ? " (past the end of the file)" : "");
}

/* The bitmap directory the header's bitmaps extension names, when the
 * BITMAPS autoclear bit vouches for it (else the bitmaps are stale). */
static int read_bitmaps(int fd, uint64_t file_size,
                        const struct qcow2_header *h, struct qcow2_info *out) {
  uint32_t nb = h->bitmaps_nb;
  uint64_t dsize = h->bitmaps_dir_size, doff = h->bitmaps_dir_offset;
  if (!nb)
    return 0;
  if (doff > file_size || dsize > file_size - doff)
    return qcow2_err(-EINVAL,
                     "corrupt bitmaps extension (%u bitmaps, directory at "
                     "0x%llx, %llu bytes)",
                     nb, (unsigned long long)doff, (unsigned long long)dsize);
  CLEANUP_FREE uint8_t *dir = malloc(dsize ? dsize : 1);
  if (!dir)
    return qcow2_err(-ENOMEM, "out of memory");
  int r = io_pread_exact(fd, dir, dsize, doff);
  if (r < 0)
    return qcow2_err(r, "corrupt bitmap directory: %s", strerror(-r));
  r = qcow2_parse_bitmap_dir(dir, dsize, nb, h->cluster_bits, h->size,
                             &out->bitmaps);
  if (r < 0) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    strncpy(why, bd_errmsg(), sizeof why - 1);
    why[sizeof why - 1] = 0;
    return qcow2_err(r, "corrupt bitmap directory: %s", why);
  }
  out->nbitmaps = nb;
  return 0;
}

/* The fields info shows, from the parsed header HDR (the file's first
 * bytes: the backing file name is there). */
static int fill_header(const struct qcow2_header *h, const uint8_t *hdr,
                       struct qcow2_info *out) {
  out->version = h->version;
  out->size = h->size;
  out->cluster_size = 1ull << h->cluster_bits;
  out->refcount_bits = 1u << h->refcount_order;
  out->compression = h->compression_type == 1 ? "zstd" : "zlib";
  out->lazy_refcounts = h->compatible & QCOW2_COMPAT_LAZY_REFCOUNTS;
  out->extended_l2 = h->incompatible & QCOW2_INCOMPAT_EXTL2;
  out->corrupt = h->incompatible & QCOW2_INCOMPAT_CORRUPT;
  out->dirty = h->incompatible & QCOW2_INCOMPAT_DIRTY;
  memcpy(out->backing_format, h->backing_format, sizeof out->backing_format);
  out->has_data_file = h->incompatible & QCOW2_INCOMPAT_DATA_FILE;
  out->data_file_raw = h->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW;
  memcpy(out->data_file, h->data_file, sizeof out->data_file);
  if (!h->backing_offset)
    return 0;
  /* qcow2_parse_header checked the name's place and that it has no NUL. */
  out->backing =
      strndup((const char *)hdr + h->backing_offset, h->backing_size);
  return out->backing ? 0 : qcow2_err(-ENOMEM, "out of memory");
}

int qcow2_read_info(int fd, uint64_t file_size, struct qcow2_info *out) {
  memset(out, 0, sizeof *out);
  size_t len = file_size < HEADER_READ ? (size_t)file_size : HEADER_READ;
  CLEANUP_FREE uint8_t *hdr = malloc(len ? len : 1);
  if (!hdr)
    return qcow2_err(-ENOMEM, "out of memory");
  int r = io_pread_exact(fd, hdr, len, 0);
  if (r < 0)
    return qcow2_err(r, "%s", strerror(-r));
  struct qcow2_header h;
  r = qcow2_parse_header(hdr, len, file_size, &h);
  if (r == 0)
    r = fill_header(&h, hdr, out);
  if (r == 0)
    r = read_bitmaps(fd, file_size, &h, out);
  if (r == 0)
    r = read_snapshots(fd, file_size, &h, out);
  if (r < 0)
    qcow2_info_free(out);
  return r;
}

void qcow2_info_free(struct qcow2_info *info) {
  free(info->backing);
  qcow2_free_snapshots(info->snaps, info->nsnaps);
  qcow2_free_bitmaps(info->bitmaps, info->nbitmaps);
  memset(info, 0, sizeof *info);
}
