/* SPDX-License-Identifier: BSD-3-Clause */
#include "handshake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd-protocol.h"
#include "wire.h"

/* ---- output buffer ---- */

static uint8_t *out_reserve(struct hs_out *out, size_t n) {
  if (out->oom)
    return NULL;
  if (out->len + n > out->cap) {
    size_t cap = out->cap ? out->cap : 256;
    while (cap < out->len + n)
      cap *= 2;
    uint8_t *b = realloc(out->buf, cap);
    if (!b) {
      out->oom = true;
      return NULL;
    }
    out->buf = b;
    out->cap = cap;
  }
  uint8_t *p = out->buf + out->len;
  out->len += n;
  return p;
}

void hs_out_free(struct hs_out *out) {
  free(out->buf);
  memset(out, 0, sizeof *out);
}

/* One option reply with its payload assembled from up to three parts. */
static void reply(struct hs_out *out, uint32_t opt, uint32_t type,
                  const void *a, size_t alen, const void *b, size_t blen) {
  uint8_t *p = out_reserve(out, 20 + alen + blen);
  if (!p)
    return;
  put_be64(p, NBD_REP_MAGIC);
  put_be32(p + 8, opt);
  put_be32(p + 12, type);
  put_be32(p + 16, (uint32_t)(alen + blen));
  if (alen)
    memcpy(p + 20, a, alen);
  if (blen)
    memcpy(p + 20 + alen, b, blen);
}

static void reply_ack(struct hs_out *out, uint32_t opt) {
  reply(out, opt, NBD_REP_ACK, NULL, 0, NULL, 0);
}

static void reply_err(struct hs_out *out, uint32_t opt, uint32_t err,
                      const char *msg) {
  reply(out, opt, err, msg, msg ? strlen(msg) : 0, NULL, 0);
}

void hs_refuse_go(struct hs_state *hs, uint32_t opt, const char *msg,
                  struct hs_out *out) {
  out->len = 0;
  hs->export_index = -1;
  /* Error strings are at most NBD_MAX_STRING bytes on the wire. */
  char text[256];
  snprintf(text, sizeof text, "%s", msg);
  reply_err(out, opt, NBD_REP_ERR_UNKNOWN, text);
}

