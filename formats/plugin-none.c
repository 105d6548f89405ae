/* SPDX-License-Identifier: BSD-3-Clause */
/* The nbdkit plugin source in a build without the plugin host
 * (BLOCKPORT_PLUGINS=OFF), compiled instead of plugin.c: a plugin spec
 * is still recognised, and refused. */
#include <stddef.h>

#include "core/features.h"
#include "core/open.h"
#include "formats.h"

struct bd *plugin_source_open(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  (void)o;
  feature_missing(FEATURE_PLUGINS);
  return NULL;
}

const char *plugin_dir(void) {
  return NULL;
}
