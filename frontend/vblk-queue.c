/* SPDX-License-Identifier: BSD-3-Clause */
/* virtio-blk queues: chains in, bd requests out, used entries back.
 *
 * One request slot per descriptor head.  The queue thread pops a chain,
 * parses it and submits one or more bd requests (a read or write larger
 * than the source's largest request is split; discard and write-zeroes
 * submit one per range).  The last completion, on whichever thread,
 * writes the status byte and pushes the used entry under the queue lock.
 * Single-piece reads and writes go straight to guest memory; requests of
 * several pieces go through a bounce buffer (libnbd 1.14 has no vectored
 * I/O). */
#include <errno.h>
#include <linux/virtio_blk.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/reqstats.h"
#include "virtio-blk.h"

#define LOGGED_ERRORS 10 /* per queue, then only at debug level */

struct vblk_sub {
  struct bd_req br;
  struct vblk_req *r;
};

struct vblk_req {
  struct vblk_queue *q;
  bool busy;
  uint16_t head;
  enum vblk_kind kind;
  uint8_t *status_ptr;
  uint32_t used_len;
  uint64_t length;
  struct iovec *iov; /* READ through a bounce buffer: where to scatter */
  unsigned niov;
  void *bounce;
  struct vblk_sub *subs;
  struct vblk_sub sub1; /* the usual single sub-request, no allocation */
  atomic_uint remaining;
  atomic_int err;
  char errmsg[BD_REQ_ERRMSG_MAX]; /* the first failing sub-request's */
  uint64_t t0;                    /* --metrics: when it was started */
  enum metrics_cmd mcmd;
};

int vblk_queue_init(struct vblk_queue *q, struct vblk_dev *dev, unsigned index,
                    void (*notify)(void *), void *opaque) {
  q->dev = dev;
  q->index = index;
  q->notify = notify;
  q->opaque = opaque;
  q->inflight = q->pending = 0;
  q->batching = false;
  q->completed = q->errors = q->abandoned = 0;
  q->reqs = calloc(q->vq.num, sizeof *q->reqs);
  q->chain = malloc(sizeof *q->chain);
  q->scratch = malloc(VQ_MAX_IOV * sizeof *q->scratch);
  if (!q->reqs || !q->chain || !q->scratch) {
    free(q->reqs);
    free(q->chain);
    free(q->scratch);
    return -ENOMEM;
  }
  for (unsigned i = 0; i < q->vq.num; i++) {
    q->reqs[i].q = q;
    q->reqs[i].head = (uint16_t)i;
  }
  pthread_mutex_init(&q->lock, NULL);
  pthread_cond_init(&q->idle, NULL);
  return 0;
}

void vblk_queue_drain(struct vblk_queue *q) {
  pthread_mutex_lock(&q->lock);
  while (q->inflight)
    pthread_cond_wait(&q->idle, &q->lock);
  pthread_mutex_unlock(&q->lock);
}

void vblk_queue_fini(struct vblk_queue *q) {
  vblk_queue_drain(q);
  free(q->reqs);
  free(q->chain);
  free(q->scratch);
  q->reqs = NULL;
  q->chain = NULL;
  q->scratch = NULL;
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->idle);
}

static void log_failure(struct vblk_queue *q, uint16_t head, const char *what,
                        const char *why) {
  uint64_t n = q->errors; /* read racily: only decides the log level */
  if (n < LOGGED_ERRORS)
    log_warn("vhost queue %u: request %u: %s: %s%s", q->index, head, what, why,
             n + 1 == LOGGED_ERRORS ? " (further errors not logged)" : "");
  else
    log_debug("vhost queue %u: request %u: %s: %s", q->index, head, what, why);
}

static void end_batch(struct vblk_queue *q) {
  pthread_mutex_lock(&q->lock);
  q->batching = false;
  bool notify = q->pending && vq_should_notify(&q->vq);
  q->pending = 0;
  pthread_mutex_unlock(&q->lock);
  if (notify)
    q->notify(q->opaque);
}

