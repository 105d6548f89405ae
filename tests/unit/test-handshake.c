/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for server/handshake.c: the fixed-newstyle option state
 * machine, checked byte for byte through the replies it produces. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/handshake.h"
#include "server/nbd-protocol.h"
#include "server/wire.h"

/* ---- the catalog ---- */

#define MAIN_FLAGS                                                             \
  (NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM |              \
   NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO |                      \
   NBD_FLAG_CAN_MULTI_CONN | NBD_FLAG_SEND_CACHE)
#define BACKUP_FLAGS (NBD_FLAG_SEND_FLUSH | NBD_FLAG_READ_ONLY)

static const struct hs_export exports[2] = {
    {.name = "main",
     .description = "main disk",
     .size = 0x0000000123456789ull,
     .tflags = MAIN_FLAGS,
     .min_block = 1,
     .pref_block = 4096,
     .max_block = 32u * 1024 * 1024},
    {.name = "backup",
     .description = "read-only copy",
     .size = 1ull << 30,
     .tflags = BACKUP_FLAGS,
     .min_block = 512,
     .pref_block = 65536,
     .max_block = 1u << 20},
};
static const struct hs_catalog cat = {exports, 2};

/* ---- parsing the replies ---- */

struct rep {
  uint32_t opt, type, len;
  const uint8_t *data;
};

/* Split OUT into option replies; asserts the framing is exact. */
static size_t parse_replies(const struct hs_out *out, struct rep *v,
                            size_t max) {
  size_t n = 0, off = 0;
  cr_assert(!out->oom);
  while (off < out->len) {
    cr_assert_geq(out->len - off, 20, "truncated reply header at %zu", off);
    cr_assert_eq(get_be64(out->buf + off), NBD_REP_MAGIC,
                 "bad reply magic at %zu", off);
    cr_assert_lt(n, max, "too many replies");
    v[n].opt = get_be32(out->buf + off + 8);
    v[n].type = get_be32(out->buf + off + 12);
    v[n].len = get_be32(out->buf + off + 16);
    v[n].data = out->buf + off + 20;
    cr_assert_leq(v[n].len, out->len - off - 20, "reply %zu overruns", n);
    off += 20 + v[n].len;
    n++;
  }
  cr_assert_eq(off, out->len);
  return n;
}

/* Expect exactly one reply of TYPE to OPT; returns it. */
static struct rep one_reply(const struct hs_out *out, uint32_t opt,
                            uint32_t type) {
  struct rep v[8];
  size_t n = parse_replies(out, v, 8);
  cr_assert_eq(n, 1, "want one reply, got %zu", n);
  cr_assert_eq(v[0].opt, opt);
  cr_assert_eq(v[0].type, type, "reply type 0x%x, want 0x%x", v[0].type, type);
  if (type & 0x80000000u)
    cr_assert_gt(v[0].len, 0, "errors carry a message");
  else if (type == NBD_REP_ACK)
    cr_assert_eq(v[0].len, 0);
  return v[0];
}

/* ---- building options ---- */

struct buf {
  uint8_t b[8192];
  uint32_t len;
};

static void b_u16(struct buf *b, uint16_t v) {
  put_be16(b->b + b->len, v);
  b->len += 2;
}
static void b_u32(struct buf *b, uint32_t v) {
  put_be32(b->b + b->len, v);
  b->len += 4;
}
static void b_str(struct buf *b, const char *s) {
  memcpy(b->b + b->len, s, strlen(s));
  b->len += (uint32_t)strlen(s);
}

/* INFO/GO data: name, then the information requests. */
static struct buf info_data(const char *name, unsigned nreqs,
                            const uint16_t *reqs) {
  struct buf b = {.len = 0};
  b_u32(&b, (uint32_t)strlen(name));
  b_str(&b, name);
  b_u16(&b, (uint16_t)nreqs);
  for (unsigned i = 0; i < nreqs; i++)
    b_u16(&b, reqs[i]);
  return b;
}

/* META_CONTEXT data: name, then NQ queries from a NULL-terminated list. */
static struct buf meta_data(const char *name, const char *const *queries) {
  struct buf b = {.len = 0};
  b_u32(&b, (uint32_t)strlen(name));
  b_str(&b, name);
  uint32_t nq = 0;
  while (queries && queries[nq])
    nq++;
  b_u32(&b, nq);
  for (uint32_t i = 0; i < nq; i++) {
    b_u32(&b, (uint32_t)strlen(queries[i]));
    b_str(&b, queries[i]);
  }
  return b;
}

/* ---- fixtures ---- */

static struct hs_state hs;
static struct hs_out out;

static void setup(void) {
  memset(&hs, 0, sizeof hs);
  memset(&out, 0, sizeof out);
  cr_assert(
      hs_client_flags(&hs, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES));
}
static void teardown(void) {
  hs_out_free(&out);
}

static enum hs_result opt_(uint32_t opt, const void *data, uint32_t len) {
  out.len = 0;
  return hs_option(&hs, &cat, opt, data, len, &out);
}
static enum hs_result opt_buf(uint32_t opt, const struct buf *b) {
  return opt_(opt, b->b, b->len);
}

static void negotiate_structured(void) {
  cr_assert_eq(opt_(NBD_OPT_STRUCTURED_REPLY, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK);
  cr_assert(hs.structured);
}

static void negotiate_extended(void) {
  cr_assert_eq(opt_(NBD_OPT_EXTENDED_HEADERS, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ACK);
  cr_assert(hs.extended);
}

/* ---- greeting and client flags ---- */

Test(greeting, bytes) {
  struct hs_out o = {0};
  hs_greeting(&o);
  static const uint8_t want[18] = {'N', 'B', 'D', 'M', 'A', 'G', 'I', 'C', 'I',
                                   'H', 'A', 'V', 'E', 'O', 'P', 'T', 0,   3};
  cr_assert_eq(o.len, 18);
  cr_assert_arr_eq(o.buf, want, 18);
  hs_out_free(&o);
  cr_assert_null(o.buf);
  cr_assert_eq(o.len, 0);
}

Test(client_flags, accepted) {
  for (uint32_t f = 0; f < 4; f++) {
    struct hs_state s;
    memset(&s, 0x55, sizeof s);
    cr_assert(hs_client_flags(&s, f), "flags %u", f);
    cr_assert_eq(s.fixed, (f & 1) != 0);
    cr_assert_eq(s.no_zeroes, (f & 2) != 0);
    cr_assert_eq(s.export_index, -1);
    cr_assert_eq(s.ctx_export, -1);
  }
}

Test(client_flags, unknown_bits_refused) {
  for (unsigned bit = 2; bit < 32; bit++) {
    struct hs_state s = {0};
    cr_assert_not(hs_client_flags(&s, 1u << bit), "bit %u", bit);
    cr_assert_not(hs_client_flags(&s, 3u | (1u << bit)), "bit %u", bit);
  }
}

/* ---- EXPORT_NAME ---- */

TestSuite(export_name, .init = setup, .fini = teardown);

Test(export_name, known_no_zeroes) {
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "backup", 6), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  uint16_t f = BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS;
  cr_assert_eq(hs.tflags, f);
  static const uint8_t want[10] = {0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0x07};
  cr_assert_eq(out.len, 10);
  cr_assert_arr_eq(out.buf, want, 10);
}

Test(export_name, known_with_zeroes) {
  memset(&hs, 0, sizeof hs);
  cr_assert(hs_client_flags(&hs, NBD_FLAG_C_FIXED_NEWSTYLE));
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "main", 4), HS_GO);
  cr_assert_eq(hs.export_index, 0);
  cr_assert_eq(out.len, 134);
  cr_assert_eq(get_be64(out.buf), 0x0000000123456789ull);
  cr_assert_eq(get_be16(out.buf + 8), MAIN_FLAGS | NBD_FLAG_HAS_FLAGS);
  for (size_t i = 10; i < 134; i++)
    cr_assert_eq(out.buf[i], 0, "byte %zu", i);
}

