/* SPDX-License-Identifier: BSD-3-Clause */
/* Constructors of the sources blockport can open: the entries of the
 * format table (registry.c); programs open through bd_open_with().  Each
 * returns a struct bd (see core/blockdev.h) or NULL with a message set by
 * bd_set_error(). */
#ifndef BLOCKPORT_FORMATS_H
#define BLOCKPORT_FORMATS_H

#include <stdbool.h>
#include <stdint.h>

struct bd;
struct bd_open_opts;

/* Each opens SPEC as O says (O->flags: BD_OPEN_*, core/blockdev.h). */
struct bd *raw_open(const char *path, const struct bd_open_opts *o);
/* "null:SIZE" and "memory:SIZE". */
bool null_is_spec(const char *spec);
struct bd *null_open(const char *spec, const struct bd_open_opts *o);
bool memory_is_spec(const char *spec);
struct bd *memory_open(const char *spec, const struct bd_open_opts *o);
/* nbd://, nbd+unix://, nbds:// and nbds+unix:// URIs, through libnbd.
 * Options (NBD_OPTION_KEYS): connections=N (0-16; 0, the default: 4 when
 * the server advertises multi-conn, else 1; more than one on a server
 * without multi-conn is refused with a warning, using one), timeout=S
 * (seconds a request may wait for a lost server before failing with EIO;
 * 0 waits forever), replay-limit=SIZE (acknowledged writes kept until a
 * flush covers them, sent again to a server that restarted; 0 keeps
 * none). */
#define NBD_OPTION_KEYS "connections", "timeout", "replay-limit"
#define NBD_CONNECTIONS_MAX 16
#define NBD_TIMEOUT_DEFAULT 30
#define NBD_REPLAY_LIMIT_DEFAULT (64ull << 20)
bool nbdsrc_is_uri(const char *spec);
struct bd *nbdsrc_open(const char *uri, const struct bd_open_opts *o);
/* nbdkit plugins (formats/plugin.c).  A plugin's spec is built by
 * plugin_spec() from its name or path and its key=value parameters, as
 * `--plugin NAME key=value...` gives them: "nbdkit:" then the fields
 * separated by PLUGIN_SPEC_SEP.  NULL when out of memory. */
#define PLUGIN_SPEC_PREFIX "nbdkit:"
#define PLUGIN_SPEC_SEP '\x1f'
char *plugin_spec(const char *plugin, char *const *params, int n);
bool plugin_is_spec(const char *spec);
/* Options: debug=NAME.FLAG=N (repeatable, as nbdkit's -D), each setting
 * the plugin's global int NAME_debug_FLAG when it loads. */
#define PLUGIN_OPTION_KEYS "debug"
struct bd *plugin_source_open(const char *spec, const struct bd_open_opts *o);
/* Whether ARG is a -D NAME.FLAG=N setting: 0, or -EINVAL with a message in
 * bd_errmsg(); for command lines to refuse a bad one at once. */
int plugin_check_debug_flag(const char *arg);
/* Where a plugin named without a path is looked for (nbdkit's plugindir),
 * NULL in a build without the plugin host. */
const char *plugin_dir(void);
/* Ceph RBD images, rbd:POOL/IMAGE[@SNAP][:KEY=VALUE]... (rbd-spec.h),
 * through librbd.  Options: timeout=S (seconds a cluster operation may
 * take before failing with EIO; 0 waits forever), lock=MODE (what opening
 * for writing does when another client holds the exclusive lock: fail,
 * wait for it, or none: take no lock, as QEMU; RBD_LOCK_MODES). */
#define RBD_OPTION_KEYS "timeout", "lock"
#define RBD_TIMEOUT_DEFAULT 30
#define RBD_LOCK_MODES "fail", "wait", "none"
struct bd *rbd_source_open(const char *spec, const struct bd_open_opts *o);
struct bd *qcow2_open(const char *path, const struct bd_open_opts *o);
/* The filters O asks for over BD, an opened qcow2 image: copy-on-read
 * (formats/qcow2/copy-on-read.c). */
struct bd *qcow2_filters(struct bd *bd, const struct bd_open_opts *o);
/* Options: l2-cache-size=SIZE, the L2 cache of each image of the chain,
 * at least QCOW2_L2_CACHE_MIN; 32 MiB maps 256 GiB of 64 KiB clusters.
 * snapshot=ID_OR_NAME, or snapshot.id=ID and/or snapshot.name=NAME: the
 * image (opened read-only) as that internal snapshot holds it. */
#define QCOW2_OPTION_KEYS                                                      \
  "l2-cache-size", "snapshot", "snapshot.id", "snapshot.name"
#define QCOW2_L2_CACHE_DEFAULT (32u * 1024 * 1024)
#define QCOW2_L2_CACHE_MIN (64u * 1024)

#endif