/* Hand the chain back to the guest. */
static void complete(struct vblk_req *r, uint8_t status) {
  struct vblk_queue *q = r->q;
  if (q->dev->reqs)
    metrics_req_done(q->dev->reqs, r->mcmd, r->t0, r->length,
                     status != VIRTIO_BLK_S_OK);
  if (r->status_ptr)
    *r->status_ptr = status;
  pthread_mutex_lock(&q->lock);
  vq_push(&q->vq, r->head, r->used_len);
  r->busy = false;
  q->completed++;
  if (status != VIRTIO_BLK_S_OK)
    q->errors++;
  bool notify = false;
  if (q->batching)
    q->pending++;
  else
    notify = vq_should_notify(&q->vq);
  if (!--q->inflight)
    pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->lock);
  if (notify)
    q->notify(q->opaque);
}

/* Drop a request cancelled because its front end left: the guest's ring
 * and status byte stay untouched (that front end may be gone and its
 * memory reused), and its inflight entry stays set, so that the next front
 * end submits it again. */
static void abandon(struct vblk_req *r) {
  struct vblk_queue *q = r->q;
  log_debug("vhost queue %u: request %u abandoned: %s", q->index, r->head,
            r->errmsg);
  if (q->dev->reqs) /* the next front end submits it again */
    metrics_req_dropped(q->dev->reqs, r->mcmd, r->length);
  pthread_mutex_lock(&q->lock);
  r->busy = false;
  q->abandoned++;
  if (!--q->inflight)
    pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->lock);
}

static void scatter(const struct iovec *iov, unsigned n, const uint8_t *src) {
  for (unsigned i = 0; i < n; i++) {
    memcpy(iov[i].iov_base, src, iov[i].iov_len);
    src += iov[i].iov_len;
  }
}

static void finish(struct vblk_req *r) {
  int err = atomic_load(&r->err);
  bool cancelled = err == -ECANCELED && bd_req_cancelled(&r->subs[0].br);
  if (!err && r->kind == VBLK_READ && r->bounce)
    scatter(r->iov, r->niov, r->bounce);
  free(r->bounce);
  r->bounce = NULL;
  free(r->iov);
  r->iov = NULL;
  if (r->subs != &r->sub1)
    free(r->subs);
  r->subs = NULL;
  if (cancelled) {
    abandon(r);
    return;
  }
  uint8_t status = VIRTIO_BLK_S_OK;
  if (err) {
    status = err == -ENOTSUP ? VIRTIO_BLK_S_UNSUPP : VIRTIO_BLK_S_IOERR;
    log_failure(r->q, r->head, "I/O error", r->errmsg);
  }
  complete(r, status);
}

static void sub_done(struct bd_req *br, int err) {
  struct vblk_req *r = ((struct vblk_sub *)br)->r;
  int none = 0;
  /* Written before this sub-request stops counting: finish() sees it. */
  if (err && atomic_compare_exchange_strong(&r->err, &none, err))
    memcpy(r->errmsg, br->errmsg, sizeof r->errmsg);
  if (atomic_fetch_sub(&r->remaining, 1) == 1)
    finish(r);
}

static bool alloc_subs(struct vblk_req *r, unsigned n) {
  r->subs = n == 1 ? &r->sub1 : calloc(n, sizeof *r->subs);
  if (!r->subs)
    return false;
  memset(r->subs, 0, n * sizeof *r->subs);
  for (unsigned i = 0; i < n; i++)
    r->subs[i].r = r;
  atomic_store(&r->err, 0);
  atomic_store(&r->remaining, n);
  return true;
}

/* Submit the prepared sub-requests.  R may be completed and reused as
 * soon as the last one is submitted: touch nothing of it after. */
