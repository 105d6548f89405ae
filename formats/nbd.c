/* SPDX-License-Identifier: BSD-3-Clause */
/* nbd: a remote export as a block device, through libnbd's asynchronous
 * calls.
 *
 * Connections.  A device holds one libnbd handle per connection to the
 * URI: several only when the server advertises multi-conn, whose flush
 * then covers writes completed on every connection, so a flush goes to
 * one of them.  Each submitting thread has a home connection, and requests
 * are issued from that thread: libnbd sends at once, and only when the
 * socket is full is the event thread woken to wait for POLLOUT.
 *
 * One event thread per device polls every handle, reads the replies, and
 * runs reconnection and timeouts.  libnbd runs callbacks with the handle
 * locked, so callbacks only record a result: a command's free callback
 * puts it on a per-thread list that the thread drains once libnbd has
 * returned.  A front end's done() may then submit again to this device.
 *
 * Loss.  When a connection dies, its commands complete with ENOTCONN and
 * are sent again once a connection is up (block status only when nothing
 * was reported yet).  While no connection is up, requests wait; one whose
 * source's timeout (the timeout option) has passed since its
 * submission fails with EIO, after at least one reconnection attempt
 * (GRACE_MS) once lost; once one has failed so in an outage, a new
 * request gets only that one attempt.  A connection with requests in
 * flight that hears nothing from the server for as long is dropped as lost
 * (a peer gone without closing the socket), and so is one holding a
 * request sent again past its deadline; with it go the idle connections
 * that have not heard from the server since (hang_up_silent()).  The event
 * thread reconnects in the background, every 0.5 s doubling to 4 s (every
 * 0.5 s while requests wait).
 *
 * Replay.  A server killed and restarted loses what it had not made
 * durable: acknowledged writes in its cache, a qcow2 image's metadata.  So
 * every write, trim and zero the server acknowledges is kept, with its
 * data, in the replay log (nbd-replay.c) until a flush covers it.  The
 * rule: a flush that completes covers every acknowledgement received
 * before the flush was submitted, on any connection.  That holds because
 * there are several connections only when the server advertises
 * multi-conn (whose flush covers writes completed on every connection);
 * without it there is one, whose flush covers its own writes.  After any
 * loss the device stops issuing (requests queue), waits until nothing is
 * in flight anywhere, and on one connection that is up sends the whole
 * log again in acknowledgement order (a batch of non-overlapping entries
 * at a time, the next when all are answered: a server may reorder
 * requests on one connection), and only then releases the queue: its
 * flushes first (what they cover is on the server again), then the rest
 * as queued (those in flight at the loss, resent, and new ones: none was
 * acknowledged, so their order is the submitters' concern).  Every
 * connection goes to the same server, so a loss of one is taken as the
 * server's restart; replaying into a server that kept everything rewrites
 * the same bytes in the same order, harmless.  The log is bounded
 * (the replay-limit option); only when acknowledgements had to be
 * dropped for the bound and a loss came before a flush covered them does
 * the next flush fail with EIO, saying how many bytes were past the
 * bound.  A server that comes back with another size or other export
 * flags (or refusing the export) is another image: nothing is replayed
 * into it, and every request fails with EIO until the right one returns. */
#include <errno.h>
#include <libnbd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/source.h"
#include "core/stats.h"
#include "formats.h"
#include "nbd-replay.h"
#include "nbd-uri.h"

/* For serve --metrics (core/stats.h), over every nbd:// source. */
BD_STAT_DEFINE(st_reconnects, "nbd_reconnects_total",
               "nbd:// source connections re-established after a loss.")
BD_STAT_DEFINE(st_timeouts, "nbd_request_timeouts_total",
               "nbd:// source requests failed because no connection "
               "answered within the timeout.")
BD_STAT_DEFINE(st_hangups, "nbd_hung_connections_total",
               "nbd:// source connections dropped after a timeout without "
               "a reply.")

/* libnbd 1.14 speaks no extended headers: lengths stay below 4 GiB. */
#define NBD_CHUNK (1u << 30)
#define MAX_CONNS 16
#define AUTO_CONNS 4
#define RETRY_MIN_MS 500
#define ORDERLY_MS 10000 /* after ESHUTDOWN: losses count as orderly */
#define RETRY_MAX_MS 4000
#define GRACE_MS 1000        /* after a loss: time for one reconnection */
#define CONNECT_MAX_MS 10000 /* a handshake taking longer is abandoned */
#define CLOSE_BUSY_MS 5000   /* close waits this long for requests */
#define CLOSE_DISC_MS 1000   /* and this long for the server to hang up */
#define REPLAY_BATCH 64      /* replayed commands in flight at once */

enum conn_state {
  C_DOWN,       /* no handle; the event thread retries at due */
  C_CONNECTING, /* handshake in progress until due */
  C_UP,         /* ready for requests */
  C_DEAD,       /* a submitter saw the handle die; the event thread cleans */
  C_DRAINING,   /* the server is shutting down (ESHUTDOWN): no new requests;
                 * closed once those in flight are answered */
};

struct nbddev;

struct conn {
  struct nbddev *d;
  unsigned idx;
  struct nbd_handle *h;  /* changed by the event thread only */
  _Atomic int state;     /* enum conn_state */
  pthread_rwlock_t lock; /* read-held while issuing on h */
  atomic_int inflight;
  _Atomic int64_t last_read; /* ms: last reply bytes, or first request */
  /* Requests sent again after a loss, in flight here, and the earliest of
   * their deadlines: a connection that keeps one past it is dropped. */
  atomic_int resent;
  _Atomic int64_t resent_deadline;
  int64_t due; /* C_DOWN: next attempt; C_CONNECTING: end */
  int64_t backoff;
  unsigned failures; /* attempts failed since the connection was lost */
  bool lost;         /* was up once: a success is a reconnection */
  bool disc_sent;
};

/* One libnbd command: a whole request or one piece of a split one. */
struct op {
  struct nbddev *d;
  struct bd_req *req;
  struct split *split; /* NULL unless the request is split */
  uint64_t off, len;
  struct conn *c;
  int err;          /* from libnbd's completion callback */
  bool completed;   /* the completion callback ran */
  bool nowait;      /* fail rather than wait for a connection */
  uint64_t gen;     /* flush: the replay log's mark when submitted */
  size_t ext_n;     /* block status: list length when submitted */
  uint64_t ext_end; /* ... and its end */
  int64_t start;    /* ms: when submitted */
  int64_t deadline; /* ms: when waiting for a connection must end */
  struct op *next;
};

/* A request split into several commands completes when the last one
 * does, with the first error. */
struct split {
  struct bd_req *req;
  atomic_int pending;
  atomic_int err;
};

struct nbddev {
  char *uri;
  struct bd_stat_scope *stats; /* the opening's (core/stats.h), or NULL */
  uint64_t size;
  unsigned nconns;
  struct conn conns[MAX_CONNS];
  atomic_uint rr;
  int wakefd;
  pthread_t thread;
  int64_t timeout_ms; /* 0: wait for a connection forever */
  bool can_flush, can_trim, can_cache, can_extents;
  /* Named contexts asked of the server, passed through (bd.contexts). */
  char **ctx;
  size_t nctx;
  pthread_mutex_t lock; /* waiters, closing, and changes to C_UP */
  struct op *wait_head, *wait_tail;
  bool closing;
  /* Acknowledged writes not yet covered by a flush (header comment). */
  struct replay_log log;
  /* After a loss: no request is issued until the log has been sent again
   * (changed under lock); the replay's state belongs to the event thread. */
  atomic_bool replay_pending;
  bool rp_started;              /* the log is being sent: rp_next valid */
  struct replay_entry *rp_next; /* the next entry to send again */
  atomic_int rp_inflight;       /* replayed commands not answered */
  atomic_bool rp_lost;          /* one met a lost connection: start over */
  uint64_t rp_count, rp_bytes;  /* entries sent again in this replay */
  int64_t rp_t0;                /* ms: when it started */
  /* A loss lost acknowledged writes (bytes past the bound, or a replayed
   * one the server refused): the next flush fails. */
  atomic_bool writes_lost;
  _Atomic uint64_t lost_bytes;
  /* The server came back as another export: requests fail at once. */
  atomic_bool foreign;
  unsigned ident; /* the export's flags at open (ident_of()) */
  /* ms: until then a lost connection is the server's orderly shutdown
   * (one of its connections said ESHUTDOWN), which flushes before it
   * exits: unflushed writes are not counted lost. */
  _Atomic int64_t orderly_until;
  /* A request failed for the time-out in this outage (no connection up
   * since): new requests get one reconnection attempt (GRACE_MS), not a
   * time-out of their own (a FUSE fsync queued behind a failing write
   * would wait for both).  Cleared when a connection is up, or lost while
   * none was lost before (a new outage). */
  atomic_bool gave_up;
  int64_t bad_size; /* event thread: the wrong identity last logged */
};

