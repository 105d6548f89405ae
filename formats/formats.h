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
/* nbd://, nbd+unix://, nbds:// and nbds+unix:// URIs, through libnbd;
 * O->nbd_connections and O->nbd_timeout as core/blockdev.h says.  More
 * connections than one on a server without multi-conn are refused with a
 * warning, using one. */
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
/* O->plugin_debug: -D NAME.FLAG=N, each setting the plugin's global int
 * NAME_debug_FLAG when it loads. */
struct bd *plugin_source_open(const char *spec, const struct bd_open_opts *o);
/* Whether ARG is a -D NAME.FLAG=N setting: 0, or -EINVAL with a message in
 * bd_errmsg(); for command lines to refuse a bad one at once. */
int plugin_check_debug_flag(const char *arg);
/* O->qcow2_l2_cache: per image of the chain; 0: QCOW2_L2_CACHE_DEFAULT. */
/* Ceph RBD images, rbd:POOL/IMAGE[@SNAP][:KEY=VALUE]... (rbd-spec.h),
 * through librbd; O->rbd_timeout and O->rbd_lock as core/blockdev.h
 * says. */
struct bd *rbd_source_open(const char *spec, const struct bd_open_opts *o);
struct bd *qcow2_open(const char *path, const struct bd_open_opts *o);
/* The filters O asks for over BD, an opened qcow2 image: copy-on-read
 * (formats/qcow2/copy-on-read.c). */
struct bd *qcow2_filters(struct bd *bd, const struct bd_open_opts *o);
/* 32 MiB maps 256 GiB of 64 KiB clusters. */
#define QCOW2_L2_CACHE_DEFAULT (32u * 1024 * 1024)

#endif
