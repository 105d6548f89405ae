/* SPDX-License-Identifier: BSD-3-Clause */
/* The checkpoint verbs of a control socket (checkpoints.c): checkpoint,
 * release and list, for `serve` (the exports of its own server) and for
 * `vhost` and `mount` (their one disk, its views served by a view server,
 * view-server.h).  What differs between them is a struct ckpt_host: where
 * the live devices are and which server the views become exports of. */
#ifndef BLOCKPORT_CHECKPOINTS_H
#define BLOCKPORT_CHECKPOINTS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/checkpoint.h"

struct bd;
struct device;
struct server;

/* An export that may take checkpoints, as a host finds it. */
struct ckpt_export {
  const char *name;    /* "" the default export's (command line) */
  struct bd *bd;       /* a live device (ckpt_live_open()) takes them */
  struct device *base; /* what its views keep open in VIEWS; NULL: none */
  bool readonly;       /* refuses writes (EROFS) */
  bool is_view;        /* a checkpoint's view: takes none */
  bool is_default;     /* also reached as "" */
};

struct ckpt_host {
  /* The server whose exports the views become (they are added to every
   * set it builds); NULL: views cannot be served, `checkpoint` fails. */
  struct server *views;
  struct ckpt_opts ckpt; /* for list: the fleece limit and directory */
  /* Appended to the message of a checkpoint of a device that is not live
   * (ENOTSUP): what to start the command with instead. */
  const char *hint;
  /* The exports: GET fills *V (*N of them) as they are now, valid until
   * PUT(H, *V, *HOLD); 0 or -ENOMEM.  GET NULL: the one export DISK. */
  int (*get)(const struct ckpt_host *h, struct ckpt_export **v, size_t *n,
             void **hold);
  void (*put)(const struct ckpt_host *h, struct ckpt_export *v, void *hold);
  void *opaque;
  struct ckpt_export disk;
};

struct checkpoints;

/* The control socket at PATH, with the verbs checkpoint, release and list
 * on the exports of H (copied).  NULL with bd_errmsg() saying why. */
struct checkpoints *checkpoints_start(const struct ckpt_host *h,
                                      const char *path);
/* Stop taking commands (one running finishes first).  NULL: a no-op. */
void checkpoints_stop(struct checkpoints *c);

/* serve's host: the exports of SRV's current set, views added to SRV. */
struct ckpt_host checkpoints_serve_host(struct server *srv);

#endif
