/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the NBD transmission phase as pure functions
 * (server/wire.c).
 *
 * The input is parsed as a request header in both header styles; a parsed
 * request is checked with wire_request_payload() and wire_validate_request()
 * against several connection variants, and what validation accepts must be
 * safe to execute.  The input, and a buffer of blocks derived from it, are
 * also split into zero runs, which must cover the buffer exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-check.h"
#include "server/nbd-protocol.h"
#include "server/wire.h"

#define RW_FLAGS                                                               \
  (NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |              \
   NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_CACHE |     \
   NBD_FLAG_SEND_FAST_ZERO)

static const struct wire_tx txs[] = {
    /* simple replies */
    {.size = 1u << 20, .tflags = RW_FLAGS, .max_payload = 65536},
    /* structured replies with one context */
    {.size = 1ull << 40,
     .tflags = RW_FLAGS | NBD_FLAG_SEND_DF,
     .structured = true,
     .ncontexts = 1,
     .max_payload = 32u << 20},
    /* extended headers, two contexts, block status payloads */
    {.size = 12345,
     .tflags = RW_FLAGS | NBD_FLAG_SEND_DF | NBD_FLAG_BLOCK_STAT_PAYLOAD,
     .structured = true,
     .extended = true,
     .ncontexts = 2,
     .max_payload = 4096},
    /* extended headers, read-only, no contexts */
    {.size = UINT64_MAX,
     .tflags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH |
               NBD_FLAG_SEND_DF,
     .structured = true,
     .extended = true,
     .max_payload = 32u << 20},
    /* an empty export */
    {.size = 0, .tflags = NBD_FLAG_HAS_FLAGS, .max_payload = 65536},
};

static bool is_write(uint16_t t) {
  return t == NBD_CMD_WRITE || t == NBD_CMD_TRIM || t == NBD_CMD_WRITE_ZEROES;
}

static void check_request(const struct wire_tx *tx,
                          const struct wire_request *r) {
  uint64_t payload = wire_request_payload(tx, r);
  bool plen = r->flags & NBD_CMD_FLAG_PAYLOAD_LEN;
  if (tx->extended)
    CHECK(payload == (plen ? r->length : 0));
  else
    CHECK(payload == (r->type == NBD_CMD_WRITE ? r->length : 0));
  /* Overlong is the extended, announced payload above the maximum only. */
  CHECK(wire_request_overlong(tx, r) ==
        (tx->extended && plen && r->length > tx->max_payload));

  const char *msg = NULL;
  uint32_t err = wire_validate_request(tx, r, &msg);
  if (err != 0) {
    CHECK(msg != NULL && msg[0] != 0);
    CHECK(err == NBD_EINVAL || err == NBD_EPERM || err == NBD_ENOSPC ||
          err == NBD_EOVERFLOW);
    return;
  }
  /* Accepted: it must be a command the server can execute as it is. */
  CHECK(r->type <= NBD_CMD_BLOCK_STATUS && r->type != NBD_CMD_DISC);
  CHECK(!(r->flags & ~0x3fu));
  if (!tx->extended)
    CHECK(!(r->flags & NBD_CMD_FLAG_PAYLOAD_LEN));
  if (tx->extended && r->type == NBD_CMD_WRITE)
    CHECK(plen); /* else the next header would be taken for data */
  if (!tx->structured)
    CHECK(!(r->flags & NBD_CMD_FLAG_DF));
  if (r->flags & NBD_CMD_FLAG_FUA)
    CHECK(tx->tflags & NBD_FLAG_SEND_FUA);
  if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
    CHECK(r->type == NBD_CMD_WRITE_ZEROES &&
          (tx->tflags & NBD_FLAG_SEND_FAST_ZERO));
  if (is_write(r->type))
    CHECK(!(tx->tflags & NBD_FLAG_READ_ONLY));
  if (r->type == NBD_CMD_BLOCK_STATUS)
    CHECK(tx->ncontexts > 0);
  if (r->type == NBD_CMD_FLUSH)
    return;
  if (r->type == NBD_CMD_BLOCK_STATUS &&
      (r->flags & NBD_CMD_FLAG_PAYLOAD_LEN)) {
    CHECK(tx->tflags & NBD_FLAG_BLOCK_STAT_PAYLOAD);
    return;
  }
  CHECK(r->length > 0);
  CHECK(r->offset <= tx->size && r->length <= tx->size - r->offset);
  if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
    CHECK(r->length <= tx->max_payload);
}

