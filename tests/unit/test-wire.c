/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for server/wire.c: request parsing and validation, reply
 * header layouts and zero-run splitting. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "server/nbd-protocol.h"
#include "server/wire.h"

/* ---- helpers ---- */

static size_t make_request(uint8_t *p, bool extended, uint16_t flags,
                           uint16_t type, uint64_t cookie, uint64_t offset,
                           uint64_t length) {
  put_be32(p, extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC);
  put_be16(p + 4, flags);
  put_be16(p + 6, type);
  put_be64(p + 8, cookie);
  put_be64(p + 16, offset);
  if (extended) {
    put_be64(p + 24, length);
    return NBD_EXTENDED_REQUEST_SIZE;
  }
  put_be32(p + 24, (uint32_t)length);
  return NBD_REQUEST_SIZE;
}

#define SIZE_1M (1024u * 1024)
#define ALL_WRITE_FLAGS                                                        \
  (NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |              \
   NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_CACHE |     \
   NBD_FLAG_SEND_FAST_ZERO)

/* A writable export of 1 MiB, simple replies, no contexts. */
static struct wire_tx tx_plain(void) {
  return (struct wire_tx){
      .size = SIZE_1M, .tflags = ALL_WRITE_FLAGS, .max_payload = 64 * 1024};
}

/* Structured replies, extended headers, one context. */
static struct wire_tx tx_ext(void) {
  struct wire_tx tx = tx_plain();
  tx.tflags |= NBD_FLAG_SEND_DF | NBD_FLAG_BLOCK_STAT_PAYLOAD;
  tx.structured = tx.extended = true;
  tx.ncontexts = 1;
  return tx;
}

static struct wire_request req(uint16_t type, uint16_t flags, uint64_t offset,
                               uint64_t length) {
  return (struct wire_request){.flags = flags,
                               .type = type,
                               .cookie = 0x1122334455667788ull,
                               .offset = offset,
                               .length = length};
}

static uint32_t validate(const struct wire_tx *tx, struct wire_request r) {
  const char *msg = NULL;
  uint32_t e = wire_validate_request(tx, &r, &msg);
  if (e != 0) {
    cr_assert_not_null(msg, "an error must come with a message");
    cr_assert_gt(strlen(msg), 0);
  }
  return e;
}

/* ---- wire_parse_request ---- */

Test(parse, compact_header) {
  uint8_t b[64];
  size_t n =
      make_request(b, false, 0x0102, NBD_CMD_WRITE, 0xa1a2a3a4a5a6a7a8ull,
                   0x0102030405060708ull, 0xdeadbeefu);
  cr_assert_eq(n, 28);
  struct wire_request r;
  memset(&r, 0x55, sizeof r);
  cr_assert_eq(wire_parse_request(b, n, false, &r), 28);
  cr_assert_eq(r.flags, 0x0102);
  cr_assert_eq(r.type, NBD_CMD_WRITE);
  cr_assert_eq(r.cookie, 0xa1a2a3a4a5a6a7a8ull);
  cr_assert_eq(r.offset, 0x0102030405060708ull);
  cr_assert_eq(r.length, 0xdeadbeefull);
}

Test(parse, compact_header_ignores_trailing_bytes) {
  uint8_t b[64];
  memset(b, 0xff, sizeof b);
  make_request(b, false, 0, NBD_CMD_READ, 7, 4096, 512);
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, sizeof b, false, &r), 28);
  cr_assert_eq(r.cookie, 7);
  cr_assert_eq(r.offset, 4096);
  cr_assert_eq(r.length, 512);
}

Test(parse, extended_header) {
  uint8_t b[64];
  size_t n = make_request(b, true, NBD_CMD_FLAG_PAYLOAD_LEN,
                          NBD_CMD_BLOCK_STATUS, 0x0102030405060708ull,
                          0xf0e0d0c0b0a09080ull, 0x1122334455667788ull);
  cr_assert_eq(n, 32);
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, n, true, &r), 32);
  cr_assert_eq(r.flags, NBD_CMD_FLAG_PAYLOAD_LEN);
  cr_assert_eq(r.type, NBD_CMD_BLOCK_STATUS);
  cr_assert_eq(r.cookie, 0x0102030405060708ull);
  cr_assert_eq(r.offset, 0xf0e0d0c0b0a09080ull);
  cr_assert_eq(r.length, 0x1122334455667788ull);
}

