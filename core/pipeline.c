/* SPDX-License-Identifier: BSD-3-Clause */
/* The request pipeline: every request of every way out takes this path,
 * in this order (docs/ARCHITECTURE.md, "The request path"):
 *
 *   bd_submit()       the cache mode's promise, then bd_check(): validated
 *                     once, here, and never again on the way
 *   submit_checked()  a cancelled client's request ends; a range the
 *                     device cannot take goes to the aligner
 *                     (core/disk.c: aligned pieces cut by bd_split_*(),
 *                     back to bd_submit());
 *                     else how to execute: inline in this thread (cheap
 *                     sources, page-cache hits of try_nowait), on the
 *                     source's own queue (an io_uring ring, a remote
 *                     server's: submit_async, submit), or on the pool
 *   bd_execute()      the operation, in a worker or the submitting thread
 *   bd_complete()     the request's message, then done()
 *
 * bd_run() is the same path for callers that wait; batches and plugs
 * bracket many completions or submissions of one thread. */
#include "pipeline.h"
#include "source.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk.h"
#include "pool.h"

static _Thread_local struct bd_conn *cur_conn;

void *bd_conn_current(void) {
  return cur_conn ? cur_conn->priv : NULL;
}

/* ---- splitting: the one splitter of every way out ---- */

size_t bd_split_count(uint64_t len, uint64_t max) {
  if (len == 0)
    return 0;
  if (max == 0 || len <= max)
    return 1;
  return (size_t)((len - 1) / max + 1);
}

struct bd_split bd_split_piece(uint64_t off, uint64_t len, uint64_t max,
                               size_t i) {
  uint64_t skip = max ? (uint64_t)i * max : 0;
  uint64_t left = len - skip;
  return (struct bd_split){.offset = off + skip,
                           .length = max && left > max ? max : left,
                           .skip = skip};
}

/* ---- validation, once per request ---- */

static bool is_write_cmd(enum bd_cmd cmd) {
  return cmd == BD_WRITE || cmd == BD_TRIM || cmd == BD_ZERO;
}

/* The cache mode's promise for REQ (enum bd_cache): writes made FUA in
 * writethrough and directsync, flushes and FUA dropped in unsafe.
 * Returns true when REQ is finished already (an ignored flush). */
static bool apply_cache_mode(struct bd *bd, struct bd_req *req) {
  switch (bd->cache) {
  case BD_CACHE_WRITETHROUGH:
  case BD_CACHE_DIRECTSYNC:
    if (req->cmd == BD_WRITE || req->cmd == BD_ZERO)
      req->flags |= BD_F_FUA;
    return false;
  case BD_CACHE_UNSAFE:
    req->flags &= ~(uint32_t)BD_F_FUA;
    return req->cmd == BD_FLUSH;
  default: return false;
  }
}

/* Whether BD takes REQ: 0, or -errno with the thread's message.  Called
 * by bd_submit() and bd_run() only, so once per request. */
static int bd_check(struct bd *bd, const struct bd_req *req) {
  if (req->cmd == BD_FLUSH)
    return 0;
  if (req->offset > bd->size || req->length > bd->size - req->offset) {
    bd_set_error("request [%llu, +%llu) is beyond the end of the device "
                 "(%llu bytes)",
                 (unsigned long long)req->offset,
                 (unsigned long long)req->length, (unsigned long long)bd->size);
    return is_write_cmd(req->cmd) ? -ENOSPC : -EINVAL;
  }
  if (req->cmd == BD_BLOCK_STATUS && req->context > bd->ncontexts) {
    bd_set_error("block-status context %u is not offered", req->context);
    return -EINVAL;
  }
  if (is_write_cmd(req->cmd) && bd->caps.readonly) {
    bd_set_error("the device is read-only");
    return -EPERM;
  }
  if ((req->cmd == BD_READ || req->cmd == BD_WRITE) &&
      req->length > BD_MAX_IO) {
    bd_set_error("request of %llu bytes exceeds the maximum of %u",
                 (unsigned long long)req->length, BD_MAX_IO);
    return -EINVAL;
  }
  return 0;
}

/* Whether REQ's connection was cancelled (its client is gone), with the
 * request's message saying so. */
bool bd_req_cancelled(const struct bd_req *req) {
  return req->conn && atomic_load(&req->conn->cancelled);
}

static bool conn_cancelled(struct bd_req *req) {
  if (!bd_req_cancelled(req))
    return false;
  bd_req_set_error(req, "cancelled: the client is gone");
  return true;
}