static void check_replies(const struct wire_request *r, bool extended) {
  uint8_t b[WIRE_MAX_CHUNK_HEADER + 8];
  memset(b, 0xa5, sizeof b);
  CHECK(wire_put_simple_reply(b, (uint32_t)r->offset, r->cookie) == 16);
  CHECK(get_be32(b) == NBD_SIMPLE_REPLY_MAGIC);
  CHECK(get_be64(b + 8) == r->cookie);
  CHECK(b[16] == 0xa5);
  memset(b, 0xa5, sizeof b);
  size_t n = wire_put_chunk(b, extended, r->flags, r->type, r->cookie,
                            r->offset, r->length);
  CHECK(n == (extended ? 32u : 20u) && n <= WIRE_MAX_CHUNK_HEADER);
  CHECK(b[n] == 0xa5);
  CHECK(get_be32(b) ==
        (extended ? NBD_EXTENDED_REPLY_MAGIC : NBD_STRUCTURED_REPLY_MAGIC));
  CHECK(get_be16(b + 4) == r->flags && get_be16(b + 6) == r->type);
  CHECK(get_be64(b + 8) == r->cookie);
  if (extended)
    CHECK(get_be64(b + 16) == r->offset && get_be64(b + 24) == r->length);
  else
    CHECK(get_be32(b + 16) == (uint32_t)r->length);
}

static void check_runs(const uint8_t *buf, uint64_t len, size_t maxruns) {
  struct wire_run runs[16];
  CHECK(maxruns <= 16);
  size_t n = wire_split_zero_runs(buf, len, runs, maxruns);
  if (len == 0 || maxruns == 0) {
    CHECK(n == 0);
    return;
  }
  CHECK(n >= 1 && n <= maxruns);
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(runs[i].offset == off);
    CHECK(runs[i].length > 0);
    /* Runs start on the 4 KiB grain. */
    CHECK(runs[i].offset % 4096 == 0);
    if (i > 0 && n < maxruns)
      CHECK(runs[i].hole != runs[i - 1].hole);
    if (runs[i].hole)
      for (uint64_t k = 0; k < runs[i].length; k++)
        CHECK(buf[runs[i].offset + k] == 0);
    off += runs[i].length;
  }
  CHECK(off == len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int ext = 0; ext < 2; ext++) {
    struct wire_request r;
    int n = wire_parse_request(data, size, ext, &r);
    CHECK(n == -1 || n == 0 || n == (ext ? 32 : 28));
    if (n > 0)
      CHECK((size_t)n <= size);
    if (n == 0)
      CHECK(size < (ext ? 32u : 28u));
    if (n <= 0)
      continue;
    CHECK(r.type == get_be16(data + 6) && r.flags == get_be16(data + 4));
    CHECK(r.cookie == get_be64(data + 8) && r.offset == get_be64(data + 16));
    CHECK(r.length == (ext ? get_be64(data + 24) : get_be32(data + 24)));
    for (size_t i = 0; i < sizeof txs / sizeof txs[0]; i++) {
      struct wire_tx tx = txs[i];
      /* The header style must match what the request was parsed as. */
      tx.extended = ext;
      if (!ext)
        tx.tflags &= ~NBD_FLAG_BLOCK_STAT_PAYLOAD;
      check_request(&tx, &r);
    }
    check_replies(&r, ext);
  }

  /* Zero runs of the input itself, and of a buffer where each input byte
   * decides one 512-byte piece, so that runs span several 4 KiB blocks. */
  size_t maxruns = size ? data[0] % 17 : 1;
  check_runs(data, size, maxruns);
  if (size > 0 && size <= 1024) {
    uint64_t len = (uint64_t)size * 512 - (size > 1 ? data[1] : 0);
    uint8_t *buf = calloc(1, len ? len : 1);
    CHECK(buf);
    for (size_t i = 1; i < size; i++) {
      uint64_t at = (uint64_t)i * 512 + (data[i] >> 1);
      if ((data[i] & 1) && at < len)
        buf[at] = data[i];
    }
    check_runs(buf, len, maxruns);
    free(buf);
  }
  return 0;
}