void hs_greeting(struct hs_out *out) {
  uint8_t *p = out_reserve(out, 18);
  if (!p)
    return;
  put_be64(p, NBD_MAGIC);
  put_be64(p + 8, NBD_IHAVEOPT);
  put_be16(p + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
}

bool hs_client_flags(struct hs_state *hs, uint32_t flags) {
  if (flags & ~(uint32_t)(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
    return false;
  hs->fixed = flags & NBD_FLAG_C_FIXED_NEWSTYLE;
  hs->no_zeroes = flags & NBD_FLAG_C_NO_ZEROES;
  hs->ctx_export = -1;
  hs->export_index = -1;
  return true;
}

/* ---- exports ---- */

static int find_export(const struct hs_catalog *cat, const uint8_t *name,
                       uint32_t len) {
  if (len == 0 && !cat->no_default)
    return cat->n > 0 ? 0 : -1;
  for (size_t i = 0; i < cat->n; i++)
    if (strlen(cat->v[i].name) == len &&
        (len == 0 || memcmp(cat->v[i].name, name, len) == 0))
      return (int)i;
  return -1;
}

static bool admitted(const struct hs_catalog *cat, size_t idx) {
  return !cat->admits || cat->admits(cat->admits_ctx, idx);
}

/* 0 if the client may use export IDX now, else the error to reply with.
 * Admission comes first: a client that may never use the export has no
 * use for being told to come back with TLS. */
static uint32_t access_error(const struct hs_state *hs,
                             const struct hs_catalog *cat, int idx) {
  if (!admitted(cat, (size_t)idx))
    return NBD_REP_ERR_POLICY;
  if (cat->v[idx].tls_required && !hs->tls_active)
    return NBD_REP_ERR_TLS_REQD;
  return 0;
}

/* Names may be 4096 bytes: quote at most this much of one in a message. */
#define HS_QUOTED_NAME_MAX 64

static void reply_policy(struct hs_out *out, uint32_t opt, const uint8_t *name,
                         uint32_t len) {
  uint32_t n = len;
  if (n > HS_QUOTED_NAME_MAX) {
    n = HS_QUOTED_NAME_MAX;
    while (n > 0 && (name[n] & 0xc0) == 0x80)
      n--; /* cut before a UTF-8 character, not inside it */
  }
  char msg[HS_QUOTED_NAME_MAX + 64];
  snprintf(msg, sizeof msg,
           "access to export '%.*s%s' is not allowed from this address", (int)n,
           (const char *)name, n < len ? "..." : "");
  reply_err(out, opt, NBD_REP_ERR_POLICY, msg);
}

/* The export NAME names for OPT, or -1 after replying why it cannot be
 * used.  A TLS-only export named in the clear: NBD_REP_ERR_TLS_REQD is
 * for NBD_OPT_INFO and NBD_OPT_GO only (proto.md, SELECTIVETLS: "MUST NOT
 * send NBD_REP_ERR_TLS_REQD in response to any option other than
 * NBD_OPT_INFO, NBD_OPT_GO and NBD_OPT_EXPORT_NAME"); to the meta context
 * options the server's policy refuses it (NBD_REP_ERR_POLICY: "known ...
 * and syntactically valid, but server-side policy forbids"). */
static int lookup(const struct hs_state *hs, const struct hs_catalog *cat,
                  uint32_t opt, const uint8_t *name, uint32_t len,
                  struct hs_out *out) {
  int idx = find_export(cat, name, len);
  uint32_t err = idx < 0 ? NBD_REP_ERR_UNKNOWN : access_error(hs, cat, idx);
  bool may_tls_reqd = opt == NBD_OPT_INFO || opt == NBD_OPT_GO;
  switch (err) {
  case 0: return idx;
  case NBD_REP_ERR_UNKNOWN: reply_err(out, opt, err, "no such export"); break;
  case NBD_REP_ERR_POLICY: reply_policy(out, opt, name, len); break;
  default:
    if (may_tls_reqd)
      reply_err(out, opt, err, "export requires TLS");
    else
      reply_err(out, opt, NBD_REP_ERR_POLICY,
                "export requires TLS: use STARTTLS first");
    break;
  }
  return -1;
}

uint16_t hs_tflags(const struct hs_state *hs, const struct hs_export *e) {
  uint16_t f = e->tflags | NBD_FLAG_HAS_FLAGS;
  if (hs->structured)
    f |= NBD_FLAG_SEND_DF;
  /* The payload form of block status only means something with contexts. */
  if (hs->extended && (hs->ctx_base || hs->ctx_depth || hs->ctx_extra))
    f |= NBD_FLAG_BLOCK_STAT_PAYLOAD;
  return f;
}

/* ---- options ---- */

/* NBD_REP_SERVER: u32 name length, name, then the description (the spec
 * lets the rest of the reply carry implementation-specific text). */
static void reply_server(struct hs_out *out, const struct hs_export *e) {
  size_t nlen = strlen(e->name), dlen = strlen(e->description);
  uint8_t *p = out_reserve(out, 24 + nlen + dlen);
  if (!p)
    return;
  put_be64(p, NBD_REP_MAGIC);
  put_be32(p + 8, NBD_OPT_LIST);
  put_be32(p + 12, NBD_REP_SERVER);
  put_be32(p + 16, (uint32_t)(4 + nlen + dlen));
  put_be32(p + 20, (uint32_t)nlen);
  memcpy(p + 24, e->name, nlen);
  memcpy(p + 24 + nlen, e->description, dlen);
}

static void do_list(const struct hs_state *hs, const struct hs_catalog *cat,
                    uint32_t len, struct hs_out *out) {
  if (len != 0) {
    reply_err(out, NBD_OPT_LIST, NBD_REP_ERR_INVALID, "LIST takes no data");
    return;
  }
  /* Only what the client may use now: a TLS-only export's name is not
   * sent in the clear, and clients that GO to every listed export
   * (nbdinfo --list) work without TLS.  Named directly, it answers
   * TLS_REQD, so the client learns to come back with TLS. */
  for (size_t i = 0; i < cat->n; i++)
    if (!cat->v[i].unlisted && access_error(hs, cat, (int)i) == 0)
      reply_server(out, &cat->v[i]);
  reply_ack(out, NBD_OPT_LIST);
}

static void info_reply(struct hs_out *out, uint32_t opt, uint16_t type,
                       const void *body, size_t blen) {
  uint8_t t[2];
  put_be16(t, type);
  reply(out, opt, NBD_REP_INFO, t, 2, body, blen);
}

/* NBD_INFO_NAME and NBD_INFO_DESCRIPTION if asked for: once each, in the
 * order first asked, however often the list repeats them (as qemu-nbd
 * does): 64 KiB of requests would otherwise be 32,000 replies. */
static void send_requested_infos(uint32_t opt, const struct hs_export *e,
                                 const uint8_t *reqs, uint16_t nreqs,
                                 struct hs_out *out) {
  unsigned sent = 0;
  for (uint16_t i = 0; i < nreqs; i++) {
    uint16_t type = get_be16(reqs + 2 * i);
    if ((type != NBD_INFO_NAME && type != NBD_INFO_DESCRIPTION) ||
        (sent & (1u << type)))
      continue;
    sent |= 1u << type;
    if (type == NBD_INFO_NAME)
      info_reply(out, opt, NBD_INFO_NAME, e->name, strlen(e->name));
    else if (*e->description) /* none: not sent, as qemu-nbd without -D */
      info_reply(out, opt, NBD_INFO_DESCRIPTION, e->description,
                 strlen(e->description));
  }
}

static void send_infos(struct hs_state *hs, uint32_t opt,
                       const struct hs_export *e, const uint8_t *reqs,
                       uint16_t nreqs, struct hs_out *out) {
  uint8_t body[12];
  put_be64(body, e->size);
  put_be16(body + 8, hs_tflags(hs, e));
  info_reply(out, opt, NBD_INFO_EXPORT, body, 10);
  /* Block sizes are always sent: clients that did not ask may ignore them,
   * and min_block is 1 so nobody needs to be refused. */
  put_be32(body, e->min_block);
  put_be32(body + 4, e->pref_block);
  put_be32(body + 8, e->max_block);
  info_reply(out, opt, NBD_INFO_BLOCK_SIZE, body, 12);
  send_requested_infos(opt, e, reqs, nreqs, out);
}

static enum hs_result do_info_go(struct hs_state *hs,
                                 const struct hs_catalog *cat, uint32_t opt,
                                 const uint8_t *data, uint32_t len,
                                 struct hs_out *out) {
  if (len < 6) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "option data too short");
    return HS_CONTINUE;
  }
  uint32_t nlen = get_be32(data);
  if (nlen > NBD_MAX_STRING || (uint64_t)nlen + 6 > len) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "bad export name length");
    return HS_CONTINUE;
  }
  uint16_t nreqs = get_be16(data + 4 + nlen);
  if ((uint64_t)4 + nlen + 2 + 2ull * nreqs != len) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "bad information request count");
    return HS_CONTINUE;
  }
  int idx = lookup(hs, cat, opt, data + 4, nlen, out);
  if (idx < 0)
    return HS_CONTINUE;
  /* Contexts chosen for another export do not carry over to this one. */
  struct hs_state probe = *hs;
  if (probe.ctx_export != idx) {
    probe.ctx_base = probe.ctx_depth = false;
    probe.ctx_extra = 0;
  }
  send_infos(&probe, opt, &cat->v[idx], data + 4 + nlen + 2, nreqs, out);
  reply_ack(out, opt);
  if (opt == NBD_OPT_INFO)
    return HS_CONTINUE;
  hs->ctx_base = probe.ctx_base;
  hs->ctx_depth = probe.ctx_depth;
  hs->ctx_extra = probe.ctx_extra;
  hs->export_index = idx;
  hs->tflags = hs_tflags(hs, &cat->v[idx]);
  return HS_GO;
}