/* ---- execution in the calling thread ---- */

/* Zeroing where the source has no efficient way: write zero buffers. */
static int write_zeroes(struct bd *bd, uint64_t len, uint64_t off) {
  if (!bd->ops->pwrite)
    return -EROFS;
  size_t chunk = len < 1024 * 1024 ? (size_t)len : 1024 * 1024;
  void *zeroes = calloc(1, chunk ? chunk : 1);
  if (!zeroes)
    return -ENOMEM;
  int r = 0;
  while (len > 0 && r == 0) {
    size_t n = len < chunk ? (size_t)len : chunk;
    r = bd->ops->pwrite(bd, zeroes, n, off, 0);
    off += n;
    len -= n;
  }
  free(zeroes);
  return r;
}

static int do_zero(struct bd *bd, struct bd_req *req) {
  if (bd->ops->zero) {
    int r = bd->ops->zero(bd, req->length, req->offset, req->flags);
    if (r != -ENOTSUP || (req->flags & BD_F_FAST_ZERO))
      return r;
  } else if (req->flags & BD_F_FAST_ZERO) {
    bd_set_error("this device cannot zero quickly");
    return -ENOTSUP;
  }
  return write_zeroes(bd, req->length, req->offset);
}

static int do_extents(struct bd *bd, struct bd_req *req) {
  if (req->context && !bd->ops->context_extents)
    return -ENOTSUP;
  if (req->context) /* bd_check() saw that the source offers it */
    return bd->ops->context_extents(bd, req->context - 1, req->length,
                                    req->offset, req->flags, req->extents);
  if (bd->ops->extents && bd->caps.can_extents)
    return bd->ops->extents(bd, req->length, req->offset, req->flags,
                            req->extents);
  int r = bd_extents_add(req->extents, req->length, 0, 1);
  return r < 0 ? r : 0;
}

static int dispatch(struct bd *bd, struct bd_req *req) {
  switch (req->cmd) {
  case BD_READ: return bd->ops->pread(bd, req->buf, req->length, req->offset);
  case BD_WRITE:
    if (!bd->ops->pwrite)
      return -EROFS;
    return bd->ops->pwrite(bd, req->buf, req->length, req->offset, req->flags);
  case BD_FLUSH: return bd->ops->flush ? bd->ops->flush(bd) : 0;
  case BD_TRIM:
    /* Trim is advisory: a source that cannot trim succeeds doing nothing. */
    return bd->ops->trim
               ? bd->ops->trim(bd, req->length, req->offset, req->flags)
               : 0;
  case BD_ZERO: return do_zero(bd, req);
  case BD_CACHE:
    return bd->ops->cache ? bd->ops->cache(bd, req->length, req->offset) : 0;
  case BD_BLOCK_STATUS: return do_extents(bd, req);
  }
  return -EINVAL;
}

/* The lock that serialises a request as the source's concurrency asks,
 * or NULL. */
static pthread_mutex_t *serial_lock(struct bd *bd, struct bd_conn *c) {
  switch (bd->conc) {
  case BD_CONC_PARALLEL: return NULL;
  case BD_CONC_SERIALIZE_CONN: return c ? &c->lock : &bd->serial_lock;
  case BD_CONC_SERIALIZE:
  case BD_CONC_SERIALIZE_CONNS: return &bd->serial_lock;
  }
  return &bd->serial_lock;
}

int bd_execute(struct bd *bd, struct bd_req *req) {
  bd_clear_error(); /* what bd_complete() then finds is this request's */
  if (conn_cancelled(req))
    return -ECANCELED; /* queued before its client left */
  if (req->length == 0 && req->cmd != BD_FLUSH)
    return 0;
  struct bd_conn *c = req->conn;
  if (!c && bd->ops->conn_open && !(c = bd_conn_default(bd)))
    return -EIO;
  pthread_mutex_t *lock = serial_lock(bd, c);
  struct bd_conn *saved = cur_conn; /* a backing device runs nested */
  cur_conn = c;
  if (lock)
    pthread_mutex_lock(lock);
  int r = dispatch(bd, req);
  if (r == 0 && (req->flags & BD_F_FUA) && is_write_cmd(req->cmd) &&
      !bd->caps.native_fua && bd->ops->flush)
    r = bd->ops->flush(bd);
  if (lock)
    pthread_mutex_unlock(lock);
  cur_conn = saved;
  return r;
}

/* Through the default connection of a source with connections, if one
 * was opened (each other connection was the front end's to flush). */
