/* SPDX-License-Identifier: BSD-3-Clause */
/* Filters (filter.h says what): a BD_EXEC_ASYNC device whose requests go
 * to the filter's submit() or straight on to INNER. */
#include "filter.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

struct filter {
  struct bd *inner;
  const struct bd_filter_ops *ops;
  struct bd_ops bops; /* the device's: passthrough of what INNER has */
  void *state;
  /* Runs bd_filter_offload() work on the pool (job_ops), made on first
   * use. */
  struct bd *helper;
  pthread_mutex_t lock; /* for helper */
};

static const struct bd_ops bare_ops = {.name = "filter"};

/* A request forwarded to INNER. */
struct fwd {
  struct bd_req child; /* first: child's done() finds the rest */
  struct bd_req *parent;
  bd_filter_after_fn *after;
  void *arg;
};

static void fwd_done(struct bd_req *child, int err) {
  struct fwd *f = (struct fwd *)child;
  struct bd_req *parent = f->parent;
  if (err < 0) /* INNER's words are the parent's */
    memcpy(parent->errmsg, child->errmsg, sizeof parent->errmsg);
  bd_filter_after_fn *after = f->after;
  void *arg = f->arg;
  free(f);
  if (after)
    err = after(parent, err, arg);
  bd_complete(parent, err);
}

void bd_filter_forward(struct bd_req *req, bd_filter_after_fn *after,
                       void *arg) {
  struct filter *fl = req->bd->priv;
  struct fwd *f = malloc(sizeof *f);
  if (!f) {
    int err = after ? after(req, -ENOMEM, arg) : -ENOMEM;
    bd_complete(req, err);
    return;
  }
  f->parent = req;
  f->after = after;
  f->arg = arg;
  f->child = (struct bd_req){.cmd = req->cmd,
                             .flags = req->flags,
                             .offset = req->offset,
                             .length = req->length,
                             .buf = req->buf,
                             .extents = req->extents,
                             .context = req->context,
                             .done = fwd_done,
                             .conn = req->conn ? req->conn->priv : NULL};
  bd_submit(fl->inner, &f->child);
}

/* ---- work on the pool ---- */

struct job {
  struct bd_req child; /* the helper's request; first */
  struct bd_req *parent;
  void (*work)(struct bd *bd, struct bd_req *req);
};

/* The helper's pwrite: nothing; the work runs in job_done(), once the pool
 * is done with the helper's request (the work may complete the parent,
 * whose done() may close the filter and its helper). */
static int job_run(struct bd *helper, const void *buf, uint64_t len,
                   uint64_t off, uint32_t flags) {
  (void)helper, (void)buf, (void)len, (void)off, (void)flags;
  return 0;
}

static const struct bd_ops job_ops = {.name = "filter-work", .pwrite = job_run};

static void job_done(struct bd_req *child, int err) {
  (void)err;
  struct job *j = (struct job *)child;
  struct bd_req *parent = j->parent;
  void (*work)(struct bd *, struct bd_req *) = j->work;
  free(j);
  work(parent->bd, parent);
}

static struct bd *helper_of(struct filter *fl) {
  pthread_mutex_lock(&fl->lock);
  if (!fl->helper && (fl->helper = bd_new(&job_ops, "filter-work", ""))) {
    fl->helper->size = 1;
    fl->helper->exec = BD_EXEC_POOL;
  }
  pthread_mutex_unlock(&fl->lock);
  return fl->helper;
}

int bd_filter_offload(struct bd_req *req,
                      void (*work)(struct bd *bd, struct bd_req *req)) {
  struct filter *fl = req->bd->priv;
  struct bd *helper = helper_of(fl);
  struct job *j = helper ? malloc(sizeof *j) : NULL;
  if (!j)
    return -ENOMEM;
  j->parent = req;
  j->work = work;
  j->child = (struct bd_req){
      .cmd = BD_WRITE, .length = 1, .buf = j, .done = job_done, .bd = helper};
  bd_pool_queue(&j->child);
  return 0;
}

/* ---- the filter device ---- */

static void filter_submit(struct bd *bd, struct bd_req *req) {
  struct filter *fl = bd->priv;
  if (fl->ops->submit && (fl->ops->intercept & BD_FILTER_CMD(req->cmd)))
    fl->ops->submit(bd, req);
  else
    bd_filter_forward(req, NULL, NULL);
}

/* Only the core's final flush of bd_close() comes here (the device is
 * BD_EXEC_ASYNC), through the filter's default connection if any. */
static int filter_flush(struct bd *bd) {
  struct filter *fl = bd->priv;
  struct bd_req r = {.cmd = BD_FLUSH, .conn = bd_conn_current()};
  return bd_run(fl->inner, &r);
}

static void filter_close(struct bd *bd) {
  struct filter *fl = bd->priv;
  bd_close(fl->helper);
  if (fl->ops->close)
    fl->ops->close(fl->state, fl->inner);
  else
    bd_close(fl->inner);
  pthread_mutex_destroy(&fl->lock);
  free(fl);
}

