/* SPDX-License-Identifier: BSD-3-Clause */
/* The exports a server offers, as immutable generations.
 *
 * A configuration (the command line, or a config file read at startup and
 * on SIGHUP) becomes a struct export_set.  Each connection holds a
 * reference to the set it negotiated with, so a reload never changes what
 * a connected client uses; the set, and the images only it uses, are
 * closed after its last connection.  Images are struct devices shared by
 * every set that names the same image, so an image is never open twice. */
#ifndef BLOCKPORT_EXPORTS_H
#define BLOCKPORT_EXPORTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access.h"
#include "core/blockdev.h"
#include "core/open.h"
#include "handshake.h"

struct server;
struct config;
struct metrics_export;

/* One opened image.  Listed in srv->devices while some set uses it. */
struct device {
  struct bd *bd;
  char *key;      /* identity: see device_key() in exports.c */
  char *spec;     /* as opened, for messages */
  char *options;  /* the export's option lines, '\n'-joined; NULL: none */
  unsigned users; /* exports (of any set) naming it; under srv->lock */
  unsigned conns; /* connections using it; under srv->lock */
  /* A checkpoint view's device: the live image's device it reads, which
   * it keeps open (a user) until it closes itself. */
  struct device *base;
  struct device *next;
};

/* A checkpoint's view (server/checkpoints.c): a read-only export named
 * "EXPORT@CHECKPOINT", added to every set built while it exists, reloads
 * included.  Listed in srv->views, under srv->lock. */
struct view {
  char *name;
  struct device *dev; /* the view's device; the list holds one user */
  char **ctx_names;   /* its meta contexts beside base:allocation */
  size_t nctx;
  struct view *next;
};

struct export {
  char *name;
  char *description; /* NULL: the device's */
  struct device *dev;
  bool readonly; /* may be stricter than the device */
  bool tls_required;
  struct acl_rule *allow; /* TCP clients admitted; none: everyone */
  size_t nallow;
  struct metrics_export *mx; /* --metrics counters, or NULL */
  /* Its own meta contexts (its bitmaps, "qemu:dirty-bitmap:NAME"): the
   * handshake's context HS_CTX_EXTRA + i is the device's ctx_map[i]
   * (bd_req.context). */
  char **ctx_names;
  unsigned *ctx_map;
  size_t nctx;
};

struct export_set {
  unsigned refs; /* the server's, and each connection's; under srv->lock */
  unsigned generation;
  struct export *v;
  size_t n;
  struct hs_export *hs; /* what the handshake tells clients, as v */
  struct hs_catalog catalog;
  struct bd_export_list listed; /* an nbdkit plugin's list_exports */
};

/* How the configuration's exports are opened. */
struct exports_opts {
  const char *format; /* -f: for exports that name none */
  bool readonly;      /* -r: every export */
  bool share;         /* -U: images opened read-only lock no writer out */
  /* --readonly-export: these exports refuse writes ("" the default
   * export); a name that is no export of the set fails the build. */
  char *const *ro_names;
  size_t n_ro_names;
  bool plugin;      /* v[0] is an nbdkit plugin: add the exports it lists */
  const char *file; /* the config file, for messages; NULL: command line */
};

/* Open (or reuse from SRV's live devices) what CF declares, with the
 * source options OPEN (NULL: the defaults; its format and flags are
 * replaced by each export's).  Returns a set holding one reference, or
 * NULL with the reason in ERR; then nothing has changed. */
struct export_set *exports_build(struct server *srv, const struct config *cf,
                                 const struct exports_opts *o, char *err,
                                 size_t errlen,
                                 const struct bd_open_opts *open);
/* Make S the set new clients get, dropping the previous one.  Takes over
 * the caller's reference. */
void exports_install(struct server *srv, struct export_set *s);
/* The current set, with a reference for the caller. */
struct export_set *exports_get(struct server *srv);
/* If a newer set than *S is current, put a reference to it in *S and
 * return the old one (for the caller to exports_put() when done with it);
 * else NULL. */
struct export_set *exports_refresh(struct server *srv, struct export_set **s);
/* Drop a reference; the last one closes the images only S used.  Returns
 * -1 if an image's final flush failed (logged), else 0. */
int exports_put(struct server *srv, struct export_set *s);
/* A connection starts or stops using E's device. */
void exports_conn_begin(struct server *srv, struct export *e);
void exports_conn_end(struct server *srv, struct export *e);
/* Add a view named NAME of BASE's image: VIEW_BD, read-only, offering
 * the named contexts CTX (its bd contexts, in order).  The view takes
 * VIEW_BD and a user of BASE; sets built from now on offer it.  Returns 0
 * or -ENOMEM (VIEW_BD closed). */
int exports_add_view(struct server *srv, const char *name, struct bd *view_bd,
                     struct device *base, const char *const *ctx, size_t nctx);
/* Drop view NAME from the sets built from now on; it closes with the last
 * set (and so connection) using it.  Returns 0 or -ENOENT. */
int exports_remove_view(struct server *srv, const char *name);
/* Drop every view (at shutdown). */
void exports_remove_views(struct server *srv);
/* The view named NAME, or NULL; under srv->lock. */
struct view *exports_view_find(struct server *srv, const char *name);

/* Index of the export named NAME in S, or -1. */
int exports_find(const struct export_set *s, const char *name);

#endif
