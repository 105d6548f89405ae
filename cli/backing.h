/* SPDX-License-Identifier: BSD-3-Clause */
/* A new image's backing file, opened as the image will open it: what
 * `create -b` and `convert -B` check before they write. */
#ifndef BLOCKPORT_CLI_BACKING_H
#define BLOCKPORT_CLI_BACKING_H

#include "core/blockdev.h"

/* Open NAME, the backing file of the image IMAGE, read-only: a relative
 * file name from IMAGE's directory, a source spec (an NBD URI) through the
 * format table with its data format checked.  *FMT is the declared format
 * or NULL, and is set to the format found.  *PATH gets the name as opened
 * (free it).  Returns the device, or NULL with the reason in bd_errmsg(). */
struct bd *cli_open_backing(const char *image, const char *name,
                            const char **fmt, char **path);

#endif
