/* SPDX-License-Identifier: BSD-3-Clause */
/* Plugin specs and -D flags as the command lines write them (formats.h):
 * plain strings, so that a build without the plugin host (formats/
 * plugin-none.c) still knows a plugin spec when it sees one, and says it
 * cannot open it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats.h"

int plugin_check_debug_flag(const char *arg) {
  const char *dot = strchr(arg, '.'), *eq = strchr(arg, '=');
  if (!dot || !eq || dot == arg || eq < dot + 2 || !eq[1]) {
    bd_set_error("-D %s: expected NAME.FLAG=N", arg);
    return -EINVAL;
  }
  return 0;
}

char *plugin_spec(const char *plugin, char *const *params, int n) {
  size_t len = strlen(PLUGIN_SPEC_PREFIX) + strlen(plugin) + 1;
  for (int i = 0; i < n; i++)
    len += strlen(params[i]) + 1;
  char *s = malloc(len);
  if (!s)
    return NULL;
  char *p = stpcpy(stpcpy(s, PLUGIN_SPEC_PREFIX), plugin);
  for (int i = 0; i < n; i++) {
    *p++ = PLUGIN_SPEC_SEP;
    p = stpcpy(p, params[i]);
  }
  return s;
}

bool plugin_is_spec(const char *spec) {
  return strncmp(spec, PLUGIN_SPEC_PREFIX, strlen(PLUGIN_SPEC_PREFIX)) == 0;
}