static enum hs_result do_export_name(struct hs_state *hs,
                                     const struct hs_catalog *cat,
                                     const uint8_t *data, uint32_t len,
                                     struct hs_out *out) {
  int idx = find_export(cat, data, len);
  /* The spec leaves no way to refuse but closing. */
  if (idx < 0 || access_error(hs, cat, idx))
    return HS_CLOSE;
  const struct hs_export *e = &cat->v[idx];
  /* As with GO: contexts set for this export are kept, others dropped. */
  if (hs->ctx_export != idx) {
    hs->ctx_base = hs->ctx_depth = false;
    hs->ctx_extra = 0;
  }
  hs->export_index = idx;
  hs->tflags = hs_tflags(hs, e);
  uint8_t *p = out_reserve(out, 10 + (hs->no_zeroes ? 0 : 124));
  if (!p)
    return HS_CLOSE;
  put_be64(p, e->size);
  put_be16(p + 8, hs->tflags);
  if (!hs->no_zeroes)
    memset(p + 10, 0, 124);
  return HS_GO;
}

/* Meta context queries, answered as qemu-nbd 7.2 answers them:
 * "base:allocation", "qemu:allocation-depth" and the export's own contexts
 * by exact name; for LIST only, the namespace "base:", "qemu:" (every
 * qemu: context) and "qemu:dirty-bitmap:" (every bitmap).  Returns a mask
 * of context ids. */