static void submit_subs(struct vblk_req *r, unsigned n) {
  struct vblk_sub *subs = r->subs;
  struct bd *bd = r->q->dev->bd;
  for (unsigned i = 0; i < n; i++) {
    subs[i].br.done = sub_done;
    subs[i].br.conn = r->q->dev->conn;
    bd_submit(bd, &subs[i].br);
  }
}

/* The data buffer of a read or write: guest memory itself when it is one
 * piece, else a bounce buffer (filled now for a write). */
static uint8_t *data_buffer(struct vblk_req *r, const struct iovec *iov,
                            unsigned niov) {
  if (niov == 1)
    return iov[0].iov_base;
  r->bounce = malloc(r->length);
  if (!r->bounce)
    return NULL;
  if (r->kind == VBLK_WRITE) {
    uint8_t *p = r->bounce;
    for (unsigned i = 0; i < niov; i++) {
      memcpy(p, iov[i].iov_base, iov[i].iov_len);
      p += iov[i].iov_len;
    }
    return r->bounce;
  }
  r->iov = malloc(niov * sizeof *r->iov);
  if (!r->iov) {
    free(r->bounce);
    r->bounce = NULL;
    return NULL;
  }
  memcpy(r->iov, iov, niov * sizeof *r->iov);
  r->niov = niov;
  return r->bounce;
}

static void start_rw(struct vblk_req *r, const struct vblk_parsed *p,
                     const struct iovec *iov) {
  uint32_t max = r->q->dev->max_io;
  unsigned n = (unsigned)bd_split_count(p->length, max);
  uint8_t *buf = data_buffer(r, iov, p->niov);
  if (!buf || !alloc_subs(r, n)) {
    free(r->bounce);
    free(r->iov);
    r->bounce = NULL;
    r->iov = NULL;
    log_failure(r->q, r->head, "request", "out of memory");
    complete(r, VIRTIO_BLK_S_IOERR);
    return;
  }
  for (unsigned i = 0; i < n; i++) {
    struct bd_req *br = &r->subs[i].br;
    struct bd_split piece = bd_split_piece(p->offset, p->length, max, i);
    br->cmd = p->kind == VBLK_READ ? BD_READ : BD_WRITE;
    br->offset = piece.offset;
    br->length = piece.length;
    br->buf = buf + piece.skip;
  }
  submit_subs(r, n);
}

static void start_ranges(struct vblk_req *r, const struct vblk_parsed *p) {
  unsigned n = p->kind == VBLK_FLUSH ? 1 : p->nranges;
  if (!alloc_subs(r, n)) {
    log_failure(r->q, r->head, "request", "out of memory");
    complete(r, VIRTIO_BLK_S_IOERR);
    return;
  }
  for (unsigned i = 0; i < n; i++) {
    struct bd_req *br = &r->subs[i].br;
    if (p->kind == VBLK_FLUSH) {
      br->cmd = BD_FLUSH;
      continue;
    }
    br->cmd = p->kind == VBLK_DISCARD ? BD_TRIM : BD_ZERO;
    br->offset = p->ranges[i].offset;
    br->length = p->ranges[i].length;
    br->flags = p->ranges[i].unmap ? BD_F_MAY_TRIM : 0;
  }
  submit_subs(r, n);
}

static void get_id(struct vblk_req *r, const struct vblk_parsed *p,
                   const struct iovec *iov) {
  const uint8_t *src = (const uint8_t *)r->q->dev->serial;
  for (unsigned i = 0; i < p->niov; i++) {
    memcpy(iov[i].iov_base, src, iov[i].iov_len);
    src += iov[i].iov_len;
  }
  complete(r, VIRTIO_BLK_S_OK);
}

/* What --metrics calls a request of KIND. */
static enum metrics_cmd metrics_cmd_of(enum vblk_kind kind) {
  switch (kind) {
  case VBLK_READ: return METRICS_READ;
  case VBLK_WRITE: return METRICS_WRITE;
  case VBLK_FLUSH: return METRICS_FLUSH;
  case VBLK_DISCARD: return METRICS_TRIM;
  case VBLK_ZEROES: return METRICS_WRITE_ZEROES;
  default: return METRICS_OTHER; /* GET_ID, malformed, unsupported */
  }
}