/* Set around an issuing call, so that a free callback run inside the call
 * knows libnbd refused the command. */
static _Thread_local struct op *issuing;
/* Commands libnbd is done with, to finish once libnbd has returned. */
static _Thread_local struct op *done_head, *done_tail;

static void dispatch(struct op *op);

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wake(struct nbddev *d) {
  uint64_t one = 1;
  ssize_t r = write(d->wakefd, &one, sizeof one);
  (void)r; /* only fails when the counter is saturated: already awake */
}

static const char *cmd_name(enum bd_cmd cmd) {
  static const char *const names[] = {[BD_READ] = "read",
                                      [BD_WRITE] = "write",
                                      [BD_FLUSH] = "flush",
                                      [BD_TRIM] = "trim",
                                      [BD_ZERO] = "zero",
                                      [BD_CACHE] = "cache",
                                      [BD_BLOCK_STATUS] = "block status"};
  return (unsigned)cmd < sizeof names / sizeof *names ? names[cmd] : "?";
}

/* ---- finishing commands ---- */

/* WHY: a failure's message (this piece's; the first failure's is the
 * request's, written before this piece stops counting). */
static void piece_done(struct split *s, int err, const char *why) {
  int none = 0;
  if (err && atomic_compare_exchange_strong(&s->err, &none, err))
    bd_req_set_error(s->req, "%s", why);
  if (atomic_fetch_sub(&s->pending, 1) == 1) {
    bd_complete(s->req, atomic_load(&s->err));
    free(s);
  }
}

static void op_end(struct op *op, int err, const char *why) {
  struct split *s = op->split;
  struct bd_req *req = op->req;
  free(op);
  if (s) {
    piece_done(s, err, why);
    return;
  }
  if (err)
    bd_req_set_error(req, "%s", why);
  bd_complete(req, err);
}

static void op_fail(struct op *op, int err, const char *why) {
  char msg[BD_REQ_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "nbd %s: %s at %llu: %s", op->d->uri,
           cmd_name(op->req->cmd), (unsigned long long)op->off, why);
  op_end(op, err, msg);
}

static bool is_write(enum bd_cmd cmd) {
  return cmd == BD_WRITE || cmd == BD_TRIM || cmd == BD_ZERO;
}

static void flush_done(struct op *op) {
  struct nbddev *d = op->d;
  replay_flushed(&d->log, op->gen);
  if (atomic_exchange(&d->writes_lost, false)) {
    uint64_t past = atomic_exchange(&d->lost_bytes, 0);
    log_error("nbd %s: a lost connection lost %llu bytes of acknowledged "
              "writes: past --nbd-replay-limit (%llu bytes kept), or "
              "refused when sent again",
              d->uri, (unsigned long long)past,
              (unsigned long long)d->log.limit);
    op_fail(op, -EIO,
            "writes completed before a lost connection may not "
            "have reached stable storage");
    return;
  }
  op_end(op, 0, NULL);
}

static void op_succeeded(struct op *op) {
  struct bd_req *req = op->req;
  if (req->cmd == BD_FLUSH) {
    flush_done(op);
    return;
  }
  if (is_write(req->cmd))
    replay_add(&op->d->log, req->cmd, req->flags, op->off, op->len,
               req->cmd == BD_WRITE ? req->buf : NULL);
  op_end(op, 0, NULL);
}

/* Set OP's deadline when it first has to wait for a connection.  The
 * time-out counts from submission, so a request on a server found hung
 * (after the time-out) gets no second time-out, only one reconnection
 * attempt (GRACE_MS). */
static void set_deadline(struct op *op, int64_t now) {
  int64_t t = op->d->timeout_ms;
  if (op->deadline)
    return;
  if (!t) {
    op->deadline = INT64_MAX;
    return;
  }
  op->deadline =
      op->start + t > now + GRACE_MS ? op->start + t : now + GRACE_MS;
}

/* OP's time is up: it fails, and the outage counts as given up. */
static void op_timed_out(struct op *op, const char *why) {
  bd_stat_count(op->d->stats, &st_timeouts, 1);
  atomic_store(&op->d->gave_up, true);
  op_fail(op, -EIO, why);
}

/* The connection went away with the command in flight. */
static void op_lost(struct op *op) {
  struct bd_req *req = op->req;
  /* Writes, trims, zeroes and flushes go again after the replay (header
   * comment); block status only if nothing was reported. */
  bool resend =
      req->cmd != BD_BLOCK_STATUS ||
      (req->extents->n == op->ext_n && req->extents->end == op->ext_end);
  if (!resend) {
    op_fail(op, -EIO, "the connection was lost with the request in flight");
    return;
  }
  /* The timeout runs from the first loss, however many connections the
   * request tries after it. */
  int64_t now = now_ms();
  set_deadline(op, now);
  if (op->deadline <= now) {
    op_timed_out(op, "the connection was lost and no other answered "
                     "within the timeout");
    return;
  }
  dispatch(op);
}

/* The server is shutting down and did not execute OP: stop using its
 * connection, and send OP again on another or once it is back. */
static void op_refused_for_shutdown(struct op *op) {
  struct nbddev *d = op->d;
  /* Every connection goes to the same server: stop using all of them, so
   * OP waits for the server to return instead of meeting it again. */
  bool first = false;
  for (unsigned i = 0; i < d->nconns; i++) {
    int up = C_UP;
    first |=
        atomic_compare_exchange_strong(&d->conns[i].state, &up, C_DRAINING);
  }
  if (first) {
    log_info("nbd %s: the server is shutting down; reconnecting when it "
             "returns",
             d->uri);
    atomic_store(&d->orderly_until, now_ms() + ORDERLY_MS);
    wake(d);
  }
  int64_t now = now_ms();
  set_deadline(op, now);
  if (op->deadline <= now) {
    op_timed_out(op, "the server shut down and did not return in time");
    return;
  }
  dispatch(op);
}

static void finish(struct op *op) {
  struct conn *c = op->c;
  if (op->deadline && atomic_fetch_sub(&c->resent, 1) == 1)
    atomic_store(&c->resent_deadline, INT64_MAX);
  int err = op->completed ? op->err : ENOTCONN;
  if (err == ESHUTDOWN)
    op_refused_for_shutdown(op);
  else if (err == ENOTCONN)
    op_lost(op);
  else if (err)
    op_fail(op, -err, strerror(err));
  else
    op_succeeded(op);
  /* Last: a replay starts only once nothing is in flight, so the replay
   * log is not changed (by this acknowledgement or flush) under it. */
  atomic_fetch_sub(&c->inflight, 1);
}

/* Finish the commands libnbd released on this thread. */
static void drain(void) {
  struct op *op;
  while ((op = done_head)) {
    done_head = op->next;
    if (!done_head)
      done_tail = NULL;
    finish(op);
  }
}

static int op_completed(void *user_data, int *error) {
  struct op *op = user_data;
  op->completed = true;
  op->err = *error;
  return 1;
}

static void op_freed(void *user_data) {
  struct op *op = user_data;
  if (op == issuing && !op->completed)
    return; /* libnbd refused it: the issuing call fails, its caller acts */
  op->next = NULL;
  if (done_tail)
    done_tail->next = op;
  else
    done_head = op;
  done_tail = op;
}