Test(export_name, empty_name_is_the_default) {
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "", 0), HS_GO);
  cr_assert_eq(hs.export_index, 0);
  cr_assert_eq(out.len, 10);
  cr_assert_eq(get_be64(out.buf), exports[0].size);
}

Test(export_name, unknown_closes) {
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "nope", 4), HS_CLOSE);
  cr_assert_eq(out.len, 0);
  cr_assert_eq(hs.export_index, -1);
  /* A prefix or an extension of a known name is not that name. */
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "mai", 3), HS_CLOSE);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "main\0", 5), HS_CLOSE);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "mainx", 5), HS_CLOSE);
  cr_assert_eq(out.len, 0);
}

Test(export_name, allowed_without_fixed_newstyle) {
  memset(&hs, 0, sizeof hs);
  cr_assert(hs_client_flags(&hs, 0));
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "main", 4), HS_GO);
  cr_assert_eq(hs.export_index, 0);
  cr_assert_eq(out.len, 134);
}

/* proto.md: contexts set for the export "ultimately selected ... by
 * NBD_OPT_GO (or NBD_OPT_EXPORT_NAME)" may be used. */
Test(export_name, keeps_meta_contexts_of_the_same_export) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf b = meta_data("main", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &b);
  cr_assert(hs.ctx_base);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "main", 4), HS_GO);
  cr_assert(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
  cr_assert(hs.structured);
}

Test(export_name, default_name_keeps_meta_contexts_of_export_zero) {
  negotiate_structured();
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  struct buf b = meta_data("main", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &b);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "", 0), HS_GO);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
}

Test(export_name, drops_meta_contexts_of_another_export) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf b = meta_data("main", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &b);
  cr_assert(hs.ctx_base);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "backup", 6), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
}

/* ---- ABORT, LIST, STARTTLS, unknown ---- */

TestSuite(options, .init = setup, .fini = teardown);

Test(options, abort) {
  cr_assert_eq(opt_(NBD_OPT_ABORT, NULL, 0), HS_CLOSE);
  one_reply(&out, NBD_OPT_ABORT, NBD_REP_ACK);
}

Test(options, list) {
  cr_assert_eq(opt_(NBD_OPT_LIST, NULL, 0), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  for (int i = 0; i < 2; i++) {
    const char *name = exports[i].name, *desc = exports[i].description;
    size_t nlen = strlen(name), dlen = strlen(desc);
    cr_assert_eq(v[i].opt, NBD_OPT_LIST);
    cr_assert_eq(v[i].type, NBD_REP_SERVER);
    cr_assert_eq(v[i].len, 4 + nlen + dlen);
    cr_assert_eq(get_be32(v[i].data), nlen);
    cr_assert_arr_eq(v[i].data + 4, name, nlen);
    cr_assert_arr_eq(v[i].data + 4 + nlen, desc, dlen);
  }
  cr_assert_eq(v[2].opt, NBD_OPT_LIST);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
  cr_assert_eq(v[2].len, 0);
  /* The very first reply, byte for byte. */
  static const uint8_t want[] = {
      0,   0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0,   0,   0,  3,   0,
      0,   0,    2,    0,    0,    0,    17,   0,    0,   0,   4,  'm', 'a',
      'i', 'n',  'm',  'a',  'i',  'n',  ' ',  'd',  'i', 's', 'k'};
  cr_assert_arr_eq(out.buf, want, sizeof want);
}

Test(options, list_with_data) {
  cr_assert_eq(opt_(NBD_OPT_LIST, "x", 1), HS_CONTINUE);
  one_reply(&out, NBD_OPT_LIST, NBD_REP_ERR_INVALID);
}

Test(options, starttls) {
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STARTTLS, NBD_REP_ERR_POLICY);
}

Test(options, unknown) {
  uint32_t opts[] = {0, 4, 12, 13, 0x1000, 0xffffffffu};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    cr_assert_eq(opt_(opts[i], "abc", 3), HS_CONTINUE);
    one_reply(&out, opts[i], NBD_REP_ERR_UNSUP);
  }
}

Test(options, error_reply_bytes) {
  cr_assert_eq(opt_(42, NULL, 0), HS_CONTINUE);
  static const uint8_t head[20] = {0,    0x03, 0xe8, 0x89, 0x04, 0x55,
                                   0x65, 0xa9, 0,    0,    0,    42,
                                   0x80, 0,    0,    1,    0,    0};
  cr_assert_arr_eq(out.buf, head, 18);
  uint32_t mlen = get_be32(out.buf + 16);
  cr_assert_eq(out.len, 20 + mlen);
  cr_assert_arr_eq(out.buf + 20, "unknown option", mlen);
}

Test(options, too_big) {
  hs_option_too_big(&hs, NBD_OPT_GO, &out);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_TOO_BIG);
}

Test(options, non_fixed_client_closes_on_other_options) {
  memset(&hs, 0, sizeof hs);
  cr_assert(hs_client_flags(&hs, NBD_FLAG_C_NO_ZEROES));
  uint32_t opts[] = {NBD_OPT_ABORT,
                     NBD_OPT_LIST,
                     NBD_OPT_STARTTLS,
                     NBD_OPT_INFO,
                     NBD_OPT_GO,
                     NBD_OPT_STRUCTURED_REPLY,
                     NBD_OPT_LIST_META_CONTEXT,
                     NBD_OPT_SET_META_CONTEXT,
                     NBD_OPT_EXTENDED_HEADERS,
                     99};
  struct buf b = info_data("main", 0, NULL);
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    cr_assert_eq(opt_buf(opts[i], &b), HS_CLOSE, "option %u", opts[i]);
    cr_assert_eq(out.len, 0, "option %u produced output", opts[i]);
  }
  cr_assert_not(hs.structured);
  cr_assert_not(hs.extended);
}

