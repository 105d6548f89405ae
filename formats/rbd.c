/* SPDX-License-Identifier: BSD-3-Clause */
/* The Ceph RBD source: an image in a Ceph cluster, through librbd.
 *
 * Asynchronous: reads, writes, flushes, trims and zeroes go to librbd's
 * aio calls, so a front end keeps its whole queue depth in flight without
 * a thread per request.  Completions are not taken one by one in librbd's
 * callback threads but collected by one reaper thread per image, woken by
 * an eventfd (rbd_set_image_notification), which completes everything
 * that finished since it last looked as one batch (bd_batch_begin()): the
 * NBD server then answers a batch with one send instead of waking its
 * client once per reply (about 3.5 replies per send at iodepth 64, and 6%
 * more IOPS on one connection: docs/BENCHMARKS.md).  Block status
 * (rbd_diff_iterate2) is synchronous in librbd and runs on the worker
 * pool.  One image handle serves every connection of a front end: a
 * flush on any of them covers all writes (multi-conn).
 *
 * A writable open takes the image's exclusive lock explicitly, which
 * (unlike librbd's automatic locking) refuses to hand it to another
 * client: a second writer fails or waits (the lock option, formats.h)
 * instead of taking turns.  Snapshots open read-only. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/source.h"

#include "formats.h"
#include "rbd-cluster.h"
#include "rbd-lib.h"
#include "rbd-spec.h"

struct rbd_dev {
  struct rbd_cluster c;
  rbd_image_t img;
  bool whole_object;   /* block status by whole objects (fast-diff) */
  atomic_bool failing; /* the last request failed: log only the first */
  int efd;             /* librbd counts finished requests here; -1: the
                        * callbacks complete them one by one */
  atomic_bool stop;    /* the reaper's cue to leave */
  pthread_t reaper;
  bool reaping;   /* the reaper thread runs */
  char name[256]; /* pool/image@snap, for messages */
};

/* One request in librbd's hands. */
struct rbd_op {
  struct bd_req *req;
  struct rbd_dev *d;
  bool flush_next; /* FUA: a flush follows the write */
  bool flushing;   /* the write is done: this is the FUA flush */
};

/* What a front end can report: librbd's timeouts, a lost lock or a
 * blocklisted client all mean the data did not get there. */
static int map_error(int r) {
  switch (r) {
  case -ENOSPC:
  case -EDQUOT: return -ENOSPC;
  case -EINVAL:
  case -ENOMEM:
  case -EROFS: return r;
  default: return -EIO;
  }
}

static const char *cmd_name(enum bd_cmd c) {
  static const char *const names[] = {"read", "write", "flush",       "trim",
                                      "zero", "cache", "block status"};
  return (unsigned)c < sizeof names / sizeof *names ? names[c] : "request";
}

static void finish(struct rbd_op *op, int r) {
  struct bd_req *req = op->req;
  struct rbd_dev *d = op->d;
  const char *what =
      op->flushing ? "flush after a FUA write" : cmd_name(req->cmd);
  free(op);
  if (r < 0) {
    bd_req_set_error(req, "rbd %s: %s at %llu: %s", d->name, what,
                     (unsigned long long)req->offset,
                     r == -ETIMEDOUT ? "the cluster did not answer in time"
                                     : strerror(-r));
    if (!atomic_exchange(&d->failing, true))
      log_error("%s", req->errmsg);
    r = map_error(r);
  } else if (atomic_load_explicit(&d->failing, memory_order_relaxed)) {
    atomic_store(&d->failing, false);
    log_info("rbd %s: requests succeed again", d->name);
  }
  bd_complete(req, r);
}

static int start(struct rbd_op *op);

static void on_done(rbd_completion_t c, void *arg) {
  struct rbd_op *op = arg;
  ssize_t r = rbd_aio_get_return_value(c);
  rbd_aio_release(c);
  if (r >= 0 && op->flush_next) {
    op->flush_next = false;
    op->flushing = true;
    int e = start(op);
    if (e < 0)
      finish(op, e);
    return;
  }
  finish(op, r < 0 ? (int)r : 0);
}

/* Hands OP to librbd.  Returns 0, or -errno when librbd refused it (OP's
 * completion was not taken). */
