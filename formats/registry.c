/* SPDX-License-Identifier: BSD-3-Clause */
/* The table of formats (registry.h).  Sources a spec names come first, so
 * that null:SIZE opens the null device whatever --format says (a file
 * with such a name is given as ./null:SIZE). */
#include "registry.h"

#include "core/open.h"
#include "formats.h"
#include "rbd-spec.h"

static const struct bd_format null_format = {
    .name = "null",
    .matches = null_is_spec,
    .usage = "a size: use null:SIZE",
    .open = null_open,
};

static const struct bd_format memory_format = {
    .name = "memory",
    .matches = memory_is_spec,
    .usage = "a size: use memory:SIZE",
    .open = memory_open,
};

static const struct bd_format nbd_format = {
    .name = "nbd",
    .matches = nbdsrc_is_uri,
    .option_keys = (const char *const[]){NBD_OPTION_KEYS, NULL},
    .open = nbdsrc_open,
    .backing = true,
};

/* Not a backing source: an image file naming rbd:...:keyring=... would
 * reach whatever cluster the host has credentials for. */
static const struct bd_format rbd_format = {
    .name = "rbd",
    .matches = rbd_spec_matches,
    .option_keys = (const char *const[]){RBD_OPTION_KEYS, NULL},
    .usage = "an RBD image: use rbd:POOL/IMAGE[@SNAP]",
    .open = rbd_source_open,
};

static const struct bd_format plugin_format = {
    .name = "nbdkit",
    .matches = plugin_is_spec,
    .option_keys = (const char *const[]){PLUGIN_OPTION_KEYS, NULL},
    .open = plugin_source_open,
};

const struct bd_format *const formats_registry[] = {
    &null_format,   &memory_format, &nbd_format,    &rbd_format,
    &plugin_format, &formats_raw,   &formats_qcow2, NULL,
};