int bd_final_flush(struct bd *bd) {
  if (bd->caps.readonly || !bd->caps.can_flush || !bd->ops->flush)
    return 0;
  if (bd->ops->conn_open && !bd->default_conn)
    return 0;
  struct bd_conn *saved = cur_conn;
  cur_conn = bd->default_conn;
  int r = bd->ops->flush(bd);
  cur_conn = saved;
  return r;
}

/* ---- how to execute ---- */

/* A pool source's request answered in the calling thread when it needs
 * no device I/O: 0 or -errno, or -EAGAIN when it does. */
static int try_inline(struct bd *bd, struct bd_req *req) {
  if (req->length == 0 && req->cmd != BD_FLUSH)
    return 0; /* nothing to do */
  if (!bd->ops->try_nowait || (req->flags & BD_F_FUA) ||
      (req->cmd != BD_READ && req->cmd != BD_WRITE))
    return -EAGAIN;
  bd_clear_error(); /* what bd_complete() then finds is this request's */
  return bd->ops->try_nowait(bd, req);
}

/* A pool source's request: finished in the calling thread when it can
 * be (try_inline, contexts_nowait), started on the source's own queue
 * (submit_async: an io_uring ring), or else queued to the pool. */
static void submit_pooled(struct bd *bd, struct bd_req *req) {
  const struct bd_ops *ops = bd->ops;
  if (req->cmd == BD_BLOCK_STATUS && req->context && bd->caps.contexts_nowait) {
    bd_complete(req, bd_execute(bd, req));
    return;
  }
  if (bd->conc != BD_CONC_PARALLEL ||
      (!ops->try_nowait && !ops->submit_async)) {
    bd_pool_queue(req);
    return;
  }
  int r = try_inline(bd, req);
  if (r != -EAGAIN) {
    bd_complete(req, r);
    return;
  }
  r = ops->submit_async ? ops->submit_async(bd, req) : -EAGAIN;
  if (r == -EAGAIN)
    bd_pool_queue(req);
  else if (r < 0)
    bd_complete(req, r); /* 0: started, the source completes it */
}

/* REQ, checked: ended if its client left, to the aligner if the device
 * cannot take its range, else executed as the source asks. */
static void submit_checked(struct bd *bd, struct bd_req *req) {
  if (conn_cancelled(req)) {
    bd_complete(req, -ECANCELED);
    return;
  }
  if (disk_wants(bd, req)) {
    disk_submit_for(bd, req);
    return;
  }
  req->flags &= ~BD_F_ALIGNED;
  switch (bd->exec) {
  case BD_EXEC_INLINE: bd_complete(req, bd_execute(bd, req)); return;
  case BD_EXEC_POOL: submit_pooled(bd, req); return;
  case BD_EXEC_ASYNC: bd->ops->submit(bd, req); return;
  }
}

void bd_submit(struct bd *bd, struct bd_req *req) {
  req->bd = bd;
  req->errmsg[0] = 0;
  if (apply_cache_mode(bd, req)) {
    bd_complete(req, 0);
    return;
  }
  int r = bd_check(bd, req);
  if (r < 0)
    bd_complete(req, r);
  else
    submit_checked(bd, req);
}

/* ---- completion ---- */

void bd_req_set_error(struct bd_req *req, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->errmsg, sizeof req->errmsg, fmt, ap);
  va_end(ap);
}

void bd_complete(struct bd_req *req, int err) {
  if (err < 0) {
    if (!req->errmsg[0])
      snprintf(req->errmsg, sizeof req->errmsg, "%s",
               bd_error_is_set() ? bd_errmsg() : strerror(-err));
    /* For done() callbacks that still read the thread's message. */
    bd_set_error("%s", req->errmsg);
  }
  req->done(req, err);
}

/* ---- batches and plugs ---- */

/* A thread's nesting of batches (or plugs) and the hooks deferred to the
 * outermost end. */
struct hook_stack {
  unsigned depth;
  struct bd_batch_hook *hooks;
};

static bool stack_defer(struct hook_stack *st, struct bd_batch_hook *h) {
  if (st->depth == 0)
    return false;
  h->next = st->hooks;
  st->hooks = h;
  return true;
}

static void stack_end(struct hook_stack *st) {
  if (--st->depth > 0)
    return;
  /* Outside now: whatever a hook completes or submits is handled inline. */
  struct bd_batch_hook *h = st->hooks;
  st->hooks = NULL;
  while (h) {
    struct bd_batch_hook *next = h->next;
    h->run(h);
    h = next;
  }
}

