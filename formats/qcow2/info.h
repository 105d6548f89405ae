/* SPDX-License-Identifier: BSD-3-Clause */
/* What `blockport info` shows of a qcow2 image: the header (through
 * qcow2_parse_header), the snapshot table and the bitmap directory, read
 * from an open file with every length checked first. */
#ifndef BLOCKPORT_QCOW2_INFO_H
#define BLOCKPORT_QCOW2_INFO_H

#include <stdbool.h>
#include <stdint.h>

#include "bitmap.h"
#include "qcow2.h"
#include "snapshot.h"

struct qcow2_info {
  uint32_t version; /* 2 or 3 */
  uint64_t size;    /* virtual size */
  uint64_t cluster_size;
  unsigned refcount_bits;
  const char *compression; /* "zlib" or "zstd" */
  bool lazy_refcounts, extended_l2, corrupt, dirty;
  char *backing; /* the name in the header, NULL without a backing file */
  char backing_format[32];                    /* "" when not recorded */
  bool has_data_file;                         /* external data file */
  bool data_file_raw;                         /* ... kept raw */
  char data_file[QCOW2_MAX_BACKING_NAME + 1]; /* its name, maybe "" */
  struct qcow2_snapshot *snaps;
  uint32_t nsnaps;
  struct qcow2_bitmap *bitmaps; /* only when the BITMAPS bit vouches */
  uint32_t nbitmaps;
};

/* Read the qcow2 image open at FD, FILE_SIZE bytes long.  Returns 0 with
 * *OUT filled (free with qcow2_info_free), or -errno with a reason in
 * bd_errmsg() (a corrupt image: -EINVAL or -ENOTSUP); *OUT is then empty. */
int qcow2_read_info(int fd, uint64_t file_size, struct qcow2_info *out);
void qcow2_info_free(struct qcow2_info *info);

#endif
