/* SPDX-License-Identifier: BSD-3-Clause */
/* Laying out the reply to one request as an iovec: simple replies,
 * structured or extended chunks, reads split into data and hole chunks, and
 * block status descriptors for each selected meta context. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "core/log.h"
#include "handshake.h"
#include "nbd-protocol.h"

static void iov_add(struct nreq *n, const void *base, size_t len) {
  n->iov[n->niov].iov_base = (void *)base;
  n->iov[n->niov].iov_len = len;
  n->niov++;
  n->total += len;
}

static size_t chunk_hdr(struct nreq *n, uint8_t *p, uint16_t flags,
                        uint16_t type, uint64_t length) {
  return wire_put_chunk(p, n->c->tx.extended, flags, type, n->r.cookie,
                        n->r.offset, length);
}

void reply_error(struct nreq *n, uint32_t err, const char *msg) {
  n->niov = 0;
  n->total = 0;
  if (!n->c->tx.structured) {
    iov_add(n, n->hdr, wire_put_simple_reply(n->hdr, err, n->r.cookie));
    return;
  }
  size_t mlen = msg ? strlen(msg) : 0;
  if (mlen > 200)
    mlen = 200;
  size_t h =
      chunk_hdr(n, n->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, 6 + mlen);
  put_be32(n->hdr + h, err);
  put_be16(n->hdr + h + 4, (uint16_t)mlen);
  memcpy(n->hdr + h + 6, msg, mlen);
  iov_add(n, n->hdr, h + 6 + mlen);
}

static void reply_ok(struct nreq *n) {
  n->niov = 0;
  n->total = 0;
  /* Without extended headers a simple reply is allowed for any command
   * that returns no data, structured replies or not. */
  if (!n->c->tx.extended)
    iov_add(n, n->hdr, wire_put_simple_reply(n->hdr, 0, n->r.cookie));
  else
    iov_add(n, n->hdr,
            chunk_hdr(n, n->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0));
}

static void reply_read(struct nreq *n) {
  uint64_t len = n->r.length;
  n->niov = 0;
  n->total = 0;
  if (!n->c->tx.structured) {
    iov_add(n, n->hdr, wire_put_simple_reply(n->hdr, 0, n->r.cookie));
    iov_add(n, n->buf, len);
    return;
  }
  struct wire_run runs[READ_MAX_RUNS];
  size_t nruns;
  if (n->r.flags & NBD_CMD_FLAG_DF)
    nruns = 1, runs[0] = (struct wire_run){0, len, false};
  else
    nruns = wire_split_zero_runs(n->buf, len, runs, READ_MAX_RUNS);
  uint8_t *p = n->hdr;
  for (size_t i = 0; i < nruns; i++) {
    uint16_t flags = i + 1 == nruns ? NBD_REPLY_FLAG_DONE : 0;
    uint64_t off = n->r.offset + runs[i].offset;
    uint8_t *start = p;
    if (runs[i].hole) {
      p += chunk_hdr(n, p, flags, NBD_REPLY_TYPE_OFFSET_HOLE, 12);
      put_be64(p, off);
      put_be32(p + 8, (uint32_t)runs[i].length);
      p += 12;
      iov_add(n, start, (size_t)(p - start));
    } else {
      p += chunk_hdr(n, p, flags, NBD_REPLY_TYPE_OFFSET_DATA,
                     8 + runs[i].length);
      put_be64(p, off);
      p += 8;
      iov_add(n, start, (size_t)(p - start));
      iov_add(n, n->buf + runs[i].offset, runs[i].length);
    }
  }
}

static uint8_t *put_desc(uint8_t *d, bool ext, uint64_t len, uint32_t val) {
  if (ext) {
    put_be64(d, len);
    put_be64(d + 8, val);
    return d + 16;
  }
  put_be32(d, (uint32_t)len);
  put_be32(d + 4, val);
  return d + 8;
}