/* ---- INFO and GO ---- */

TestSuite(info, .init = setup, .fini = teardown);

static void check_export_info(const struct rep *r, uint32_t opt, int idx,
                              uint16_t flags) {
  cr_assert_eq(r->opt, opt);
  cr_assert_eq(r->type, NBD_REP_INFO);
  cr_assert_eq(r->len, 12);
  cr_assert_eq(get_be16(r->data), NBD_INFO_EXPORT);
  cr_assert_eq(get_be64(r->data + 2), exports[idx].size);
  cr_assert_eq(get_be16(r->data + 10), flags, "flags 0x%x, want 0x%x",
               get_be16(r->data + 10), flags);
}

static void check_block_info(const struct rep *r, uint32_t opt, int idx) {
  cr_assert_eq(r->opt, opt);
  cr_assert_eq(r->type, NBD_REP_INFO);
  cr_assert_eq(r->len, 14);
  cr_assert_eq(get_be16(r->data), NBD_INFO_BLOCK_SIZE);
  cr_assert_eq(get_be32(r->data + 2), exports[idx].min_block);
  cr_assert_eq(get_be32(r->data + 6), exports[idx].pref_block);
  cr_assert_eq(get_be32(r->data + 10), exports[idx].max_block);
}

Test(info, export_and_block_size) {
  struct buf b = info_data("backup", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_INFO, 1, BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS);
  check_block_info(&v[1], NBD_OPT_INFO, 1);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
  cr_assert_eq(v[2].opt, NBD_OPT_INFO);
  cr_assert_eq(v[2].len, 0);
  /* INFO does not end the handshake. */
  cr_assert_eq(hs.export_index, -1);
  /* The export info reply byte for byte. */
  static const uint8_t want[32] = {
      0, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, /* magic */
      0, 0,    0,    6,                            /* NBD_OPT_INFO */
      0, 0,    0,    3,                            /* NBD_REP_INFO */
      0, 0,    0,    12,                           /* length */
      0, 0,                                        /* NBD_INFO_EXPORT */
      0, 0,    0,    0,    0x40, 0,    0,    0,    /* size */
      0, 7};                                       /* flags */
  cr_assert_arr_eq(out.buf, want, 32);
}

Test(info, default_export) {
  struct buf b = info_data("", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_INFO, 0, MAIN_FLAGS | NBD_FLAG_HAS_FLAGS);
}

Test(info, name_and_description_on_request) {
  uint16_t reqs[] = {NBD_INFO_DESCRIPTION, 77, NBD_INFO_NAME,
                     NBD_INFO_BLOCK_SIZE};
  struct buf b = info_data("main", 4, reqs);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 5);
  check_export_info(&v[0], NBD_OPT_INFO, 0, MAIN_FLAGS | NBD_FLAG_HAS_FLAGS);
  check_block_info(&v[1], NBD_OPT_INFO, 0);
  cr_assert_eq(v[2].type, NBD_REP_INFO);
  cr_assert_eq(v[2].len, 2 + 9);
  cr_assert_eq(get_be16(v[2].data), NBD_INFO_DESCRIPTION);
  cr_assert_arr_eq(v[2].data + 2, "main disk", 9);
  cr_assert_eq(v[3].type, NBD_REP_INFO);
  cr_assert_eq(v[3].len, 2 + 4);
  cr_assert_eq(get_be16(v[3].data), NBD_INFO_NAME);
  cr_assert_arr_eq(v[3].data + 2, "main", 4);
  cr_assert_eq(v[4].type, NBD_REP_ACK);
}

/* Each kind is answered once, in the order first asked, however often
 * the list repeats it (as qemu-nbd does): 64 KiB of requests must not
 * become 32,000 replies. */
Test(info, repeated_requests_answered_once) {
  static const uint16_t kinds[] = {NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE,
                                   NBD_INFO_EXPORT, NBD_INFO_DESCRIPTION};
  uint16_t reqs[4000];
  for (unsigned i = 0; i < 4000; i++)
    reqs[i] = i < 2000 ? NBD_INFO_NAME : kinds[i % 4];
  struct buf b = info_data("main", 4000, reqs);
  for (uint32_t opt = NBD_OPT_INFO; opt <= NBD_OPT_GO; opt++) {
    opt_buf(opt, &b);
    struct rep v[8];
    cr_assert_eq(parse_replies(&out, v, 8), 5, "option %u", opt);
    check_export_info(&v[0], opt, 0, MAIN_FLAGS | NBD_FLAG_HAS_FLAGS);
    check_block_info(&v[1], opt, 0);
    cr_assert_eq(get_be16(v[2].data), NBD_INFO_NAME);
    cr_assert_eq(get_be16(v[3].data), NBD_INFO_DESCRIPTION);
    cr_assert_eq(v[4].type, NBD_REP_ACK);
  }
}

Test(info, name_for_default_export_is_the_real_name) {
  uint16_t reqs[] = {NBD_INFO_NAME};
  struct buf b = info_data("", 1, reqs);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 4);
  cr_assert_eq(get_be16(v[2].data), NBD_INFO_NAME);
  cr_assert_eq(v[2].len, 6);
  cr_assert_arr_eq(v[2].data + 2, "main", 4);
}