static int start(struct rbd_op *op) {
  struct bd_req *req = op->req;
  rbd_image_t img = op->d->img;
  rbd_completion_t c;
  /* With the reaper, librbd queues the completion for rbd_poll_io_events
   * instead of calling back. */
  int r = rbd_aio_create_completion(op, op->d->reaping ? NULL : on_done, &c);
  if (r < 0)
    return r;
  switch (op->flushing ? BD_FLUSH : req->cmd) {
  case BD_READ:
    r = rbd_aio_read(img, req->offset, req->length, req->buf, c);
    break;
  case BD_WRITE:
    r = rbd_aio_write(img, req->offset, req->length, req->buf, c);
    break;
  case BD_FLUSH: r = rbd_aio_flush(img, c); break;
  case BD_TRIM: r = rbd_aio_discard(img, req->offset, req->length, c); break;
  case BD_ZERO:
    r = rbd_aio_write_zeroes(img, req->offset, req->length, c, 0, 0);
    break;
  default: r = -EINVAL; break;
  }
  if (r < 0)
    rbd_aio_release(c);
  return r;
}

static void rbd_submit(struct bd *bd, struct bd_req *req) {
  switch (req->cmd) {
  case BD_BLOCK_STATUS: bd_pool_queue(req); return; /* synchronous */
  case BD_CACHE: bd_complete(req, 0); return;       /* advisory */
  case BD_ZERO:
    if (req->flags & BD_F_FAST_ZERO) {
      bd_complete(req, -ENOTSUP); /* librbd may write the zeroes */
      return;
    }
    break;
  default: break;
  }
  if (req->length == 0 && req->cmd != BD_FLUSH) {
    bd_complete(req, 0);
    return;
  }
  struct rbd_op *op = malloc(sizeof *op);
  if (!op) {
    bd_complete(req, -ENOMEM);
    return;
  }
  *op = (struct rbd_op){.req = req, .d = bd->priv};
  op->flush_next =
      (req->flags & BD_F_FUA) && req->cmd != BD_FLUSH && req->cmd != BD_READ;
  int r = start(op);
  if (r < 0)
    finish(op, r);
}

/* Block status: rbd_diff_iterate2() reports the allocated extents in
 * order; the gaps between them are holes that read as zeroes. */
struct extent_walk {
  struct bd_extents *ext;
  uint64_t pos, end;
  bool one, stopped;
};

static int add_extent(struct extent_walk *w, uint64_t to, uint32_t flags,
                      uint32_t depth) {
  int r = bd_extents_add(w->ext, to - w->pos, flags, depth);
  w->pos = to;
  if (r < 0)
    return r;
  if (r > 0 || w->one) {
    w->stopped = true;
    return -ECANCELED; /* stops the iteration */
  }
  return 0;
}

static int on_extent(uint64_t off, size_t len, int exists, void *arg) {
  struct extent_walk *w = arg;
  uint64_t a = off > w->pos ? off : w->pos;
  uint64_t b = off + len < w->end ? off + len : w->end;
  if (!exists || a >= b)
    return 0;
  int r = 0;
  if (a > w->pos && (r = add_extent(w, a, BD_EXT_HOLE | BD_EXT_ZERO, 0)) < 0)
    return r;
  return add_extent(w, b, 0, 1);
}

static int rbd_extents(struct bd *bd, uint64_t len, uint64_t off,
                       uint32_t flags, struct bd_extents *ext) {
  struct rbd_dev *d = bd->priv;
  struct extent_walk w = {
      .ext = ext, .pos = off, .end = off + len, .one = flags & BD_F_REQ_ONE};
  int r = rbd_diff_iterate2(d->img, NULL, off, len, 1, d->whole_object,
                            on_extent, &w);
  if (r == -ECANCELED && w.stopped)
    return 0;
  if (r < 0) {
    bd_set_error("rbd %s: block status: %s", d->name, strerror(-r));
    return map_error(r);
  }
  if (w.pos < w.end && (r = bd_extents_add(ext, w.end - w.pos,
                                           BD_EXT_HOLE | BD_EXT_ZERO, 0)) < 0)
    return r;
  return 0;
}

/* Everything that finished since the last look, as one batch. */
static void reap(struct rbd_dev *d) {
  rbd_completion_t comps[64];
  int n;
  bd_batch_begin();
  do {
    n = rbd_poll_io_events(d->img, comps, 64);
    for (int i = 0; i < n; i++)
      on_done(comps[i], rbd_aio_get_arg(comps[i]));
  } while (n == 64);
  bd_batch_end();
}