Test(parse, short_buffers_return_zero) {
  uint8_t b[64];
  size_t n = make_request(b, false, 0, NBD_CMD_READ, 1, 0, 512);
  struct wire_request r;
  for (size_t avail = 0; avail < n; avail++)
    cr_assert_eq(wire_parse_request(b, avail, false, &r), 0, "avail %zu",
                 avail);
  n = make_request(b, true, 0, NBD_CMD_READ, 1, 0, 512);
  for (size_t avail = 0; avail < n; avail++)
    cr_assert_eq(wire_parse_request(b, avail, true, &r), 0, "avail %zu", avail);
}

Test(parse, short_buffer_with_bad_magic_fails_once_magic_is_read) {
  uint8_t b[8] = {0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0};
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, 3, false, &r), 0);
  cr_assert_eq(wire_parse_request(b, 4, false, &r), -1);
  cr_assert_eq(wire_parse_request(b, 8, true, &r), -1);
}

Test(parse, wrong_magic) {
  uint8_t b[64];
  make_request(b, false, 0, NBD_CMD_READ, 1, 0, 512);
  b[3] ^= 1;
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, sizeof b, false, &r), -1);
  cr_assert_eq(wire_parse_request(b, sizeof b, true, &r), -1);
}

Test(parse, compact_magic_on_extended_connection) {
  uint8_t b[64];
  make_request(b, false, 0, NBD_CMD_READ, 1, 0, 512);
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, sizeof b, true, &r), -1);
}

Test(parse, extended_magic_on_compact_connection) {
  uint8_t b[64];
  make_request(b, true, 0, NBD_CMD_READ, 1, 0, 512);
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, sizeof b, false, &r), -1);
}

Test(parse, simple_reply_magic_is_not_a_request) {
  uint8_t b[32] = {0};
  put_be32(b, NBD_SIMPLE_REPLY_MAGIC);
  struct wire_request r;
  cr_assert_eq(wire_parse_request(b, sizeof b, false, &r), -1);
}

/* ---- wire_request_payload ---- */

Test(payload, write_carries_length) {
  struct wire_tx tx = tx_plain();
  struct wire_request r = req(NBD_CMD_WRITE, 0, 0, 4096);
  cr_assert_eq(wire_request_payload(&tx, &r), 4096);
  tx = tx_ext();
  r.flags = NBD_CMD_FLAG_PAYLOAD_LEN;
  cr_assert_eq(wire_request_payload(&tx, &r), 4096);
}

Test(payload, other_commands_carry_none) {
  struct wire_tx tx = tx_plain();
  uint16_t types[] = {
      NBD_CMD_READ,  NBD_CMD_DISC,         NBD_CMD_FLUSH,        NBD_CMD_TRIM,
      NBD_CMD_CACHE, NBD_CMD_WRITE_ZEROES, NBD_CMD_BLOCK_STATUS, 99};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    struct wire_request r = req(types[i], 0, 0, 4096);
    cr_assert_eq(wire_request_payload(&tx, &r), 0, "type %u", types[i]);
  }
}

/* proto.md (extended headers): "if the flag is clear, the header length
 * is instead an effect length ... and there is no payload after the
 * header" -- for WRITE too, which MUST set it: the bytes after such a
 * header are the next request, not data. */
Test(payload, extended_write_without_payload_len_has_none) {
  struct wire_tx tx = tx_ext();
  struct wire_request r = req(NBD_CMD_WRITE, 0, 0, 32);
  cr_assert_eq(wire_request_payload(&tx, &r), 0);
  r.flags = NBD_CMD_FLAG_FUA;
  cr_assert_eq(wire_request_payload(&tx, &r), 0);
  /* Compact headers have no flag: a WRITE always carries its length. */
  tx = tx_plain();
  r.flags = 0;
  cr_assert_eq(wire_request_payload(&tx, &r), 32);
}

/* Any command may announce a payload with extended headers; it is read
 * (and the command refused) unless it is above the maximum. */
Test(payload, extended_payload_len_on_any_command) {
  struct wire_tx tx = tx_ext();
  uint16_t types[] = {NBD_CMD_READ,  NBD_CMD_FLUSH,        NBD_CMD_TRIM,
                      NBD_CMD_CACHE, NBD_CMD_WRITE_ZEROES, 99};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    struct wire_request r = req(types[i], NBD_CMD_FLAG_PAYLOAD_LEN, 0, 100);
    cr_assert_eq(wire_request_payload(&tx, &r), 100, "type %u", types[i]);
    cr_assert_eq(validate(&tx, r), NBD_EINVAL, "type %u", types[i]);
    cr_assert(!wire_request_overlong(&tx, &r), "type %u", types[i]);
  }
}

/* "A server SHOULD initiate hard disconnect if a client sets the
 * NBD_CMD_FLAG_PAYLOAD_LEN flag and uses a length larger than a server's
 * advertised or default maximum payload length." */