/* The server answers every context negotiated: only the one REQ asked
 * for is kept, allocation (its hole and zero bits, depth 1) or a named
 * context's values as they are (depth 0). */
static int extent_cb(void *user_data, const char *context, uint64_t offset,
                     uint32_t *entries, size_t n, int *error) {
  (void)offset, (void)error;
  const struct op *op = user_data;
  struct bd_req *req = op->req;
  const char *want = req->context ? op->d->ctx[req->context - 1]
                                  : LIBNBD_CONTEXT_BASE_ALLOCATION;
  if (strcmp(context, want) != 0)
    return 0;
  uint32_t mask = req->context ? UINT32_MAX : 3;
  uint32_t depth = req->context ? 0 : 1;
  for (size_t i = 0; i + 1 < n; i += 2)
    if (bd_extents_add(req->extents, entries[i], entries[i + 1] & mask,
                       depth) != 0)
      break;
  return 0;
}

/* ---- issuing ---- */

static int64_t issue(struct nbd_handle *h, struct op *op) {
  struct bd_req *req = op->req;
  nbd_completion_callback cb = {
      .callback = op_completed, .user_data = op, .free = op_freed};
  uint32_t fua = (req->flags & BD_F_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;
  switch (req->cmd) {
  case BD_READ: return nbd_aio_pread(h, req->buf, op->len, op->off, cb, 0);
  case BD_WRITE: return nbd_aio_pwrite(h, req->buf, op->len, op->off, cb, fua);
  case BD_FLUSH: return nbd_aio_flush(h, cb, 0);
  case BD_TRIM: return nbd_aio_trim(h, op->len, op->off, cb, fua);
  case BD_CACHE: return nbd_aio_cache(h, op->len, op->off, cb, 0);
  case BD_ZERO: {
    uint32_t f =
        fua | ((req->flags & BD_F_MAY_TRIM) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE) |
        ((req->flags & BD_F_FAST_ZERO) ? LIBNBD_CMD_FLAG_FAST_ZERO : 0);
    return nbd_aio_zero(h, op->len, op->off, cb, f);
  }
  case BD_BLOCK_STATUS: {
    nbd_extent_callback ecb = {.callback = extent_cb, .user_data = op};
    return nbd_aio_block_status(
        h, op->len, op->off, ecb, cb,
        (req->flags & BD_F_REQ_ONE) ? LIBNBD_CMD_FLAG_REQ_ONE : 0);
  }
  }
  return -1;
}

/* Each submitting thread has a home connection, dealt round-robin per
 * device: a thread's requests reach the server in batches on one socket
 * (the server reads many per system call), and threads spread over the
 * connections.  Per-request round-robin scattered one thread's stream
 * and was slower on the 2-core bench. */
static _Thread_local const struct nbddev *home_dev;
static _Thread_local unsigned home_slot;

static struct conn *pick(struct nbddev *d) {
  unsigned n = d->nconns, start = 0;
  if (atomic_load(&d->replay_pending))
    return NULL; /* the queue waits for the replay */
  if (n > 1) {
    if (home_dev != d) {
      home_dev = d;
      home_slot = atomic_fetch_add_explicit(&d->rr, 1, memory_order_relaxed);
    }
    start = home_slot;
  }
  for (unsigned i = 0; i < n; i++) {
    struct conn *c = &d->conns[(start + i) % n];
    if (atomic_load(&c->state) == C_UP)
      return c;
  }
  return NULL;
}

/* Issue OP on C.  False when C turned out to be dead (OP is untouched);
 * true when OP is in flight or has been failed. */
static bool try_issue(struct conn *c, struct op *op) {
  pthread_rwlock_rdlock(&c->lock);
  /* A replay checks under the write lock that nothing is in flight. */
  if (atomic_load(&c->state) != C_UP || atomic_load(&c->d->replay_pending)) {
    pthread_rwlock_unlock(&c->lock);
    return false;
  }
  /* The clock of the hang check starts with the first request. */
  if (atomic_load(&c->inflight) == 0)
    atomic_store(&c->last_read, now_ms());
  atomic_fetch_add(&c->inflight, 1);
  if (op->deadline) {
    atomic_fetch_add(&c->resent, 1);
    int64_t cur = atomic_load(&c->resent_deadline);
    while (op->deadline < cur && !atomic_compare_exchange_weak(
                                     &c->resent_deadline, &cur, op->deadline))
      ;
  }
  op->c = c;
  op->completed = false;
  issuing = op;
  int64_t r = issue(c->h, op);
  issuing = NULL;
  bool more = false, dead = false;
  int e = 0;
  if (r >= 0)
    more = nbd_aio_get_direction(c->h) & LIBNBD_AIO_DIRECTION_WRITE;
  else {
    e = nbd_get_errno();
    dead = nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h);
  }
  pthread_rwlock_unlock(&c->lock);
  if (r >= 0) {
    /* OP may be finished already: do not touch it. */
    if (more)
      wake(c->d);
    return true;
  }
  atomic_fetch_sub(&c->inflight, 1);
  if (op->deadline)
    atomic_fetch_sub(&c->resent, 1);
  if (dead) {
    int up = C_UP;
    atomic_compare_exchange_strong(&c->state, &up, C_DEAD);
    wake(c->d);
    return false;
  }
  op_fail(op, -(e > 0 ? e : EIO), nbd_get_error());
  return true;
}

static bool any_up(struct nbddev *d) {
  for (unsigned i = 0; i < d->nconns; i++)
    if (atomic_load(&d->conns[i].state) == C_UP)
      return true;
  return false;
}

/* A connection takes requests: up, and no replay pending (under lock). */
static bool usable(struct nbddev *d) {
  return !atomic_load(&d->replay_pending) && any_up(d);
}

/* Queue OP until a connection is up.  Returns 1 when queued, 0 when a
 * connection came up meanwhile, or -EIO or -ECANCELED (with OP failed). */
static int wait_for_conn(struct op *op) {
  struct nbddev *d = op->d;
  const char *why = NULL;
  int err = -EIO;
  int64_t now = now_ms();
  pthread_mutex_lock(&d->lock);
  if (d->closing)
    why = "the device is closing";
  else if (bd_req_cancelled(op->req))
    why = "cancelled: the client is gone", err = -ECANCELED;
  else if (atomic_load(&d->foreign))
    why = "the server came back as a different export";
  else if (usable(d)) {
    pthread_mutex_unlock(&d->lock);
    return 0;
  } else if (op->nowait)
    why = "not connected to the server";
  else {
    if (!op->deadline && atomic_load(&d->gave_up))
      op->deadline = now + GRACE_MS;
    set_deadline(op, now);
    if (op->deadline <= now)
      why = "no connection to the server within the timeout";
  }
  if (!why) {
    op->next = NULL;
    if (d->wait_tail)
      d->wait_tail->next = op;
    else
      d->wait_head = op;
    d->wait_tail = op;
  }
  pthread_mutex_unlock(&d->lock);
  if (why) {
    if (op->deadline && op->deadline <= now)
      atomic_store(&d->gave_up, true);
    op_fail(op, err, why);
    return err;
  }
  wake(d);
  return 1;
}

/* Send OP on a connection that is up, or queue it until one is. */
static void dispatch(struct op *op) {
  for (;;) {
    struct conn *c = pick(op->d);
    if (c) {
      if (try_issue(c, op))
        return;
    } else if (wait_for_conn(op) != 0) {
      return;
    }
  }
}

/* Requests the server cannot take, answered here: trim and cache are
 * advisory, a flush without a write cache has nothing to do, block status
 * without the context is "all data", and empty requests are done.
 * Returns true with *ERR set when answered. */
static bool answer_locally(struct nbddev *d, struct bd_req *req, int *err) {
  *err = 0;
  switch (req->cmd) {
  case BD_FLUSH: return !d->can_flush;
  case BD_TRIM: return !d->can_trim || req->length == 0;
  case BD_CACHE: return !d->can_cache || req->length == 0;
  case BD_BLOCK_STATUS:
    if (req->context) /* the core checked that it was negotiated */
      return req->length == 0;
    if (d->can_extents && req->length > 0)
      return false;
    if (req->length > 0 && bd_extents_add(req->extents, req->length, 0, 1) < 0)
      *err = -ENOMEM;
    return true;
  default: return req->length == 0;
  }
}