static _Thread_local struct hook_stack batch, plug;

void bd_batch_begin(void) {
  batch.depth++;
}

bool bd_batch_defer(struct bd_batch_hook *h) {
  return stack_defer(&batch, h);
}

void bd_batch_end(void) {
  stack_end(&batch);
}

void bd_plug_begin(void) {
  plug.depth++;
}

bool bd_plug_defer(struct bd_batch_hook *h) {
  return stack_defer(&plug, h);
}

bool bd_plug_pending(void) {
  return plug.hooks != NULL;
}

void bd_plug_end(void) {
  stack_end(&plug);
}

/* ---- callers that wait ---- */

/* bd_run() on an asynchronous source: submit a copy of the request that
 * carries its own wait state, then sleep until it completes. */
struct sync_req {
  struct bd_req req; /* first, so done() can find the rest */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
};

static void sync_done(struct bd_req *req, int err) {
  struct sync_req *s = (struct sync_req *)req;
  pthread_mutex_lock(&s->lock);
  s->done = true;
  s->err = err;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static int run_async(struct bd *bd, const struct bd_req *req) {
  struct sync_req s = {.req = *req, .done = false};
  pthread_mutex_init(&s.lock, NULL);
  pthread_cond_init(&s.cond, NULL);
  s.req.done = sync_done;
  bd_submit(bd, &s.req);
  pthread_mutex_lock(&s.lock);
  while (!s.done)
    pthread_cond_wait(&s.cond, &s.lock);
  pthread_mutex_unlock(&s.lock);
  pthread_cond_destroy(&s.cond);
  pthread_mutex_destroy(&s.lock);
  if (s.err < 0) /* the request's message, for this thread's caller */
    bd_set_error("%s", s.req.errmsg);
  return s.err;
}

/* An unaligned read of an aligned-only device, run in the calling thread:
 * the aligned range around it into a bounce, then the part asked for. */
static int read_widened(struct bd *bd, struct bd_req *req) {
  uint32_t a = bd->caps.min_block;
  uint64_t s = req->offset - req->offset % a;
  uint64_t e = req->offset + req->length;
  e = e % a ? e + (a - e % a) : e;
  if (e > bd->size)
    e = bd->size; /* the device reads its unaligned last block itself */
  void *b = NULL;
  if (e - s > BD_MAX_IO || posix_memalign(&b, 4096, e - s) != 0)
    return disk_run_for(bd, req);
  struct bd_req w = {.cmd = BD_READ,
                     .offset = s,
                     .length = e - s,
                     .buf = b,
                     .conn = req->conn,
                     .bd = bd};
  int r = bd_execute(bd, &w); /* inside the checked range, widened */
  if (r == 0)
    memcpy(req->buf, (uint8_t *)b + (req->offset - s), req->length);
  free(b);
  return r;
}

int bd_run(struct bd *bd, struct bd_req *req) {
  if (bd->exec == BD_EXEC_ASYNC)
    return run_async(bd, req); /* checked and aligned by bd_submit() */
  req->bd = bd;
  if (apply_cache_mode(bd, req))
    return 0;
  int r = bd_check(bd, req);
  if (r < 0)
    return r;
  /* Synchronous callers (the image tools, a format reading its backing
   * file from a worker) go through the aligner only for a range it must
   * widen.  A read is widened here, in the calling thread: waiting in the
   * aligner for pieces that need workers could starve the pool when the
   * caller is a worker. */
  if (bd->aligner && !(req->flags & BD_F_ALIGNED) &&
      (req->offset | req->length) % bd->caps.min_block) {
    if (req->cmd == BD_READ)
      return read_widened(bd, req);
    if (req->cmd == BD_WRITE || req->cmd == BD_ZERO)
      return disk_run_for(bd, req);
  }
  req->flags &= ~BD_F_ALIGNED;
  return bd_execute(bd, req);
}

int bd_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct bd_req req = {
      .cmd = BD_READ, .offset = off, .length = len, .buf = buf};
  return bd_run(bd, &req);
}

int bd_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
              uint32_t flags) {
  struct bd_req req = {.cmd = BD_WRITE,
                       .offset = off,
                       .length = len,
                       .buf = (void *)buf,
                       .flags = flags};
  return bd_run(bd, &req);
}

int bd_flush(struct bd *bd) {
  struct bd_req req = {.cmd = BD_FLUSH};
  return bd_run(bd, &req);
}
