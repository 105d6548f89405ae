/* nbd: a remote export as a block device, through libnbd's asynchronous
 * calls.  Requests are issued from whatever thread submits them (libnbd
 * handles are thread-safe) and complete on the thread that reads the
 * reply; one event thread per device polls the socket and is woken through
 * an eventfd whenever a submission may have left bytes to send.  One
 * connection per device for now. */
#include <errno.h>
#include <libnbd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../core/blockdev.h"
#include "../core/log.h"
#include "formats.h"

/* libnbd 1.14 speaks no extended headers: lengths stay below 4 GiB. */
#define NBD_CHUNK (1u << 30)

unsigned nbd_source_connections = 0;
unsigned nbd_source_timeout = 30;

struct nbddev {
  struct nbd_handle *h;
  int wakefd;
  atomic_bool stop;
  pthread_t thread;
  char *uri;
};

static void wake(struct nbddev *n) {
  uint64_t one = 1;
  ssize_t r = write(n->wakefd, &one, sizeof one);
  (void)r; /* only fails when the counter is saturated: already awake */
}

static void *event_loop(void *arg) {
  struct nbddev *n = arg;
  int fd = nbd_aio_get_fd(n->h);
  while (!atomic_load(&n->stop)) {
    unsigned dir = nbd_aio_get_direction(n->h);
    struct pollfd p[2] = {
        {.fd = fd,
         .events = (short)(((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                           ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0))},
        {.fd = n->wakefd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR)
      break;
    if (p[1].revents & POLLIN) {
      uint64_t v;
      ssize_t r = read(n->wakefd, &v, sizeof v);
      (void)r;
    }
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) &&
        nbd_aio_notify_read(n->h) < 0)
      break;
    if ((p[0].revents & POLLOUT) && nbd_aio_notify_write(n->h) < 0)
      break;
  }
  if (!atomic_load(&n->stop))
    log_error("nbd %s: connection lost: %s", n->uri, nbd_get_error());
  return NULL;
}

/* ---- requests ---- */

/* A request split into several libnbd commands completes when the last
 * one does, with the first error. */
struct split {
  struct bd_req *req;
  atomic_int pending;
  atomic_int err;
};

static int split_done(void *user_data, int *error) {
  struct split *s = user_data;
  if (*error)
    atomic_store(&s->err, -*error);
  if (atomic_fetch_sub(&s->pending, 1) == 1) {
    bd_complete(s->req, atomic_load(&s->err));
    free(s);
  }
  return 1;
}

