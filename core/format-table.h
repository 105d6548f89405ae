/* SPDX-License-Identifier: BSD-3-Clause */
/* The installed table of formats, as bd_open_with() consults it (the
 * table itself is formats/registry.c's; core/open.h says how it is
 * installed). */
#ifndef BLOCKPORT_FORMAT_TABLE_H
#define BLOCKPORT_FORMAT_TABLE_H

#include <stdbool.h>

#include "open.h"

/* Whether a program installed a table. */
bool bd_formats_installed(void);
/* The entry that opens SPEC: the first whose matcher accepts it, else the
 * one named by O->format or found by the probe (which then adds
 * BD_OPEN_PROBED to O->flags).  NULL with a message in bd_errmsg(). */
const struct bd_format *bd_format_for(const char *spec, struct bd_open_opts *o);

#endif