static uint32_t match_extra(const struct hs_export *e, const uint8_t *q,
                            uint32_t len, bool list) {
  static const char bm[] = "qemu:dirty-bitmap:";
  bool all_qemu = list && len == 5 && !memcmp(q, "qemu:", 5);
  bool all_bm = list && len == sizeof bm - 1 && !memcmp(q, bm, len);
  uint32_t mask = 0;
  for (size_t i = 0; i < e->ncontexts && i < HS_MAX_EXTRA; i++) {
    const char *name = e->contexts[i];
    bool is_bm = !strncmp(name, bm, sizeof bm - 1);
    bool exact = strlen(name) == len && !memcmp(q, name, len);
    bool in_ns = !strncmp(name, "qemu:", 5);
    if (exact || (all_bm && is_bm) || (all_qemu && in_ns))
      mask |= 1u << (HS_CTX_EXTRA + i);
  }
  return mask;
}

static uint32_t match_context(const struct hs_export *e, const uint8_t *q,
                              uint32_t len, bool list) {
  static const char base[] = "base:allocation",
                    depth[] = "qemu:allocation-depth";
  uint32_t mask = match_extra(e, q, len, list);
  if (len == sizeof base - 1 && !memcmp(q, base, len))
    mask |= 1u << HS_CTX_BASE_ALLOCATION;
  if (len == sizeof depth - 1 && !memcmp(q, depth, len))
    mask |= 1u << HS_CTX_ALLOCATION_DEPTH;
  if (list && len == 5 && !memcmp(q, "base:", 5))
    mask |= 1u << HS_CTX_BASE_ALLOCATION;
  if (list && len == 5 && !memcmp(q, "qemu:", 5))
    mask |= 1u << HS_CTX_ALLOCATION_DEPTH;
  return mask;
}

static uint32_t all_contexts(const struct hs_export *e) {
  size_t n = e->ncontexts < HS_MAX_EXTRA ? e->ncontexts : HS_MAX_EXTRA;
  return (1u << HS_CTX_BASE_ALLOCATION) | (1u << HS_CTX_ALLOCATION_DEPTH) |
         (((1u << n) - 1) << HS_CTX_EXTRA);
}

