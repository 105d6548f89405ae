/* SPDX-License-Identifier: BSD-3-Clause */
/* io_uring rings: a poller thread's own, or the process's shared one with
 * its reaper (see core/uring.h). */
#include "uring.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "source.h"

#define RING_ENTRIES 256
/* Requests in flight on a ring, at most: its completion queue (twice the
 * submission queue) never overflows. */
#define RING_MAX_INFLIGHT (2 * RING_ENTRIES)
#define REAP_BATCH 64

struct ring;

/* One request in flight: its segments, each an SQE whose user_data
 * points at it. */
struct op {
  struct bd_req *req;
  struct ring *ring;
  int fd;
  enum uring_op kind;
  bool direct;
  unsigned pending; /* segments not yet complete */
  int err;
  unsigned nseg;
  struct seg {
    struct op *op;
    uint8_t *buf;
    uint64_t off;
    uint32_t len;
  } seg[];
};

struct ring {
  struct io_uring u;
  bool shared;          /* the process's ring: a lock and a reaper */
  pthread_mutex_t lock; /* shared: the submission queue */
  atomic_uint inflight; /* segments submitted or queued, not reaped */
  unsigned queued;      /* SQEs prepared and not yet submitted */
  /* Plugged submission: the hook that submits at bd_plug_end(). */
  struct bd_batch_hook plug;
  bool plugged;
  pthread_t reaper; /* shared ring only; it lives as long as the process */
};

/* ---- availability ---- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool works;

static void probe(void) {
  struct io_uring u;
  int r = io_uring_queue_init(4, &u, 0);
  if (r == 0) {
    io_uring_queue_exit(&u);
    works = true;
    return;
  }
  /* Information, not a warning: nothing is lost (the worker pool does the
   * same I/O), and a tool's output stays qemu-img's where a container or
   * kernel.io_uring_disabled refuses io_uring. */
  log_info("io_uring is not available (%s): local images use worker threads "
           "(--aio threads)",
           strerror(-r));
}

bool uring_available(void) {
  pthread_once(&probe_once, probe);
  return works;
}

/* ---- submission ---- */

static void submit_locked(struct ring *r) {
  if (r->queued == 0)
    return;
  int n = io_uring_submit(&r->u);
  if (n > 0)
    r->queued -= (unsigned)n < r->queued ? (unsigned)n : r->queued;
  else if (n < 0 && n != -EAGAIN && n != -EBUSY && n != -EINTR)
    log_error("io_uring submit: %s", strerror(-n));
}

static void lock(struct ring *r) {
  if (r->shared)
    pthread_mutex_lock(&r->lock);
}

static void unlock(struct ring *r) {
  if (r->shared)
    pthread_mutex_unlock(&r->lock);
}

static void plug_run(struct bd_batch_hook *h) {
  struct ring *r = (struct ring *)((char *)h - offsetof(struct ring, plug));
  lock(r);
  r->plugged = false;
  submit_locked(r);
  unlock(r);
}

/* Room for N submission entries, submitting what is queued if need be. */
static bool room_locked(struct ring *r, unsigned n) {
  if (io_uring_sq_space_left(&r->u) < n)
    submit_locked(r);
  return io_uring_sq_space_left(&r->u) >= n;
}

/* Queue segment S (room_locked() said there is room). */
static void prep_seg(struct ring *r, struct seg *s) {
  struct op *o = s->op;
  struct io_uring_sqe *sqe = io_uring_get_sqe(&r->u);
  switch (o->kind) {
  case URING_READ:
    io_uring_prep_read(sqe, o->fd, s->buf, s->len, s->off);
    break;
  case URING_WRITE:
  case URING_WRITE_DSYNC:
    io_uring_prep_write(sqe, o->fd, s->buf, s->len, s->off);
    if (o->kind == URING_WRITE_DSYNC)
      sqe->rw_flags = RWF_DSYNC;
    break;
  case URING_FDATASYNC:
    io_uring_prep_fsync(sqe, o->fd, IORING_FSYNC_DATASYNC);
    break;
  }
  io_uring_sqe_set_data(sqe, s);
  r->queued++;
}

/* Submit now, or at the end of the submitting thread's plug. */
static void kick_locked(struct ring *r) {
  if (r->plugged)
    return;
  if (bd_plug_defer(&r->plug)) {
    r->plugged = true;
    return;
  }
  submit_locked(r);
}

