/* SPDX-License-Identifier: BSD-3-Clause */
/* A view server: an NBD server, on a Unix socket and a thread of its own,
 * that serves only the read-only exports given to it at run time (the
 * checkpoint views of a vhost or mount, which serve their disk another
 * way).  It is a struct server like serve's (handshake, connections,
 * export sets, meta contexts) whose configuration has no exports: its
 * sets hold its views alone, NBD_OPT_LIST lists them, there is no default
 * export. */
#ifndef BLOCKPORT_VIEW_SERVER_H
#define BLOCKPORT_VIEW_SERVER_H

#include <stddef.h>

struct bd;
struct server;
struct view_server;

/* Listen on the Unix socket UNIX_PATH (mode 0600; a stale socket there is
 * replaced, a live one or anything else refused) and serve from a thread.
 * Needs the worker pool (bd_pool_start()) until view_server_stop().  NULL
 * with bd_errmsg() saying why. */
struct view_server *view_server_start(const char *unix_path);
/* Serve VIEW (taken: closed with the last client using it once removed)
 * as the read-only export NAME, offering base:allocation and its named
 * contexts CTX (N, in the order VIEW numbers them).  0, -ENOMEM or -EIO
 * (VIEW closed). */
int view_server_add(struct view_server *vs, const char *name, struct bd *view,
                    const char *const *ctx, size_t n);
/* Stop offering NAME (clients using it keep it until they leave).  0 or
 * -ENOENT. */
int view_server_remove(struct view_server *vs, const char *name);
/* The server the views are exports of (for a struct ckpt_host); NULL for
 * VS NULL. */
struct server *view_server_srv(struct view_server *vs);
/* Stop listening, end the connections (as serve's shutdown does), close
 * every view and remove the socket.  NULL: a no-op. */
void view_server_stop(struct view_server *vs);

#endif