Test(info, unknown_export) {
  struct buf b = info_data("nosuch", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_INFO, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(hs.export_index, -1);
}

Test(info, malformed_lengths) {
  uint32_t opts[] = {NBD_OPT_INFO, NBD_OPT_GO};
  for (int k = 0; k < 2; k++) {
    uint32_t o = opts[k];
    /* Too short for a name length and a request count. */
    for (uint32_t len = 0; len < 6; len++) {
      uint8_t z[6] = {0};
      cr_assert_eq(opt_(o, z, len), HS_CONTINUE, "len %u", len);
      one_reply(&out, o, NBD_REP_ERR_INVALID);
    }
    /* Name longer than the data. */
    struct buf b = info_data("main", 0, NULL);
    put_be32(b.b, 5);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    put_be32(b.b, 0xffffffffu);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* Request count larger than the data. */
    uint16_t reqs[] = {NBD_INFO_NAME, NBD_INFO_DESCRIPTION};
    b = info_data("main", 2, reqs);
    b.len -= 1;
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* Trailing bytes after the requests. */
    b = info_data("main", 2, reqs);
    b_u16(&b, NBD_INFO_NAME);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* Name longer than NBD_MAX_STRING, even when it is all there. */
    struct buf big = {.len = 0};
    b_u32(&big, NBD_MAX_STRING + 1);
    memset(big.b + 4, 'a', NBD_MAX_STRING + 1);
    big.len += NBD_MAX_STRING + 1;
    b_u16(&big, 0);
    cr_assert_eq(opt_buf(o, &big), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
  }
  cr_assert_eq(hs.export_index, -1);
}

Test(info, go_plain) {
  struct buf b = info_data("backup", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  uint16_t f = BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS;
  check_export_info(&v[0], NBD_OPT_GO, 1, f);
  check_block_info(&v[1], NBD_OPT_GO, 1);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
  cr_assert_eq(v[2].opt, NBD_OPT_GO);
  cr_assert_eq(hs.export_index, 1);
  cr_assert_eq(hs.tflags, f);
  cr_assert_eq(hs_tflags(&hs, &exports[1]), f);
}

Test(info, go_structured_adds_df) {
  negotiate_structured();
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  uint16_t f = MAIN_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF;
  check_export_info(&v[0], NBD_OPT_GO, 0, f);
  cr_assert_eq(hs.export_index, 0);
  cr_assert_eq(hs.tflags, f);
  cr_assert_eq(hs.tflags & NBD_FLAG_BLOCK_STAT_PAYLOAD, 0);
}

Test(info, go_extended_without_contexts) {
  /* Block status payloads are only offered once a context is chosen. */
  negotiate_extended();
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  uint16_t f = MAIN_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF;
  check_export_info(&v[0], NBD_OPT_GO, 0, f);
  cr_assert_eq(hs.tflags, f);
}

Test(info, go_extended_with_contexts_adds_block_stat_payload) {
  negotiate_extended();
  const char *q[] = {"qemu:allocation-depth", NULL};
  struct buf m = meta_data("main", q);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  uint16_t f = MAIN_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF |
               NBD_FLAG_BLOCK_STAT_PAYLOAD;
  struct rep v[8];
  /* INFO on the same export reports what GO will give. */
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_INFO, 0, f);
  /* INFO on another export: the contexts do not apply there. */
  b = info_data("backup", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_INFO, &b), HS_CONTINUE);
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_INFO, 1,
                    BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF);
  /* ... and INFO did not drop them. */
  cr_assert(hs.ctx_depth);
  b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_GO, 0, f);
  cr_assert_eq(hs.tflags, f);
  cr_assert(hs.ctx_depth);
}

Test(info, go_other_export_has_no_block_stat_payload) {
  negotiate_extended();
  const char *q[] = {"base:allocation", NULL};
  struct buf m = meta_data("main", q);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  struct buf b = info_data("backup", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  uint16_t f = BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF;
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  check_export_info(&v[0], NBD_OPT_GO, 1, f);
  cr_assert_eq(hs.tflags, f);
  cr_assert_not(hs.ctx_base);
}

Test(info, structured_contexts_give_no_block_stat_payload) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf m = meta_data("main", q);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.tflags, MAIN_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF);
}

Test(info, info_flags_follow_negotiation) {
  struct buf b = info_data("main", 0, NULL);
  struct rep v[8];
  opt_buf(NBD_OPT_INFO, &b);
  parse_replies(&out, v, 8);
  check_export_info(&v[0], NBD_OPT_INFO, 0, MAIN_FLAGS | NBD_FLAG_HAS_FLAGS);
  negotiate_structured();
  opt_buf(NBD_OPT_INFO, &b);
  parse_replies(&out, v, 8);
  check_export_info(&v[0], NBD_OPT_INFO, 0,
                    MAIN_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF);
}

Test(info, hs_tflags) {
  struct hs_state s = {0};
  uint16_t base = BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS;
  cr_assert_eq(hs_tflags(&s, &exports[1]), base);
  s.ctx_base = true; /* contexts alone change nothing */
  cr_assert_eq(hs_tflags(&s, &exports[1]), base);
  s.ctx_base = false;
  s.structured = true;
  cr_assert_eq(hs_tflags(&s, &exports[1]), base | NBD_FLAG_SEND_DF);
  s.extended = true;
  cr_assert_eq(hs_tflags(&s, &exports[1]), base | NBD_FLAG_SEND_DF);
  s.ctx_base = true;
  cr_assert_eq(hs_tflags(&s, &exports[1]),
               base | NBD_FLAG_SEND_DF | NBD_FLAG_BLOCK_STAT_PAYLOAD);
  s.ctx_base = false;
  s.ctx_depth = true;
  cr_assert_eq(hs_tflags(&s, &exports[1]),
               base | NBD_FLAG_SEND_DF | NBD_FLAG_BLOCK_STAT_PAYLOAD);
}

Test(info, go_keeps_contexts_of_the_same_export) {
  negotiate_structured();
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  struct buf m = meta_data("backup", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &m);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
  struct buf b = info_data("backup", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
}

Test(info, go_drops_contexts_of_another_export) {
  negotiate_structured();
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  struct buf m = meta_data("backup", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &m);
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 0);
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
}

Test(info, go_default_name_keeps_contexts_of_export_zero) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf m = meta_data("", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &m);
  cr_assert(hs.ctx_base);
  cr_assert_eq(hs.ctx_export, 0);
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert(hs.ctx_base);
}

/* ---- STRUCTURED_REPLY and EXTENDED_HEADERS ---- */

TestSuite(modes, .init = setup, .fini = teardown);

Test(modes, structured_once) {
  negotiate_structured();
  cr_assert_not(hs.extended);
}

