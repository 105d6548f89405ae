/* SPDX-License-Identifier: BSD-3-Clause */
/* The backing file name relative to the image (see backing-path.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backing-path.h"
#include "core/blockdev.h"

char *qcow2_backing_path(const char *image, const char *name) {
  const char *slash = strrchr(image, '/');
  char *out = NULL;
  if (name[0] == '/' || !slash)
    out = strdup(name);
  else if (asprintf(&out, "%.*s%s", (int)(slash - image + 1), image, name) < 0)
    out = NULL;
  if (!out)
    bd_set_error("out of memory");
  return out;
}
