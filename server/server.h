/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD server: exports, connections, and the settings they share. */
#ifndef BLOCKPORT_SERVER_H
#define BLOCKPORT_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/blockdev.h"
#include "handshake.h"

struct bd;
struct conn;
struct device;
struct export_set;
struct metrics;

struct server_limits {
  unsigned max_connections;
  unsigned max_requests; /* in flight per connection */
  uint64_t max_bytes;    /* payload bytes in flight per connection */
  unsigned handshake_ms; /* the whole handshake, 0: no limit */
  unsigned idle_ms;      /* nothing in flight and nothing received, 0: no
                          * limit */
};

struct server {
  struct server_limits limits;
  struct acl_rule *allow; /* --allow: TCP clients admitted, none: all */
  size_t nallow;
  enum hs_tls tls;         /* --tls */
  struct metrics *metrics; /* --metrics, NULL: not collected */

  pthread_mutex_t lock;
  struct tls_creds *tls_creds; /* when tls is not HS_TLS_OFF; a reload
                                * swaps them (tls.h) */
  struct export_set *current;  /* what new clients get (exports.h) */
  unsigned generation;         /* of current: one more per reload */
  struct device *devices;      /* images some set uses */
  pthread_cond_t cond;         /* signalled when a connection ends */
  struct conn *conns;          /* live connections */
  unsigned nconns;
  unsigned next_id;
  bool shutting_down;
  unsigned grace_ms; /* see conn_begin_shutdown() */
};

/* Take over FD (an accepted socket from ADDR) and serve it on a new
 * thread.  Returns false (and closes FD) if the connection could not be
 * started. */
bool conn_start(struct server *srv, int fd, const char *peer,
                const struct sockaddr_storage *addr);
/* Stop reading from every connection (HOW as for shutdown(2)). */
void conn_shutdown_all(struct server *srv, int how);
/* Server shutdown as the NBD spec asks: connections still negotiating are
 * cut; in transmission, requests in flight finish, later ones are answered
 * NBD_ESHUTDOWN (the client then disconnects and may retry elsewhere), and
 * each connection closes when its client leaves or after GRACE_MS. */
void conn_begin_shutdown(struct server *srv, unsigned grace_ms);

#endif