/* ---- completion ---- */

static void finish(struct op *o) {
  struct bd_req *req = o->req;
  int err = o->err;
  atomic_fetch_sub(&o->ring->inflight, o->nseg);
  free(o);
  if (err < 0)
    bd_req_set_error(req, "%s", strerror(-err));
  bd_complete(req, err);
}

/* A short transfer continues where it stopped (in the reaping thread). */
static bool resubmit(struct ring *r, struct seg *s) {
  lock(r);
  bool ok = room_locked(r, 1);
  if (ok) {
    prep_seg(r, s);
    submit_locked(r);
  }
  unlock(r);
  return ok;
}

static void on_cqe(struct ring *r, struct seg *s, int res) {
  struct op *o = s->op;
  bool reading = o->kind == URING_READ;
  if (res < 0) {
    if (!o->err)
      o->err = res;
  } else if (o->kind != URING_FDATASYNC && (uint32_t)res < s->len) {
    s->buf += res;
    s->off += (uint64_t)res;
    s->len -= (uint32_t)res;
    if (reading && (res == 0 || o->direct)) {
      memset(s->buf, 0, s->len); /* the end of the file: zeroes */
    } else if (res == 0) {
      if (!o->err)
        o->err = -EIO; /* a write that makes no progress */
    } else if (resubmit(r, s)) {
      return;
    } else if (!o->err) {
      o->err = -EIO; /* no room to continue: rare, and reported */
    }
  }
  if (--o->pending == 0)
    finish(o);
}

/* Reap what the completion queue holds, as one batch.  Returns the number
 * of completions. */
static unsigned reap(struct ring *r) {
  struct io_uring_cqe *cqes[REAP_BATCH];
  unsigned total = 0, n;
  bd_batch_begin();
  /* Requests that complete here and submit more (a read-modify-write's
   * second half) submit at once: nobody would end a plug. */
  while ((n = io_uring_peek_batch_cqe(&r->u, cqes, REAP_BATCH)) > 0) {
    struct {
      struct seg *s;
      int res;
    } done[REAP_BATCH];
    for (unsigned i = 0; i < n; i++) {
      done[i].s = io_uring_cqe_get_data(cqes[i]);
      done[i].res = cqes[i]->res;
    }
    /* Free the slots before completing: a completion may submit more. */
    io_uring_cq_advance(&r->u, n);
    for (unsigned i = 0; i < n; i++)
      if (done[i].s) /* NULL: the reaper's wake-up */
        on_cqe(r, done[i].s, done[i].res);
    total += n;
  }
  bd_batch_end();
  return total;
}

/* ---- rings ---- */

static int ring_init(struct ring *r, bool shared) {
  memset(r, 0, sizeof *r);
  /* SUBMIT_ALL: an entry the kernel refuses (it completes with the error)
   * does not hold back the ones after it.  COOP_TASKRUN, a poller's own
   * ring only: a completion does not interrupt the thread with an IPI
   * (a VM exit under virtualisation) while it runs; the thread posts it at
   * its next system call, which a poller makes all the time, and is still
   * woken when asleep.  The shared ring's requests complete in the
   * submitting threads' context, which may block without a system call
   * the ring sees, so it keeps the interrupt. */
  unsigned flags = IORING_SETUP_SUBMIT_ALL;
  if (!shared)
    flags |= IORING_SETUP_COOP_TASKRUN;
  int e = io_uring_queue_init(RING_ENTRIES, &r->u, flags);
  if (e == -EINVAL && (flags & IORING_SETUP_COOP_TASKRUN))
    e = io_uring_queue_init(RING_ENTRIES, &r->u, IORING_SETUP_SUBMIT_ALL);
  if (e == -EINVAL)
    e = io_uring_queue_init(RING_ENTRIES, &r->u, 0);
  if (e < 0)
    return e;
  r->shared = shared;
  r->plug.run = plug_run;
  pthread_mutex_init(&r->lock, NULL);
  atomic_init(&r->inflight, 0);
  return 0;
}

