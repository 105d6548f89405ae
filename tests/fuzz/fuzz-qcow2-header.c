/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target for the two rebuilders of a qcow2 image's first cluster,
 * which walk the header extensions of an image from outside:
 * qcow2_build_header() (formats/qcow2/header-build.c, for amend) and
 * qcow2_header_set_backing() (formats/qcow2/set-backing.c, for rebase).
 * The input is the image's first cluster (zero-padded to the cluster size
 * its header names).  Checked: each either refuses with a message or
 * writes a cluster that parses again, with the same geometry, and for
 * set_backing the new backing file name and format. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "formats/qcow2/header-build.h"
#include "formats/qcow2/qcow2.h"
#include "formats/qcow2/set-backing.h"
#include "fuzz-check.h"

#define MAX_CLUSTER (2u << 20)

static void same_geometry(const struct qcow2_header *a,
                          const struct qcow2_header *b) {
  CHECK(a->version == b->version);
  CHECK(a->cluster_bits == b->cluster_bits);
  CHECK(a->size == b->size);
  CHECK(a->l1_size == b->l1_size && a->l1_offset == b->l1_offset);
  CHECK(a->reftable_offset == b->reftable_offset);
  CHECK(a->reftable_clusters == b->reftable_clusters);
  CHECK(a->nb_snapshots == b->nb_snapshots);
  CHECK(a->snapshots_offset == b->snapshots_offset);
}

/* OUT, rebuilt from OLD as H_OLD describes it, must parse as H did. */
static void check_build(const struct qcow2_header *h, const uint8_t *old,
                        size_t csize, uint8_t *out, uint64_t file_size) {
  bd_set_error("%s", "");
  int r = qcow2_build_header(h, h, old, csize, out, csize);
  if (r < 0) {
    CHECK(r == -EFBIG && bd_errmsg()[0]);
    return;
  }
  struct qcow2_header back;
  CHECK(qcow2_parse_header(out, csize, file_size, &back) == 0);
  same_geometry(h, &back);
  CHECK(back.backing_size == (h->backing_offset ? h->backing_size : 0));
  CHECK(!strcmp(back.backing_format, h->backing_format));
}

static void check_set_backing(const struct qcow2_header *h, const uint8_t *old,
                              size_t csize, uint8_t *out, uint64_t file_size) {
  static const char name[] = "new-backing.qcow2";
  uint32_t pos = 0;
  /* Refused before the rebuild (qcow2_change_backing()): a raw data file
   * must make sense of the image alone. */
  if (h->autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW)
    return;
  int r = qcow2_header_set_backing(old, csize, h, name, "qcow2", out, &pos);
  if (r < 0) {
    CHECK(r == -EINVAL || r == -ENOSPC);
    return;
  }
  struct qcow2_header back;
  CHECK(qcow2_parse_header(out, csize, file_size, &back) == 0);
  same_geometry(h, &back);
  CHECK(back.backing_size == sizeof name - 1);
  CHECK(back.backing_offset + back.backing_size <= csize);
  CHECK(!memcmp(out + back.backing_offset, name, sizeof name - 1));
  CHECK(!strcmp(back.backing_format, "qcow2"));
  CHECK(pos < csize);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_CLUSTER)
    return 0;
  /* The file is as long as its header says it must be at least. */
  uint64_t file_size = (uint64_t)MAX_CLUSTER * 64;
  struct qcow2_header h;
  if (qcow2_parse_header(data, size, file_size, &h) < 0)
    return 0;
  size_t csize = (size_t)1 << h.cluster_bits;
  uint8_t *old = calloc(1, csize), *out = malloc(csize);
  CHECK(old && out);
  memcpy(old, data, size < csize ? size : csize);
  /* The header as the cluster shows it (the input may be shorter). */
  if (qcow2_parse_header(old, csize, file_size, &h) == 0) {
    check_build(&h, old, csize, out, file_size);
    check_set_backing(&h, old, csize, out, file_size);
  }
  free(old);
  free(out);
  return 0;
}