Test(payload, overlong_payload_means_disconnect) {
  struct wire_tx tx = tx_ext();
  struct wire_request r =
      req(NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, tx.max_payload);
  cr_assert(!wire_request_overlong(&tx, &r));
  r.length = tx.max_payload + 1ull;
  cr_assert(wire_request_overlong(&tx, &r));
  r.length = UINT64_MAX;
  cr_assert(wire_request_overlong(&tx, &r));
  r.type = NBD_CMD_READ;
  cr_assert(wire_request_overlong(&tx, &r));
  r.type = NBD_CMD_BLOCK_STATUS;
  cr_assert(wire_request_overlong(&tx, &r));
  /* Without the flag, length is an effect length: no payload at all. */
  r.flags = 0;
  cr_assert(!wire_request_overlong(&tx, &r));
  r.type = NBD_CMD_WRITE;
  cr_assert(!wire_request_overlong(&tx, &r));
  /* Compact headers: no such flag; an oversized WRITE is refused with an
   * error reply once its payload is skipped. */
  tx = tx_plain();
  r = req(NBD_CMD_WRITE, 0, 0, tx.max_payload + 1ull);
  cr_assert(!wire_request_overlong(&tx, &r));
  cr_assert_eq(validate(&tx, r), NBD_EINVAL);
}

Test(validate, extended_write_needs_payload_len) {
  struct wire_tx tx = tx_ext();
  const char *msg = NULL;
  struct wire_request r = req(NBD_CMD_WRITE, 0, 0, 512);
  cr_assert_eq(wire_validate_request(&tx, &r, &msg), NBD_EINVAL);
  cr_assert(strstr(msg, "PAYLOAD_LEN"), "%s", msg);
  r.flags = NBD_CMD_FLAG_FUA;
  cr_assert_eq(validate(&tx, r), NBD_EINVAL);
  r.flags |= NBD_CMD_FLAG_PAYLOAD_LEN;
  cr_assert_eq(validate(&tx, r), 0);
}

Test(payload, payload_len_needs_extended_headers) {
  struct wire_tx tx = tx_plain();
  struct wire_request r =
      req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 16);
  cr_assert_eq(wire_request_payload(&tx, &r), 0);
  tx = tx_ext();
  cr_assert_eq(wire_request_payload(&tx, &r), 16);
  r.flags = 0;
  cr_assert_eq(wire_request_payload(&tx, &r), 0);
}

/* ---- wire_validate_request ---- */

Test(validate, valid_requests) {
  struct wire_tx tx = tx_plain();
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 4096)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, SIZE_1M - 1, 1)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 4096)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_FLUSH, 0, 0, 0)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_TRIM, 0, 0, SIZE_1M)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_CACHE, 0, 0, SIZE_1M)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES,
                                 NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO |
                                     NBD_CMD_FLAG_FUA,
                                 0, SIZE_1M)),
               0);
  /* Zeroes and trims are not bounded by the payload limit. */
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES, 0, 0, SIZE_1M)), 0);
  tx = tx_ext();
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 4096)), 0);
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 4096)),
      0);
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 4096)), 0);
}

Test(validate, unknown_commands) {
  struct wire_tx tx = tx_ext();
  cr_assert_eq(validate(&tx, req(8, 0, 0, 512)), NBD_EINVAL);
  cr_assert_eq(validate(&tx, req(0xffff, 0, 0, 512)), NBD_EINVAL);
}

Test(validate, disc_is_not_validated_as_a_request) {
  struct wire_tx tx = tx_plain();
  const char *msg = NULL;
  struct wire_request r = req(NBD_CMD_DISC, 0, 0, 0);
  cr_assert_eq(wire_validate_request(&tx, &r, &msg), NBD_EINVAL);
  cr_assert_str_eq(msg, "unknown command");
}

Test(validate, unknown_flag_bits) {
  struct wire_tx tx = tx_ext();
  for (unsigned bit = 6; bit < 16; bit++) {
    cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 1u << bit, 0, 512)),
                 NBD_EINVAL, "bit %u", bit);
    cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, 1u << bit, 0, 512)),
                 NBD_EINVAL, "bit %u", bit);
  }
}