static void *reaper_main(void *arg) {
  struct rbd_dev *d = arg;
  while (!atomic_load(&d->stop)) {
    uint64_t count;
    if (read(d->efd, &count, sizeof count) < 0 && errno != EINTR) {
      log_error("rbd %s: completion eventfd: %s", d->name, strerror(errno));
      break; /* cannot happen with a valid eventfd */
    }
    reap(d);
  }
  return NULL;
}

/* Starts the reaper.  Without it (no eventfd, no thread, a librbd that
 * refuses the notification) the callbacks complete requests one by one,
 * which is correct, only dearer. */
static void start_reaper(struct rbd_dev *d) {
  d->efd = eventfd(0, EFD_CLOEXEC);
  if (d->efd < 0)
    return;
  if (rbd_set_image_notification(d->img, d->efd, EVENT_TYPE_EVENTFD) < 0 ||
      pthread_create(&d->reaper, NULL, reaper_main, d) != 0) {
    close(d->efd);
    d->efd = -1;
    return;
  }
  pthread_setname_np(d->reaper, "bp-rbd-reap");
  d->reaping = true;
}

/* Called with nothing in flight (the front ends have drained). */
static void stop_reaper(struct rbd_dev *d) {
  if (d->reaping) {
    atomic_store(&d->stop, true);
    uint64_t one = 1;
    if (write(d->efd, &one, sizeof one) < 0)
      log_error("rbd %s: cannot wake the reaper: %s", d->name, strerror(errno));
    pthread_join(d->reaper, NULL);
    d->reaping = false;
  }
  if (d->efd >= 0)
    close(d->efd);
  d->efd = -1;
}

static void free_dev(struct rbd_dev *d) {
  stop_reaper(d);
  if (d->img)
    rbd_close(d->img); /* releases the exclusive lock */
  rbd_cluster_close(&d->c);
  free(d);
}

static void rbd_close_dev(struct bd *bd) {
  free_dev(bd->priv);
}

/* As QEMU's rbd driver: the size changes in the image header, which
 * takes no space; there is nothing to preallocate ahead of the writes. */
static int rbd_resize_dev(struct bd *bd, uint64_t size, enum bd_prealloc pa) {
  struct rbd_dev *d = bd->priv;
  if (pa != BD_PREALLOC_OFF) {
    bd_set_error("rbd %s: an RBD image takes no preallocation", d->name);
    return -ENOTSUP;
  }
  int r = rbd_resize(d->img, size);
  if (r < 0) {
    bd_set_error("rbd %s: resizing to %llu bytes: %s", d->name,
                 (unsigned long long)size, strerror(-r));
    return r;
  }
  return 0;
}

static const struct bd_ops rbd_ops = {
    .name = "rbd",
    .submit = rbd_submit,
    .extents = rbd_extents,
    .close = rbd_close_dev,
    .resize = rbd_resize_dev,
};

/* The lock option, in the order of RBD_LOCK_MODES. */
enum lock_mode { LOCK_FAIL, LOCK_WAIT, LOCK_NONE };
static const char *const lock_modes[] = {RBD_LOCK_MODES, NULL};

/* The address of the lock's owner as librbd names it, or "an unknown
 * address" when it cannot say. */