/* The id is only meaningful for SET: proto.md says the id in
 * LIST_META_CONTEXT replies "is reserved and SHOULD be set to zero". */
static void send_context(struct hs_out *out, uint32_t opt,
                         const struct hs_export *e, unsigned id) {
  const char *name = id == HS_CTX_BASE_ALLOCATION ? "base:allocation"
                     : id == HS_CTX_ALLOCATION_DEPTH
                         ? "qemu:allocation-depth"
                         : e->contexts[id - HS_CTX_EXTRA];
  uint8_t b[4];
  put_be32(b, opt == NBD_OPT_SET_META_CONTEXT ? id : 0);
  reply(out, opt, NBD_REP_META_CONTEXT, b, 4, name, strlen(name));
}

/* The query list at Q..END holds NQ well-formed strings. */
static bool queries_ok(const uint8_t *q, const uint8_t *end, uint32_t nq) {
  for (uint32_t i = 0; i < nq; i++) {
    if (end - q < 4 || get_be32(q) > (uint64_t)(end - q - 4))
      return false;
    q += 4 + get_be32(q);
  }
  return q == end;
}

static uint32_t match_queries(const struct hs_export *e, const uint8_t *q,
                              uint32_t nq, bool list) {
  uint32_t mask = 0;
  for (uint32_t i = 0; i < nq; i++) { /* bounds checked by queries_ok() */
    uint32_t qlen = get_be32(q);
    mask |= match_context(e, q + 4, qlen, list);
    q += 4 + qlen;
  }
  return mask;
}

static void do_meta_context(struct hs_state *hs, const struct hs_catalog *cat,
                            uint32_t opt, const uint8_t *data, uint32_t len,
                            struct hs_out *out) {
  bool list = opt == NBD_OPT_LIST_META_CONTEXT;
  if (!hs->structured) {
    reply_err(out, opt, NBD_REP_ERR_INVALID,
              "meta contexts need structured replies first");
    return;
  }
  if (len < 8) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "option data too short");
    return;
  }
  uint32_t nlen = get_be32(data);
  if (nlen > NBD_MAX_STRING || (uint64_t)nlen + 8 > len) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "bad export name length");
    return;
  }
  uint32_t nq = get_be32(data + 4 + nlen);
  const uint8_t *q = data + 8 + nlen;
  if (!queries_ok(q, data + len, nq)) {
    reply_err(out, opt, NBD_REP_ERR_INVALID, "malformed query list");
    return;
  }
  int idx = lookup(hs, cat, opt, data + 4, nlen, out);
  if (idx < 0)
    return;
  const struct hs_export *e = &cat->v[idx];
  uint32_t mask =
      list && nq == 0 ? all_contexts(e) : match_queries(e, q, nq, list);
  for (unsigned id = HS_CTX_BASE_ALLOCATION; id < HS_CTX_EXTRA + HS_MAX_EXTRA;
       id++)
    if (mask & (1u << id))
      send_context(out, opt, e, id);
  if (!list) {
    hs->ctx_base = mask & (1u << HS_CTX_BASE_ALLOCATION);
    hs->ctx_depth = mask & (1u << HS_CTX_ALLOCATION_DEPTH);
    hs->ctx_extra = mask >> HS_CTX_EXTRA;
    hs->ctx_export = idx;
  }
  reply_ack(out, opt);
}

static void do_structured(struct hs_state *hs, uint32_t len,
                          struct hs_out *out) {
  if (len != 0)
    reply_err(out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_INVALID,
              "option takes no data");
  else if (hs->extended)
    reply_err(out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_EXT_HEADER_REQD,
              "extended headers are already in use");
  else if (hs->structured)
    reply_err(out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_INVALID,
              "structured replies already negotiated");
  else {
    hs->structured = true;
    reply_ack(out, NBD_OPT_STRUCTURED_REPLY);
  }
}