Test(modes, structured_twice) {
  negotiate_structured();
  cr_assert_eq(opt_(NBD_OPT_STRUCTURED_REPLY, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_INVALID);
  cr_assert(hs.structured);
}

Test(modes, structured_with_data) {
  cr_assert_eq(opt_(NBD_OPT_STRUCTURED_REPLY, "x", 1), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_INVALID);
  cr_assert_not(hs.structured);
}

Test(modes, structured_after_extended) {
  negotiate_extended();
  cr_assert_eq(opt_(NBD_OPT_STRUCTURED_REPLY, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_EXT_HEADER_REQD);
  cr_assert(hs.extended);
  cr_assert(hs.structured);
}

Test(modes, extended_sets_structured) {
  negotiate_extended();
  cr_assert(hs.structured);
}

Test(modes, extended_after_structured) {
  negotiate_structured();
  negotiate_extended();
  cr_assert(hs.structured);
}

Test(modes, extended_twice) {
  negotiate_extended();
  cr_assert_eq(opt_(NBD_OPT_EXTENDED_HEADERS, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_INVALID);
  cr_assert(hs.extended);
}

Test(modes, extended_with_data) {
  cr_assert_eq(opt_(NBD_OPT_EXTENDED_HEADERS, "xy", 2), HS_CONTINUE);
  one_reply(&out, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_INVALID);
  cr_assert_not(hs.extended);
  cr_assert_not(hs.structured);
}

/* Only STARTTLS resets the contexts (proto.md, SET_META_CONTEXT: "with no
 * intervening NBD_OPT_STARTTLS"). */
Test(modes, extended_keeps_contexts) {
  negotiate_structured();
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  struct buf m = meta_data("main", q);
  opt_buf(NBD_OPT_SET_META_CONTEXT, &m);
  cr_assert(hs.ctx_base);
  negotiate_extended();
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
  cr_assert(hs.tflags & NBD_FLAG_BLOCK_STAT_PAYLOAD);
}

/* ---- LIST_META_CONTEXT and SET_META_CONTEXT ---- */

TestSuite(meta, .init = setup, .fini = teardown);

/* Check a META_CONTEXT reply; returns which context it names (1 base,
 * 2 depth).  Its id: the one conn.c knows for SET; for LIST "reserved and
 * SHOULD be set to zero" (proto.md). */
static unsigned check_ctx(const struct rep *r, uint32_t opt) {
  cr_assert_eq(r->opt, opt);
  cr_assert_eq(r->type, NBD_REP_META_CONTEXT);
  cr_assert_geq(r->len, 4);
  const char *name = (const char *)r->data + 4;
  size_t len = r->len - 4;
  unsigned which = len == 15 && !memcmp(name, "base:allocation", 15) ? 1
                   : len == 21 && !memcmp(name, "qemu:allocation-depth", 21)
                       ? 2
                       : 0;
  cr_assert_neq(which, 0, "context '%.*s'", (int)len, name);
  uint32_t want = opt == NBD_OPT_LIST_META_CONTEXT ? 0
                  : which == 1                     ? HS_CTX_BASE_ALLOCATION
                                                   : HS_CTX_ALLOCATION_DEPTH;
  cr_assert_eq(get_be32(r->data), want, "id of '%.*s'", (int)len, name);
  return which;
}

/* Run a meta context option; returns the contexts replied, in order, as a
 * number (base = 1, depth = 2, both = 12), asserting a final ACK. */
static unsigned run_meta(uint32_t opt, const char *name,
                         const char *const *queries) {
  struct buf b = meta_data(name, queries);
  cr_assert_eq(opt_buf(opt, &b), HS_CONTINUE);
  struct rep v[8];
  size_t n = parse_replies(&out, v, 8);
  cr_assert_geq(n, 1);
  cr_assert_eq(v[n - 1].opt, opt);
  cr_assert_eq(v[n - 1].type, NBD_REP_ACK, "last reply 0x%x", v[n - 1].type);
  cr_assert_eq(v[n - 1].len, 0);
  unsigned ids = 0;
  for (size_t i = 0; i + 1 < n; i++)
    ids = ids * 10 + check_ctx(&v[i], opt);
  return ids;
}

Test(meta, before_structured) {
  const char *q[] = {"base:allocation", NULL};
  struct buf b = meta_data("main", q);
  cr_assert_eq(opt_buf(NBD_OPT_LIST_META_CONTEXT, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_LIST_META_CONTEXT, NBD_REP_ERR_INVALID);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_INVALID);
  cr_assert_not(hs.ctx_base);
}

Test(meta, list_queries) {
  negotiate_structured();
  uint32_t L = NBD_OPT_LIST_META_CONTEXT;
  const char *q1[] = {"base:allocation", NULL};
  cr_assert_eq(run_meta(L, "main", q1), 1);
  const char *q2[] = {"qemu:allocation-depth", NULL};
  cr_assert_eq(run_meta(L, "main", q2), 2);
  const char *q3[] = {"base:", NULL};
  cr_assert_eq(run_meta(L, "main", q3), 1);
  const char *q4[] = {"qemu:", NULL};
  cr_assert_eq(run_meta(L, "main", q4), 2);
  const char *q5[] = {"qemu:allocation-depth", "base:allocation", NULL};
  cr_assert_eq(run_meta(L, "main", q5), 12);
  const char *q6[] = {"base:allocation", "base:allocation", "base:", NULL};
  cr_assert_eq(run_meta(L, "main", q6), 1);
  const char *q7[] = {"base:alloc", "qemu:dirty-bitmap:x", "x", "", NULL};
  cr_assert_eq(run_meta(L, "main", q7), 0);
  const char *q8[] = {"BASE:ALLOCATION", "base:allocation ", NULL};
  cr_assert_eq(run_meta(L, "main", q8), 0);
  /* Listing never selects anything. */
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
  cr_assert_eq(hs.ctx_export, -1);
}

Test(meta, list_empty_query_returns_all) {
  negotiate_structured();
  cr_assert_eq(run_meta(NBD_OPT_LIST_META_CONTEXT, "backup", NULL), 12);
  cr_assert_eq(run_meta(NBD_OPT_LIST_META_CONTEXT, "", NULL), 12);
}

/* proto.md, NBD_OPT_LIST_META_CONTEXT: "The metadata context ID in these
 * replies is reserved and SHOULD be set to zero". */
Test(meta, list_ids_are_zero_set_ids_are_not) {
  negotiate_structured();
  uint32_t opts[] = {NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT};
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  for (int k = 0; k < 2; k++) {
    struct buf b = meta_data("main", q);
    cr_assert_eq(opt_buf(opts[k], &b), HS_CONTINUE);
    struct rep v[4];
    cr_assert_eq(parse_replies(&out, v, 4), 3);
    for (int i = 0; i < 2; i++) {
      cr_assert_eq(v[i].type, NBD_REP_META_CONTEXT);
      if (opts[k] == NBD_OPT_LIST_META_CONTEXT)
        cr_assert_eq(get_be32(v[i].data), 0, "LIST reply %d", i);
      else
        cr_assert_neq(get_be32(v[i].data), 0, "SET reply %d", i);
    }
    if (opts[k] == NBD_OPT_SET_META_CONTEXT)
      cr_assert_neq(get_be32(v[0].data), get_be32(v[1].data));
  }
}

Test(meta, list_bytes) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  run_meta(NBD_OPT_LIST_META_CONTEXT, "main", q);
  static const uint8_t want[] = {
      0,   0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0,    0,    0,    9,
      0,   0,    0,    4,    0,    0,    0,    19,   0,    0,    0,    0,
      'b', 'a',  's',  'e',  ':',  'a',  'l',  'l',  'o',  'c',  'a',  't',
      'i', 'o',  'n',  0,    0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0,
      0,   0,    9,    0,    0,    0,    1,    0,    0,    0,    0};
  cr_assert_eq(out.len, sizeof want);
  cr_assert_arr_eq(out.buf, want, sizeof want);
}

Test(meta, set_selects) {
  negotiate_structured();
  uint32_t S = NBD_OPT_SET_META_CONTEXT;
  const char *q1[] = {"base:allocation", NULL};
  cr_assert_eq(run_meta(S, "backup", q1), 1);
  cr_assert(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
  cr_assert_eq(hs.ctx_export, 1);
  const char *q2[] = {"qemu:allocation-depth", NULL};
  cr_assert_eq(run_meta(S, "main", q2), 2);
  cr_assert_not(hs.ctx_base);
  cr_assert(hs.ctx_depth);
  cr_assert_eq(hs.ctx_export, 0);
  const char *q3[] = {"qemu:allocation-depth", "nope:x", "base:allocation",
                      NULL};
  cr_assert_eq(run_meta(S, "main", q3), 12);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
}

Test(meta, set_prefixes_select_nothing) {
  negotiate_structured();
  const char *q[] = {"base:", "qemu:", NULL};
  cr_assert_eq(run_meta(NBD_OPT_SET_META_CONTEXT, "main", q), 0);
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
}

Test(meta, set_empty_clears) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  run_meta(NBD_OPT_SET_META_CONTEXT, "main", q);
  cr_assert(hs.ctx_base);
  cr_assert_eq(run_meta(NBD_OPT_SET_META_CONTEXT, "main", NULL), 0);
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
}

Test(meta, unknown_export) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf b = meta_data("nosuch", q);
  cr_assert_eq(opt_buf(NBD_OPT_LIST_META_CONTEXT, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_LIST_META_CONTEXT, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_UNKNOWN);
  cr_assert_not(hs.ctx_base);
}

Test(meta, malformed) {
  negotiate_structured();
  uint32_t opts[] = {NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT};
  for (int k = 0; k < 2; k++) {
    uint32_t o = opts[k];
    /* Too short for a name length and a query count. */
    for (uint32_t len = 0; len < 8; len++) {
      uint8_t z[8] = {0};
      cr_assert_eq(opt_(o, z, len), HS_CONTINUE, "len %u", len);
      one_reply(&out, o, NBD_REP_ERR_INVALID);
    }
    const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
    struct buf good = meta_data("main", q), b;
    /* Name length beyond the data. */
    b = good;
    put_be32(b.b, 200);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    b = good;
    put_be32(b.b, 0xfffffffcu);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* Name longer than NBD_MAX_STRING, even when it is all there. */
    b.len = 0;
    b_u32(&b, NBD_MAX_STRING + 1);
    memset(b.b + 4, 'a', NBD_MAX_STRING + 1);
    b.len += NBD_MAX_STRING + 1;
    b_u32(&b, 0);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* More queries announced than present. */
    b = good;
    put_be32(b.b + 8, 3);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    b = good;
    put_be32(b.b + 8, 0xffffffffu);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* A query length beyond the data. */
    b = good;
    put_be32(b.b + 12, 16);
    put_be32(b.b + 12 + 4 + 15, 100);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    b = good;
    put_be32(b.b + 12, 0xffffffffu);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    /* Truncated data: every proper prefix of a valid option fails. */
    for (uint32_t len = 8; len < good.len; len++) {
      cr_assert_eq(opt_(o, good.b, len), HS_CONTINUE, "len %u", len);
      one_reply(&out, o, NBD_REP_ERR_INVALID);
    }
    /* Fewer queries announced than present: trailing bytes. */
    b = good;
    put_be32(b.b + 8, 1);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
    b = good;
    b_u16(&b, 0);
    cr_assert_eq(opt_buf(o, &b), HS_CONTINUE);
    one_reply(&out, o, NBD_REP_ERR_INVALID);
  }
  cr_assert_not(hs.ctx_base);
  cr_assert_not(hs.ctx_depth);
}

Test(meta, failed_set_keeps_previous_selection) {
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  run_meta(NBD_OPT_SET_META_CONTEXT, "main", q);
  struct buf b = meta_data("main", q);
  b.len -= 1;
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_INVALID);
  cr_assert(hs.ctx_base);
  cr_assert_eq(hs.ctx_export, 0);
}

/* ---- a whole negotiation ---- */

Test(session, extended_with_contexts_then_go) {
  setup();
  negotiate_extended();
  const char *q[] = {"base:allocation", "qemu:allocation-depth", NULL};
  cr_assert_eq(run_meta(NBD_OPT_SET_META_CONTEXT, "backup", q), 12);
  uint16_t reqs[] = {NBD_INFO_BLOCK_SIZE};
  struct buf b = info_data("backup", 1, reqs);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  cr_assert(hs.structured);
  cr_assert(hs.extended);
  cr_assert(hs.ctx_base);
  cr_assert(hs.ctx_depth);
  cr_assert_eq(hs.tflags, BACKUP_FLAGS | NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_DF |
                              NBD_FLAG_BLOCK_STAT_PAYLOAD);
  teardown();
}

/* ---- TLS: STARTTLS and --tls require ---- */

TestSuite(tls, .init = setup, .fini = teardown);

Test(tls, starttls_acked_when_on) {
  hs.tls = HS_TLS_ON;
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_STARTTLS);
  one_reply(&out, NBD_OPT_STARTTLS, NBD_REP_ACK);
  cr_assert_not(hs.tls_active, "active only once the TLS handshake is done");
}

