/* SPDX-License-Identifier: BSD-3-Clause */
/* vhost-user-blk: the virtio-blk device core (virtio-blk.h) served to a
 * front end such as QEMU over a vhost-user Unix socket (qemu/qemu
 * docs/interop/vhost-user.rst).
 *
 * One front end at a time.  Features and protocol features (MQ,
 * REPLY_ACK, CONFIG, INFLIGHT_SHMFD), the memory table (each region
 * mapped with its mmap offset), ring setup, kick and call eventfds,
 * GET_CONFIG, stop through GET_VRING_BASE; a thread per started queue.
 * When the front end goes away, the requests in flight finish, the device
 * is reset and the next front end is accepted on the same socket.  When
 * blockport itself restarts under a running QEMU (reconnect=1), the
 * requests in flight are resubmitted from the inflight region QEMU hands
 * back. */
#ifndef BLOCKPORT_VHOST_USER_H
#define BLOCKPORT_VHOST_USER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/blockdev.h"

#define VHU_MAX_QUEUES 64

struct vhu_options {
  const char *socket_path;
  unsigned queues; /* the most the front end may use */
  bool readonly;
  const char *serial; /* GET_ID (NULL: "blockport") */
  bool once;          /* return after the first front end leaves */
  /* --metrics: where the guest's requests are counted, or NULL */
  struct metrics_reqs *reqs;
};

/* A socket listening at PATH for a front end (a stale socket there, one
 * nobody answers on, is replaced), or -errno with bd_errmsg() set, naming
 * the option ("--socket PATH: ..."). */
int vhu_listen(const char *path);
/* Close LSOCK and remove its socket file PATH. */
void vhu_unlisten(int lsock, const char *path);

/* Serve BD to the front ends that connect to LSOCK (vhu_listen()'s on
 * o->socket_path, taken: closed and its file removed on return) until
 * STOP_FD becomes readable (a signalfd, say).  READY, if not NULL, is
 * called once clients are accepted.  Returns 0, or -errno with
 * bd_errmsg() set. */
int vhu_serve(struct bd *bd, const struct vhu_options *o, int lsock,
              int stop_fd, void (*ready)(void *), void *opaque);

#endif
