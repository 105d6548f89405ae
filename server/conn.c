/* SPDX-License-Identifier: BSD-3-Clause */
/* One NBD connection: the handshake, then the transmission loop.
 *
 * Each connection has one thread.  In transmission it reads the socket into
 * a buffer (one read may carry many requests), parses requests and submits
 * them to the export's block device, which runs them on the worker pool (or
 * inline for cheap sources).  Completions lay out their reply and append it
 * to the connection's reply queue (send.c), so replies go out in
 * completion order.  Back-pressure: at the per-connection limit on requests
 * or bytes in flight the thread stops reading until completions free
 * budget. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "core/cleanup.h"
#include "core/log.h"
#include "metrics.h"
#include "nbd-protocol.h"
#include "tls.h"

#define RBUF_SIZE (64 * 1024)
/* Non-blocking reads tried before sleeping in poll(), at most; see
 * spin_read().  A sleep shorter than SPIN_SHORT_NS means a spin would
 * have caught what woke it. */
#define SPIN_READS 20
#define SPIN_SHORT_NS 30000
#define PLUG_READS 4 /* reads whose requests may wait for each other */
/* A rejected request's payload up to this size is read and dropped; a
 * larger one means the client is lost, and the connection closes. */
#define DISCARD_MAX (64ull * 1024 * 1024)
/* How often a client waiting for the device's connection slot is looked
 * at, to see whether it left. */
#define CONN_SLOT_POLL_MS 200

/* ---- socket I/O: plain, or through TLS after STARTTLS ---- */

static ssize_t conn_recv(struct conn *c, void *buf, size_t len) {
  return c->tls ? tls_recv(c->tls, buf, len) : read(c->fd, buf, len);
}

static ssize_t conn_send(struct conn *c, const void *buf, size_t len) {
  return c->tls ? tls_send(c->tls, buf, len)
                : send(c->fd, buf, len, MSG_NOSIGNAL);
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Said and counted once per connection. */
static void handshake_timed_out(struct conn *c) {
  if (c->hs_timed_out)
    return;
  c->hs_timed_out = true;
  log_info("connection %u (%s): handshake timed out", c->id, c->peer);
  if (c->srv->metrics)
    metrics_conn_refused(c->srv->metrics, METRICS_REFUSED_HANDSHAKE_TIMEOUT);
}

/* Bound the next blocking call by what is left of the handshake: a client
 * that stalls or trickles bytes loses its slot.  False once it is over. */
static bool arm_deadline(struct conn *c) {
  if (!c->hs_deadline)
    return true;
  int64_t left = c->hs_deadline - mono_ms();
  if (left <= 0) {
    handshake_timed_out(c);
    return false;
  }
  struct timeval tv = {left / 1000, (left % 1000) * 1000};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return true;
}

/* Blocking, for the handshake. */
static bool read_full(struct conn *c, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len > 0) {
    if (!arm_deadline(c))
      return false;
    ssize_t n = conn_recv(c, p, len);
    if (n < 0 && errno == EAGAIN)
      handshake_timed_out(c);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    len -= (size_t)n;
  }
  return true;
}

static bool write_full(struct conn *c, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    if (!arm_deadline(c))
      return false;
    ssize_t n = conn_send(c, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    len -= (size_t)n;
  }
  return true;
}

static bool discard_bytes(struct conn *c, uint64_t len) {
  uint8_t tmp[4096];
  while (len > 0) {
    size_t n = len < sizeof tmp ? (size_t)len : sizeof tmp;
    if (!read_full(c, tmp, n))
      return false;
    len -= n;
  }
  return true;
}

static bool flush_out(struct conn *c, struct hs_out *out) {
  bool ok = !out->oom && write_full(c, out->buf, out->len);
  out->len = 0;
  return ok;
}

/* Whether the client hung up (or the server shut its socket down for a
 * shutdown): only the front end watches its client. */