Test(validate, flags_per_command) {
  struct wire_tx tx = tx_ext();
  struct {
    uint16_t type, flag;
  } bad[] = {
      {NBD_CMD_READ, NBD_CMD_FLAG_NO_HOLE},
      {NBD_CMD_READ, NBD_CMD_FLAG_REQ_ONE},
      {NBD_CMD_READ, NBD_CMD_FLAG_FAST_ZERO},
      {NBD_CMD_READ, NBD_CMD_FLAG_PAYLOAD_LEN},
      {NBD_CMD_WRITE, NBD_CMD_FLAG_NO_HOLE},
      {NBD_CMD_WRITE, NBD_CMD_FLAG_DF},
      {NBD_CMD_WRITE, NBD_CMD_FLAG_REQ_ONE},
      {NBD_CMD_WRITE, NBD_CMD_FLAG_FAST_ZERO},
      {NBD_CMD_FLUSH, NBD_CMD_FLAG_NO_HOLE},
      {NBD_CMD_FLUSH, NBD_CMD_FLAG_DF},
      {NBD_CMD_FLUSH, NBD_CMD_FLAG_PAYLOAD_LEN},
      {NBD_CMD_TRIM, NBD_CMD_FLAG_NO_HOLE},
      {NBD_CMD_TRIM, NBD_CMD_FLAG_FAST_ZERO},
      {NBD_CMD_TRIM, NBD_CMD_FLAG_PAYLOAD_LEN},
      {NBD_CMD_CACHE, NBD_CMD_FLAG_DF},
      {NBD_CMD_CACHE, NBD_CMD_FLAG_REQ_ONE},
      {NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_DF},
      {NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_REQ_ONE},
      {NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_PAYLOAD_LEN},
      {NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_NO_HOLE},
      {NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_DF},
      {NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_FAST_ZERO},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(validate(&tx, req(bad[i].type, bad[i].flag, 0, 512)),
                 NBD_EINVAL, "type %u flag 0x%x", bad[i].type, bad[i].flag);
}

Test(validate, fua_needs_the_transmission_flag) {
  struct wire_tx tx = tx_plain();
  tx.tflags &= ~NBD_FLAG_SEND_FUA;
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 512)),
               NBD_EINVAL);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, 0, 0, 512)), 0);
}

Test(validate, df_needs_structured_replies) {
  struct wire_tx tx = tx_plain();
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512)),
               NBD_EINVAL);
  tx.structured = true;
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512)), 0);
}

Test(validate, fast_zero_needs_the_transmission_flag) {
  struct wire_tx tx = tx_plain();
  tx.tflags &= ~NBD_FLAG_SEND_FAST_ZERO;
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 512)),
      NBD_EINVAL);
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, 512)),
      0);
}

Test(validate, payload_len_only_with_extended_headers) {
  struct wire_tx tx = tx_plain();
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 512)),
      NBD_EINVAL);
  tx.ncontexts = 1;
  tx.structured = true;
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 16)),
      NBD_EINVAL);
  /* Extended headers but the server did not offer block status payloads. */
  tx = tx_ext();
  tx.tflags &= ~NBD_FLAG_BLOCK_STAT_PAYLOAD;
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 16)),
      NBD_EINVAL);
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 512)), 0);
}

Test(validate, block_status_payload_skips_range_checks) {
  struct wire_tx tx = tx_ext();
  /* Length is the payload length here: offset and length are checked once
   * the payload is read. */
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 16)),
      0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_PAYLOAD_LEN,
                                 SIZE_1M * 2, 0)),
               0);
}

Test(validate, unsupported_commands) {
  struct wire_tx tx = tx_plain();
  tx.tflags &=
      ~(NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_CACHE);
  cr_assert_eq(validate(&tx, req(NBD_CMD_TRIM, 0, 0, 512)), NBD_EINVAL);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES, 0, 0, 512)), NBD_EINVAL);
  cr_assert_eq(validate(&tx, req(NBD_CMD_CACHE, 0, 0, 512)), NBD_EINVAL);
}

Test(validate, block_status_without_contexts) {
  struct wire_tx tx = tx_ext();
  tx.ncontexts = 0;
  const char *msg = NULL;
  struct wire_request r = req(NBD_CMD_BLOCK_STATUS, 0, 0, 512);
  cr_assert_eq(wire_validate_request(&tx, &r, &msg), NBD_EINVAL);
  cr_assert_str_eq(msg, "no meta context was negotiated");
}

Test(validate, read_only_export) {
  struct wire_tx tx = tx_plain();
  /* What the server offers for a read-only export. */
  tx.tflags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH |
              NBD_FLAG_SEND_CACHE;
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, 0, 0, 512)), NBD_EPERM);
  cr_assert_eq(validate(&tx, req(NBD_CMD_TRIM, 0, 0, 512)), NBD_EPERM);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES, 0, 0, 512)), NBD_EPERM);
  /* Even when the flags would allow them. */
  tx.tflags |= NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES;
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, 0, 0, 512)), NBD_EPERM);
  cr_assert_eq(validate(&tx, req(NBD_CMD_TRIM, 0, 0, 512)), NBD_EPERM);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES, 0, 0, 512)), NBD_EPERM);
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 512)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_FLUSH, 0, 0, 0)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_CACHE, 0, 0, 512)), 0);
}