static struct op *new_op(struct nbddev *d, struct bd_req *req, struct split *s,
                         uint64_t off, uint64_t len) {
  struct op *op = calloc(1, sizeof *op);
  if (!op)
    return NULL;
  *op = (struct op){.d = d,
                    .req = req,
                    .split = s,
                    .off = off,
                    .len = len,
                    .start = now_ms()};
  if (req->cmd == BD_FLUSH)
    op->gen = replay_mark(&d->log);
  if (req->cmd == BD_BLOCK_STATUS) {
    op->ext_n = req->extents->n;
    op->ext_end = req->extents->end;
  }
  return op;
}

/* Trim and zero above NBD_CHUNK go as several commands. */
static void submit_split(struct nbddev *d, struct bd_req *req) {
  uint64_t len = req->length, off = req->offset;
  unsigned pieces = (unsigned)((len + NBD_CHUNK - 1) / NBD_CHUNK);
  struct split *s = calloc(1, sizeof *s);
  if (!s) {
    bd_complete(req, -ENOMEM);
    return;
  }
  s->req = req;
  atomic_init(&s->pending, (int)pieces);
  atomic_init(&s->err, 0);
  for (unsigned i = 0; i < pieces; i++) {
    uint64_t o = (uint64_t)i * NBD_CHUNK;
    uint64_t l = len - o < NBD_CHUNK ? len - o : NBD_CHUNK;
    struct op *op = new_op(d, req, s, off + o, l);
    if (op) {
      dispatch(op);
    } else {
      piece_done(s, -ENOMEM, "out of memory");
    }
  }
}

static void submit_req(struct nbddev *d, struct bd_req *req, bool nowait) {
  int err;
  if (answer_locally(d, req, &err)) {
    bd_complete(req, err);
    return;
  }
  uint64_t len = req->length;
  if ((req->cmd == BD_TRIM || req->cmd == BD_ZERO) && len > NBD_CHUNK) {
    submit_split(d, req);
    drain();
    return;
  }
  /* Block status may answer short: ask for at most one chunk. */
  if (req->cmd == BD_BLOCK_STATUS && len > NBD_CHUNK)
    len = NBD_CHUNK;
  struct op *op = new_op(d, req, NULL, req->offset, len);
  if (!op) {
    bd_set_error("nbd %s: out of memory", d->uri);
    bd_complete(req, -ENOMEM);
    return;
  }
  op->nowait = nowait;
  dispatch(op);
  drain();
}

static void nbdsrc_submit(struct bd *bd, struct bd_req *req) {
  submit_req(bd->priv, req, false);
}

/* ---- connections ---- */

static struct nbd_handle *new_handle(const struct nbddev *d) {
  struct nbd_handle *h = nbd_create();
  if (!h)
    return NULL;
  for (size_t i = 0; i < d->nctx; i++)
    nbd_add_meta_context(h, d->ctx[i]);
  nbd_set_pread_initialize(h, false); /* buffers are ours, unread on error */
  /* The URI comes from our own command line, so nbds:// may name its key
   * file (tls-psk-file=); libnbd refuses that by default. */
  nbd_set_uri_allow_local_file(h, true);
  nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION);
  return h;
}

static void schedule_retry(struct conn *c, int64_t now) {
  c->due = now + c->backoff;
  c->backoff = c->backoff * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : c->backoff * 2;
}

/* Whether every connection but C is up (C was the first one lost). */
static bool all_up_but(struct nbddev *d, struct conn *c) {
  for (unsigned i = 0; i < d->nconns; i++)
    if (&d->conns[i] != c && atomic_load(&d->conns[i].state) != C_UP)
      return false;
  return true;
}

/* Swap the handle out under the write lock, so no submitter is using it,
 * and close it: commands still queued in it come back through op_freed. */
static void drop_handle(struct conn *c) {
  pthread_rwlock_wrlock(&c->lock);
  struct nbd_handle *h = c->h;
  c->h = NULL;
  pthread_rwlock_unlock(&c->lock);
  nbd_close(h);
}

static void conn_lost(struct conn *c, int64_t now, const char *why) {
  struct nbddev *d = c->d;
  atomic_store(&c->state, C_DOWN);
  pthread_mutex_lock(&d->lock);
  bool closing = d->closing;
  /* Before the handle goes: its commands come back to the queue. */
  if (!closing)
    atomic_store(&d->replay_pending, true);
  d->rp_started = false;
  if (all_up_but(d, c))
    atomic_store(&d->gave_up, false); /* a new outage */
  pthread_mutex_unlock(&d->lock);
  uint64_t past = replay_past(&d->log);
  drop_handle(c);
  c->failures = 0;
  c->lost = true;
  c->backoff = RETRY_MIN_MS;
  c->due = now; /* try at once: the server may only have dropped us */
  if (closing)
    return; /* the server hung up after our goodbye */
  if (now < atomic_load(&d->orderly_until)) {
    log_info("nbd %s: connection %u closed by the server's shutdown; "
             "reconnecting",
             d->uri, c->idx);
    return;
  }
  log_warn("nbd %s: connection %u lost: %s", d->uri, c->idx, why);
  if (past) {
    atomic_store(&d->lost_bytes, past);
    if (!atomic_exchange(&d->writes_lost, true))
      log_warn("nbd %s: %llu bytes written since the last flush were past "
               "the replay log's bound and may be lost; the next flush "
               "will fail",
               d->uri, (unsigned long long)past);
  }
  if (!any_up(d) && d->timeout_ms)
    log_warn("nbd %s: no connection left; requests wait up to %lld s for one",
             d->uri, (long long)d->timeout_ms / 1000);
  else if (!any_up(d))
    log_warn("nbd %s: no connection left; requests wait for one", d->uri);
}

static void connect_failed(struct conn *c, int64_t now, const char *why) {
  if (c->failures++ == 0)
    log_info("nbd %s: reconnecting connection %u: %s", c->d->uri, c->idx, why);
  if (c->h)
    drop_handle(c);
  atomic_store(&c->state, C_DOWN);
  schedule_retry(c, now);
}

static void start_connect(struct conn *c, int64_t now) {
  struct nbd_handle *h = new_handle(c->d);
  if (!h) {
    connect_failed(c, now, "cannot create a libnbd handle");
    return;
  }
  pthread_rwlock_wrlock(&c->lock);
  c->h = h;
  pthread_rwlock_unlock(&c->lock);
  atomic_store(&c->state, C_CONNECTING);
  c->due = now + CONNECT_MAX_MS;
  if (nbd_aio_connect_uri(h, c->d->uri) < 0 || nbd_aio_is_dead(h) ||
      nbd_aio_is_closed(h))
    connect_failed(c, now, nbd_get_error());
}

/* Take the queue of waiting requests (under lock). */
static struct op *take_waiters(struct nbddev *d) {
  struct op *op = d->wait_head;
  d->wait_head = d->wait_tail = NULL;
  return op;
}

/* Send the queue: the flushes first (they cover what was replayed), then
 * the rest in order. */
static void release(struct op *list) {
  for (int pass = 0; pass < 2; pass++) {
    struct op *rest = NULL, **tail = &rest;
    while (list) {
      struct op *next = list->next;
      if (pass == 1 || list->req->cmd == BD_FLUSH) {
        dispatch(list);
      } else {
        *tail = list;
        tail = &list->next;
        list->next = NULL;
      }
      list = next;
    }
    list = rest;
  }
}

/* C is up: the waiting requests go, unless a replay must come first. */
static void conn_up(struct conn *c) {
  struct nbddev *d = c->d;
  struct op *op = NULL;
  atomic_store(&c->last_read, now_ms());
  pthread_mutex_lock(&d->lock);
  atomic_store(&c->state, C_UP);
  atomic_store(&d->gave_up, false);
  if (!atomic_load(&d->replay_pending))
    op = take_waiters(d);
  pthread_mutex_unlock(&d->lock);
  d->bad_size = 0;
  log_info("nbd %s: connection %u %s", d->uri, c->idx,
           c->lost ? "re-established" : "up");
  if (c->lost)
    bd_stat_count(d->stats, &st_reconnects, 1);
  c->failures = 0;
  c->lost = false;
  release(op);
}

