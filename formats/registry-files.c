/* SPDX-License-Identifier: BSD-3-Clause */
/* The image-file formats of the table (registry.h): raw and qcow2, and the
 * probe that tells them (and the formats blockport refuses) apart.  A file
 * of its own so that a program that opens only image files (the qcow2
 * fuzzers) links neither libnbd nor the plugin host. */
#include "registry.h"

#include <errno.h>

#include "core/open.h"
#include "formats.h"
#include "probe.h"

int formats_probe(const char *path, const char **format) {
  int r = probe_file(path, format);
  if (r < 0)
    return r;
  if (!probe_supported(*format)) {
    probe_set_unsupported_error(path, *format);
    return -ENOTSUP;
  }
  return 0;
}

/* raw carries the probe: what a file is when no other magic is found. */
const struct bd_format formats_raw = {
    .name = "raw",
    .probe = formats_probe,
    .probe_fallback = true,
    .open = raw_open,
};

const struct bd_format formats_qcow2 = {
    .name = "qcow2",
    .option_keys = (const char *const[]){QCOW2_OPTION_KEYS, NULL},
    .open = qcow2_open,
    .filter = qcow2_filters,
};

const struct bd_format *const formats_files[] = {&formats_raw, &formats_qcow2,
                                                 NULL};