static void do_extended(struct hs_state *hs, uint32_t len, struct hs_out *out) {
  if (len != 0)
    reply_err(out, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_INVALID,
              "option takes no data");
  else if (hs->extended)
    reply_err(out, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_INVALID,
              "extended headers already negotiated");
  else {
    /* The contexts chosen so far are kept: only STARTTLS resets them
     * (proto.md, NBD_OPT_SET_META_CONTEXT). */
    hs->extended = hs->structured = true;
    reply_ack(out, NBD_OPT_EXTENDED_HEADERS);
  }
}

static enum hs_result do_starttls(struct hs_state *hs, uint32_t len,
                                  struct hs_out *out) {
  uint32_t opt = NBD_OPT_STARTTLS;
  if (hs->tls == HS_TLS_OFF)
    reply_err(out, opt, NBD_REP_ERR_POLICY, "TLS is not available");
  else if (len != 0)
    reply_err(out, opt, NBD_REP_ERR_INVALID, "option takes no data");
  else if (hs->tls_active)
    reply_err(out, opt, NBD_REP_ERR_INVALID, "TLS is already in use");
  else {
    reply_ack(out, opt);
    return out->oom ? HS_CLOSE : HS_STARTTLS;
  }
  return out->oom ? HS_CLOSE : HS_CONTINUE;
}

void hs_tls_started(struct hs_state *hs) {
  hs->tls_active = true;
  hs->structured = hs->extended = false;
  hs->ctx_base = hs->ctx_depth = false;
  hs->ctx_extra = 0;
  hs->ctx_export = -1;
}

/* With --tls require, before TLS: only ABORT and STARTTLS are answered;
 * EXPORT_NAME cannot be refused but by closing. */
static bool tls_refused(const struct hs_state *hs, uint32_t opt) {
  return hs->tls == HS_TLS_REQUIRE && !hs->tls_active && opt != NBD_OPT_ABORT &&
         opt != NBD_OPT_STARTTLS;
}

enum hs_result hs_option(struct hs_state *hs, const struct hs_catalog *cat,
                         uint32_t opt, const uint8_t *data, uint32_t len,
                         struct hs_out *out) {
  if (opt == NBD_OPT_EXPORT_NAME)
    return tls_refused(hs, opt) ? HS_CLOSE
                                : do_export_name(hs, cat, data, len, out);
  if (!hs->fixed)
    return HS_CLOSE; /* old newstyle: no way to reject an option */
  if (tls_refused(hs, opt)) {
    reply_err(out, opt, NBD_REP_ERR_TLS_REQD, "TLS is required");
    return out->oom ? HS_CLOSE : HS_CONTINUE;
  }
  switch (opt) {
  case NBD_OPT_ABORT: reply_ack(out, opt); return HS_CLOSE;
  case NBD_OPT_LIST: do_list(hs, cat, len, out); break;
  case NBD_OPT_STARTTLS: return do_starttls(hs, len, out);
  case NBD_OPT_INFO:
  case NBD_OPT_GO: return do_info_go(hs, cat, opt, data, len, out);
  case NBD_OPT_STRUCTURED_REPLY: do_structured(hs, len, out); break;
  case NBD_OPT_LIST_META_CONTEXT:
  case NBD_OPT_SET_META_CONTEXT:
    do_meta_context(hs, cat, opt, data, len, out);
    break;
  case NBD_OPT_EXTENDED_HEADERS: do_extended(hs, len, out); break;
  default: reply_err(out, opt, NBD_REP_ERR_UNSUP, "unknown option"); break;
  }
  return out->oom ? HS_CLOSE : HS_CONTINUE;
}

void hs_option_too_big(struct hs_state *hs, uint32_t opt, struct hs_out *out) {
  if (tls_refused(hs, opt))
    reply_err(out, opt, NBD_REP_ERR_TLS_REQD, "TLS is required");
  else
    reply_err(out, opt, NBD_REP_ERR_TOO_BIG, "option data too large");
}
