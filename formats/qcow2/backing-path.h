/* SPDX-License-Identifier: BSD-3-Clause */
/* Where a qcow2 image's backing file (or external data file) is: its name
 * taken relative to the image's directory, as QEMU's path_combine() takes
 * it.  One resolver for the source, `info` and `create`. */
#ifndef BLOCKPORT_QCOW2_BACKING_PATH_H
#define BLOCKPORT_QCOW2_BACKING_PATH_H

/* NAME as seen from the image at IMAGE: NAME itself when absolute or when
 * IMAGE has no directory part, else IMAGE's directory (up to its last '/')
 * followed by NAME.  Returns a string to free, or NULL with "out of memory"
 * in bd_errmsg(). */
char *qcow2_backing_path(const char *image, const char *name);

#endif