/* What identifies the export besides its size: its flags. */
static unsigned ident_of(struct nbd_handle *h) {
  int v[] = {nbd_is_read_only(h),
             nbd_can_flush(h),
             nbd_can_fua(h),
             nbd_can_trim(h),
             nbd_can_zero(h),
             nbd_can_fast_zero(h),
             nbd_can_cache(h),
             nbd_can_multi_conn(h),
             nbd_can_df(h),
             nbd_is_rotational(h),
             nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION)};
  unsigned r = 0;
  for (unsigned i = 0; i < sizeof v / sizeof *v; i++)
    r |= (v[i] == 1 ? 1u : 0u) << i;
  return r;
}

/* Fail every waiting request: the server is another export now. */
static void fail_waiters(struct nbddev *d, const char *why) {
  pthread_mutex_lock(&d->lock);
  struct op *op = take_waiters(d);
  pthread_mutex_unlock(&d->lock);
  while (op) {
    struct op *next = op->next;
    op_fail(op, -EIO, why);
    op = next;
  }
}

/* The server is not the export opened (SIZE -1: it has no such export):
 * refuse it, and fail the requests rather than replay into it. */
static void foreign_export(struct conn *c, int64_t now, int64_t size) {
  struct nbddev *d = c->d;
  unsigned ident = size < 0 ? 0 : ident_of(c->h);
  int64_t key = size ^ ((int64_t)ident << 48);
  if (key != d->bad_size && size < 0)
    log_error("nbd %s: the server came back without the export: failing "
              "requests until it has it again",
              d->uri);
  else if (key != d->bad_size)
    log_error("nbd %s: the export came back as another (%lld bytes, flags "
              "%#x; was %llu bytes, flags %#x): failing requests until it "
              "is the same again",
              d->uri, (long long)size, ident, (unsigned long long)d->size,
              d->ident);
  d->bad_size = key; /* log each wrong identity once */
  atomic_store(&d->foreign, true);
  c->failures++;
  drop_handle(c);
  atomic_store(&c->state, C_DOWN);
  schedule_retry(c, now);
  fail_waiters(d, "the server came back as a different export");
}

/* The handshake advanced: done, failed, or still going. */
static void connect_progress(struct conn *c, int64_t now, const char *why) {
  struct nbd_handle *h = c->h;
  if (nbd_aio_is_connecting(h) && now < c->due)
    return;
  /* libnbd says so only in its message (NBD_REP_ERR_UNKNOWN). */
  if (!nbd_aio_is_ready(h) && !nbd_aio_is_connecting(h) &&
      strstr(why, "has no export named")) {
    foreign_export(c, now, -1);
    return;
  }
  if (!nbd_aio_is_ready(h)) {
    connect_failed(c, now,
                   nbd_aio_is_connecting(h) ? "handshake timed out" : why);
    return;
  }
  int64_t size = nbd_get_size(h);
  if (size != (int64_t)c->d->size || ident_of(h) != c->d->ident) {
    foreign_export(c, now, size);
    return;
  }
  atomic_store(&c->d->foreign, false);
  conn_up(c);
}

/* ---- replay after a loss (header comment) ---- */

struct rp_cmd {
  struct nbddev *d;
  struct conn *c;
  uint64_t len;
  int err;
  bool completed;
};

static _Thread_local struct rp_cmd *rp_issuing;

static int rp_completed(void *user_data, int *error) {
  struct rp_cmd *r = user_data;
  r->completed = true;
  r->err = *error;
  return 1;
}

static void rp_refused(struct nbddev *d, uint64_t len, const char *why) {
  log_error("nbd %s: a write sent again after a loss failed: %s", d->uri, why);
  atomic_fetch_add(&d->lost_bytes, len);
  atomic_store(&d->writes_lost, true);
}

static void rp_freed(void *user_data) {
  struct rp_cmd *r = user_data;
  struct nbddev *d = r->d;
  int err = r->completed ? r->err : ENOTCONN;
  if (r == rp_issuing && !r->completed)
    err = 0; /* refused at issue: replay_one() decides */
  if (err == ESHUTDOWN) {
    int up = C_UP;
    atomic_compare_exchange_strong(&r->c->state, &up, C_DRAINING);
  }
  if (err == ENOTCONN || err == ESHUTDOWN)
    atomic_store(&d->rp_lost, true);
  else if (err)
    rp_refused(d, r->len, strerror(err));
  atomic_fetch_sub(&r->c->inflight, 1);
  atomic_fetch_sub(&d->rp_inflight, 1);
  free(r);
}

/* Send E again on C (read-locked). */
static void replay_one(struct conn *c, const struct replay_entry *e) {
  struct nbddev *d = c->d;
  struct rp_cmd *r = calloc(1, sizeof *r);
  if (!r) {
    rp_refused(d, e->len, "out of memory");
    return;
  }
  *r = (struct rp_cmd){.d = d, .c = c, .len = e->len};
  nbd_completion_callback cb = {
      .callback = rp_completed, .user_data = r, .free = rp_freed};
  uint32_t fua = (e->flags & BD_F_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;
  uint32_t zf = (e->flags & BD_F_MAY_TRIM) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE;
  atomic_fetch_add(&c->inflight, 1);
  atomic_fetch_add(&d->rp_inflight, 1);
  rp_issuing = r;
  int64_t rc = e->cmd == BD_WRITE
                   ? nbd_aio_pwrite(c->h, e->data, e->len, e->off, cb, fua)
               : e->cmd == BD_TRIM
                   ? nbd_aio_trim(c->h, e->len, e->off, cb, fua)
                   : nbd_aio_zero(c->h, e->len, e->off, cb, fua | zf);
  rp_issuing = NULL;
  if (rc >= 0)
    return;
  if (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h))
    atomic_store(&d->rp_lost, true);
  else
    rp_refused(d, e->len, nbd_get_error());
}

static bool overlaps(struct replay_entry *const *b, unsigned n,
                     const struct replay_entry *e) {
  for (unsigned i = 0; i < n; i++)
    if (e->off < b[i]->off + b[i]->len && b[i]->off < e->off + e->len)
      return true;
  return false;
}

/* Nothing in flight on any connection (a submitter that saw no replay
 * pending has counted its request before it unlocks). */
static bool quiet(struct nbddev *d) {
  bool busy = false;
  for (unsigned i = 0; i < d->nconns; i++) {
    struct conn *c = &d->conns[i];
    pthread_rwlock_wrlock(&c->lock);
    busy |= atomic_load(&c->inflight) > 0;
    pthread_rwlock_unlock(&c->lock);
  }
  return !busy;
}

/* The replay is over: the queue goes. */
static void replay_done(struct nbddev *d) {
  pthread_mutex_lock(&d->lock);
  atomic_store(&d->replay_pending, false);
  struct op *op = take_waiters(d);
  pthread_mutex_unlock(&d->lock);
  d->rp_started = false;
  if (d->rp_count)
    log_info("nbd %s: sent %llu acknowledged writes, trims and zeroes "
             "again after the loss (%llu bytes of data, %lld ms)",
             d->uri, (unsigned long long)d->rp_count,
             (unsigned long long)d->rp_bytes, (long long)(now_ms() - d->rp_t0));
  release(op);
}

/* The next step of a pending replay: start once a connection is up and
 * nothing is in flight, send the next batch of non-overlapping entries
 * once the last is answered, finish at the end of the log. */
