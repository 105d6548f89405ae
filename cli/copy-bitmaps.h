/* SPDX-License-Identifier: BSD-3-Clause */
/* convert --bitmaps: the persistent bitmaps of a qcow2 source copied into
 * a qcow2 output, as qemu-img convert --bitmaps copies them. */
#ifndef BLOCKPORT_CLI_COPY_BITMAPS_H
#define BLOCKPORT_CLI_COPY_BITMAPS_H

#include <stdbool.h>

struct bd;

/* Before the output is made: SRC keeps persistent bitmaps, and none is
 * inconsistent unless SKIP_BROKEN.  0, or -1 (said). */
int copy_bitmaps_check_src(struct bd *src, bool skip_broken);
/* The output, once open, can hold them.  0, or -1 (said). */
int copy_bitmaps_check_dst(struct bd *dst);
/* After the data: each bitmap of SRC added to DST (same name,
 * granularity, enabled or not) with its bits; inconsistent ones skipped
 * with a warning under SKIP_BROKEN.  0, or -1 (said). */
int copy_bitmaps(struct bd *src, struct bd *dst, bool skip_broken);

#endif
