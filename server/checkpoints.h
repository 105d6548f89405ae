/* SPDX-License-Identifier: BSD-3-Clause */
/* The checkpoint verbs of a server's control socket (checkpoints.c). */
#ifndef BLOCKPORT_CHECKPOINTS_H
#define BLOCKPORT_CHECKPOINTS_H

struct server;
struct ctl_server;

/* The control socket at PATH, with the verbs checkpoint, release and list
 * on SRV.  NULL with bd_errmsg() saying why. */
struct ctl_server *checkpoints_start(struct server *srv, const char *path);

#endif
