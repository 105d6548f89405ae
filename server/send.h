/* SPDX-License-Identifier: BSD-3-Clause */
/* The sending side of one NBD connection: its reply queue and the right
 * to write the socket (send.c).  Not for use outside server/.
 *
 * Replies come from any thread: the connection thread (requests answered
 * inline, protocol errors), pool workers and pollers (completions).  At
 * most one of them holds the "sending" role at a time and writes the
 * queue out; the others append and leave.  The role is taken by
 *   - send_queue(), by whoever queues a reply and finds nobody sending,
 *     unless it runs inside a source's completion batch: then the batch
 *     keeps the role and sends once at its end (batch_hook);
 *   - send_cork() .. send_uncork(), by the connection thread while it
 *     dispatches the requests of one read, so that inline replies leave
 *     in one write;
 *   - send_writable(), by the connection thread when POLLOUT says a full
 *     socket has room again.
 * Writes never block: a full socket sets "blocked", and the connection
 * thread polls for POLLOUT (send_wants_pollout_locked()).  A failed write
 * sets "dead": queued and later replies are dropped.
 *
 * Locking: the fields marked "lock" are guarded by the connection's lock
 * (struct conn.lock), the same lock that guards its in-flight budget: a
 * reply leaving the socket gives its budget back (conn_release_locked())
 * in the same critical section.  No lock of its own, so queueing a reply
 * costs one lock round trip, as before this was its own object. */
#ifndef BLOCKPORT_SEND_H
#define BLOCKPORT_SEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/blockdev.h"

struct conn;
struct nreq;

struct sender {
  struct conn *c; /* the owner: its socket, TLS session, lock, budget */
  /* Set once by send_init(); a completing thread hands it to its batch
   * (bd_batch_defer()) while holding the sending role. */
  struct bd_batch_hook batch_hook;
  /* The TLS record being written (allocated by send_tls_begin(), before
   * the first reply): touched only by the holder of the sending role,
   * outside the lock.  A send that would block is repeated with the same
   * bytes, as GnuTLS requires. */
  uint8_t *tls_wbuf;
  size_t tls_wlen;
  /* lock */
  struct nreq *head, **tail; /* replies waiting to be sent */
  bool sending;              /* somebody holds the right to write */
  bool corked;               /* ... and it is the connection thread */
  bool batched;              /* ... and it is a completion batch */
  bool blocked;              /* the socket is full: wait for POLLOUT */
  bool dead;                 /* the socket failed: drop replies */
};

/* Connection thread, before any reply. */
void send_init(struct sender *s, struct conn *c);
/* After STARTTLS: the record buffer.  False when out of memory. */
bool send_tls_begin(struct sender *s);
void send_free(struct sender *s);

/* Any thread, without the lock: N's reply (laid out by reply.c) joins
 * the queue, and is sent now unless somebody else holds the role. */
void send_queue(struct sender *s, struct nreq *n);

/* Connection thread, without the lock. */
void send_cork(struct sender *s);
void send_uncork(struct sender *s);
void send_writable(struct sender *s); /* POLLOUT came */
void send_fail(struct sender *s);     /* the peer hung up: drop replies */

/* With the lock held. */
static inline bool send_dead_locked(const struct sender *s) {
  return s->dead;
}
static inline bool send_wants_pollout_locked(const struct sender *s) {
  return s->blocked && !s->dead;
}

#endif
