/* SPDX-License-Identifier: BSD-3-Clause */
/* Constructors of the sources blockport can open.  Each returns a struct bd
 * (see core/blockdev.h) or NULL with a message set by bd_set_error(). */
#ifndef BLOCKPORT_FORMATS_H
#define BLOCKPORT_FORMATS_H

#include <stdbool.h>
#include <stdint.h>

struct bd;

/* FLAGS: BD_OPEN_* (core/blockdev.h). */
struct bd *raw_open(const char *path, unsigned flags);
struct bd *null_open(const char *size);
struct bd *memory_open(const char *size);
/* nbd://, nbd+unix://, nbds:// and nbds+unix:// URIs, through libnbd. */
bool nbdsrc_is_uri(const char *spec);
struct bd *nbdsrc_open(const char *uri, bool readonly);
/* Options of each NBD source opened from now on.  Connections: 0 means 4
 * when the server advertises multi-conn, otherwise 1; more than 1 on a
 * server without multi-conn is refused with a warning, using 1 (at most
 * 16).  Timeout: seconds a request may wait for a lost server
 * (reconnecting) before failing with EIO, and how long a connection with
 * requests in flight may hear nothing before it counts as lost; 0 waits
 * forever. */
extern unsigned nbd_source_connections;
extern unsigned nbd_source_timeout;
/* nbdkit plugins (formats/plugin.c).  A plugin's spec is built by
 * plugin_spec() from its name or path and its key=value parameters, as
 * `--plugin NAME key=value...` gives them: "nbdkit:" then the fields
 * separated by PLUGIN_SPEC_SEP.  NULL when out of memory. */
#define PLUGIN_SPEC_PREFIX "nbdkit:"
#define PLUGIN_SPEC_SEP '\x1f'
char *plugin_spec(const char *plugin, char *const *params, int n);
bool plugin_is_spec(const char *spec);
struct bd *plugin_source_open(const char *spec, bool readonly);
/* -D NAME.FLAG=N: set the plugin's global int NAME_debug_FLAG when it
 * loads.  ARG must outlive the load.  Returns 0 or -EINVAL (message in
 * bd_errmsg()). */
int plugin_add_debug_flag(const char *arg);
struct bd *qcow2_open(const char *path, unsigned flags);
/* L2 cache of each qcow2 image opened from now on, in bytes. */
extern uint64_t qcow2_l2_cache_bytes;

#endif
