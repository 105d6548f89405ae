/* SPDX-License-Identifier: BSD-3-Clause */
/* convert --bitmaps (see copy-bitmaps.h), with qemu-img's messages. */
#include <stdio.h>

#include "core/blockdev.h"
#include "formats/qcow2/bitmap-edit.h"

#include "cli.h"
#include "copy-bitmaps.h"

int copy_bitmaps_check_src(struct bd *src, bool skip_broken) {
  struct qcow2_bm_edit *e = NULL;
  if (!qcow2_bm_supported(src)) {
    cli_error("convert", NULL, "Source lacks bitmap support");
    return -1;
  }
  if (qcow2_bm_open(src, &e) < 0) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    return -1;
  }
  int r = 0;
  for (uint32_t i = 0; r == 0 && !skip_broken && i < qcow2_bm_count(e); i++) {
    struct qcow2_bm_info b;
    qcow2_bm_get(e, i, &b);
    if (b.in_use) {
      cli_error("convert", NULL, "Cannot copy inconsistent bitmap '%s'",
                b.name);
      fputs("Try --skip-broken-bitmaps, or use 'qemu-img bitmap --remove' "
            "to delete it\n",
            stderr);
      r = -1;
    }
  }
  qcow2_bm_close(e);
  return r;
}

int copy_bitmaps_check_dst(struct bd *dst) {
  if (qcow2_bm_supported(dst))
    return 0;
  cli_error("convert", NULL, "Format driver '%s' does not support bitmaps",
            dst->format);
  return -1;
}

/* Bitmap B of S into D; a failed merge takes the new bitmap away again. */
static int copy_one(struct qcow2_bm_edit *s, struct qcow2_bm_edit *d,
                    const struct qcow2_bm_info *b) {
  if (qcow2_bm_add(d, b->name, b->granularity, !b->enabled) < 0) {
    cli_error("convert", NULL, "Failed to create bitmap %s: %s", b->name,
              bd_errmsg());
    return -1;
  }
  if (qcow2_bm_merge(d, b->name, s, b->name) < 0) {
    cli_error("convert", NULL, "Failed to populate bitmap %s: %s", b->name,
              bd_errmsg());
    qcow2_bm_remove(d, b->name);
    return -1;
  }
  return 0;
}

int copy_bitmaps(struct bd *src, struct bd *dst, bool skip_broken) {
  struct qcow2_bm_edit *s = NULL, *d = NULL;
  int r = qcow2_bm_open(src, &s);
  if (r == 0)
    r = qcow2_bm_open(dst, &d);
  if (r < 0)
    cli_error("convert", NULL, "%s", bd_errmsg());
  for (uint32_t i = 0; r == 0 && i < qcow2_bm_count(s); i++) {
    struct qcow2_bm_info b;
    qcow2_bm_get(s, i, &b);
    if (b.in_use && skip_broken)
      cli_error("convert", NULL, "warning: Skipping inconsistent bitmap '%s'",
                b.name);
    else
      r = copy_one(s, d, &b);
  }
  if (d && qcow2_bm_commit(d) < 0) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    r = -1;
  }
  qcow2_bm_close(d);
  qcow2_bm_close(s);
  return r < 0 ? -1 : 0;
}
