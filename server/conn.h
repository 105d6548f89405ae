/* SPDX-License-Identifier: BSD-3-Clause */
/* Internals of one NBD connection, shared by conn.c (reading and
 * dispatching requests), reply.c (laying out replies) and send.c (the
 * reply queue, send.h).  Not for use outside server/. */
#ifndef BLOCKPORT_CONN_H
#define BLOCKPORT_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "core/blockdev.h"
#include "exports.h"
#include "send.h"
#include "server.h"
#include "wire.h"

#define READ_MAX_RUNS 32 /* chunks in one read reply */
#define REQ_MAX_IOV (2 * READ_MAX_RUNS + 2)
#define REQ_HDR_SPACE (READ_MAX_RUNS * 48 + 256)
#define BS_MAX_EXTENTS 16384 /* descriptors per context */
/* ... of an export's own context (a bitmap, from memory): as many as
 * qemu-nbd sends (1 MiB of descriptors), so a walk takes as few trips. */
#define BS_MAX_PART_EXTENTS 131072

/* Block status of one of an export's own contexts (a dirty bitmap),
 * asked of the device beside the request's allocation extents. */
struct bs_part {
  struct bd_req bdr; /* first: completions find it */
  struct nreq *n;
  struct bd_extents ext;
};

/* One request from the moment its header is parsed until its reply has
 * been sent.  The struct bd_req comes first so completions can find it. */
struct nreq {
  struct bd_req bdr;
  struct conn *c;
  struct wire_request r;
  uint32_t error;     /* NBD error to answer with, when nonzero */
  const char *errmsg; /* static text for protocol errors */
  uint64_t cost;      /* bytes counted against the in-flight limit */
  uint64_t t0;        /* ns (monotonic) when it arrived, with --metrics */
  bool failed;        /* answered with an error, for the metrics */
  uint8_t *buf;       /* read or write data */
  size_t bufcap;
  uint64_t have;     /* write payload received so far */
  unsigned ctx_mask; /* block status: contexts to answer */
  struct bd_extents ext;
  /* Block status: parts[i] for context HS_CTX_EXTRA + i (allocated on
   * first use); device requests still running, and the first error. */
  struct bs_part *parts;
  unsigned pending;
  int part_err;
  uint8_t *extra; /* block status descriptors, error text */
  size_t extracap;
  /* The reply, as an iovec over hdr, buf and extra. */
  uint8_t hdr[REQ_HDR_SPACE];
  struct iovec iov[REQ_MAX_IOV];
  int niov;
  size_t total, sent;
  struct nreq *next;
};

/* Who touches what: the connection thread owns the fields above
 * "Input" before transmission starts, and everything under "Input";
 * after that the fields above it are read-only, for the threads that
 * send replies too (send.h). */
struct conn {
  int fd;
  int wakefd; /* eventfd: completions wake the connection thread */
  unsigned id;
  char peer[80];
  struct server *srv;
  struct sockaddr_storage addr; /* the client's, for per-export allow lists */
  struct export_set *set;       /* the exports it negotiated with */
  struct export *exp;           /* its choice, in set */
  struct bd_conn *bconn;        /* the device's per-connection state */
  struct wire_tx tx;
  bool ctx_base, ctx_depth;
  uint32_t ctx_extra; /* bit i: context HS_CTX_EXTRA + i */
  struct conn *next;  /* in srv->conns */
  /* After STARTTLS every byte goes through the session. */
  struct tls_session *tls;

  /* Input, touched only by the connection thread. */
  uint8_t *rbuf;
  size_t rstart, rend, rcap;
  struct nreq *cur;     /* receiving its payload */
  uint64_t discard;     /* payload bytes to skip after a rejected request */
  struct nreq *refused; /* that request: answered once its payload is
                         * skipped (libnbd drops a reply that arrives
                         * while it still sends the request) */
  bool eof;             /* no more requests will be read */
  bool held;            /* process_input() stopped at the budget with
                         * input left in rbuf */
  unsigned spin;        /* reads to try before sleeping (spin_read()) */
  int64_t hs_deadline;  /* ms (monotonic): the handshake's end, 0: none */
  bool hs_timed_out;    /* ... and it passed (counted once) */
  int64_t last_input;   /* ms (monotonic): when a request last arrived */

  /* Everything below is guarded by lock. */
  pthread_mutex_t lock;
  /* The budget: taken by the connection thread, given back by whoever
   * sends or drops the reply (conn_release_locked()). */
  unsigned inflight;
  uint64_t inflight_bytes;
  struct nreq *freelist;
  /* Output: the reply queue, its own object (send.h); its shared fields
   * are guarded by lock too. */
  struct sender out;
  /* Waking the connection thread: set by it before it sleeps (or by
   * whoever must have it look again), cleared by conn_wake_locked(). */
  bool waiting;         /* the connection thread wants a wake-up */
  bool wake_on_release; /* ... also when a finished request frees budget */
  /* Shutdown: set by the server's thread (conn_begin_shutdown()), read
   * by the connection thread. */
  bool transmitting; /* past the handshake */
  bool closing;      /* server shutdown: new requests get ESHUTDOWN */
};

/* conn.c, for send.c: with the lock held. */
void conn_release_locked(struct conn *c, struct nreq *n);
void conn_wake_locked(struct conn *c);

/* reply.c */
void reply_build(struct nreq *n, int err);
void reply_error(struct nreq *n, uint32_t nbd_err, const char *msg);

#endif
