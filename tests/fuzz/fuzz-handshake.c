/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the NBD option haggling (server/handshake.c).
 *
 * The input is what a client sends after the server's greeting: 4 bytes of
 * client flags, then options [IHAVEOPT, u32 option, u32 length, data].  Each
 * option is handed to hs_option() the way server/conn.c does (lengths
 * checked exactly, over-long data discarded with hs_option_too_big()) until
 * the state machine says GO or CLOSE or the input runs out.  The replies are
 * then checked for framing and the state for consistency.  STARTTLS is
 * taken to succeed; the server's TLS policy comes from the input's length
 * (so existing inputs stay meaningful), and under "require" nothing but
 * TLS_REQD may be answered before TLS.
 *
 * The per-export policy comes from the length too: which export the
 * client is not admitted to, and whether "" is the default export.  The
 * checks: LIST shows only exports the client may use now, every
 * refusal names the right reason, and no option ever reaches
 * an export the client may not use (now). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-check.h"
#include "server/handshake.h"
#include "server/nbd-protocol.h"
#include "server/wire.h"

static const struct hs_export exports[4] = {
    {.name = "disk",
     .description = "a writable disk",
     .size = 1ull << 30,
     .tflags = NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM |
               NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO |
               NBD_FLAG_CAN_MULTI_CONN | NBD_FLAG_SEND_CACHE,
     .min_block = 1,
     .pref_block = 4096,
     .max_block = 32u * 1024 * 1024},
    {.name = "ro",
     .description = "",
     .size = 12345,
     .tflags = NBD_FLAG_SEND_FLUSH | NBD_FLAG_READ_ONLY,
     .min_block = 1,
     .pref_block = 512,
     .max_block = 1u << 20},
    {.name = "tls",
     .description = "TLS only",
     .size = 4096,
     .tflags = NBD_FLAG_SEND_FLUSH,
     .min_block = 1,
     .pref_block = 4096,
     .max_block = 1u << 20,
     .tls_required = true},
    {.name = "", /* reached by "" only without a default export */
     .description = "unnamed",
     .size = 512,
     .min_block = 1,
     .pref_block = 512,
     .max_block = 512},
};
#define NEXPORTS (sizeof exports / sizeof exports[0])

/* The one export the client is not admitted to. */
static size_t refused;
static bool refuse_one(const void *ctx, size_t idx) {
  return idx != *(const size_t *)ctx;
}
static struct hs_catalog catalog = {exports, NEXPORTS, .admits = refuse_one,
                                    .admits_ctx = &refused};

/* The export literally called NAME; -1 if none. */
static int named(const uint8_t *name, uint32_t len) {
  for (size_t i = 0; i < NEXPORTS; i++)
    if (strlen(exports[i].name) == len &&
        (len == 0 || !memcmp(exports[i].name, name, len)))
      return (int)i;
  return -1;
}

/* The export a client's NAME refers to, as the policy says; -1 if none. */
static int resolve(const uint8_t *name, uint32_t len) {
  return len == 0 && !catalog.no_default ? 0 : named(name, len);
}

/* Whether the client may use export IDX right now. */
static bool usable(const struct hs_state *hs, int idx) {
  return idx >= 0 && (size_t)idx != refused &&
         (!exports[idx].tls_required || hs->tls_active);
}

/* The state must be one a server can act on. */
static void check_state(const struct hs_state *hs) {
  if (hs->extended)
    CHECK(hs->structured);
  if (hs->ctx_base || hs->ctx_depth) {
    CHECK(hs->structured);
    CHECK(hs->ctx_export >= 0 && (size_t)hs->ctx_export < catalog.n);
  }
  /* Contexts are only ever chosen for an export the client may use. */
  if (hs->ctx_export >= 0)
    CHECK(usable(hs, hs->ctx_export));
}