Test(validate, zero_length) {
  struct wire_tx tx = tx_ext();
  uint16_t types[] = {NBD_CMD_READ,         NBD_CMD_WRITE,
                      NBD_CMD_TRIM,         NBD_CMD_CACHE,
                      NBD_CMD_WRITE_ZEROES, NBD_CMD_BLOCK_STATUS};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    cr_assert_eq(validate(&tx, req(types[i], 0, 0, 0)), NBD_EINVAL, "type %u",
                 types[i]);
}

Test(validate, past_end) {
  struct wire_tx tx = tx_ext();
  tx.max_payload = 4 * SIZE_1M;
  struct {
    uint16_t type;
    uint32_t err;
  } cases[] = {
      {NBD_CMD_READ, NBD_EINVAL},         {NBD_CMD_WRITE, NBD_ENOSPC},
      {NBD_CMD_TRIM, NBD_EINVAL},         {NBD_CMD_CACHE, NBD_EINVAL},
      {NBD_CMD_WRITE_ZEROES, NBD_ENOSPC}, {NBD_CMD_BLOCK_STATUS, NBD_EINVAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t t = cases[i].type;
    uint32_t e = cases[i].err;
    uint16_t f = t == NBD_CMD_WRITE ? NBD_CMD_FLAG_PAYLOAD_LEN : 0;
    cr_assert_eq(validate(&tx, req(t, f, SIZE_1M - 512, 512)), 0, "type %u", t);
    cr_assert_eq(validate(&tx, req(t, f, SIZE_1M - 512, 513)), e, "type %u", t);
    cr_assert_eq(validate(&tx, req(t, f, SIZE_1M, 1)), e, "type %u", t);
    cr_assert_eq(validate(&tx, req(t, f, SIZE_1M + 1, 1)), e, "type %u", t);
    cr_assert_eq(validate(&tx, req(t, f, 0, SIZE_1M + 1)), e, "type %u", t);
    /* offset + length wraps around 2^64 */
    cr_assert_eq(validate(&tx, req(t, f, UINT64_MAX - 10, 512)), e, "type %u",
                 t);
    cr_assert_eq(validate(&tx, req(t, f, 512, UINT64_MAX - 10)),
                 t == NBD_CMD_READ || t == NBD_CMD_WRITE ? NBD_EOVERFLOW : e,
                 "type %u", t);
  }
}

Test(validate, too_large_read_or_write) {
  struct wire_tx tx = tx_plain();
  tx.max_payload = 4096;
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 4096)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 4097)), NBD_EINVAL);
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE, 0, 0, 4097)), NBD_EINVAL);
  /* Not a payload: zeroing more than max_payload is fine. */
  cr_assert_eq(validate(&tx, req(NBD_CMD_WRITE_ZEROES, 0, 0, 8192)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_TRIM, 0, 0, 8192)), 0);
  tx = tx_ext();
  tx.max_payload = 4096;
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 4097)), NBD_EOVERFLOW);
  cr_assert_eq(
      validate(&tx, req(NBD_CMD_WRITE, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 4097)),
      NBD_EOVERFLOW);
  cr_assert_eq(validate(&tx, req(NBD_CMD_READ, 0, 0, 4096)), 0);
}

Test(validate, flush_ignores_range) {
  struct wire_tx tx = tx_plain();
  cr_assert_eq(validate(&tx, req(NBD_CMD_FLUSH, 0, SIZE_1M * 8, 12345)), 0);
  cr_assert_eq(validate(&tx, req(NBD_CMD_FLUSH, NBD_CMD_FLAG_FUA, 0, 0)), 0);
}

/* ---- wire_errno_from ---- */