static void *filter_conn_open(struct bd *bd, const struct bd_conn_params *p) {
  struct filter *fl = bd->priv;
  return bd_conn_open_peer(fl->inner, p->export_name, p->readonly, p->peer_fd);
}

static void filter_conn_close(struct bd *bd, void *priv) {
  struct filter *fl = bd->priv;
  bd_conn_close(fl->inner, priv);
}

/* A cancelled connection cancels its inner one: INNER drops the requests
 * of it that it holds waiting. */
static void filter_cancel(struct bd *bd, struct bd_conn *conn) {
  struct filter *fl = bd->priv;
  if (conn->priv)
    bd_conn_cancel(fl->inner, conn->priv);
}

static int filter_list_exports(struct bd *bd, bool readonly,
                               struct bd_export_list *l) {
  struct filter *fl = bd->priv;
  return bd_list_exports(fl->inner, readonly, l);
}

static void filter_hold_locks(struct bd *bd, bool hold) {
  struct filter *fl = bd->priv;
  bd_hold_locks(fl->inner, hold);
}

/* Persistent bitmaps are INNER's: a checkpoint over copy-on-read keeps
 * them in the qcow2 image below. */
static int filter_bitmap_resume(struct bd *bd, char **name) {
  struct bd *in = bd_filter_inner(bd);
  return in->ops->bitmap_resume(in, name);
}

static int filter_bitmap_start(struct bd *bd, const char *name,
                               uint32_t granularity) {
  struct bd *in = bd_filter_inner(bd);
  return in->ops->bitmap_start(in, name, granularity);
}

static int filter_bitmap_enable(struct bd *bd, const char *name, bool on) {
  struct bd *in = bd_filter_inner(bd);
  return in->ops->bitmap_enable(in, name, on);
}

static int filter_bitmap_bits(struct bd *bd, const char *name,
                              int (*dirty)(void *opaque, uint64_t off,
                                           uint64_t len),
                              void *opaque) {
  struct bd *in = bd_filter_inner(bd);
  return in->ops->bitmap_bits(in, name, dirty, opaque);
}

/* The filter device's operations: its own, and the optional ones INNER
 * has passed through. */
static void filter_bops(struct bd_ops *o, const struct bd_ops *in) {
  *o = (struct bd_ops){.name = "filter",
                       .submit = filter_submit,
                       .flush = filter_flush,
                       .close = filter_close,
                       .list_exports = filter_list_exports,
                       .hold_locks = filter_hold_locks};
  /* INNER's connections, or its cancelling of requests that name one:
   * a connection of the filter opens one of INNER. */
  if (in->conn_open || in->cancel) {
    o->conn_open = filter_conn_open;
    o->conn_close = filter_conn_close;
    o->cancel = filter_cancel;
  }
  if (in->bitmap_resume && in->bitmap_start && in->bitmap_enable &&
      in->bitmap_bits) {
    o->bitmap_resume = filter_bitmap_resume;
    o->bitmap_start = filter_bitmap_start;
    o->bitmap_enable = filter_bitmap_enable;
    o->bitmap_bits = filter_bitmap_bits;
  }
}

struct bd *bd_filter_new(struct bd *inner, const struct bd_filter_ops *ops,
                         void *state) {
  struct filter *fl = calloc(1, sizeof *fl);
  if (fl)
    filter_bops(&fl->bops, inner->ops);
  struct bd *bd =
      fl ? bd_new(&fl->bops, inner->format, inner->description) : NULL;
  int r = fl && bd ? 0 : -ENOMEM;
  for (size_t i = 0; r == 0 && i < inner->ncontexts; i++)
    r = bd_add_context(bd, inner->contexts[i]);
  if (r == 0 && inner->export_description &&
      !(bd->export_description = strdup(inner->export_description)))
    r = -ENOMEM;
  if (r < 0) {
    bd_set_error("%s: out of memory", inner->description);
    if (bd)
      bd->ops = &bare_ops; /* no state to close */
    bd_close(bd);
    free(fl);
    return NULL;
  }
  pthread_mutex_init(&fl->lock, NULL);
  fl->inner = inner;
  fl->ops = ops;
  fl->state = state;
  bd->priv = fl;
  bd->size = inner->size;
  bd->caps = inner->caps;
  bd->conc = BD_CONC_PARALLEL;
  bd->exec = BD_EXEC_ASYNC;
  /* As INNER was opened, for users that compare openings (a server's
   * reload); applying the mode again on the way through changes nothing. */
  bd->cache = inner->cache;
  bd->aio = inner->aio;
  return bd;
}

const struct bd_filter_ops *bd_filter_ops_of(const struct bd *bd) {
  if (!bd || bd->ops->submit != filter_submit)
    return NULL;
  return ((const struct filter *)bd->priv)->ops;
}

struct bd *bd_filter_inner(const struct bd *bd) {
  return ((const struct filter *)bd->priv)->inner;
}

void *bd_filter_state(const struct bd *bd) {
  return ((const struct filter *)bd->priv)->state;
}