/* Check the replies to option OPT in OUT; returns the number of replies. */
static size_t check_replies(const struct hs_state *hs, const struct hs_out *out,
                            uint32_t opt, enum hs_result res) {
  size_t off = 0, n = 0;
  uint32_t last_type = 0;
  while (off < out->len) {
    CHECK(out->len - off >= 20);
    const uint8_t *p = out->buf + off;
    CHECK(get_be64(p) == NBD_REP_MAGIC);
    CHECK(get_be32(p + 8) == opt);
    uint32_t type = get_be32(p + 12), len = get_be32(p + 16);
    CHECK(len <= out->len - off - 20);
    const uint8_t *d = p + 20;
    switch (type) {
    case NBD_REP_ACK: CHECK(len == 0); break;
    case NBD_REP_SERVER: {
      CHECK(opt == NBD_OPT_LIST);
      CHECK(len >= 4 && get_be32(d) <= len - 4);
      /* Listed: usable now (admitted; TLS-only ones after TLS), and not
       * unlisted. */
      int idx = named(d + 4, get_be32(d));
      CHECK(usable(hs, idx) && !exports[idx].unlisted);
      break;
    }
    case NBD_REP_INFO:
      CHECK(opt == NBD_OPT_INFO || opt == NBD_OPT_GO);
      CHECK(len >= 2);
      switch (get_be16(d)) {
      case NBD_INFO_EXPORT: CHECK(len == 12); break;
      case NBD_INFO_BLOCK_SIZE: CHECK(len == 14); break;
      case NBD_INFO_NAME:
      case NBD_INFO_DESCRIPTION: break;
      default: CHECK(!"unknown info type");
      }
      break;
    case NBD_REP_META_CONTEXT:
      CHECK(opt == NBD_OPT_LIST_META_CONTEXT ||
            opt == NBD_OPT_SET_META_CONTEXT);
      CHECK(len > 4);
      /* LIST's ids are reserved, zero; SET's are the ones conn.c knows. */
      if (opt == NBD_OPT_LIST_META_CONTEXT)
        CHECK(get_be32(d) == 0);
      else
        CHECK(get_be32(d) == HS_CTX_BASE_ALLOCATION ||
              get_be32(d) == HS_CTX_ALLOCATION_DEPTH);
      break;
    default:
      CHECK(type & 0x80000000u);
      CHECK(len <= NBD_MAX_STRING);
      break;
    }
    last_type = type;
    off += 20 + len;
    n++;
  }
  if (res == HS_GO)
    CHECK(n > 0 && last_type == NBD_REP_ACK);
  return n;
}

/* Under --tls require before TLS: no export, no information. */
static void check_plain_refused(const struct hs_state *hs, uint32_t opt,
                                const struct hs_out *out, enum hs_result res) {
  if (opt == NBD_OPT_ABORT || opt == NBD_OPT_STARTTLS)
    return;
  CHECK(res != HS_GO && hs->export_index == -1 && !hs->structured);
  if (opt == NBD_OPT_EXPORT_NAME || !hs->fixed)
    CHECK(res == HS_CLOSE && out->len == 0);
  else
    CHECK(out->len >= 20 && get_be32(out->buf + 12) == NBD_REP_ERR_TLS_REQD &&
          20 + get_be32(out->buf + 16) == out->len);
}

/* INFO, GO and the META_CONTEXT options name an export; once the name
 * is looked at (the answer is an ACK or an error about the export), the
 * answer must follow the policy for that export. */