Test(errno_from, mapping) {
  cr_assert_eq(wire_errno_from(0), 0);
  cr_assert_eq(wire_errno_from(-EPERM), NBD_EPERM);
  cr_assert_eq(wire_errno_from(-EROFS), NBD_EPERM);
  cr_assert_eq(wire_errno_from(-ENOMEM), NBD_ENOMEM);
  cr_assert_eq(wire_errno_from(-EINVAL), NBD_EINVAL);
  cr_assert_eq(wire_errno_from(-ENOSPC), NBD_ENOSPC);
  cr_assert_eq(wire_errno_from(-EFBIG), NBD_ENOSPC);
  cr_assert_eq(wire_errno_from(-EDQUOT), NBD_ENOSPC);
  cr_assert_eq(wire_errno_from(-EOVERFLOW), NBD_EOVERFLOW);
  cr_assert_eq(wire_errno_from(-ENOTSUP), NBD_ENOTSUP);
  cr_assert_eq(wire_errno_from(-EOPNOTSUPP), NBD_ENOTSUP);
  cr_assert_eq(wire_errno_from(-ESHUTDOWN), NBD_ESHUTDOWN);
  cr_assert_eq(wire_errno_from(-EIO), NBD_EIO);
  cr_assert_eq(wire_errno_from(-EBADF), NBD_EIO);
  cr_assert_eq(wire_errno_from(-ENOENT), NBD_EIO);
  cr_assert_eq(wire_errno_from(-12345), NBD_EIO);
}

/* ---- reply headers ---- */

Test(reply, simple) {
  uint8_t b[40];
  memset(b, 0xaa, sizeof b);
  cr_assert_eq(wire_put_simple_reply(b, NBD_ENOSPC, 0x0102030405060708ull), 16);
  static const uint8_t want[16] = {0x67, 0x44, 0x66, 0x98, 0, 0, 0, 28,
                                   1,    2,    3,    4,    5, 6, 7, 8};
  cr_assert_arr_eq(b, want, 16);
  cr_assert_eq(b[16], 0xaa, "wrote past the header");
}

Test(reply, structured_chunk) {
  uint8_t b[40];
  memset(b, 0xaa, sizeof b);
  size_t n = wire_put_chunk(b, false, NBD_REPLY_FLAG_DONE,
                            NBD_REPLY_TYPE_OFFSET_DATA, 0x1112131415161718ull,
                            0x2122232425262728ull, 0x0000000131323334ull);
  cr_assert_eq(n, 20);
  /* The compact chunk has no offset field and a 32-bit length. */
  static const uint8_t want[20] = {0x66, 0x8e, 0x33, 0xef, 0x00, 0x01, 0x00,
                                   0x01, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16,
                                   0x17, 0x18, 0x31, 0x32, 0x33, 0x34};
  cr_assert_arr_eq(b, want, 20);
  cr_assert_eq(b[20], 0xaa, "wrote past the header");
}

Test(reply, structured_error_chunk) {
  uint8_t b[40];
  size_t n = wire_put_chunk(b, false, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR,
                            1, 0, 6);
  cr_assert_eq(n, NBD_STRUCTURED_REPLY_SIZE);
  static const uint8_t want[20] = {0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80,
                                   0x01, 0,    0,    0,    0, 0, 0,
                                   0,    1,    0,    0,    0, 6};
  cr_assert_arr_eq(b, want, 20);
}

Test(reply, extended_chunk) {
  uint8_t b[40];
  memset(b, 0xaa, sizeof b);
  size_t n = wire_put_chunk(b, true, 0, NBD_REPLY_TYPE_BLOCK_STATUS_EXT,
                            0x1112131415161718ull, 0x2122232425262728ull,
                            0x3132333435363738ull);
  cr_assert_eq(n, 32);
  static const uint8_t want[32] = {
      0x6e, 0x8a, 0x27, 0x8c, 0x00, 0x00, 0x00, 0x06, 0x11, 0x12, 0x13,
      0x14, 0x15, 0x16, 0x17, 0x18, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26,
      0x27, 0x28, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38};
  cr_assert_arr_eq(b, want, 32);
  cr_assert_eq(b[32], 0xaa, "wrote past the header");
  cr_assert_leq(n, WIRE_MAX_CHUNK_HEADER);
}

Test(reply, be_helpers) {
  uint8_t b[8];
  put_be64(b, 0x0102030405060708ull);
  cr_assert_eq(b[0], 1);
  cr_assert_eq(b[7], 8);
  cr_assert_eq(get_be64(b), 0x0102030405060708ull);
  cr_assert_eq(get_be32(b + 4), 0x05060708u);
  cr_assert_eq(get_be16(b + 6), 0x0708);
  put_be32(b, 0xfffefdfcu);
  cr_assert_eq(get_be32(b), 0xfffefdfcu);
  cr_assert_eq(get_be16(b), 0xfffe);
}

/* ---- wire_split_zero_runs ---- */

#define G 4096u