static void replay_step(struct nbddev *d, bool closing) {
  if (closing || !atomic_load(&d->replay_pending) ||
      atomic_load(&d->rp_inflight) > 0)
    return;
  if (atomic_exchange(&d->rp_lost, false))
    d->rp_started = false; /* its connection went too: start over */
  struct conn *c = NULL;
  for (unsigned i = 0; i < d->nconns && !c; i++)
    if (atomic_load(&d->conns[i].state) == C_UP)
      c = &d->conns[i];
  if (!c)
    return;
  if (!d->rp_started) {
    if (!quiet(d))
      return;
    pthread_mutex_lock(&d->log.lock);
    d->rp_next = d->log.head;
    pthread_mutex_unlock(&d->log.lock);
    d->rp_started = true;
    d->rp_count = d->rp_bytes = 0;
    d->rp_t0 = now_ms();
  }
  struct replay_entry *batch[REPLAY_BATCH];
  unsigned n = 0;
  pthread_rwlock_rdlock(&c->lock);
  atomic_store(&c->last_read, now_ms()); /* the hang check's clock */
  while (d->rp_next && n < REPLAY_BATCH && !overlaps(batch, n, d->rp_next)) {
    batch[n++] = d->rp_next;
    if (d->rp_next->cmd == BD_WRITE)
      d->rp_bytes += d->rp_next->len;
    replay_one(c, d->rp_next);
    d->rp_next = d->rp_next->next;
  }
  pthread_rwlock_unlock(&c->lock);
  d->rp_count += n;
  if (!n)
    replay_done(d);
}

/* ---- the event thread ---- */

static bool is_closing(struct nbddev *d) {
  pthread_mutex_lock(&d->lock);
  bool r = d->closing;
  pthread_mutex_unlock(&d->lock);
  return r;
}

/* The front end lost CONN's client: its requests waiting for a lost
 * server need not wait any longer (those sent wait for their answer). */
static void nbdsrc_cancel(struct bd *bd, struct bd_conn *conn) {
  struct nbddev *d = bd->priv;
  struct op *gone = NULL, **pp;
  pthread_mutex_lock(&d->lock);
  for (pp = &d->wait_head; *pp;) {
    struct op *op = *pp;
    if (op->req->conn == conn) {
      *pp = op->next;
      op->next = gone;
      gone = op;
    } else {
      pp = &op->next;
    }
  }
  d->wait_tail = NULL;
  for (struct op *op = d->wait_head; op; op = op->next)
    d->wait_tail = op;
  pthread_mutex_unlock(&d->lock);
  while (gone) {
    struct op *op = gone;
    gone = op->next;
    op_fail(op, -ECANCELED, "cancelled: the client is gone");
  }
}

/* Fail the waiting requests whose time is up (all of them when closing). */
static void expire_waiters(struct nbddev *d, int64_t now, int64_t *next) {
  struct op *expired = NULL, **pp;
  pthread_mutex_lock(&d->lock);
  bool closing = d->closing;
  for (pp = &d->wait_head; *pp;) {
    struct op *op = *pp;
    if (closing || op->deadline <= now) {
      *pp = op->next;
      op->next = expired;
      expired = op;
    } else {
      if (op->deadline < *next)
        *next = op->deadline;
      pp = &op->next;
    }
  }
  d->wait_tail = NULL;
  for (struct op *op = d->wait_head; op; op = op->next)
    d->wait_tail = op;
  bool waiting = d->wait_head != NULL;
  pthread_mutex_unlock(&d->lock);
  while (expired) {
    struct op *op = expired;
    expired = op->next;
    if (closing)
      op_fail(op, -EIO, "the device is closing");
    else
      op_timed_out(op, "no connection to the server within the timeout");
  }
  /* Requests are waiting: retry a lost server often. */
  if (waiting)
    for (unsigned i = 0; i < d->nconns; i++)
      if (atomic_load(&d->conns[i].state) == C_DOWN &&
          d->conns[i].due > now + RETRY_MIN_MS)
        d->conns[i].due = now + RETRY_MIN_MS;
}

/* A connection with requests in flight that heard nothing for the
 * timeout is dropped: its server is gone or stuck. */
static void hang_up(struct conn *c) {
  bd_stat_count(c->d->stats, &st_hangups, 1);
  int fd = nbd_aio_get_fd(c->h);
  if (fd >= 0)
    shutdown(fd, SHUT_RDWR); /* libnbd sees the end and fails them */
}

/* C was dropped as hung: so is every other connection up that has heard
 * nothing from the server since C last did (the same server, stopped):
 * an idle one would otherwise take the next request and only start its
 * own time-out then. */
static void hang_up_silent(struct conn *c, int64_t since) {
  struct nbddev *d = c->d;
  for (unsigned i = 0; i < d->nconns; i++) {
    struct conn *o = &d->conns[i];
    if (o == c || atomic_load(&o->state) != C_UP ||
        atomic_load(&o->last_read) > since)
      continue;
    log_warn("nbd %s: connection %u: silent too; dropping it", d->uri, o->idx);
    hang_up(o);
  }
}

static void check_hung(struct conn *c, int64_t now, int64_t *next) {
  int64_t t = c->d->timeout_ms;
  if (!t || atomic_load(&c->inflight) == 0)
    return;
  int64_t since = atomic_load(&c->last_read);
  int64_t resent_end = atomic_load(&c->resent) > 0
                           ? atomic_load(&c->resent_deadline)
                           : INT64_MAX;
  if (now >= resent_end) {
    log_warn("nbd %s: connection %u: no reply to a request sent again "
             "within its time-out; dropping it",
             c->d->uri, c->idx);
    hang_up(c);
    hang_up_silent(c, since);
    *next = now;
  } else if (now - since >= t) {
    log_warn("nbd %s: connection %u: no reply for %lld s; dropping it",
             c->d->uri, c->idx, (long long)t / 1000);
    hang_up(c);
    hang_up_silent(c, since);
    *next = now;
  } else {
    if (since + t < *next)
      *next = since + t;
    if (resent_end < *next)
      *next = resent_end;
  }
}

/* Timers: reconnection, handshake deadlines, waiters, hangs.  Returns
 * the poll timeout in ms. */
static int housekeeping(struct nbddev *d, int64_t now, bool closing) {
  int64_t next = INT64_MAX;
  expire_waiters(d, now, &next);
  for (unsigned i = 0; i < d->nconns; i++) {
    struct conn *c = &d->conns[i];
    int st = atomic_load(&c->state);
    if (st == C_DEAD || ((st == C_UP || st == C_DRAINING) &&
                         (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)))) {
      conn_lost(c, now, "the server closed the connection");
      st = C_DOWN;
    }
    if (st == C_DRAINING && atomic_load(&c->inflight) == 0) {
      /* Everything answered: leave as the spec asks, then reconnect. */
      nbd_aio_disconnect(c->h, 0);
      conn_lost(c, now, "the server is shutting down");
      c->due = now + RETRY_MIN_MS; /* it is restarting, if at all */
      st = C_DOWN;
    }
    if (st == C_CONNECTING && closing) {
      drop_handle(c); /* abandon the handshake */
      atomic_store(&c->state, C_DOWN);
    } else if (st == C_CONNECTING && now >= c->due) {
      connect_progress(c, now, "handshake timed out");
    }
    if (st == C_DOWN && !closing && now >= c->due)
      start_connect(c, now);
    st = atomic_load(&c->state);
    if ((st == C_UP || st == C_DRAINING) && !closing)
      check_hung(c, now, &next);
    if ((st == C_DOWN || st == C_CONNECTING) && !closing && c->due < next)
      next = c->due;
  }
  replay_step(d, closing);
  drain();
  /* Submitters do not wake this thread for a first request in flight, so
   * the hang check runs on a tick. */
  int64_t tick = d->timeout_ms / 4 < 1000 ? d->timeout_ms / 4 : 1000;
  if (d->timeout_ms && !closing && now + tick < next)
    next = now + tick;
  if (next == INT64_MAX)
    return -1;
  return next <= now ? 0 : next - now > 60000 ? 60000 : (int)(next - now);
}