/* The extents that answer context ID. */
static const struct bd_extents *extents_of(const struct nreq *n, unsigned id) {
  return id >= HS_CTX_EXTRA ? &n->parts[id - HS_CTX_EXTRA].ext : &n->ext;
}

/* One block status chunk for context ID at P: extents merged by what this
 * context reports, clipped to the requested length.  Returns its size. */
static size_t encode_context(struct nreq *n, uint8_t *p, unsigned id,
                             bool last) {
  const struct bd_extents *x = extents_of(n, id);
  bool ext = n->c->tx.extended, one = n->r.flags & NBD_CMD_FLAG_REQ_ONE;
  size_t hdr = ext ? NBD_EXTENDED_REPLY_SIZE : NBD_STRUCTURED_REPLY_SIZE;
  size_t prefix = ext ? 8 : 4; /* context id, and count when extended */
  uint8_t *d = p + hdr + prefix;
  uint64_t left = n->bdr.length, cur_len = 0;
  uint32_t cur_val = 0, ndesc = 0;
  for (size_t i = 0; i < x->n && left > 0; i++) {
    const struct bd_extent *e = &x->v[i];
    uint32_t val = id == HS_CTX_ALLOCATION_DEPTH ? e->depth : e->flags;
    if (cur_len > 0 && val != cur_val) {
      d = put_desc(d, ext, cur_len, cur_val);
      ndesc++;
      cur_len = 0;
      if (one)
        break;
    }
    uint64_t l = e->length < left ? e->length : left;
    cur_val = val;
    cur_len += l;
    left -= l;
  }
  if (cur_len > 0) {
    d = put_desc(d, ext, cur_len, cur_val);
    ndesc++;
  }
  size_t size = (size_t)(d - p);
  chunk_hdr(n, p, last ? NBD_REPLY_FLAG_DONE : 0,
            ext ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT : NBD_REPLY_TYPE_BLOCK_STATUS,
            size - hdr);
  put_be32(p + hdr, id);
  if (ext)
    put_be32(p + hdr + 4, ndesc);
  return size;
}

static void reply_block_status(struct nreq *n) {
  unsigned ids[HS_CTX_EXTRA + HS_MAX_EXTRA], nids = 0;
  size_t need = 0, unit = n->c->tx.extended ? 16 : 8;
  for (unsigned id = HS_CTX_BASE_ALLOCATION; id < HS_CTX_EXTRA + HS_MAX_EXTRA;
       id++) {
    if (!(n->ctx_mask & (1u << id)))
      continue;
    const struct bd_extents *x = extents_of(n, id);
    if (x->n == 0) {
      reply_error(n, NBD_EIO, "the device returned no extents");
      return;
    }
    ids[nids++] = id;
    need += unit * (x->n + 1) + 48;
  }
  if (n->extracap < need) {
    uint8_t *x = realloc(n->extra, need);
    if (!x) {
      reply_error(n, NBD_ENOMEM, "out of memory");
      return;
    }
    n->extra = x;
    n->extracap = need;
  }
  n->niov = 0;
  n->total = 0;
  size_t len = 0;
  for (unsigned i = 0; i < nids; i++)
    len += encode_context(n, n->extra + len, ids[i], i + 1 == nids);
  iov_add(n, n->extra, len);
}

void reply_build(struct nreq *n, int err) {
  if (err < 0) {
    struct conn *c = n->c;
    log_info("connection %u (%s), export '%s': command %u at %llu+%llu "
             "failed: %s",
             c->id, c->peer, c->exp->name, n->r.type,
             (unsigned long long)n->r.offset, (unsigned long long)n->bdr.length,
             n->bdr.errmsg);
    reply_error(n, wire_errno_from(err), n->bdr.errmsg);
    return;
  }
  switch (n->r.type) {
  case NBD_CMD_READ: reply_read(n); break;
  case NBD_CMD_BLOCK_STATUS: reply_block_status(n); break;
  default: reply_ok(n); break;
  }
}
