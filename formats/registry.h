/* SPDX-License-Identifier: BSD-3-Clause */
/* The formats blockport opens, as the table the core dispatches through
 * (struct bd_format, core/blockdev.h).  A program that opens sources calls
 * bd_formats_install(formats_registry) once, before it opens any. */
#ifndef BLOCKPORT_FORMATS_REGISTRY_H
#define BLOCKPORT_FORMATS_REGISTRY_H

#include "core/blockdev.h"
#include "core/open.h"

/* null:SIZE, memory:SIZE, NBD URIs and plugin specs by their spec; raw
 * and qcow2 by name or by probing.  NULL-terminated. */
extern const struct bd_format *const formats_registry[];

/* Image files only: raw and qcow2 (formats/registry-files.c), for
 * programs that open nothing else. */
extern const struct bd_format *const formats_files[];
extern const struct bd_format formats_raw, formats_qcow2;

/* The table's probe: the format of the image file at PATH by its content,
 * refusing by name a format blockport does not open (struct bd_format's
 * probe). */
int formats_probe(const char *path, const char **format);

#endif