static void service(struct conn *c, short revents, int64_t now) {
  struct nbd_handle *h = c->h;
  unsigned dir = nbd_aio_get_direction(h);
  char why[256] = "the server closed the connection";
  int r = 0;
  atomic_store(&c->last_read, now); /* progress either way */
  if ((revents & (POLLIN | POLLHUP | POLLERR)) &&
      (dir & LIBNBD_AIO_DIRECTION_READ)) {
    r = nbd_aio_notify_read(h);
    dir = nbd_aio_get_direction(h);
  }
  /* A submitter may have finished the send meanwhile: re-check. */
  if (r == 0 && (revents & (POLLOUT | POLLHUP | POLLERR)) &&
      (dir & LIBNBD_AIO_DIRECTION_WRITE))
    r = nbd_aio_notify_write(h);
  /* -1 may also be a benign race on the state; only death counts. */
  if (r < 0 && nbd_get_error())
    snprintf(why, sizeof why, "%s", nbd_get_error());
  if (atomic_load(&c->state) == C_CONNECTING)
    connect_progress(c, now, why);
  else if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h))
    conn_lost(c, now, why);
}

/* Closing: once nothing is in flight, say goodbye on every connection;
 * done when every server hung up or the grace time is over. */
static bool close_done(struct nbddev *d, int64_t now, int64_t since,
                       int64_t *disc_at) {
  bool busy = false, open = false;
  for (unsigned i = 0; i < d->nconns; i++) {
    struct conn *c = &d->conns[i];
    if (atomic_load(&c->state) != C_UP)
      continue;
    if (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h))
      continue;
    open = true;
    if (atomic_load(&c->inflight) > 0) {
      busy = true;
    } else if (!c->disc_sent) {
      c->disc_sent = true;
      nbd_aio_disconnect(c->h, 0);
    }
  }
  if (!busy && !*disc_at)
    *disc_at = now;
  return !open || (busy && now - since >= CLOSE_BUSY_MS) ||
         (*disc_at && now - *disc_at >= CLOSE_DISC_MS);
}

static int build_pollfds(struct nbddev *d, struct pollfd *p, struct conn **pc) {
  int np = 0;
  for (unsigned i = 0; i < d->nconns; i++) {
    struct conn *c = &d->conns[i];
    int st = atomic_load(&c->state);
    if (st != C_UP && st != C_CONNECTING && st != C_DRAINING)
      continue;
    int fd = nbd_aio_get_fd(c->h);
    unsigned dir = nbd_aio_get_direction(c->h);
    if (fd < 0 || !dir)
      continue;
    p[np] = (struct pollfd){
        .fd = fd,
        .events = (short)(((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                          ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0))};
    pc[np++] = c;
  }
  return np;
}

static void *event_loop(void *arg) {
  struct nbddev *d = arg;
  int64_t close_since = 0, disc_at = 0;
  for (;;) {
    int64_t now = now_ms();
    bool closing = is_closing(d);
    if (closing && !close_since)
      close_since = now;
    int timeout = housekeeping(d, now, closing);
    if (closing) {
      if (close_done(d, now, close_since, &disc_at))
        break;
      timeout = 50;
    }
    struct pollfd p[MAX_CONNS + 1];
    struct conn *pc[MAX_CONNS];
    int np = build_pollfds(d, p, pc);
    p[np] = (struct pollfd){.fd = d->wakefd, .events = POLLIN};
    if (poll(p, (nfds_t)np + 1, timeout) < 0)
      continue; /* EINTR; nothing else can fail on valid fds */
    if (p[np].revents & POLLIN) {
      uint64_t v;
      ssize_t r = read(d->wakefd, &v, sizeof v);
      (void)r;
    }
    now = now_ms();
    for (int i = 0; i < np; i++)
      if (p[i].revents)
        service(pc[i], p[i].revents, now);
    drain();
  }
  return NULL;
}

/* ---- opening and closing ---- */

/* bd_close() flushes through here.  A flush with nothing to flush is
 * skipped; with no connection up, it fails at once rather than waiting
 * for the server to come back. */
struct sync_flush {
  struct bd_req req; /* first: done() finds the rest */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
};

static void sync_flush_done(struct bd_req *req, int err) {
  struct sync_flush *s = (struct sync_flush *)req;
  pthread_mutex_lock(&s->lock);
  s->done = true;
  s->err = err;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static int nbdsrc_flush_sync(struct bd *bd) {
  struct nbddev *d = bd->priv;
  if (replay_clean(&d->log) && !atomic_load(&d->writes_lost))
    return 0;
  struct sync_flush s = {.req = {.cmd = BD_FLUSH, .done = sync_flush_done},
                         .lock = PTHREAD_MUTEX_INITIALIZER,
                         .cond = PTHREAD_COND_INITIALIZER};
  s.req.bd = bd;
  submit_req(d, &s.req, true);
  pthread_mutex_lock(&s.lock);
  while (!s.done)
    pthread_cond_wait(&s.cond, &s.lock);
  pthread_mutex_unlock(&s.lock);
  return s.err;
}

static void free_dev(struct nbddev *d) {
  d->closing = true; /* the event thread is gone or never started */
  for (unsigned i = 0; i < MAX_CONNS; i++)
    atomic_store(&d->conns[i].state, C_DOWN);
  for (unsigned i = 0; i < MAX_CONNS; i++) {
    if (d->conns[i].h)
      drop_handle(&d->conns[i]);
    pthread_rwlock_destroy(&d->conns[i].lock);
  }
  drain(); /* commands closed with their handles fail here */
  for (size_t i = 0; i < d->nctx; i++)
    free(d->ctx[i]);
  free(d->ctx);
  if (d->log.peak)
    log_info("nbd %s: replay log peak %llu bytes", d->uri,
             (unsigned long long)d->log.peak);
  replay_destroy(&d->log);
  if (d->wakefd >= 0)
    close(d->wakefd);
  pthread_mutex_destroy(&d->lock);
  free(d->uri);
  free(d);
}

static void nbdsrc_close_dev(struct bd *bd) {
  struct nbddev *d = bd->priv;
  pthread_mutex_lock(&d->lock);
  d->closing = true;
  pthread_mutex_unlock(&d->lock);
  wake(d);
  pthread_join(d->thread, NULL);
  free_dev(d);
}

static const struct bd_ops nbd_ops = {
    .name = "nbd",
    .flush = nbdsrc_flush_sync,
    .submit = nbdsrc_submit,
    .cancel = nbdsrc_cancel,
    .close = nbdsrc_close_dev,
};

bool nbdsrc_is_uri(const char *spec) {
  return !strncmp(spec, "nbd://", 6) || !strncmp(spec, "nbd+unix://", 11) ||
         !strncmp(spec, "nbds://", 7) || !strncmp(spec, "nbds+unix://", 12);
}

static void set_caps(struct bd *bd, struct nbddev *d, struct nbd_handle *h,
                     bool readonly) {
  struct bd_caps *c = &bd->caps;
  c->readonly = readonly || nbd_is_read_only(h) == 1;
  c->can_flush = d->can_flush = nbd_can_flush(h) == 1;
  c->can_fua = nbd_can_fua(h) == 1;
  c->native_fua = c->can_fua;
  c->can_trim = d->can_trim = nbd_can_trim(h) == 1;
  c->can_zero = nbd_can_zero(h) == 1;
  c->can_fast_zero = nbd_can_fast_zero(h) == 1;
  c->can_cache = d->can_cache = nbd_can_cache(h) == 1;
  c->can_extents = d->can_extents =
      nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  /* Every user of this device shares its connections, and a flush on one
   * of them covers the others (one connection, or a multi-conn server). */
  c->multi_conn = true;
  int64_t pref = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
  int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
  int64_t min = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
  c->min_block = min > 0 ? (uint32_t)min : 1;
  c->pref_block = pref > 0 ? (uint32_t)pref : 4096;
  c->max_block = max > 0 && max < BD_MAX_IO ? (uint32_t)max : BD_MAX_IO;
}

/* How many connections: WANT as the connections option says. */
static unsigned conn_count(struct nbddev *d, struct nbd_handle *h,
                           unsigned want) {
  bool multi = nbd_can_multi_conn(h) == 1;
  if (want > MAX_CONNS)
    want = MAX_CONNS;
  if (want == 0)
    return multi ? AUTO_CONNS : 1;
  if (want > 1 && !multi) {
    log_warn("nbd %s: the server does not advertise multi-conn; using one "
             "connection instead of %u",
             d->uri, want);
    return 1;
  }
  return want;
}

static struct nbddev *new_dev(const char *uri, unsigned timeout_s,
                              uint64_t replay_limit) {
  struct nbddev *d = calloc(1, sizeof *d);
  if (!d)
    return NULL;
  d->wakefd = -1;
  replay_init(&d->log, replay_limit);
  pthread_mutex_init(&d->lock, NULL);
  for (unsigned i = 0; i < MAX_CONNS; i++) {
    struct conn *c = &d->conns[i];
    c->d = d;
    c->idx = i;
    c->backoff = RETRY_MIN_MS;
    c->resent_deadline = INT64_MAX;
    pthread_rwlock_init(&c->lock, NULL);
  }
  d->timeout_ms = (int64_t)timeout_s * 1000;
  /* Resolved now: a daemon changes directory before it reconnects. */
  if (!(d->uri = nbd_uri_absolute(uri)) ||
      (d->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
    free_dev(d);
    return NULL;
  }
  return d;
}

/* Connect H to URI in the caller's thread, giving up after CONNECT_MAX_MS:
 * nbd_connect_uri() would wait forever for a server that accepts the
 * connection and never answers the handshake, and the caller may be a
 * server opening its exports.  Returns NULL, or why it failed. */
static const char *connect_within(struct nbd_handle *h, const char *uri) {
  if (nbd_aio_connect_uri(h, uri) < 0)
    return nbd_get_error();
  int64_t deadline = now_ms() + CONNECT_MAX_MS;
  while (nbd_aio_is_connecting(h) == 1) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      static _Thread_local char msg[80];
      snprintf(msg, sizeof msg, "no handshake from the server within %d s",
               CONNECT_MAX_MS / 1000);
      return msg;
    }
    unsigned dir = nbd_aio_get_direction(h);
    struct pollfd p = {.fd = nbd_aio_get_fd(h)};
    if (p.fd < 0)
      return nbd_get_error();
    p.events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0) |
               (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0);
    int n = poll(&p, 1, (int)(left < 100 ? left : 100));
    if (n < 0 && errno != EINTR)
      return strerror(errno);
    if (n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) &&
        nbd_aio_notify_read(h) < 0)
      break;
    if (n > 0 && (p.revents & POLLOUT) && nbd_aio_notify_write(h) < 0)
      break;
  }
  return nbd_aio_is_ready(h) == 1 ? NULL : nbd_get_error();
}