static void check_named(const struct hs_state *hs, uint32_t opt,
                        const uint8_t *data, uint32_t len,
                        const struct hs_out *out) {
  if (opt != NBD_OPT_INFO && opt != NBD_OPT_GO &&
      opt != NBD_OPT_LIST_META_CONTEXT && opt != NBD_OPT_SET_META_CONTEXT)
    return;
  uint32_t first = get_be32(out->buf + 12), last = first;
  for (size_t off = 0; off < out->len;
       off += 20 + get_be32(out->buf + off + 16))
    last = get_be32(out->buf + off + 12);
  if (first != NBD_REP_ERR_POLICY && first != NBD_REP_ERR_TLS_REQD &&
      first != NBD_REP_ERR_UNKNOWN && last != NBD_REP_ACK)
    return; /* refused before the name was looked at */
  if (hs->tls == HS_TLS_REQUIRE && !hs->tls_active)
    return; /* check_plain_refused() covers it */
  CHECK(len >= 4 && get_be32(data) <= len - 4);
  int idx = resolve(data + 4, get_be32(data));
  if (last == NBD_REP_ACK)
    CHECK(usable(hs, idx));
  else if (first == NBD_REP_ERR_UNKNOWN)
    CHECK(idx < 0);
  else if (first == NBD_REP_ERR_TLS_REQD)
    /* SELECTIVETLS: TLS_REQD for INFO and GO only. */
    CHECK((opt == NBD_OPT_INFO || opt == NBD_OPT_GO) && idx >= 0 &&
          (size_t)idx != refused && exports[idx].tls_required &&
          !hs->tls_active);
  else if (idx >= 0 && (size_t)idx != refused)
    /* POLICY for an admitted export: a TLS-only one named in the clear to
     * a meta context option. */
    CHECK(opt != NBD_OPT_INFO && opt != NBD_OPT_GO &&
          exports[idx].tls_required && !hs->tls_active);
  else
    CHECK(idx >= 0 && (size_t)idx == refused);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct hs_state hs = {.tls = (enum hs_tls)(size % 3)};
  refused = size / 3 % NEXPORTS;
  catalog.no_default = size / (3 * NEXPORTS) % 2;
  struct hs_out out = {0};
  hs_greeting(&out);
  CHECK(out.len == 18);
  out.len = 0;
  if (size < 4)
    goto done;
  if (!hs_client_flags(&hs, get_be32(data)))
    goto done;
  CHECK(hs.export_index == -1);
  size_t pos = 4;
  for (;;) {
    if (size - pos < 16)
      break;
    if (get_be64(data + pos) != NBD_IHAVEOPT)
      break; /* the server disconnects */
    uint32_t opt = get_be32(data + pos + 8), len = get_be32(data + pos + 12);
    bool plain_only = hs.tls == HS_TLS_REQUIRE && !hs.tls_active;
    pos += 16;
    out.len = 0;
    enum hs_result res;
    uint8_t *opt_data = NULL;
    if (len > HS_MAX_OPTION_DATA) {
      if (opt == NBD_OPT_EXPORT_NAME || len > size - pos)
        break;
      pos += len; /* discarded unread */
      hs_option_too_big(&hs, opt, &out);
      res = HS_CONTINUE;
    } else {
      if (len > size - pos)
        break; /* the client hung up mid-option */
      /* An exact-size copy, so reading past the option is caught. */
      opt_data = malloc(len ? len : 1);
      CHECK(opt_data);
      memcpy(opt_data, data + pos, len);
      pos += len;
      res = hs_option(&hs, &catalog, opt, opt_data, len, &out);
    }
    CHECK(!out.oom);
    CHECK(res == HS_CONTINUE || res == HS_GO || res == HS_CLOSE ||
          res == HS_STARTTLS);
    check_state(&hs);
    if (plain_only)
      check_plain_refused(&hs, opt, &out, res);
    if (opt == NBD_OPT_EXPORT_NAME) {
      /* No option reply: the export's size and flags, or nothing. */
      if (res == HS_GO)
        CHECK(out.len == (hs.no_zeroes ? 10u : 134u));
      else
        CHECK(res == HS_CLOSE && out.len == 0);
    } else if (!hs.fixed) {
      CHECK(res == HS_CLOSE && out.len == 0);
    } else {
      /* Every option of a fixed-newstyle client gets a reply. */
      CHECK(check_replies(&hs, &out, opt, res) > 0);
      if (opt_data)
        check_named(&hs, opt, opt_data, len, &out);
    }
    if (res == HS_GO) {
      CHECK(hs.export_index >= 0 && (size_t)hs.export_index < catalog.n);
      CHECK(usable(&hs, hs.export_index));
      if (opt == NBD_OPT_EXPORT_NAME)
        CHECK(resolve(opt_data, len) == hs.export_index);
      else
        CHECK(resolve(opt_data + 4, get_be32(opt_data)) == hs.export_index);
      const struct hs_export *e = &exports[hs.export_index];
      CHECK(hs.tflags == hs_tflags(&hs, e));
      CHECK((hs.tflags & e->tflags) == e->tflags);
      CHECK(hs.tflags & NBD_FLAG_HAS_FLAGS);
      CHECK(!!(hs.tflags & NBD_FLAG_SEND_DF) == hs.structured);
      if (hs.tflags & NBD_FLAG_BLOCK_STAT_PAYLOAD)
        CHECK(hs.extended);
      if (hs.ctx_base || hs.ctx_depth)
        CHECK(hs.ctx_export == hs.export_index);
      if (opt == NBD_OPT_EXPORT_NAME)
        CHECK(get_be64(out.buf) == e->size &&
              get_be16(out.buf + 8) == hs.tflags);
    }
    if (opt == NBD_OPT_EXPORT_NAME && res == HS_CLOSE && !plain_only)
      CHECK(!usable(&hs, resolve(opt_data, len)));
    free(opt_data);
    if (res == HS_STARTTLS) {
      CHECK(opt == NBD_OPT_STARTTLS && hs.tls != HS_TLS_OFF && !hs.tls_active);
      hs_tls_started(&hs); /* as if the TLS handshake succeeded */
      check_state(&hs);
      continue;
    }
    if (res != HS_CONTINUE)
      break;
  }
done:
  hs_out_free(&out);
  return 0;
}
