/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-connection reply queue.
 *
 * Replies are appended in completion order.  Whoever finds nobody sending
 * takes the "sending" role and writes the queue out with one sendmsg per
 * batch, so replies completed meanwhile by other workers ride along.  The
 * socket is written without blocking: when it is full the rest waits for
 * POLLOUT in the connection thread, and no worker is ever held hostage by a
 * client that does not read its replies. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "core/log.h"
#include "metrics.h"
#include "tls.h"

#define SEND_IOV 512

void conn_wake_locked(struct conn *c) {
  if (!c->waiting)
    return;
  c->waiting = false;
  uint64_t one = 1;
  ssize_t r = write(c->wakefd, &one, sizeof one);
  (void)r; /* an eventfd write fails only when the counter is saturated */
}

/* A request is finished, its reply sent (or dropped): count it, give back
 * its in-flight budget and keep it for reuse. */
void conn_release_locked(struct conn *c, struct nreq *n) {
  if (c->exp->mx)
    metrics_req_done(c->exp->mx, metrics_cmd_of_nbd(n->r.type), n->t0,
                     n->r.length, n->failed);
  c->inflight--;
  c->inflight_bytes -= n->cost;
  if (n->bufcap > 1024 * 1024) {
    free(n->buf);
    n->buf = NULL;
    n->bufcap = 0;
  }
  n->next = c->freelist;
  c->freelist = n;
  if (c->wake_on_release)
    conn_wake_locked(c);
}

static int gather(struct conn *c, struct iovec *iov) {
  int n = 0;
  for (struct nreq *q = c->sq_head; q && n + q->niov <= SEND_IOV; q = q->next) {
    size_t skip = q->sent;
    for (int i = 0; i < q->niov; i++) {
      if (skip >= q->iov[i].iov_len) {
        skip -= q->iov[i].iov_len;
        continue;
      }
      iov[n].iov_base = (uint8_t *)q->iov[i].iov_base + skip;
      iov[n].iov_len = q->iov[i].iov_len - skip;
      skip = 0;
      n++;
    }
  }
  return n;
}

static void consume(struct conn *c, size_t w) {
  while (w > 0 && c->sq_head) {
    struct nreq *q = c->sq_head;
    size_t rem = q->total - q->sent;
    if (w < rem) {
      q->sent += w;
      return;
    }
    w -= rem;
    c->sq_head = q->next;
    if (!c->sq_head)
      c->sq_tail = &c->sq_head;
    conn_release_locked(c, q);
  }
}

static void drop_all(struct conn *c) {
  while (c->sq_head) {
    struct nreq *q = c->sq_head;
    c->sq_head = q->next;
    conn_release_locked(c, q);
  }
  c->sq_tail = &c->sq_head;
}

/* Copy the head of the queue into the TLS record buffer, unless a send
 * that would have blocked left it there to be repeated. */
static size_t stage_tls(struct conn *c, const struct iovec *iov, int n) {
  if (c->tls_wlen > 0)
    return c->tls_wlen;
  for (int i = 0; i < n && c->tls_wlen < TLS_RECORD_MAX; i++) {
    size_t room = TLS_RECORD_MAX - c->tls_wlen;
    size_t take = iov[i].iov_len < room ? iov[i].iov_len : room;
    memcpy(c->tls_wbuf + c->tls_wlen, iov[i].iov_base, take);
    c->tls_wlen += take;
  }
  return c->tls_wlen;
}

/* One write without blocking: sendmsg, or one TLS record. */
static ssize_t send_some(struct conn *c, struct iovec *iov, int n) {
  if (!c->tls) {
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    return sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  ssize_t w = tls_send(c->tls, c->tls_wbuf, stage_tls(c, iov, n));
  if (w >= 0)
    c->tls_wlen = 0; /* sent (a short send is staged again from the queue) */
  return w;
}

/* Write out the queue; called with the lock held and the sending role. */
static void drain_locked(struct conn *c) {
  struct iovec iov[SEND_IOV];
  while (c->sq_head && !c->dead && !c->send_blocked) {
    int n = gather(c, iov);
    pthread_mutex_unlock(&c->lock);
    ssize_t w = send_some(c, iov, n);
    int e = errno;
    pthread_mutex_lock(&c->lock);
    if (w >= 0) {
      consume(c, (size_t)w);
    } else if (e == EAGAIN || e == EWOULDBLOCK) {
      c->send_blocked = true;
      c->waiting = true; /* the connection thread must poll for POLLOUT */
      conn_wake_locked(c);
    } else if (e != EINTR) {
      log_info("connection %u (%s): send failed: %s; dropping replies", c->id,
               c->peer, strerror(e));
      c->dead = true;
      conn_wake_locked(c); /* to stop reading, whatever its socket shows */
    }
  }
  if (c->dead)
    drop_all(c);
}

void send_queue(struct conn *c, struct nreq *n) {
  n->next = NULL;
  n->sent = 0;
  pthread_mutex_lock(&c->lock);
  *c->sq_tail = n;
  c->sq_tail = &n->next;
  if (c->dead) {
    drop_all(c);
  } else if (!c->sending) {
    c->sending = true;
    if (bd_batch_defer(&c->batch_hook)) {
      c->batched = true; /* the rest of the batch rides along */
    } else {
      drain_locked(c);
      c->sending = false;
    }
  }
  pthread_mutex_unlock(&c->lock);
}

/* The end of a source's completion batch that queued replies here: one
 * send for all of them instead of one wake-up of the client per reply. */
static void send_batch_end(struct bd_batch_hook *h) {
  struct conn *c =
      (struct conn *)((char *)h - offsetof(struct conn, batch_hook));
  pthread_mutex_lock(&c->lock);
  c->batched = false;
  drain_locked(c);
  c->sending = false;
  pthread_mutex_unlock(&c->lock);
}

void send_init(struct conn *c) {
  c->batch_hook.run = send_batch_end;
}

/* While the connection thread dispatches a batch of requests it holds the
 * sending role, so replies completed inline are sent together. */
void send_cork(struct conn *c) {
  pthread_mutex_lock(&c->lock);
  if (!c->sending) {
    c->sending = true;
    c->corked = true;
  }
  pthread_mutex_unlock(&c->lock);
}

void send_uncork(struct conn *c) {
  pthread_mutex_lock(&c->lock);
  if (c->corked) {
    drain_locked(c);
    c->corked = false;
    c->sending = false;
  }
  pthread_mutex_unlock(&c->lock);
}

void send_writable(struct conn *c) {
  pthread_mutex_lock(&c->lock);
  c->send_blocked = false;
  if (!c->sending) {
    c->sending = true;
    drain_locked(c);
    c->sending = false;
  }
  pthread_mutex_unlock(&c->lock);
}