/* Every run is contiguous and they cover [0, len) exactly. */
static void check_cover(const struct wire_run *runs, size_t n, uint64_t len,
                        bool strict) {
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(runs[i].offset, off, "run %zu starts at %llu, want %llu", i,
                 (unsigned long long)runs[i].offset, (unsigned long long)off);
    cr_assert_gt(runs[i].length, 0, "run %zu is empty", i);
    if (strict && i > 0)
      cr_assert_neq(runs[i].hole, runs[i - 1].hole,
                    "runs %zu and %zu should have been merged", i - 1, i);
    off += runs[i].length;
  }
  cr_assert_eq(off, len, "runs cover %llu of %llu bytes",
               (unsigned long long)off, (unsigned long long)len);
}

Test(zero_runs, empty_buffer) {
  struct wire_run runs[4];
  uint8_t b[1] = {0};
  cr_assert_eq(wire_split_zero_runs(b, 0, runs, 4), 0);
}

Test(zero_runs, no_room) {
  uint8_t *b = calloc(1, 4 * G);
  struct wire_run runs[1] = {{99, 99, true}};
  cr_assert_eq(wire_split_zero_runs(b, 4 * G, runs, 0), 0);
  cr_assert_eq(runs[0].offset, 99);
  free(b);
}

Test(zero_runs, all_data) {
  uint8_t *b = malloc(4 * G);
  memset(b, 0x5a, 4 * G);
  struct wire_run runs[8];
  cr_assert_eq(wire_split_zero_runs(b, 4 * G, runs, 8), 1);
  cr_assert_eq(runs[0].offset, 0);
  cr_assert_eq(runs[0].length, 4 * G);
  cr_assert_eq(runs[0].hole, false);
  free(b);
}

Test(zero_runs, all_zero) {
  uint8_t *b = calloc(1, 4 * G);
  struct wire_run runs[8];
  cr_assert_eq(wire_split_zero_runs(b, 4 * G, runs, 8), 1);
  cr_assert_eq(runs[0].offset, 0);
  cr_assert_eq(runs[0].length, 4 * G);
  cr_assert_eq(runs[0].hole, true);
  free(b);
}

Test(zero_runs, one_nonzero_byte_makes_a_block_data) {
  uint8_t *b = calloc(1, 3 * G);
  struct wire_run runs[8];
  for (size_t pos = G; pos < 2 * G; pos += G - 1) {
    memset(b, 0, 3 * G);
    b[pos] = 1;
    cr_assert_eq(wire_split_zero_runs(b, 3 * G, runs, 8), 3, "pos %zu", pos);
    cr_assert_eq(runs[0].hole, true);
    cr_assert_eq(runs[1].hole, false);
    cr_assert_eq(runs[1].offset, G);
    cr_assert_eq(runs[1].length, G);
    cr_assert_eq(runs[2].hole, true);
    check_cover(runs, 3, 3 * G, true);
  }
  free(b);
}

Test(zero_runs, mixed) {
  /* data, zero, zero, data, data, zero */
  uint8_t *b = calloc(1, 6 * G);
  memset(b, 1, G);
  memset(b + 3 * G, 2, 2 * G);
  struct wire_run runs[8];
  size_t n = wire_split_zero_runs(b, 6 * G, runs, 8);
  cr_assert_eq(n, 4);
  struct wire_run want[4] = {
      {0, G, false}, {G, 2 * G, true}, {3 * G, 2 * G, false}, {5 * G, G, true}};
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(runs[i].offset, want[i].offset, "run %zu", i);
    cr_assert_eq(runs[i].length, want[i].length, "run %zu", i);
    cr_assert_eq(runs[i].hole, want[i].hole, "run %zu", i);
  }
  check_cover(runs, n, 6 * G, true);
  free(b);
}

Test(zero_runs, short_tail) {
  /* data block, then a zero tail of 100 bytes */
  uint8_t *b = calloc(1, G + 100);
  memset(b, 7, G);
  struct wire_run runs[4];
  cr_assert_eq(wire_split_zero_runs(b, G + 100, runs, 4), 2);
  cr_assert_eq(runs[1].offset, G);
  cr_assert_eq(runs[1].length, 100);
  cr_assert_eq(runs[1].hole, true);
  check_cover(runs, 2, G + 100, true);
  /* a data tail whose last byte only is set */
  memset(b, 0, G + 100);
  b[G + 99] = 1;
  cr_assert_eq(wire_split_zero_runs(b, G + 100, runs, 4), 2);
  cr_assert_eq(runs[0].hole, true);
  cr_assert_eq(runs[0].length, G);
  cr_assert_eq(runs[1].hole, false);
  cr_assert_eq(runs[1].length, 100);
  free(b);
}

