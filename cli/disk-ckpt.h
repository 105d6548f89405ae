/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket of vhost and mount (--control), with the checkpoint
 * verbs of server/checkpoints.h on their one disk, the default export ""
 * (views "@NAME"), and with --views-unix the view server that serves the
 * views over NBD (server/view-server.h). */
#ifndef BLOCKPORT_CLI_DISK_CKPT_H
#define BLOCKPORT_CLI_DISK_CKPT_H

#include <stdbool.h>

struct bd;
struct cli_common;
struct checkpoints;
struct view_server;

struct disk_ckpt {
  struct view_server *vs;
  struct checkpoints *cp;
  char hint[160]; /* checkpoint without --views-unix: what to add */
};

/* Nothing without co->control.  With it and co->views_unix, *BD (opened
 * writable) is replaced by a live device wrapping it (core/checkpoint.h)
 * and the view server starts; then the control socket.  READONLY: the
 * disk refuses writes (checkpoint answers EROFS).  0, or -1 (logged;
 * *BD is then the caller's to close, wrapped or not). */
int disk_ckpt_start(struct disk_ckpt *d, const struct cli_common *co,
                    struct bd **bd, bool readonly);
/* The control socket, then the view server (its clients ended, the views
 * closed); before the disk is closed. */
void disk_ckpt_stop(struct disk_ckpt *d);

#endif
