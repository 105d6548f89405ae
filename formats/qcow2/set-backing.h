/* SPDX-License-Identifier: BSD-3-Clause */
/* Changing a qcow2 image's backing file name and format in its header,
 * for `rebase`: the header cluster rebuilt as QEMU rebuilds it (the
 * backing format extension first, the other extensions kept in their
 * order, the end marker, then the name), refused when it does not fit
 * the cluster. */
#ifndef BLOCKPORT_QCOW2_SET_BACKING_H
#define BLOCKPORT_QCOW2_SET_BACKING_H

#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

struct bd;

/* Into OUT (CSIZE bytes): the header cluster OLD (CSIZE bytes, parsed into
 * H) naming NAME as backing file, of format FMT (NULL: no backing format
 * extension); NAME NULL: no backing file.  *BITMAPS_POS: where the
 * bitmaps extension's data now is (0 without one).  0, -EINVAL (NAME
 * longer than QEMU allows, or a malformed extension) or -ENOSPC (it does
 * not fit the cluster). */
int qcow2_header_set_backing(const uint8_t *old, size_t csize,
                             const struct qcow2_header *h, const char *name,
                             const char *fmt, uint8_t *out,
                             uint32_t *bitmaps_pos);

/* The same on BD, a qcow2 image opened for writing, with no request in
 * flight: written once its pending metadata is.  0, or -errno (-ENOTSUP:
 * not a qcow2 image; -EINVAL: also a backing file for a raw external data
 * file) with a message in bd_errmsg(). */
int qcow2_change_backing(struct bd *bd, const char *name, const char *fmt);

#endif