Test(zero_runs, smaller_than_a_block) {
  uint8_t b[10] = {0};
  struct wire_run runs[2];
  cr_assert_eq(wire_split_zero_runs(b, 10, runs, 2), 1);
  cr_assert_eq(runs[0].length, 10);
  cr_assert_eq(runs[0].hole, true);
  b[9] = 1;
  cr_assert_eq(wire_split_zero_runs(b, 10, runs, 2), 1);
  cr_assert_eq(runs[0].length, 10);
  cr_assert_eq(runs[0].hole, false);
  /* a single byte */
  cr_assert_eq(wire_split_zero_runs(b + 9, 1, runs, 2), 1);
  cr_assert_eq(runs[0].hole, false);
  cr_assert_eq(wire_split_zero_runs(b, 1, runs, 2), 1);
  cr_assert_eq(runs[0].hole, true);
}

Test(zero_runs, limit_reached_merges_rest_into_data) {
  /* alternating data/zero blocks: d z d z d z d z */
  uint8_t *b = calloc(1, 8 * G);
  for (int i = 0; i < 8; i += 2)
    memset(b + (size_t)i * G, 0xff, G);
  struct wire_run runs[3];
  size_t n = wire_split_zero_runs(b, 8 * G, runs, 3);
  cr_assert_eq(n, 3);
  cr_assert_eq(runs[0].offset, 0);
  cr_assert_eq(runs[0].length, G);
  cr_assert_eq(runs[0].hole, false);
  cr_assert_eq(runs[1].offset, G);
  cr_assert_eq(runs[1].length, G);
  cr_assert_eq(runs[1].hole, true);
  cr_assert_eq(runs[2].offset, 2 * G);
  cr_assert_eq(runs[2].length, 6 * G);
  cr_assert_eq(runs[2].hole, false);
  check_cover(runs, n, 8 * G, false);
  free(b);
}

Test(zero_runs, limit_reached_on_a_hole_turns_it_into_data) {
  /* z d z d z: with 2 runs, the second (data) absorbs the rest */
  uint8_t *b = calloc(1, 5 * G);
  memset(b + G, 1, G);
  memset(b + 3 * G, 1, G);
  struct wire_run runs[2];
  size_t n = wire_split_zero_runs(b, 5 * G, runs, 2);
  cr_assert_eq(n, 2);
  cr_assert_eq(runs[0].hole, true);
  cr_assert_eq(runs[0].length, G);
  cr_assert_eq(runs[1].hole, false);
  cr_assert_eq(runs[1].offset, G);
  cr_assert_eq(runs[1].length, 4 * G);
  /* one run: everything is data, even a leading hole */
  struct wire_run one[1];
  cr_assert_eq(wire_split_zero_runs(b, 5 * G, one, 1), 1);
  cr_assert_eq(one[0].offset, 0);
  cr_assert_eq(one[0].length, 5 * G);
  cr_assert_eq(one[0].hole, false);
  free(b);
}

Test(zero_runs, limit_exactly_enough) {
  /* d z d: three runs fit exactly into three slots */
  uint8_t *b = calloc(1, 3 * G + 5);
  memset(b, 1, G);
  memset(b + 2 * G, 1, G + 5);
  struct wire_run runs[3];
  size_t n = wire_split_zero_runs(b, 3 * G + 5, runs, 3);
  cr_assert_eq(n, 3);
  cr_assert_eq(runs[1].hole, true);
  cr_assert_eq(runs[2].length, G + 5);
  check_cover(runs, n, 3 * G + 5, true);
  free(b);
}

Test(zero_runs, pseudo_random_buffers_are_covered_exactly) {
  uint32_t seed = 12345;
  for (int iter = 0; iter < 200; iter++) {
    seed = seed * 1103515245u + 12345u;
    uint64_t len = 1 + (seed >> 8) % (20 * G);
    uint8_t *b = calloc(1, len);
    for (uint64_t off = 0; off < len; off += G) {
      seed = seed * 1103515245u + 12345u;
      if (seed & 0x10000)
        b[off + (seed >> 20) % (len - off < G ? len - off : G)] = 1;
    }
    seed = seed * 1103515245u + 12345u;
    size_t maxruns = 1 + (seed >> 16) % 8;
    struct wire_run runs[8];
    size_t n = wire_split_zero_runs(b, len, runs, maxruns);
    cr_assert_geq(n, 1);
    cr_assert_leq(n, maxruns);
    /* Once the limit is hit the last run may be data next to data. */
    check_cover(runs, n, len, n < maxruns);
    /* Holes must really be zero. */
    for (size_t i = 0; i < n; i++)
      if (runs[i].hole)
        for (uint64_t k = 0; k < runs[i].length; k++)
          cr_assert_eq(b[runs[i].offset + k], 0, "iter %d run %zu", iter, i);
    free(b);
  }
}