/* Every context asked for was negotiated, or opening fails saying which
 * (a bitmap the server does not export: qemu-nbd without -B NAME). */
static int check_contexts(const struct nbddev *d, struct nbd_handle *h) {
  size_t plen = strlen(BD_CTX_BITMAP_PREFIX);
  for (size_t i = 0; i < d->nctx; i++) {
    const char *name = d->ctx[i];
    if (nbd_can_meta_context(h, name) == 1)
      continue;
    if (!strncmp(name, BD_CTX_BITMAP_PREFIX, plen))
      bd_set_error("nbd %s: the server exports no bitmap '%s' (it offers "
                   "no context %s)",
                   d->uri, name + plen, name);
    else
      bd_set_error("nbd %s: the server offers no context %s", d->uri, name);
    return -1;
  }
  return 0;
}

/* The contexts O asks for, kept for every connection. */
static int copy_contexts(struct nbddev *d, const struct bd_open_opts *o) {
  if (!o->ncontexts)
    return 0;
  d->ctx = calloc(o->ncontexts, sizeof *d->ctx);
  for (size_t i = 0; d->ctx && i < o->ncontexts; i++) {
    if (!(d->ctx[i] = strdup(o->contexts[i])))
      return -1;
    d->nctx = i + 1;
  }
  return d->ctx ? 0 : -1;
}

/* The first connection, made in the caller's thread so that an error
 * reaches it; it fixes the size and capabilities. */
static int connect_first(struct nbddev *d) {
  struct nbd_handle *h = new_handle(d);
  if (!h) {
    bd_set_error("nbd %s: cannot set up: %s", d->uri, nbd_get_error());
    return -1;
  }
  d->conns[0].h = h;
  const char *why = connect_within(h, d->uri);
  if (why) {
    bd_set_error("nbd %s: %s", d->uri, why);
    return -1;
  }
  int64_t size = nbd_get_size(h);
  if (size < 0) {
    bd_set_error("nbd %s: %s", d->uri, nbd_get_error());
    return -1;
  }
  d->size = (uint64_t)size;
  d->ident = ident_of(h);
  atomic_store(&d->conns[0].state, C_UP);
  return check_contexts(d, h);
}

/* The others: one that fails is left to the event thread to retry. */
static void connect_rest(struct nbddev *d) {
  for (unsigned i = 1; i < d->nconns; i++) {
    struct conn *c = &d->conns[i];
    struct nbd_handle *h = new_handle(d);
    const char *why =
        h ? connect_within(h, d->uri) : "cannot create a libnbd handle";
    if (!why &&
        (nbd_get_size(h) != (int64_t)d->size || ident_of(h) != d->ident))
      why = "the export changed size or flags";
    if (!why) {
      c->h = h;
      atomic_store(&c->state, C_UP);
      continue;
    }
    log_warn("nbd %s: connection %u: %s; retrying", d->uri, i, why);
    nbd_close(h);
    c->due = now_ms() + RETRY_MIN_MS;
  }
}

/* The options (formats.h), at their defaults where O gives none. */
struct nbd_opts {
  unsigned connections, timeout;
  uint64_t replay_limit;
};

static int parse_opts(const struct bd_open_opts *o, struct nbd_opts *n) {
  *n = (struct nbd_opts){.timeout = NBD_TIMEOUT_DEFAULT,
                         .replay_limit = NBD_REPLAY_LIMIT_DEFAULT};
  if (bd_opt_uint(o, "nbd", "connections", 0, NBD_CONNECTIONS_MAX,
                  &n->connections) < 0 ||
      bd_opt_uint(o, "nbd", "timeout", 0, 86400, &n->timeout) < 0 ||
      bd_opt_size(o, "nbd", "replay-limit", 0, &n->replay_limit) < 0)
    return -EINVAL;
  return 0;
}

struct bd *nbdsrc_open(const char *uri, const struct bd_open_opts *o) {
  bool readonly = o->flags & BD_OPEN_READONLY;
  struct nbd_opts no;
  if (parse_opts(o, &no) < 0)
    return NULL;
  struct nbddev *d = new_dev(uri, no.timeout, no.replay_limit);
  struct bd *bd = NULL;
  if (!d || copy_contexts(d, o) < 0) {
    bd_set_error("nbd %s: cannot set up: out of memory", uri);
    if (d)
      free_dev(d);
    return NULL;
  }
  d->stats = o->stats;
  if (connect_first(d) < 0)
    goto fail;
  if (!(bd = bd_new(&nbd_ops, "nbd", uri))) {
    bd_set_error("nbd %s: out of memory", uri);
    goto fail;
  }
  for (size_t i = 0; i < d->nctx; i++)
    if (bd_add_context(bd, d->ctx[i]) < 0) {
      bd_set_error("nbd %s: out of memory", uri);
      goto fail;
    }
  set_caps(bd, d, d->conns[0].h, readonly);
  bd->caps.transient_eio = true; /* lost connections come back */
  d->nconns = conn_count(d, d->conns[0].h, no.connections);
  connect_rest(d);
  if (pthread_create(&d->thread, NULL, event_loop, d) != 0) {
    bd_set_error("nbd %s: cannot start its event thread", uri);
    goto fail;
  }
  pthread_setname_np(d->thread, "bp-nbd-events");
  if (d->nconns > 1)
    log_debug("nbd %s: %u connections", uri, d->nconns);
  bd->priv = d;
  bd->size = d->size;
  bd->exec = BD_EXEC_ASYNC;
  return bd;
fail:
  if (bd) {
    bd->ops = &(const struct bd_ops){.name = "nbd"};
    bd_close(bd);
  }
  free_dev(d);
  return NULL;
}