Test(tls, starttls_with_data_invalid) {
  hs.tls = HS_TLS_REQUIRE;
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, "x", 1), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID);
}

Test(tls, starttls_twice_invalid) {
  hs.tls = HS_TLS_ON;
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_STARTTLS);
  hs_tls_started(&hs);
  cr_assert(hs.tls_active);
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_CONTINUE);
  one_reply(&out, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID);
}

Test(tls, state_from_before_tls_is_forgotten) {
  hs.tls = HS_TLS_ON;
  negotiate_structured();
  const char *q[] = {"base:allocation", NULL};
  struct buf b = meta_data("main", q);
  cr_assert_eq(opt_buf(NBD_OPT_SET_META_CONTEXT, &b), HS_CONTINUE);
  cr_assert(hs.ctx_base);
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_STARTTLS);
  hs_tls_started(&hs);
  cr_assert_not(hs.structured);
  cr_assert_not(hs.ctx_base);
  cr_assert_eq(hs.ctx_export, -1);
}

/* Every option but ABORT and STARTTLS is refused before TLS, so nothing
 * about the exports leaks in the clear. */
Test(tls, require_refuses_options_before_tls) {
  hs.tls = HS_TLS_REQUIRE;
  uint32_t opts[] = {NBD_OPT_LIST,
                     NBD_OPT_INFO,
                     NBD_OPT_GO,
                     NBD_OPT_STRUCTURED_REPLY,
                     NBD_OPT_LIST_META_CONTEXT,
                     NBD_OPT_SET_META_CONTEXT,
                     NBD_OPT_EXTENDED_HEADERS,
                     99};
  struct buf b = info_data("main", 0, NULL);
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    cr_assert_eq(opt_buf(opts[i], &b), HS_CONTINUE, "option %u", opts[i]);
    one_reply(&out, opts[i], NBD_REP_ERR_TLS_REQD);
  }
  cr_assert_not(hs.structured);
  cr_assert_not(hs.extended);
  cr_assert_eq(hs.export_index, -1);
  out.len = 0;
  hs_option_too_big(&hs, NBD_OPT_GO, &out);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_TLS_REQD);
}

