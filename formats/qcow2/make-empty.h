/* SPDX-License-Identifier: BSD-3-Clause */
/* Emptying a qcow2 image after `commit`: every cluster of it let go, so
 * that it reads through to its backing file again, as QEMU's
 * bdrv_make_empty() does for qcow2. */
#ifndef BLOCKPORT_QCOW2_MAKE_EMPTY_H
#define BLOCKPORT_QCOW2_MAKE_EMPTY_H

struct bd;

/* BD: a qcow2 image opened for writing (BD_OPEN_NO_BACKING will do), with
 * no request in flight.  A version 3 image without snapshots, bitmaps or
 * an external data file is reset whole (header cluster, a new refcount
 * table and block, an empty L1 table; the file truncated after them), as
 * QEMU does; any other has every cluster unmapped.  BD may only be closed
 * afterwards.  0, or -errno with a message in bd_errmsg() (-ENOTSUP: BD is
 * not a qcow2 image). */
int qcow2_make_empty(struct bd *bd);

#endif
