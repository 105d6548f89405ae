/* SPDX-License-Identifier: BSD-3-Clause */
/* A new image's backing file, opened as the image will open it
 * (backing.h). */
#include <stdlib.h>

#include "formats/qcow2/backing-path.h"

#include "backing.h"
#include "core/open.h"

struct bd *cli_open_backing(const char *image, const char *name,
                            const char **fmt, char **path) {
  *path = qcow2_backing_path(image, name);
  if (!*path)
    return NULL;
  bool source = bd_spec_is_backing_source(*path);
  if (!*fmt && !source)
    *fmt = bd_probe_format(*path);
  struct bd *b = bd_open(*path, source ? NULL : *fmt, true);
  if (b && source && !(*fmt = qcow2_source_backing_format(b, *fmt))) {
    bd_close(b);
    b = NULL;
  }
  return b;
}
