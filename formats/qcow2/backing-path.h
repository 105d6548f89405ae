/* SPDX-License-Identifier: BSD-3-Clause */
/* Where a qcow2 image's backing file (or external data file) is: its name
 * taken relative to the image's directory, as QEMU's path_combine() takes
 * it.  One resolver for the source, `info` and `create`. */
#ifndef BLOCKPORT_QCOW2_BACKING_PATH_H
#define BLOCKPORT_QCOW2_BACKING_PATH_H

/* NAME as seen from the image at IMAGE: NAME itself when absolute, when
 * IMAGE has no directory part or when NAME is a source spec of the
 * installed formats (an NBD URI: bd_spec_is_backing_source()), else IMAGE's
 * directory (up to its last '/') followed by NAME.  Returns a string to free,
 * or NULL with "out of memory" in bd_errmsg(). */
char *qcow2_backing_path(const char *image, const char *name);

struct bd;

/* The format of backing file B, opened from a source spec (an NBD URI),
 * given DECLARED (the image's backing format, "" or NULL for none): a
 * source's data can only be a raw image here (qcow2 reads a file), so
 * "raw" declared is taken on trust, none is probed from B's first sector,
 * and anything else is refused.  Returns "raw", or NULL with a message in
 * bd_errmsg(). */
const char *qcow2_source_backing_format(struct bd *b, const char *declared);

#endif
