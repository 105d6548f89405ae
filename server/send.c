/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-connection reply queue (send.h says who calls what).
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
#include "send.h"
#include "tls.h"

#define SEND_IOV 512

static int gather(struct sender *s, struct iovec *iov) {
  int n = 0;
  for (struct nreq *q = s->head; q && n + q->niov <= SEND_IOV; q = q->next) {
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

static void consume(struct sender *s, size_t w) {
  while (w > 0 && s->head) {
    struct nreq *q = s->head;
    size_t rem = q->total - q->sent;
    if (w < rem) {
      q->sent += w;
      return;
    }
    w -= rem;
    s->head = q->next;
    if (!s->head)
      s->tail = &s->head;
    conn_release_locked(s->c, q);
  }
}

static void drop_all(struct sender *s) {
  while (s->head) {
    struct nreq *q = s->head;
    s->head = q->next;
    conn_release_locked(s->c, q);
  }
  s->tail = &s->head;
}

/* Copy the head of the queue into the TLS record buffer, unless a send
 * that would have blocked left it there to be repeated. */
static size_t stage_tls(struct sender *s, const struct iovec *iov, int n) {
  if (s->tls_wlen > 0)
    return s->tls_wlen;
  for (int i = 0; i < n && s->tls_wlen < TLS_RECORD_MAX; i++) {
    size_t room = TLS_RECORD_MAX - s->tls_wlen;
    size_t take = iov[i].iov_len < room ? iov[i].iov_len : room;
    memcpy(s->tls_wbuf + s->tls_wlen, iov[i].iov_base, take);
    s->tls_wlen += take;
  }
  return s->tls_wlen;
}

/* One write without blocking: sendmsg, or one TLS record. */
static ssize_t send_some(struct sender *s, struct iovec *iov, int n) {
  struct conn *c = s->c;
  if (!c->tls) {
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    return sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  ssize_t w = tls_send(c->tls, s->tls_wbuf, stage_tls(s, iov, n));
  if (w >= 0)
    s->tls_wlen = 0; /* sent (a short send is staged again from the queue) */
  return w;
}

/* Write out the queue; called with the lock held and the sending role. */
static void drain_locked(struct sender *s) {
  struct conn *c = s->c;
  struct iovec iov[SEND_IOV];
  while (s->head && !s->dead && !s->blocked) {
    int n = gather(s, iov);
    pthread_mutex_unlock(&c->lock);
    ssize_t w = send_some(s, iov, n);
    int e = errno;
    pthread_mutex_lock(&c->lock);
    if (w >= 0) {
      consume(s, (size_t)w);
    } else if (e == EAGAIN || e == EWOULDBLOCK) {
      s->blocked = true;
      c->waiting = true; /* the connection thread must poll for POLLOUT */
      conn_wake_locked(c);
    } else if (e != EINTR) {
      log_info("connection %u (%s): send failed: %s; dropping replies", c->id,
               c->peer, strerror(e));
      s->dead = true;
      conn_wake_locked(c); /* to stop reading, whatever its socket shows */
    }
  }
  if (s->dead)
    drop_all(s);
}

void send_queue(struct sender *s, struct nreq *n) {
  n->next = NULL;
  n->sent = 0;
  pthread_mutex_lock(&s->c->lock);
  *s->tail = n;
  s->tail = &n->next;
  if (s->dead) {
    drop_all(s);
  } else if (!s->sending) {
    s->sending = true;
    if (bd_batch_defer(&s->batch_hook)) {
      s->batched = true; /* the rest of the batch rides along */
    } else {
      drain_locked(s);
      s->sending = false;
    }
  }
  pthread_mutex_unlock(&s->c->lock);
}

/* The end of a source's completion batch that queued replies here: one
 * send for all of them instead of one wake-up of the client per reply. */
static void send_batch_end(struct bd_batch_hook *h) {
  struct sender *s =
      (struct sender *)((char *)h - offsetof(struct sender, batch_hook));
  pthread_mutex_lock(&s->c->lock);
  s->batched = false;
  drain_locked(s);
  s->sending = false;
  pthread_mutex_unlock(&s->c->lock);
}

void send_init(struct sender *s, struct conn *c) {
  s->c = c;
  s->batch_hook.run = send_batch_end;
  s->tail = &s->head;
}

bool send_tls_begin(struct sender *s) {
  s->tls_wbuf = malloc(TLS_RECORD_MAX);
  return s->tls_wbuf != NULL;
}

void send_free(struct sender *s) {
  free(s->tls_wbuf);
  s->tls_wbuf = NULL;
}

/* While the connection thread dispatches a batch of requests it holds the
 * sending role, so replies completed inline are sent together. */
void send_cork(struct sender *s) {
  pthread_mutex_lock(&s->c->lock);
  if (!s->sending) {
    s->sending = true;
    s->corked = true;
  }
  pthread_mutex_unlock(&s->c->lock);
}

void send_uncork(struct sender *s) {
  pthread_mutex_lock(&s->c->lock);
  if (s->corked) {
    drain_locked(s);
    s->corked = false;
    s->sending = false;
  }
  pthread_mutex_unlock(&s->c->lock);
}

/* Take the role unless somebody holds it (who then sends what is queued);
 * called with the lock held. */
static void kick_locked(struct sender *s) {
  if (!s->sending) {
    s->sending = true;
    drain_locked(s);
    s->sending = false;
  }
}

void send_writable(struct sender *s) {
  pthread_mutex_lock(&s->c->lock);
  s->blocked = false;
  kick_locked(s);
  pthread_mutex_unlock(&s->c->lock);
}

void send_fail(struct sender *s) {
  pthread_mutex_lock(&s->c->lock);
  s->dead = true;
  s->blocked = false;
  kick_locked(s); /* drops the queue */
  pthread_mutex_unlock(&s->c->lock);
}