static int extent_cb(void *user_data, const char *context, uint64_t offset,
                     uint32_t *entries, size_t n, int *error) {
  (void)offset, (void)error;
  struct bd_req *req = ((struct split *)user_data)->req;
  if (strcmp(context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  for (size_t i = 0; i + 1 < n; i += 2)
    if (bd_extents_add(req->extents, entries[i], entries[i + 1] & 3, 1) != 0)
      break;
  return 0;
}

static int64_t issue(struct nbddev *n, struct bd_req *req, struct split *s,
                     uint64_t off, uint64_t len) {
  nbd_completion_callback cb = {.callback = split_done, .user_data = s};
  uint32_t fua = (req->flags & BD_F_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;
  switch (req->cmd) {
  case BD_READ: return nbd_aio_pread(n->h, req->buf, len, off, cb, 0);
  case BD_WRITE: return nbd_aio_pwrite(n->h, req->buf, len, off, cb, fua);
  case BD_FLUSH: return nbd_aio_flush(n->h, cb, 0);
  case BD_TRIM: return nbd_aio_trim(n->h, len, off, cb, fua);
  case BD_CACHE: return nbd_aio_cache(n->h, len, off, cb, 0);
  case BD_ZERO: {
    uint32_t f =
        fua | ((req->flags & BD_F_MAY_TRIM) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE) |
        ((req->flags & BD_F_FAST_ZERO) ? LIBNBD_CMD_FLAG_FAST_ZERO : 0);
    return nbd_aio_zero(n->h, len, off, cb, f);
  }
  case BD_BLOCK_STATUS: {
    nbd_extent_callback ecb = {.callback = extent_cb, .user_data = s};
    return nbd_aio_block_status(
        n->h, len, off, ecb, cb,
        (req->flags & BD_F_REQ_ONE) ? LIBNBD_CMD_FLAG_REQ_ONE : 0);
  }
  }
  return -1;
}

static void nbd_submit(struct bd *bd, struct bd_req *req) {
  struct nbddev *n = bd->priv;
  uint64_t len = req->length, off = req->offset;
  /* Block status may answer short: ask for at most one chunk. */
  if (req->cmd == BD_BLOCK_STATUS && len > NBD_CHUNK)
    len = NBD_CHUNK;
  bool splittable = req->cmd == BD_TRIM || req->cmd == BD_ZERO;
  unsigned pieces =
      splittable ? (unsigned)((len + NBD_CHUNK - 1) / NBD_CHUNK) : 1;
  struct split *s = calloc(1, sizeof *s);
  if (!s) {
    bd_complete(req, -ENOMEM);
    return;
  }
  s->req = req;
  atomic_init(&s->pending, (int)(pieces ? pieces : 1));
  atomic_init(&s->err, 0);
  for (unsigned i = 0; i < (pieces ? pieces : 1); i++) {
    uint64_t l = splittable && len - (uint64_t)i * NBD_CHUNK > NBD_CHUNK
                     ? NBD_CHUNK
                     : len - (uint64_t)i * (splittable ? NBD_CHUNK : 0);
    if (issue(n, req, s, off + (uint64_t)i * NBD_CHUNK, l) < 0) {
      /* libnbd did not take the command: count it as done, failed. */
      int e = nbd_get_errno();
      bd_set_error("nbd %s: %s", n->uri, nbd_get_error());
      int err = e ? e : EIO;
      split_done(s, &err);
    }
  }
  wake(n);
}

static void nbd_close_dev(struct bd *bd) {
  struct nbddev *n = bd->priv;
  nbd_shutdown(n->h, 0);
  atomic_store(&n->stop, true);
  wake(n);
  pthread_join(n->thread, NULL);
  nbd_close(n->h);
  close(n->wakefd);
  free(n->uri);
  free(n);
}

static const struct bd_ops nbd_ops = {
    .name = "nbd",
    .submit = nbd_submit,
    .close = nbd_close_dev,
};

bool nbd_is_uri(const char *spec) {
  return !strncmp(spec, "nbd://", 6) || !strncmp(spec, "nbd+unix://", 11) ||
         !strncmp(spec, "nbds://", 7) || !strncmp(spec, "nbds+unix://", 12);
}

static void set_caps(struct bd *bd, struct nbd_handle *h, bool readonly) {
  struct bd_caps *c = &bd->caps;
  c->readonly = readonly || nbd_is_read_only(h) == 1;
  c->can_flush = nbd_can_flush(h) == 1;
  c->can_fua = nbd_can_fua(h) == 1;
  c->native_fua = c->can_fua;
  c->can_trim = nbd_can_trim(h) == 1;
  c->can_zero = nbd_can_zero(h) == 1;
  c->can_fast_zero = nbd_can_fast_zero(h) == 1;
  c->can_cache = nbd_can_cache(h) == 1;
  c->can_extents = nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  c->multi_conn = nbd_can_multi_conn(h) == 1;
  int64_t pref = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
  int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
  int64_t min = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
  c->min_block = min > 0 ? (uint32_t)min : 1;
  c->pref_block = pref > 0 ? (uint32_t)pref : 4096;
  c->max_block = max > 0 && max < BD_MAX_IO ? (uint32_t)max : BD_MAX_IO;
}

struct bd *nbd_source_open(const char *uri, bool readonly) {
  struct nbddev *n = calloc(1, sizeof *n);
  struct bd *bd = NULL;
  if (!n || !(n->uri = strdup(uri)) || !(n->h = nbd_create()) ||
      (n->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
    bd_set_error("nbd %s: cannot set up: %s", uri,
                 n && n->h ? nbd_get_error() : "out of memory");
    goto fail;
  }
  nbd_add_meta_context(n->h, LIBNBD_CONTEXT_BASE_ALLOCATION);
  if (nbd_connect_uri(n->h, uri) < 0) {
    bd_set_error("nbd %s: %s", uri, nbd_get_error());
    goto fail;
  }
  int64_t size = nbd_get_size(n->h);
  if (size < 0 || !(bd = bd_new(&nbd_ops, "nbd", uri))) {
    bd_set_error("nbd %s: %s", uri, size < 0 ? nbd_get_error() : "no memory");
    goto fail;
  }
  atomic_init(&n->stop, false);
  if (pthread_create(&n->thread, NULL, event_loop, n) != 0) {
    bd_set_error("nbd %s: cannot start its event thread", uri);
    goto fail;
  }
  bd->priv = n;
  bd->size = (uint64_t)size;
  bd->exec = BD_EXEC_ASYNC;
  set_caps(bd, n->h, readonly);
  return bd;
fail:
  if (bd) {
    bd->ops = &(const struct bd_ops){.name = "nbd"};
    bd_close(bd);
  }
  if (n) {
    nbd_close(n->h);
    if (n->wakefd > 0)
      close(n->wakefd);
    free(n->uri);
    free(n);
  }
  return NULL;
}