static void lock_owner(rbd_image_t img, char *buf, size_t len) {
  char *owners[4];
  size_t n = 4;
  rbd_lock_mode_t mode;
  snprintf(buf, len, "an unknown address");
  if (rbd_lock_get_owners(img, &mode, owners, &n) == 0 && n > 0) {
    snprintf(buf, len, "%s", owners[0]);
    rbd_lock_get_owners_cleanup(owners, n);
  }
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

/* Takes the exclusive lock so that no other client writes while this one
 * may; with WAIT, until the holder lets it go. */
static int take_lock(struct rbd_dev *d, enum lock_mode mode) {
  uint64_t features = 0;
  rbd_get_features(d->img, &features);
  if (!(features & RBD_FEATURE_EXCLUSIVE_LOCK)) {
    bd_set_error("rbd %s: the image has no exclusive-lock feature, so "
                 "nothing stops a second writer; enable it (rbd feature "
                 "enable POOL/IMAGE exclusive-lock), open the image "
                 "read-only, or pass --rbd-lock none",
                 d->name);
    return -EPERM;
  }
  for (bool logged = false;;) {
    int r = rbd_lock_acquire(d->img, RBD_LOCK_MODE_EXCLUSIVE);
    if (r == 0)
      return 0;
    if (r != -EROFS && r != -EBUSY) {
      bd_set_error("rbd %s: cannot take the image's exclusive lock: %s",
                   d->name, strerror(-r));
      return r;
    }
    char owner[128];
    lock_owner(d->img, owner, sizeof owner);
    if (mode != LOCK_WAIT) {
      bd_set_error(
          "rbd %s: the image is in use: the client at %s holds its exclusive "
          "lock (--rbd-lock wait waits for it)",
          d->name, owner);
      return -EBUSY;
    }
    if (!logged)
      log_info("rbd %s: waiting for %s to release the exclusive lock", d->name,
               owner);
    logged = true;
    sleep_ms(1000);
  }
}

static int open_image(struct rbd_dev *d, const struct rbd_spec *s,
                      bool readonly, enum lock_mode lock) {
  int r = readonly ? rbd_open_read_only(d->c.io, s->image, &d->img, s->snap)
                   : rbd_open(d->c.io, s->image, &d->img, NULL);
  if (r < 0) {
    d->img = NULL;
    bd_set_error("rbd %s: cannot open the image: %s", d->name,
                 r == -ENOENT
                     ? (s->snap ? "no such image or snapshot" : "no such image")
                     : strerror(-r));
    return r;
  }
  if (!readonly && lock != LOCK_NONE && (r = take_lock(d, lock)) < 0)
    return r;
  uint64_t features = 0, flags = 0;
  rbd_get_features(d->img, &features);
  rbd_get_flags(d->img, &flags);
  d->whole_object = (features & RBD_FEATURE_FAST_DIFF) &&
                    !(flags & RBD_FLAG_FAST_DIFF_INVALID);
  return 0;
}

static void set_caps(struct bd *bd, bool readonly) {
  struct bd_caps *c = &bd->caps;
  c->readonly = readonly;
  c->can_trim = c->can_zero = c->can_flush = !readonly;
  c->can_fua = c->native_fua = !readonly;
  c->can_fast_zero = false;
  c->can_cache = false;
  c->can_extents = true;
  c->multi_conn = true;    /* one image handle for every connection */
  c->transient_eio = true; /* daemons come back */
  c->min_block = 1;
  c->pref_block = 4096;
}

static struct bd *wrap(struct rbd_dev *d, bool readonly) {
  uint64_t size;
  int r = rbd_get_size(d->img, &size);
  if (r < 0) {
    bd_set_error("rbd %s: cannot read the image size: %s", d->name,
                 strerror(-r));
    return NULL;
  }
  char desc[300];
  snprintf(desc, sizeof desc, "rbd:%s", d->name);
  struct bd *bd = bd_new(&rbd_ops, "rbd", desc);
  if (!bd) {
    bd_set_error("rbd %s: out of memory", d->name);
    return NULL;
  }
  bd->priv = d;
  bd->size = size;
  bd->exec = BD_EXEC_ASYNC;
  bd->conc = BD_CONC_PARALLEL;
  set_caps(bd, readonly);
  return bd;
}

struct bd *rbd_source_open(const char *spec, const struct bd_open_opts *o) {
  struct rbd_spec s;
  if (rbd_spec_parse(spec, &s) < 0)
    return NULL;
  struct rbd_dev *d = calloc(1, sizeof *d);
  struct bd *bd = NULL;
  if (!d) {
    bd_set_error("rbd %s: out of memory", spec);
    goto out;
  }
  d->efd = -1;
  rbd_spec_name(&s, d->name, sizeof d->name);
  bool readonly = (o->flags & (BD_OPEN_READONLY | BD_OPEN_SHARE)) || s.snap;
  if (s.snap && !(o->flags & (BD_OPEN_READONLY | BD_OPEN_SHARE)))
    log_info("rbd %s: a snapshot: read-only", d->name);
  unsigned timeout = RBD_TIMEOUT_DEFAULT, lock = LOCK_FAIL;
  if (bd_opt_uint(o, "rbd", "timeout", 0, 86400, &timeout) < 0 ||
      bd_opt_choice(o, "rbd", "lock", lock_modes, &lock) < 0 ||
      rbd_cluster_connect(&s, timeout, bd_cache_direct(o->cache), d->name,
                          &d->c) < 0 ||
      open_image(d, &s, readonly, (enum lock_mode)lock) < 0 ||
      !(bd = wrap(d, readonly))) {
    free_dev(d);
    goto out;
  }
  start_reaper(d);
out:
  rbd_spec_free(&s);
  return bd;
}