Test(tls, require_export_name_closes) {
  hs.tls = HS_TLS_REQUIRE;
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "main", 4), HS_CLOSE);
  cr_assert_eq(out.len, 0, "no export information in the clear");
  cr_assert_eq(hs.export_index, -1);
}

Test(tls, require_abort_acked) {
  hs.tls = HS_TLS_REQUIRE;
  cr_assert_eq(opt_(NBD_OPT_ABORT, NULL, 0), HS_CLOSE);
  one_reply(&out, NBD_OPT_ABORT, NBD_REP_ACK);
}

Test(tls, require_allows_everything_after_tls) {
  hs.tls = HS_TLS_REQUIRE;
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_STARTTLS);
  hs_tls_started(&hs);
  negotiate_structured();
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 0);
  memset(&hs, 0, sizeof hs);
  hs.tls = HS_TLS_REQUIRE;
  cr_assert(hs_client_flags(&hs, NBD_FLAG_C_FIXED_NEWSTYLE));
  cr_assert_eq(opt_(NBD_OPT_STARTTLS, NULL, 0), HS_STARTTLS);
  hs_tls_started(&hs);
  cr_assert_eq(opt_(NBD_OPT_EXPORT_NAME, "backup", 6), HS_GO);
  cr_assert_eq(hs.export_index, 1);
}

Test(tls, on_serves_plain_clients_too) {
  hs.tls = HS_TLS_ON;
  negotiate_structured();
  struct buf b = info_data("main", 0, NULL);
  cr_assert_eq(opt_buf(NBD_OPT_GO, &b), HS_GO);
}

/* ---- per-export policy: admits, tls_required, no_default ---- */

static const struct hs_export pol_exports[4] = {
    {.name = "main", .description = "", .size = 1, .min_block = 1},
    {.name = "secure",
     .description = "TLS only",
     .size = 2,
     .min_block = 1,
     .tls_required = true},
    {.name = "private", .description = "", .size = 3, .min_block = 1},
    {.name = "hidden",
     .description = "",
     .size = 4,
     .min_block = 1,
     .unlisted = true},
};

/* The admits callback: refuses the one index its context points at. */
static bool refuse_one(const void *ctx, size_t idx) {
  return idx != *(const size_t *)ctx;
}

static size_t refused;
static struct hs_catalog pcat;

static void pol_setup(void) {
  setup();
  refused = 2;
  pcat = (struct hs_catalog){pol_exports, 4, .admits = refuse_one,
                             .admits_ctx = &refused};
}

static enum hs_result popt(uint32_t opt, const struct buf *b) {
  out.len = 0;
  return hs_option(&hs, &pcat, opt, b->b, b->len, &out);
}

static enum hs_result pexport_name(const char *name) {
  out.len = 0;
  return hs_option(&hs, &pcat, NBD_OPT_EXPORT_NAME, (const uint8_t *)name,
                   (uint32_t)strlen(name), &out);
}

/* Expect one error reply of TYPE with exactly message MSG. */
static void want_error(uint32_t opt, uint32_t type, const char *msg) {
  struct rep r = one_reply(&out, opt, type);
  cr_assert_eq(r.len, strlen(msg), "message '%.*s'", (int)r.len, r.data);
  cr_assert_arr_eq(r.data, msg, r.len);
}

static void start_tls(void) {
  hs.tls = HS_TLS_ON;
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_STARTTLS, &none), HS_STARTTLS);
  hs_tls_started(&hs);
}

TestSuite(policy, .init = pol_setup, .fini = teardown);

static const char private_refused[] =
    "access to export 'private' is not allowed from this address";

Test(policy, list_shows_only_what_the_client_may_use_now) {
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_LIST, &none), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 2);
  cr_assert_eq(v[0].type, NBD_REP_SERVER);
  cr_assert_eq(get_be32(v[0].data), 4);
  cr_assert_arr_eq(v[0].data + 4, "main", 4);
  cr_assert_eq(v[1].type, NBD_REP_ACK);
  /* Refusing another export shows "private" and hides that one. */
  refused = 0;
  cr_assert_eq(popt(NBD_OPT_LIST, &none), HS_CONTINUE);
  cr_assert_eq(parse_replies(&out, v, 8), 2);
  cr_assert_arr_eq(v[0].data + 4, "private", 7);
}

Test(policy, list_shows_tls_required_after_starttls) {
  start_tls();
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_LIST, &none), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  cr_assert_arr_eq(v[0].data + 4, "main", 4);
  cr_assert_eq(get_be32(v[1].data), 6);
  cr_assert_arr_eq(v[1].data + 4, "secure", 6);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
}

Test(policy, list_without_admits_shows_all_listed) {
  pcat.admits = NULL;
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_LIST, &none), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  cr_assert_arr_eq(v[1].data + 4, "private", 7);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
}

Test(policy, info_go_not_admitted) {
  struct buf b = info_data("private", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_INFO, &b), HS_CONTINUE);
  want_error(NBD_OPT_INFO, NBD_REP_ERR_POLICY, private_refused);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  want_error(NBD_OPT_GO, NBD_REP_ERR_POLICY, private_refused);
  cr_assert_eq(hs.export_index, -1);
  /* The client may carry on with an export it may use. */
  b = info_data("main", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 0);
}

