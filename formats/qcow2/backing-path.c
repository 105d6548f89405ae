/* SPDX-License-Identifier: BSD-3-Clause */
/* The backing file name relative to the image, and the format of a backing
 * source (see backing-path.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backing-path.h"
#include "core/blockdev.h"
#include "core/open.h"
#include "formats/probe.h"

char *qcow2_backing_path(const char *image, const char *name) {
  const char *slash = strrchr(image, '/');
  char *out = NULL;
  /* A URI has no directory to be relative to. */
  if (name[0] == '/' || !slash || bd_spec_is_backing_source(name))
    out = strdup(name);
  else if (asprintf(&out, "%.*s%s", (int)(slash - image + 1), image, name) < 0)
    out = NULL;
  if (!out)
    bd_set_error("out of memory");
  return out;
}

const char *qcow2_source_backing_format(struct bd *b, const char *declared) {
  const char *fmt = declared && declared[0] ? declared : NULL;
  if (!fmt) {
    uint8_t head[PROBE_HEAD];
    size_t n = b->size < sizeof head ? (size_t)b->size : sizeof head;
    int r = bd_pread(b, head, n, 0);
    if (r < 0) {
      bd_set_error("probing its format: %s", strerror(-r));
      return NULL;
    }
    fmt = probe_format(head, n, NULL);
  }
  if (strcmp(fmt, "raw")) {
    bd_set_error("%s %s image: a source's data opens only as a raw image%s",
                 declared && declared[0] ? "declared a" : "its data is a", fmt,
                 strcmp(fmt, "qcow2") ? ""
                                      : " (serve the qcow2 image decoded, "
                                        "as blockport serve does by default)");
    return NULL;
  }
  return fmt;
}