static bool client_gone(const struct conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 &&
         (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Opens BC in the source, which may wait for the connection before it
 * to close (nbdkit's serialize_connections): a client that leaves
 * meanwhile gives up its place. */
static int start_device_conn(struct conn *c, struct bd *bd,
                             struct bd_conn *bc) {
  int r;
  while ((r = bd_conn_start(bd, bc, CONN_SLOT_POLL_MS)) == -ETIMEDOUT)
    if (client_gone(c))
      bd_conn_cancel(bd, bc);
  return r;
}

/* The device's state for this connection, opened once the client has
 * chosen its export (an nbdkit plugin opens its handle here). */
static bool open_device_conn(struct conn *c, int idx) {
  struct export *e = &c->set->v[idx];
  struct bd *bd = e->dev->bd;
  struct bd_conn *bc = bd_conn_prepare(bd, e->name, e->readonly, c->fd);
  int r = bc ? start_device_conn(c, bd, bc) : -ENOMEM;
  if (r < 0) {
    log_info("connection %u (%s): export '%s' refused: %s", c->id, c->peer,
             e->name, bd_errmsg());
    bd_conn_close(bd, bc);
    return false;
  }
  c->bconn = bc;
  c->exp = e; /* bd_conn_close() needs it, whatever happens next */
  exports_conn_begin(c->srv, e);
  return true;
}

/* Per-export allow lists apply to TCP clients; a Unix socket's permissions
 * decide who uses it. */
static bool conn_admits(const void *ctx, size_t idx) {
  const struct conn *c = ctx;
  const struct export *e = &c->set->v[idx];
  return c->addr.ss_family == AF_UNIX ||
         acl_allows(e->allow, e->nallow, (const struct sockaddr *)&c->addr);
}

/* Whether A and B offer the same contexts under the same ids. */
static bool same_contexts(const struct hs_export *a,
                          const struct hs_export *b) {
  if (a->ncontexts != b->ncontexts)
    return false;
  for (size_t i = 0; i < a->ncontexts; i++)
    if (strcmp(a->contexts[i], b->contexts[i]))
      return false;
  return true;
}

/* A reload while the client negotiates: later options see the new
 * exports; meta contexts chosen for an export follow it by name. */
static void refresh_exports(struct conn *c, struct hs_state *hs) {
  struct export_set *old = exports_refresh(c->srv, &c->set);
  if (!old)
    return;
  if (hs->ctx_export >= 0) {
    int idx = hs->ctx_export;
    hs->ctx_export = exports_find(c->set, old->v[idx].name);
    if (hs->ctx_export < 0 ||
        !same_contexts(&old->hs[idx], &c->set->hs[hs->ctx_export])) {
      hs->ctx_base = hs->ctx_depth = false;
      hs->ctx_extra = 0;
    }
  }
  exports_put(c->srv, old);
}

/* The shared catalog, seen by this client. */
static struct hs_catalog conn_catalog(const struct conn *c) {
  struct hs_catalog cat = c->set->catalog;
  cat.admits = conn_admits;
  cat.admits_ctx = c;
  return cat;
}

/* The TLS handshake counts toward the handshake's deadline: it gets what
 * is left of it (0 without a deadline: tls_accept()'s default). */
static unsigned tls_time_left(const struct conn *c) {
  if (!c->hs_deadline)
    return 0;
  int64_t left = c->hs_deadline - mono_ms();
  return left > 0 ? (unsigned)left : 1;
}

/* After the ACK to STARTTLS: the TLS handshake on the same socket. */
static bool start_tls(struct conn *c, struct hs_state *hs) {
  char who[100];
  snprintf(who, sizeof who, "connection %u (%s)", c->id, c->peer);
  if (!send_tls_begin(&c->out))
    return false;
  /* The credentials of the moment: a reload may swap them meanwhile. */
  pthread_mutex_lock(&c->srv->lock);
  struct tls_creds *cr = tls_creds_ref(c->srv->tls_creds);
  pthread_mutex_unlock(&c->srv->lock);
  bool in_time = arm_deadline(c);
  c->tls = in_time ? tls_accept(cr, c->fd, who, tls_time_left(c)) : NULL;
  bool timed_out = in_time && !c->tls && errno == ETIMEDOUT;
  tls_creds_put(cr);
  if (timed_out)
    handshake_timed_out(c);
  else if (in_time && !c->tls && c->srv->metrics)
    metrics_conn_refused(c->srv->metrics, METRICS_REFUSED_TLS);
  if (!c->tls)
    return false;
  hs_tls_started(hs);
  return true;
}

/* The largest READ/WRITE payload: what NBD_INFO_BLOCK_SIZE advertised. */
static uint32_t max_payload(const struct hs_export *he) {
  return he->max_block && he->max_block < BD_MAX_IO ? he->max_block : BD_MAX_IO;
}

/* The client's flags, after the greeting. */
static bool read_client_flags(struct conn *c, struct hs_state *hs) {
  uint8_t cf[4];
  if (!read_full(c, cf, 4))
    return false;
  if (!hs_client_flags(hs, get_be32(cf))) {
    log_info("connection %u (%s): unknown client flags 0x%x", c->id, c->peer,
             get_be32(cf));
    return false;
  }
  return true;
}

/* One option: read it and answer it into OUT (sent by the caller); the
 * client's choice of export opens the device.  False: close. */
static bool handshake_option(struct conn *c, struct hs_state *hs,
                             struct hs_out *out, enum hs_result *res) {
  uint8_t hdr[16];
  if (!read_full(c, hdr, 16))
    return false;
  if (get_be64(hdr) != NBD_IHAVEOPT) {
    log_info("connection %u (%s): bad option magic", c->id, c->peer);
    return false;
  }
  uint32_t opt = get_be32(hdr + 8), len = get_be32(hdr + 12);
  if (len > HS_MAX_OPTION_DATA) {
    if (opt == NBD_OPT_EXPORT_NAME || len > DISCARD_MAX ||
        !discard_bytes(c, len))
      return false;
    hs_option_too_big(hs, opt, out);
    *res = HS_CONTINUE;
  } else {
    CLEANUP_FREE uint8_t *data = malloc(len ? len : 1);
    if (!data || !read_full(c, data, len))
      return false;
    refresh_exports(c, hs);
    struct hs_catalog cat = conn_catalog(c);
    *res = hs_option(hs, &cat, opt, data, len, out);
  }
  if (*res == HS_GO && !open_device_conn(c, hs->export_index)) {
    if (opt != NBD_OPT_GO)
      return false; /* EXPORT_NAME cannot be refused but by closing */
    hs_refuse_go(hs, opt, bd_errmsg(), out);
    *res = HS_CONTINUE;
  }
  log_debug("connection %u: option %u (%u bytes) -> %d", c->id, opt, len,
            (int)*res);
  return true;
}

/* What the negotiation settled, for the transmission phase. */
static void take_negotiated(struct conn *c, const struct hs_state *hs) {
  const struct hs_export *he = &c->set->hs[hs->export_index];
  c->tx =
      (struct wire_tx){.size = he->size,
                       .tflags = hs->tflags,
                       .structured = hs->structured,
                       .extended = hs->extended,
                       .ncontexts = (unsigned)hs->ctx_base + hs->ctx_depth +
                                    (unsigned)__builtin_popcount(hs->ctx_extra),
                       .max_payload = max_payload(he)};
  c->ctx_base = hs->ctx_base;
  c->ctx_depth = hs->ctx_depth;
  c->ctx_extra = hs->ctx_extra;
  log_debug("connection %u (%s): export '%s'%s%s", c->id, c->peer, c->exp->name,
            hs->structured ? ", structured replies" : "",
            hs->extended ? ", extended headers" : "");
}

/* Returns true when the client chose an export and transmission starts. */
static bool handshake(struct conn *c) {
  struct hs_state hs = {.tls = c->srv->tls};
  struct hs_out out = {0};
  bool ok = false;
  unsigned limit = c->srv->limits.handshake_ms;
  c->hs_deadline = limit ? mono_ms() + limit : 0;

  hs_greeting(&out);
  if (!flush_out(c, &out) || !read_client_flags(c, &hs))
    goto done;
  for (;;) {
    enum hs_result res;
    if (!handshake_option(c, &hs, &out, &res) || !flush_out(c, &out) ||
        res == HS_CLOSE)
      goto done;
    if (res == HS_STARTTLS && !start_tls(c, &hs))
      goto done;
    if (res == HS_GO)
      break;
  }
  take_negotiated(c, &hs);
  ok = true;
done:
  hs_out_free(&out);
  c->hs_deadline = 0;
  return ok;
}

/* ---- requests ---- */

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
    metrics_req_done(&c->exp->mx->req, metrics_cmd_of_nbd(n->r.type), n->t0,
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

/* A request struct from the free list (or a new one), counted in flight. */
static struct nreq *get_req(struct conn *c, uint64_t cost) {
  pthread_mutex_lock(&c->lock);
  struct nreq *n = c->freelist;
  if (n)
    c->freelist = n->next;
  c->inflight++;
  c->inflight_bytes += cost;
  pthread_mutex_unlock(&c->lock);
  if (!n) {
    n = calloc(1, sizeof *n);
    if (!n) {
      pthread_mutex_lock(&c->lock);
      c->inflight--;
      c->inflight_bytes -= cost;
      pthread_mutex_unlock(&c->lock);
      return NULL;
    }
    n->c = c;
    bd_extents_init(&n->ext, 0, BS_MAX_EXTENTS);
  }
  n->cost = cost;
  n->have = 0;
  n->error = 0;
  n->ctx_mask = 0;
  return n;
}

static bool ensure_buf(struct nreq *n, uint64_t len) {
  if (n->bufcap >= len)
    return true;
  free(n->buf);
  /* Page aligned: an image opened with O_DIRECT takes it without a copy. */
  void *b = NULL;
  n->buf = posix_memalign(&b, 4096, len ? len : 1) == 0 ? b : NULL;
  n->bufcap = n->buf ? len : 0;
  return n->buf != NULL;
}

/* ---- metrics, counted only with --metrics ---- */

/* The request is counted done when its reply has left the socket (or is
 * dropped): conn_release_locked(). */
static void count_start(struct conn *c, struct nreq *n) {
  n->failed = false;
  if (c->exp->mx)
    n->t0 = metrics_req_start(&c->exp->mx->req, metrics_cmd_of_nbd(n->r.type),
                              n->r.length);
}

/* Before the reply is queued: after that N may be reused. */
static void count_done(struct nreq *n, bool err) {
  n->failed = err;
}

static void req_done(struct bd_req *bdr, int err) {
  struct nreq *n = (struct nreq *)bdr;
  count_done(n, err != 0);
  reply_build(n, err);
  send_queue(&n->c->out, n);
}

static void fail_req(struct conn *c, struct nreq *n, uint32_t err,
                     const char *msg) {
  log_info("connection %u (%s): command %u at %llu+%llu rejected: %s", c->id,
           c->peer, n->r.type, (unsigned long long)n->r.offset,
           (unsigned long long)n->r.length, msg);
  count_done(n, true);
  reply_error(n, err, msg);
  send_queue(&c->out, n);
}

/* BLOCK_STATUS with a payload: u64 effect length, then the context ids the
 * client wants answered. */
static bool parse_bs_payload(struct conn *c, struct nreq *n) {
  uint64_t plen = n->r.length;
  if (plen < 12 || (plen - 8) % 4 != 0)
    return false;
  n->bdr.length = get_be64(n->buf);
  n->ctx_mask = 0;
  for (uint64_t i = 8; i < plen; i += 4) {
    uint32_t id = get_be32(n->buf + i);
    bool known = (id == HS_CTX_BASE_ALLOCATION && c->ctx_base) ||
                 (id == HS_CTX_ALLOCATION_DEPTH && c->ctx_depth) ||
                 (id >= HS_CTX_EXTRA && id < HS_CTX_EXTRA + HS_MAX_EXTRA &&
                  (c->ctx_extra >> (id - HS_CTX_EXTRA)) & 1);
    /* The spec asks for EINVAL on unknown and on duplicate ids. */
    if (!known || (n->ctx_mask & (1u << id)))
      return false;
    n->ctx_mask |= 1u << id;
  }
  return true;
}

/* One device request of a block status finished: the last one replies. */
static void bs_done(struct nreq *n, const struct bd_req *part, int err) {
  /* The first failure's message is the reply's, written before this part
   * stops counting. */
  if (err < 0 &&
      __atomic_compare_exchange_n(&n->part_err, &(int){0}, err, false,
                                  __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
      part != &n->bdr)
    memcpy(n->bdr.errmsg, part->errmsg, sizeof n->bdr.errmsg);
  if (__atomic_sub_fetch(&n->pending, 1, __ATOMIC_ACQ_REL) > 0)
    return;
  err = __atomic_load_n(&n->part_err, __ATOMIC_RELAXED);
  count_done(n, err != 0);
  reply_build(n, err);
  send_queue(&n->c->out, n);
}

static void bs_alloc_done(struct bd_req *bdr, int err) {
  bs_done((struct nreq *)bdr, bdr, err);
}

static void bs_part_done(struct bd_req *bdr, int err) {
  bs_done(((struct bs_part *)bdr)->n, bdr, err);
}

static bool ensure_parts(struct nreq *n) {
  if (n->parts)
    return true;
  n->parts = calloc(HS_MAX_EXTRA, sizeof *n->parts);
  for (unsigned i = 0; n->parts && i < HS_MAX_EXTRA; i++) {
    n->parts[i].n = n;
    bd_extents_init(&n->parts[i].ext, 0, BS_MAX_EXTENTS);
  }
  return n->parts != NULL;
}

/* The device request for the export's context I (HS_CTX_EXTRA + I). */
static struct bd_req *part_req(struct conn *c, struct nreq *n, unsigned i) {
  struct bs_part *p = &n->parts[i];
  bool one = n->bdr.flags & BD_F_REQ_ONE;
  bd_extents_reset(&p->ext, n->bdr.offset, one ? 1 : BS_MAX_PART_EXTENTS);
  p->bdr = (struct bd_req){.cmd = BD_BLOCK_STATUS,
                           .flags = n->bdr.flags,
                           .offset = n->bdr.offset,
                           .length = n->bdr.length,
                           .extents = &p->ext,
                           .context = c->exp->ctx_map[i],
                           .done = bs_part_done,
                           .conn = c->bconn};
  return &p->bdr;
}

/* Allocation (base:allocation, qemu:allocation-depth) is one device
 * request, each other context one more; they run at once. */
static void submit_bs_parts(struct conn *c, struct nreq *n) {
  uint32_t alloc =
      (1u << HS_CTX_BASE_ALLOCATION) | (1u << HS_CTX_ALLOCATION_DEPTH);
  uint32_t extra = n->ctx_mask >> HS_CTX_EXTRA;
  if (extra && !ensure_parts(n)) {
    fail_req(c, n, NBD_ENOMEM, "out of memory");
    return;
  }
  n->part_err = 0;
  n->pending =
      (n->ctx_mask & alloc ? 1u : 0) + (unsigned)__builtin_popcount(extra);
  /* Built first: a request may complete (and N be reused) at submission. */
  struct bd_req *reqs[HS_MAX_EXTRA + 1];
  unsigned nr = 0;
  if (n->ctx_mask & alloc)
    reqs[nr++] = &n->bdr;
  for (unsigned i = 0; i < HS_MAX_EXTRA; i++)
    if ((extra >> i) & 1)
      reqs[nr++] = part_req(c, n, i);
  for (unsigned i = 0; i < nr; i++)
    bd_submit(c->exp->dev->bd, reqs[i]);
}

static void submit_block_status(struct conn *c, struct nreq *n) {
  n->bdr.length = n->r.length;
  n->ctx_mask = (c->ctx_base ? 1u << HS_CTX_BASE_ALLOCATION : 0) |
                (c->ctx_depth ? 1u << HS_CTX_ALLOCATION_DEPTH : 0) |
                (c->ctx_extra << HS_CTX_EXTRA);
  if ((n->r.flags & NBD_CMD_FLAG_PAYLOAD_LEN) && !parse_bs_payload(c, n)) {
    fail_req(c, n, NBD_EINVAL, "malformed block status payload");
    return;
  }
  uint64_t off = n->r.offset, len = n->bdr.length;
  if (len == 0 || off > c->tx.size || len > c->tx.size - off) {
    fail_req(c, n, NBD_EINVAL, "block status range is invalid");
    return;
  }
  bd_extents_reset(&n->ext, off,
                   (n->r.flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : BS_MAX_EXTENTS);
  n->bdr.cmd = BD_BLOCK_STATUS;
  n->bdr.flags = (n->r.flags & NBD_CMD_FLAG_REQ_ONE) ? BD_F_REQ_ONE : 0;
  n->bdr.extents = &n->ext;
  n->bdr.conn = c->bconn;
  n->bdr.context = 0;
  n->bdr.done = bs_alloc_done;
  submit_bs_parts(c, n);
}

static void submit(struct conn *c, struct nreq *n) {
  uint16_t f = n->r.flags;
  n->bdr.offset = n->r.offset;
  n->bdr.length = n->r.length;
  n->bdr.buf = n->buf;
  n->bdr.flags = (f & NBD_CMD_FLAG_FUA) ? BD_F_FUA : 0;
  n->bdr.done = req_done;
  n->bdr.conn = c->bconn;
  switch (n->r.type) {
  case NBD_CMD_READ: n->bdr.cmd = BD_READ; break;
  case NBD_CMD_WRITE: n->bdr.cmd = BD_WRITE; break;
  case NBD_CMD_FLUSH:
    n->bdr.cmd = BD_FLUSH;
    n->bdr.offset = n->bdr.length = 0;
    break;
  case NBD_CMD_TRIM: n->bdr.cmd = BD_TRIM; break;
  case NBD_CMD_CACHE: n->bdr.cmd = BD_CACHE; break;
  case NBD_CMD_WRITE_ZEROES:
    n->bdr.cmd = BD_ZERO;
    if (!(f & NBD_CMD_FLAG_NO_HOLE))
      n->bdr.flags |= BD_F_MAY_TRIM;
    if (f & NBD_CMD_FLAG_FAST_ZERO)
      n->bdr.flags |= BD_F_FAST_ZERO;
    break;
  case NBD_CMD_BLOCK_STATUS: submit_block_status(c, n); return;
  }
  bd_submit(c->exp->dev->bd, &n->bdr);
}

static bool closing(struct conn *c) {
  pthread_mutex_lock(&c->lock);
  bool v = c->closing;
  pthread_mutex_unlock(&c->lock);
  return v;
}

/* A parsed header: validate, then submit or wait for its payload. */
static void handle_request(struct conn *c, const struct wire_request *r) {
  if (r->type == NBD_CMD_DISC) {
    log_debug("connection %u: disconnect requested", c->id);
    c->eof = true;
    return;
  }
  if (wire_request_overlong(&c->tx, r)) {
    log_info("connection %u (%s): payload of %llu bytes is above the "
             "maximum of %u; closing",
             c->id, c->peer, (unsigned long long)r->length, c->tx.max_payload);
    c->eof = true; /* the spec's hard disconnect, once requests in flight end */
    return;
  }
  uint64_t payload = wire_request_payload(&c->tx, r);
  const char *msg = NULL;
  uint32_t err = wire_validate_request(&c->tx, r, &msg);
  if (!err && closing(c)) {
    err = NBD_ESHUTDOWN; /* not executed: the client may send it again */
    msg = "the server is shutting down";
  }
  if (!err && payload > c->tx.max_payload) {
    err = NBD_EINVAL;
    msg = "payload too large";
  }
  uint64_t cost = err ? 0 : (r->type == NBD_CMD_READ ? r->length : payload);
  struct nreq *n = get_req(c, cost);
  if (!n ||
      (!err && !ensure_buf(n, r->type == NBD_CMD_READ ? r->length : payload))) {
    err = NBD_ENOMEM;
    msg = "out of memory";
    if (!n) {
      log_error("connection %u: out of memory", c->id);
      c->eof = true;
      return;
    }
  }
  n->r = *r;
  count_start(c, n);
  if (err) {
    if (payload > DISCARD_MAX) {
      log_info("connection %u (%s): payload of %llu bytes is too large to "
               "skip; closing",
               c->id, c->peer, (unsigned long long)payload);
      c->eof = true;
    } else if (payload > 0) {
      c->discard = payload;
      c->refused = n;
      n->error = err;
      n->errmsg = msg;
      return;
    }
    fail_req(c, n, err, msg);
    return;
  }
  if (payload > 0) {
    c->cur = n;
    return;
  }
  submit(c, n);
}

static bool at_limit_locked(struct conn *c) {
  return c->inflight >= c->srv->limits.max_requests ||
         c->inflight_bytes >= c->srv->limits.max_bytes;
}

/* Whether to read the socket.  The budget holds back new requests, never
 * the payload of one already admitted: a write larger than the whole
 * budget would otherwise wait for itself. */
static bool want_input_locked(struct conn *c) {
  if (c->eof || send_dead_locked(&c->out))
    return false;
  return c->cur || c->discard > 0 || !at_limit_locked(c);
}

/* Consume what the read buffer holds: skipped payload, the payload of the
 * current request, then as many request headers as fit the budget. */
static void process_input(struct conn *c) {
  c->held = false;
  while (!c->eof) {
    size_t avail = c->rend - c->rstart;
    if (c->discard > 0) {
      size_t n = c->discard < avail ? (size_t)c->discard : avail;
      c->rstart += n;
      c->discard -= n;
      if (c->discard > 0)
        break;
      struct nreq *r = c->refused;
      c->refused = NULL;
      fail_req(c, r, r->error, r->errmsg);
      continue;
    }
    if (c->cur) {
      struct nreq *n = c->cur;
      uint64_t need = wire_request_payload(&c->tx, &n->r) - n->have;
      size_t take = need < avail ? (size_t)need : avail;
      memcpy(n->buf + n->have, c->rbuf + c->rstart, take);
      c->rstart += take;
      n->have += take;
      if (take < need)
        break;
      c->cur = NULL;
      submit(c, n);
      continue;
    }
    pthread_mutex_lock(&c->lock);
    bool limit = at_limit_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (limit) {
      c->held = avail > 0; /* parsed once budget frees, not after a read */
      break;
    }
    struct wire_request r;
    int used =
        wire_parse_request(c->rbuf + c->rstart, avail, c->tx.extended, &r);
    if (used == 0)
      break;
    if (used < 0) {
      log_info("connection %u (%s): bad request magic; closing", c->id,
               c->peer);
      c->eof = true;
      break;
    }
    c->rstart += (size_t)used;
    handle_request(c, &r);
  }
  /* Keep the unparsed tail at the front of the buffer. */
  if (c->rstart == c->rend) {
    c->rstart = c->rend = 0;
  } else if (c->rstart > 0 && c->rcap - c->rend < NBD_EXTENDED_REQUEST_SIZE) {
    memmove(c->rbuf, c->rbuf + c->rstart, c->rend - c->rstart);
    c->rend -= c->rstart;
    c->rstart = 0;
  }
}

enum input { INPUT_DATA, INPUT_NONE, INPUT_END };

static enum input read_result(struct conn *c, ssize_t n) {
  if (n > 0) {
    if (c->srv->limits.idle_ms)
      c->last_input = mono_ms();
    return INPUT_DATA;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return INPUT_NONE;
  if (n < 0)
    log_info("connection %u (%s): read failed: %s", c->id, c->peer,
             strerror(errno));
  else if (c->cur || c->rend > c->rstart)
    log_info("connection %u (%s): client vanished in the middle of a request",
             c->id, c->peer);
  return INPUT_END;
}

/* Read from the socket without blocking: straight into a large payload
 * when the buffer is empty (one copy instead of two), else into the
 * buffer. */
static enum input read_input(struct conn *c) {
  ssize_t n;
  struct nreq *q = c->cur;
  if (q && c->rstart == c->rend) {
    uint64_t total = wire_request_payload(&c->tx, &q->r);
    if (total - q->have >= RBUF_SIZE / 2) {
      n = conn_recv(c, q->buf + q->have, total - q->have);
      if (n > 0) {
        q->have += (uint64_t)n;
        if (q->have == total) {
          c->cur = NULL;
          submit(c, q);
        }
      }
      return read_result(c, n);
    }
  }
  if (c->rend == c->rcap)
    return INPUT_NONE; /* full: wait until processing makes room */
  n = conn_recv(c, c->rbuf + c->rend, c->rcap - c->rend);
  if (n > 0)
    c->rend += (size_t)n;
  return read_result(c, n);
}

/* A busy client sends more within microseconds of our replies.  Retrying
 * the read a few times first saves a sleep and a wake-up in poll() (two
 * context switches); an idle client costs just these few system calls.
 * Requests this thread's poller completes meanwhile are answered at once:
 * their replies are what the client waits for to send more.  Returns
 * false if nothing came.
 *
 * The number of reads adapts (c->spin): halved by a spin that neither
 * read nor answered anything, doubled by a short sleep (note_sleep()).
 * Where replies come from another thread after milliseconds (Ceph),
 * spinning finds nothing, at up to eleven reads a request, and on a busy
 * CPU it holds off the client it waits for; there it falls to none. */
static bool spin_read(struct conn *c, enum input *res) {
  bool answered = false;
  for (unsigned i = 0; i < c->spin; i++) {
    *res = read_input(c);
    if (*res != INPUT_NONE)
      return true;
    answered |= bd_poller_run();
  }
  if (!answered) /* replies sent meanwhile will bring requests: go on */
    c->spin /= 2;
  return false;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* After poll() found the socket readable: a sleep that short, a spin
 * would have saved. */
static void note_sleep(struct conn *c, int64_t slept_ns) {
  if (slept_ns >= SPIN_SHORT_NS)
    return;
  c->spin = c->spin ? c->spin * 2 : 1;
  if (c->spin > SPIN_READS)
    c->spin = SPIN_READS;
}

static void stop_reading(struct conn *c);

/* Within a plug: what more the socket holds right now joins the requests
 * just parsed, so they start with one system call (io_uring_enter), and
 * with one notification of the device.  Only when the plug holds some
 * back: requests that completed inline (the page cache) gain nothing from
 * the extra read. */
static void read_more(struct conn *c) {
  for (int i = 0; i < PLUG_READS && bd_plug_pending(); i++) {
    pthread_mutex_lock(&c->lock);
    bool want = want_input_locked(c) && !c->held;
    pthread_mutex_unlock(&c->lock);
    if (!want)
      return;
    enum input in = read_input(c);
    if (in == INPUT_END)
      stop_reading(c);
    if (in != INPUT_DATA)
      return;
    process_input(c);
  }
}

/* Drop a request that will never be answered. */
static void abandon(struct conn *c, struct nreq **pn) {
  if (!*pn)
    return;
  count_done(*pn, true);
  pthread_mutex_lock(&c->lock);
  conn_release_locked(c, *pn);
  pthread_mutex_unlock(&c->lock);
  *pn = NULL;
}

/* No more input: a request still waiting for its payload is abandoned,
 * and so are the ones that have not started (the client is gone, or the
 * server gave up on it). */
static void stop_reading(struct conn *c) {
  c->eof = true;
  bd_conn_cancel(c->exp->dev->bd, c->bconn);
  abandon(c, &c->cur);
  abandon(c, &c->refused);
}

/* Milliseconds until a closing connection gives up on its client: -1
 * while not closing. */
static int grace_left(struct conn *c, const struct timespec *deadline) {
  if (!closing(c))
    return -1;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t ms = (deadline->tv_sec - now.tv_sec) * 1000 +
               (deadline->tv_nsec - now.tv_nsec) / 1000000;
  return ms > 0 ? (int)ms : 0;
}

/* Milliseconds an idle connection may still wait for a request: -1 with
 * no idle limit, 0 when its time is up. */
static int idle_time_left(struct conn *c) {
  unsigned limit = c->srv->limits.idle_ms;
  if (!limit)
    return -1;
  int64_t left = c->last_input + limit - mono_ms();
  return left > 0 ? (int)left : 0;
}

/* A server shutdown gives the client grace_ms to collect its replies. */
struct grace {
  struct timespec deadline;
  bool set;
};

/* Whether to stop reading: the grace of a shutdown ran out, or the
 * socket failed and nobody will hear the replies. */
static void check_end(struct conn *c, struct grace *g) {
  if (!g->set && closing(c)) {
    clock_gettime(CLOCK_MONOTONIC, &g->deadline);
    g->deadline.tv_sec += c->srv->grace_ms / 1000;
    g->deadline.tv_nsec += (long)(c->srv->grace_ms % 1000) * 1000000;
    if (g->deadline.tv_nsec >= 1000000000) {
      g->deadline.tv_sec++;
      g->deadline.tv_nsec -= 1000000000;
    }
    g->set = true;
  }
  if (g->set && !c->eof && grace_left(c, &g->deadline) == 0) {
    log_info("connection %u (%s): closing for shutdown", c->id, c->peer);
    stop_reading(c);
  }
  pthread_mutex_lock(&c->lock);
  bool dead = send_dead_locked(&c->out);
  pthread_mutex_unlock(&c->lock);
  if (dead && !c->eof)
    stop_reading(c); /* nobody will hear the replies: stop taking work */
}

/* Submit what the read buffer holds, and what more the socket has,
 * with the replies that complete meanwhile sent together. */
static void dispatch_input(struct conn *c) {
  send_cork(&c->out);
  bd_plug_begin(); /* the requests of these reads start together */
  process_input(c);
  read_more(c);
  bd_plug_end();
  send_uncork(&c->out);
  bd_poller_run(); /* what finished meanwhile, answered in one send */
}

/* What the connection thread waits for next, decided under the lock. */
struct wait_plan {
  bool in, out; /* POLLIN, POLLOUT on the socket */
  bool idle;    /* nothing in flight: the idle timer runs */
};
enum plan { PLAN_END, PLAN_AGAIN, PLAN_WAIT };

static enum plan plan_wait(struct conn *c, struct wait_plan *w) {
  enum plan p = PLAN_WAIT;
  pthread_mutex_lock(&c->lock);
  bool dead = send_dead_locked(&c->out);
  if ((c->eof || dead) && c->inflight == 0) {
    p = PLAN_END;
  } else if (c->held && !c->eof && !dead && !at_limit_locked(c)) {
    /* Requests held back at the budget are already here: once replies
     * free budget, parse them at once.  The client may have sent all it
     * will, so waiting for the socket to become readable could be
     * forever. */
    p = PLAN_AGAIN;
  } else {
    w->in = want_input_locked(c);
    w->out = send_wants_pollout_locked(&c->out);
    w->idle = c->inflight == 0 && w->in && !w->out;
    c->waiting = true;
    /* A reply that frees budget changes nothing for a thread that reads
     * anyway: waking it would cost a write and a context switch per
     * batch of replies.  It matters when the budget, the end of the
     * connection or the idle timer (which starts when the last reply
     * goes) holds it. */
    c->wake_on_release = !w->in || c->held || c->srv->limits.idle_ms;
  }
  pthread_mutex_unlock(&c->lock);
  return p;
}

static void set_awake(struct conn *c) {
  pthread_mutex_lock(&c->lock);
  c->waiting = false;
  pthread_mutex_unlock(&c->lock);
}

/* What poll() found on the socket: room to send, input, or a peer that
 * is gone. */
static void socket_events(struct conn *c, const struct wait_plan *w,
                          short revents, int64_t slept) {
  if (revents & POLLOUT)
    send_writable(&c->out);
  bool readable = revents & (POLLIN | POLLHUP | POLLERR);
  if (w->in && (revents & POLLIN))
    note_sleep(c, mono_ns() - slept);
  if (w->in && (readable || (c->tls && tls_pending(c->tls) > 0))) {
    if (read_input(c) == INPUT_END)
      stop_reading(c);
  } else if (revents & (POLLHUP | POLLERR)) {
    /* The peer is gone while we only wait to send: drop the replies. */
    send_fail(&c->out);
  }
}

/* Spin, or sleep in poll() for at most TIMEOUT ms, then take what came.
 * False when poll() fails. */
static bool wait_events(struct conn *c, const struct wait_plan *w,
                        int timeout) {
  struct pollfd p[3] = {
      {.fd = c->fd,
       .events = (short)((w->in ? POLLIN : 0) | (w->out ? POLLOUT : 0))},
      {.fd = c->wakefd, .events = POLLIN},
      {.fd = bd_poller_fd(), .events = POLLIN}, /* -1: ignored */
  };
  enum input in;
  if (w->in && !w->out && timeout < 0 && spin_read(c, &in)) {
    set_awake(c);
    if (in == INPUT_END)
      stop_reading(c);
    return true;
  }
  /* poll() cannot see what TLS has already decrypted. */
  if (w->in && c->tls && tls_pending(c->tls) > 0)
    timeout = 0;
  int64_t slept = w->in ? mono_ns() : 0;
  if (poll(p, 3, timeout) < 0 && errno != EINTR)
    return false;
  set_awake(c);
  if (p[1].revents & POLLIN) {
    uint64_t v;
    ssize_t r = read(c->wakefd, &v, sizeof v);
    (void)r;
  }
  socket_events(c, w, p[0].revents, slept);
  return true;
}

static void transmission(struct conn *c) {
  c->last_input = mono_ms();
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  pthread_mutex_lock(&c->lock);
  c->transmitting = true;
  bool early = c->closing; /* shutdown began during the handshake */
  pthread_mutex_unlock(&c->lock);
  struct grace g = {{0, 0}, false};
  if (early)
    c->eof = true;
  for (;;) {
    check_end(c, &g);
    dispatch_input(c);
    struct wait_plan w;
    enum plan p = plan_wait(c, &w);
    if (p == PLAN_END)
      break;
    if (p == PLAN_AGAIN)
      continue;
    int idle_left = w.idle ? idle_time_left(c) : -1;
    if (idle_left == 0) {
      log_info("connection %u (%s): idle for %u s; closing", c->id, c->peer,
               c->srv->limits.idle_ms / 1000);
      stop_reading(c);
      continue;
    }
    int timeout = grace_left(c, &g.deadline);
    if (idle_left > 0 && (timeout < 0 || idle_left < timeout))
      timeout = idle_left;
    if (!wait_events(c, &w, timeout))
      break;
  }
}

/* ---- lifecycle ---- */

static void conn_free(struct conn *c) {
  struct nreq *n = c->freelist;
  while (n) {
    struct nreq *next = n->next;
    free(n->buf);
    free(n->extra);
    bd_extents_free(&n->ext);
    for (unsigned i = 0; n->parts && i < HS_MAX_EXTRA; i++)
      bd_extents_free(&n->parts[i].ext);
    free(n->parts);
    free(n);
    n = next;
  }
  free(c->rbuf);
  tls_close(c->tls);
  send_free(&c->out);
  if (c->wakefd >= 0)
    close(c->wakefd);
  close(c->fd);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static void unlink_conn(struct conn *c) {
  struct server *srv = c->srv;
  pthread_mutex_lock(&srv->lock);
  for (struct conn **pp = &srv->conns; *pp; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  srv->nconns--;
  pthread_cond_broadcast(&srv->cond);
  if (srv->nconns == 0 && srv->idle_fd >= 0)
    eventfd_write(srv->idle_fd, 1);
  pthread_mutex_unlock(&srv->lock);
}

static void *conn_main(void *arg) {
  struct conn *c = arg;
  char name[16];
  snprintf(name, sizeof name, "bp-conn-%u", c->id);
  pthread_setname_np(pthread_self(), name);
  struct metrics *m = c->srv->metrics;
  if (m)
    metrics_conn_accepted(m);
  log_debug("connection %u from %s", c->id, c->peer);
  c->set = exports_get(c->srv);
  if (handshake(c)) {
    if (c->exp->mx)
      metrics_export_opened(c->exp->mx);
    bd_poller_begin(); /* this thread reaps what its requests started */
    transmission(c);
    bd_poller_end();
    if (c->exp->mx)
      metrics_export_closed(c->exp->mx);
  }
  if (c->bconn) {
    bd_conn_close(c->exp->dev->bd, c->bconn);
    exports_conn_end(c->srv, c->exp);
  }
  exports_put(c->srv, c->set); /* may close images a reload removed */
  log_debug("connection %u (%s) closed", c->id, c->peer);
  if (m)
    metrics_conn_closed(m);
  /* Unlink before closing, so shutdown never touches a closed fd. */
  unlink_conn(c);
  conn_free(c);
  return NULL;
}

bool conn_start(struct server *srv, int fd, const char *peer,
                const struct sockaddr_storage *addr) {
  struct conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return false;
  }
  c->fd = fd;
  c->srv = srv;
  c->addr = *addr;
  c->spin = SPIN_READS;
  c->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->rbuf = malloc(RBUF_SIZE);
  c->rcap = RBUF_SIZE;
  send_init(&c->out, c);
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  /* Adaptive: spin briefly before sleeping, as hold times are tiny. */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&c->lock, &ma);
  pthread_mutexattr_destroy(&ma);
  if (c->wakefd < 0 || !c->rbuf) {
    conn_free(c);
    return false;
  }
  pthread_mutex_lock(&srv->lock);
  c->id = ++srv->next_id;
  c->next = srv->conns;
  srv->conns = c;
  srv->nconns++;
  pthread_mutex_unlock(&srv->lock);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int r = pthread_create(&t, &attr, conn_main, c);
  pthread_attr_destroy(&attr);
  if (r != 0) {
    log_error("cannot start a connection thread: %s", strerror(r));
    unlink_conn(c);
    conn_free(c);
    return false;
  }
  return true;
}

void conn_begin_shutdown(struct server *srv, unsigned grace_ms) {
  pthread_mutex_lock(&srv->lock);
  srv->grace_ms = grace_ms;
  for (struct conn *c = srv->conns; c; c = c->next) {
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    bool talking = c->transmitting;
    c->waiting = true; /* wake it even if it is not asleep yet */
    conn_wake_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (!talking)
      shutdown(c->fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&srv->lock);
}

void conn_shutdown_all(struct server *srv, int how) {
  pthread_mutex_lock(&srv->lock);
  for (struct conn *c = srv->conns; c; c = c->next)
    shutdown(c->fd, how);
  pthread_mutex_unlock(&srv->lock);
}