Test(policy, not_admitted_even_with_tls) {
  start_tls();
  struct buf b = info_data("private", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  want_error(NBD_OPT_GO, NBD_REP_ERR_POLICY, private_refused);
  cr_assert_eq(hs.export_index, -1);
}

/* Admission is checked before TLS: no hint to come back encrypted. */
Test(policy, not_admitted_beats_tls_required) {
  refused = 1;
  struct buf b = info_data("secure", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_INFO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_INFO, NBD_REP_ERR_POLICY);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_POLICY);
  start_tls();
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_POLICY);
  cr_assert_eq(hs.export_index, -1);
}

Test(policy, default_export_not_admitted) {
  refused = 0;
  struct buf b = info_data("", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  want_error(NBD_OPT_GO, NBD_REP_ERR_POLICY,
             "access to export '' is not allowed from this address");
  cr_assert_eq(hs.export_index, -1);
  cr_assert_eq(pexport_name(""), HS_CLOSE);
}

Test(policy, tls_required_before_tls) {
  hs.tls = HS_TLS_ON;
  struct buf b = info_data("secure", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_INFO, &b), HS_CONTINUE);
  want_error(NBD_OPT_INFO, NBD_REP_ERR_TLS_REQD, "export requires TLS");
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  want_error(NBD_OPT_GO, NBD_REP_ERR_TLS_REQD, "export requires TLS");
  cr_assert_eq(hs.export_index, -1);
}

Test(policy, tls_required_goes_after_starttls) {
  start_tls();
  struct buf b = info_data("secure", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_INFO, &b), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 3);
  cr_assert_eq(v[2].type, NBD_REP_ACK);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 1);
}

Test(policy, tls_required_export_name_after_starttls) {
  start_tls();
  cr_assert_eq(pexport_name("secure"), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  cr_assert_eq(get_be64(out.buf), 2);
}

Test(policy, export_name_refused_closes) {
  hs.tls = HS_TLS_ON;
  const char *names[] = {"private", "secure"};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(pexport_name(names[i]), HS_CLOSE, "%s", names[i]);
    cr_assert_eq(out.len, 0);
    cr_assert_eq(hs.export_index, -1);
  }
}

Test(policy, meta_context_refused) {
  hs.tls = HS_TLS_ON;
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_STRUCTURED_REPLY, &none), HS_CONTINUE);
  const char *q[] = {"base:allocation", NULL};
  struct buf m = meta_data("main", q);
  cr_assert_eq(popt(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  cr_assert(hs.ctx_base);
  uint32_t opts[] = {NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT};
  for (int k = 0; k < 2; k++) {
    m = meta_data("private", q);
    cr_assert_eq(popt(opts[k], &m), HS_CONTINUE);
    want_error(opts[k], NBD_REP_ERR_POLICY, private_refused);
    /* Not TLS_REQD: SELECTIVETLS keeps that for INFO, GO and
     * EXPORT_NAME. */
    m = meta_data("secure", q);
    cr_assert_eq(popt(opts[k], &m), HS_CONTINUE);
    want_error(opts[k], NBD_REP_ERR_POLICY,
               "export requires TLS: use STARTTLS first");
  }
  /* The refused SET left the earlier selection alone. */
  cr_assert(hs.ctx_base);
  cr_assert_eq(hs.ctx_export, 0);
}

Test(policy, meta_context_tls_required_after_starttls) {
  start_tls();
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_STRUCTURED_REPLY, &none), HS_CONTINUE);
  const char *q[] = {"base:allocation", NULL};
  struct buf m = meta_data("secure", q);
  cr_assert_eq(popt(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  struct rep v[8];
  cr_assert_eq(parse_replies(&out, v, 8), 2);
  cr_assert_eq(v[1].type, NBD_REP_ACK);
  cr_assert(hs.ctx_base);
  cr_assert_eq(hs.ctx_export, 1);
}

/* A refused name is quoted only in part, cut at a character boundary. */
Test(policy, long_name_is_not_echoed_whole) {
  static char name[NBD_MAX_STRING + 1];
  name[0] = 'a';
  for (size_t i = 1; i + 1 < NBD_MAX_STRING; i += 2)
    memcpy(name + i, "\xc3\xa9", 2); /* U+00E9, two bytes */
  name[NBD_MAX_STRING - 1] = '\0';
  struct hs_export e = {.name = name, .description = "", .min_block = 1};
  refused = 0;
  pcat =
      (struct hs_catalog){&e, 1, .admits = refuse_one, .admits_ctx = &refused};
  struct buf b = {.len = 0};
  b_u32(&b, (uint32_t)strlen(name));
  b_str(&b, name);
  b_u16(&b, 0);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  struct rep r = one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_POLICY);
  char want[256];
  snprintf(want, sizeof want,
           "access to export '%.63s...' is not allowed from this address",
           name);
  cr_assert_eq(r.len, strlen(want), "message '%.*s'", (int)r.len, r.data);
  cr_assert_arr_eq(r.data, want, r.len);
}

Test(policy, no_default_empty_name_is_unknown) {
  pcat.no_default = true;
  struct buf b = info_data("", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_INFO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_INFO, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_CONTINUE);
  one_reply(&out, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(hs.export_index, -1);
  struct buf none = {.len = 0};
  cr_assert_eq(popt(NBD_OPT_STRUCTURED_REPLY, &none), HS_CONTINUE);
  struct buf m = meta_data("", NULL);
  cr_assert_eq(popt(NBD_OPT_LIST_META_CONTEXT, &m), HS_CONTINUE);
  one_reply(&out, NBD_OPT_LIST_META_CONTEXT, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(popt(NBD_OPT_SET_META_CONTEXT, &m), HS_CONTINUE);
  one_reply(&out, NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_UNKNOWN);
  cr_assert_eq(pexport_name(""), HS_CLOSE);
  cr_assert_eq(out.len, 0);
  cr_assert_eq(hs.export_index, -1);
}

Test(policy, no_default_empty_name_matches_export_named_empty) {
  const struct hs_export v[2] = {
      {.name = "main", .description = "", .size = 1, .min_block = 1},
      {.name = "", .description = "", .size = 2, .min_block = 1},
  };
  pcat = (struct hs_catalog){v, 2, .no_default = true};
  struct buf b = info_data("", 0, NULL);
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  memset(&hs, 0, sizeof hs);
  cr_assert(hs_client_flags(&hs, NBD_FLAG_C_FIXED_NEWSTYLE));
  cr_assert_eq(pexport_name(""), HS_GO);
  cr_assert_eq(hs.export_index, 1);
  /* Without no_default, "" is still v[0], whatever the names. */
  pcat.no_default = false;
  memset(&hs, 0, sizeof hs);
  cr_assert(hs_client_flags(&hs, NBD_FLAG_C_FIXED_NEWSTYLE));
  cr_assert_eq(popt(NBD_OPT_GO, &b), HS_GO);
  cr_assert_eq(hs.export_index, 0);
}