static void *reaper_main(void *arg) {
  struct ring *r = arg;
  for (;;) {
    struct io_uring_cqe *cqe;
    int e = io_uring_wait_cqe(&r->u, &cqe);
    if (e < 0 && e != -EINTR && e != -EAGAIN && e != -ETIME) {
      log_error("io_uring wait: %s", strerror(-e));
      usleep(10000); /* not a reason to stop completing requests */
    }
    reap(r);
  }
  return NULL;
}

static struct ring shared_ring;
static bool shared_ok;
static pthread_once_t shared_once = PTHREAD_ONCE_INIT;

static void shared_start(void) {
  if (!uring_available() || ring_init(&shared_ring, true) < 0)
    return;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setstacksize(&a, 256 * 1024);
  int e = pthread_create(&shared_ring.reaper, &a, reaper_main, &shared_ring);
  pthread_attr_destroy(&a);
  if (e != 0) {
    io_uring_queue_exit(&shared_ring.u);
    return;
  }
  pthread_setname_np(shared_ring.reaper, "bp-uring-reap");
  shared_ok = true;
}

/* The calling thread's ring, if it is a poller. */
static _Thread_local struct ring *own;
static _Thread_local bool polling;

static struct ring *current_ring(void) {
  if (polling) {
    if (!own) {
      struct ring *r = malloc(sizeof *r);
      if (!r || ring_init(r, false) < 0) {
        free(r);
        polling = false; /* use the shared ring from now on */
        return current_ring();
      }
      own = r;
    }
    return own;
  }
  pthread_once(&shared_once, shared_start);
  return shared_ok ? &shared_ring : NULL;
}

int uring_start(struct bd_req *req, enum uring_op kind, int fd, bool direct,
                const struct uring_seg *segs, unsigned n) {
  unsigned nseg = kind == URING_FDATASYNC ? 1 : n;
  if (nseg == 0 || nseg > URING_MAX_SEGS || !uring_available())
    return -EAGAIN;
  struct ring *r = current_ring();
  if (!r)
    return -EAGAIN;
  if (atomic_fetch_add(&r->inflight, nseg) + nseg > RING_MAX_INFLIGHT) {
    atomic_fetch_sub(&r->inflight, nseg);
    return -EAGAIN; /* back-pressure: the pool takes the overflow */
  }
  struct op *o = malloc(sizeof *o + nseg * sizeof o->seg[0]);
  if (!o) {
    atomic_fetch_sub(&r->inflight, nseg);
    return -EAGAIN;
  }
  *o = (struct op){.req = req,
                   .ring = r,
                   .fd = fd,
                   .kind = kind,
                   .direct = direct,
                   .pending = nseg,
                   .nseg = nseg};
  for (unsigned i = 0; i < nseg; i++)
    o->seg[i] = (struct seg){o, kind == URING_FDATASYNC ? NULL : segs[i].buf,
                             kind == URING_FDATASYNC ? 0 : segs[i].off,
                             kind == URING_FDATASYNC ? 0 : segs[i].len};
  lock(r);
  bool ok = room_locked(r, nseg);
  if (ok) {
    for (unsigned i = 0; i < nseg; i++)
      prep_seg(r, &o->seg[i]);
    kick_locked(r);
  }
  unlock(r);
  if (!ok) {
    atomic_fetch_sub(&r->inflight, nseg);
    free(o);
    return -EAGAIN;
  }
  return 0;
}

/* ---- pollers (core/blockdev.h) ---- */

void bd_poller_begin(void) {
  polling = true;
}

int bd_poller_fd(void) {
  return own ? own->u.ring_fd : -1;
}

bool bd_poller_run(void) {
  if (!own || io_uring_cq_ready(&own->u) == 0)
    return false;
  return reap(own) > 0;
}

void bd_poller_end(void) {
  struct ring *r = own;
  polling = false;
  if (!r)
    return;
  /* Normally nothing is left: the front end waited for its requests. */
  while (atomic_load(&r->inflight) > 0) {
    struct io_uring_cqe *cqe;
    submit_locked(r);
    int e = io_uring_wait_cqe(&r->u, &cqe);
    if (e < 0 && e != -EINTR) {
      log_error("io_uring wait: %s; abandoning %u requests", strerror(-e),
                atomic_load(&r->inflight));
      return; /* the ring stays: the kernel may still write its buffers */
    }
    reap(r);
  }
  own = NULL;
  io_uring_queue_exit(&r->u);
  pthread_mutex_destroy(&r->lock);
  free(r);
}
