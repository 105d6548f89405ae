/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD transmission phase as pure functions over byte buffers: parsing
 * and validating requests, and laying out reply headers.  No sockets here,
 * so the unit tests and the fuzzer can drive it directly. */
#ifndef BLOCKPORT_WIRE_H
#define BLOCKPORT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/byteorder.h"

struct wire_request {
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint64_t length; /* effect length, or payload length with PAYLOAD_LEN */
};

/* What validation needs to know about the connection. */
struct wire_tx {
  uint64_t size;
  uint32_t tflags;      /* transmission flags sent to the client */
  bool structured;      /* structured replies negotiated */
  bool extended;        /* extended headers negotiated */
  unsigned ncontexts;   /* meta contexts selected */
  uint32_t max_payload; /* largest READ/WRITE accepted: the advertised
                         * maximum block size */
};

/* Parse one request header at BUF.  Returns the header size consumed, 0 if
 * AVAIL is too short, or -1 if the magic is wrong for the negotiated header
 * style (the stream is then unusable). */
int wire_parse_request(const uint8_t *buf, size_t avail, bool extended,
                       struct wire_request *req);

/* Bytes of payload that follow the header on the wire: with extended
 * headers, LENGTH when NBD_CMD_FLAG_PAYLOAD_LEN is set (any command), else
 * none; with compact headers, LENGTH for NBD_CMD_WRITE only. */
uint64_t wire_request_payload(const struct wire_tx *tx,
                              const struct wire_request *req);

/* An extended request announcing a payload larger than the advertised
 * maximum: the spec says the server SHOULD hard-disconnect rather than
 * read it. */
bool wire_request_overlong(const struct wire_tx *tx,
                           const struct wire_request *req);

/* Check a request against the spec and the export.  Returns 0, or the NBD
 * error to reply with and a message in *MSG. */
uint32_t wire_validate_request(const struct wire_tx *tx,
                               const struct wire_request *req,
                               const char **msg);

/* Map a negative errno from the block device to an NBD error. */
uint32_t wire_errno_from(int negerr);

/* Reply headers; each returns the number of bytes written at P. */
size_t wire_put_simple_reply(uint8_t *p, uint32_t error, uint64_t cookie);
size_t wire_put_chunk(uint8_t *p, bool extended, uint16_t flags, uint16_t type,
                      uint64_t cookie, uint64_t offset, uint64_t length);
#define WIRE_MAX_CHUNK_HEADER 32

/* Runs of zero blocks in a read buffer, so reads can answer with holes.
 * Fills at most MAXRUNS {offset, length, is_hole} runs covering the buffer
 * and returns their number.  Granularity is 4 KiB. */
struct wire_run {
  uint64_t offset, length;
  bool hole;
};
size_t wire_split_zero_runs(const uint8_t *buf, uint64_t len,
                            struct wire_run *runs, size_t maxruns);

#endif