/* Parse the chain in q->chain and start its request in slot R. */
static void start(struct vblk_queue *q, struct vblk_req *r) {
  struct vblk_parsed p;
  vblk_parse(q->dev, q->chain, q->scratch, &p);
  log_debug("vhost queue %u: request %u: type %u, %llu bytes at %llu "
            "(out %llu/%u, in %llu/%u, status %u)",
            q->index, r->head, p.type, (unsigned long long)p.length,
            (unsigned long long)p.offset,
            (unsigned long long)q->chain->out_bytes, q->chain->n_out,
            (unsigned long long)q->chain->in_bytes, q->chain->n_in, p.status);
  r->kind = p.kind;
  r->status_ptr = p.status_ptr;
  r->used_len = p.used_len;
  r->length = p.length;
  r->bounce = NULL;
  r->iov = NULL;
  r->niov = 0;
  if (q->dev->reqs) {
    r->mcmd = metrics_cmd_of(p.kind);
    r->t0 = metrics_req_start(q->dev->reqs, r->mcmd, r->length);
  }
  switch (p.kind) {
  case VBLK_DONE:
    if (p.status != VIRTIO_BLK_S_OK)
      log_failure(q, r->head, "malformed request", p.why);
    complete(r, p.status);
    break;
  case VBLK_GET_ID: get_id(r, &p, q->scratch); break;
  case VBLK_READ:
  case VBLK_WRITE:
    if (!p.length)
      complete(r, VIRTIO_BLK_S_OK);
    else
      start_rw(r, &p, q->scratch);
    break;
  case VBLK_FLUSH:
  case VBLK_DISCARD:
  case VBLK_ZEROES: start_ranges(r, &p); break;
  }
}

/* Claim the slot of the chain's head; a head still in flight means the
 * guest offered it twice, which breaks the ring. */
static struct vblk_req *claim(struct vblk_queue *q, uint16_t head) {
  struct vblk_req *r = &q->reqs[head];
  if (r->busy) {
    q->vq.broken = true;
    return NULL;
  }
  r->busy = true;
  q->inflight++;
  return r;
}

bool vblk_queue_process(struct vblk_queue *q) {
  bool ok = true;
  pthread_mutex_lock(&q->lock);
  q->batching = true;
  for (;;) {
    int got = vq_pop(&q->vq, q->chain);
    if (got == 0 && vq_enable_kicks(&q->vq))
      continue;
    if (got <= 0) {
      ok = got == 0;
      break;
    }
    struct vblk_req *r = claim(q, q->chain->head);
    if (!r) {
      log_error("vhost queue %u: descriptor %u offered while in flight",
                q->index, q->chain->head);
      ok = false;
      break;
    }
    pthread_mutex_unlock(&q->lock);
    start(q, r);
    pthread_mutex_lock(&q->lock);
  }
  if (!ok)
    log_error("vhost queue %u: the guest broke the ring; stopped until "
              "it resets the device",
              q->index);
  pthread_mutex_unlock(&q->lock);
  end_batch(q);
  return ok;
}

void vblk_queue_resubmit(struct vblk_queue *q, const uint16_t *heads,
                         unsigned n) {
  pthread_mutex_lock(&q->lock);
  q->batching = true;
  for (unsigned i = 0; i < n; i++) {
    if (heads[i] >= q->vq.num || q->reqs[heads[i]].busy)
      continue;
    struct vblk_req *r = claim(q, heads[i]);
    vq_walk(&q->vq, heads[i], q->chain);
    pthread_mutex_unlock(&q->lock);
    start(q, r);
    pthread_mutex_lock(&q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  end_batch(q);
}
