/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target for qcow2_read_info() (formats/qcow2/info.c), what
 * `blockport info` shows of an image: the input is the whole file, read
 * through a memfd.  Checked: a refusal is -EINVAL, -ENOTSUP or -EIO (a
 * table past the end) with a message; an accepted image has as many
 * snapshots and bitmaps as its header names, with NUL-terminated names,
 * and values info prints within their ranges. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/io.h"
#include "formats/qcow2/info.h"
#include "fuzz-check.h"

#define MAX_INPUT (4u << 20)

static void check_info(const struct qcow2_info *q, const uint8_t *data,
                       size_t size) {
  struct qcow2_header h;
  CHECK(qcow2_parse_header(data, size < (2u << 20) ? size : (2u << 20), size,
                           &h) == 0);
  CHECK(q->version == 2 || q->version == 3);
  CHECK(q->cluster_size >= 512 && q->cluster_size <= (2u << 20));
  CHECK(q->refcount_bits >= 1 && q->refcount_bits <= 64);
  CHECK(!strcmp(q->compression, "zlib") || !strcmp(q->compression, "zstd"));
  CHECK((q->backing != NULL) == (h.backing_offset != 0));
  CHECK(memchr(q->backing_format, 0, sizeof q->backing_format));
  CHECK(memchr(q->data_file, 0, sizeof q->data_file));
  CHECK(q->nsnaps == h.nb_snapshots);
  for (uint32_t i = 0; i < q->nsnaps; i++)
    CHECK(q->snaps[i].id && q->snaps[i].id[0] && q->snaps[i].name);
  CHECK(q->nbitmaps == h.bitmaps_nb);
  for (uint32_t i = 0; i < q->nbitmaps; i++)
    CHECK(q->bitmaps[i].name && q->bitmaps[i].granularity_bits < 64);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_INPUT)
    return 0;
  int fd = memfd_create("fuzz-qcow2-info", MFD_CLOEXEC);
  CHECK(fd >= 0);
  CHECK(io_pwrite_all(fd, data, size, 0) == 0);
  struct qcow2_info q;
  bd_set_error("%s", "");
  int r = qcow2_read_info(fd, size, &q);
  close(fd);
  if (r < 0) {
    /* -EFBIG: a snapshot entry with more extra data than QEMU reads. */
    CHECK(r == -EINVAL || r == -ENOTSUP || r == -EIO || r == -EFBIG);
    CHECK(strcmp(bd_errmsg(), "unknown error") != 0);
    CHECK(!q.backing && !q.snaps && !q.bitmaps);
    return 0;
  }
  CHECK(r == 0);
  check_info(&q, data, size);
  qcow2_info_free(&q);
  return 0;
}
