/* SPDX-License-Identifier: BSD-3-Clause */
/* Rebuilding the first cluster of a qcow2 image (header, extensions,
 * backing file name) from a changed header, as an update of its version,
 * features or data file name needs it: pure, for the unit tests. */
#ifndef BLOCKPORT_QCOW2_HEADER_BUILD_H
#define BLOCKPORT_QCOW2_HEADER_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

/* OUT (CSIZE bytes, the image's cluster size) gets the first cluster of
 * an image whose header is H: version 2 (72 bytes) or 3 (112 bytes, with
 * the feature name table when it fits), the backing format and data file
 * extensions from H, the bitmaps extension when H has bitmaps, every
 * extension of OLD (LEN bytes, the current first cluster, parsed as
 * H_OLD) of a type it does not know, and the backing file name of OLD.
 * Returns 0, or -EFBIG when it does not fit in one cluster (a reason in
 * bd_errmsg()). */
int qcow2_build_header(const struct qcow2_header *h,
                       const struct qcow2_header *h_old, const uint8_t *old,
                       size_t len, uint8_t *out, size_t csize);

#endif
