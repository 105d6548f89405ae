/* SPDX-License-Identifier: BSD-3-Clause */
#include "wire.h"

#include <errno.h>
#include <string.h>

#include "nbd-protocol.h"

int wire_parse_request(const uint8_t *buf, size_t avail, bool extended,
                       struct wire_request *req) {
  size_t need = extended ? NBD_EXTENDED_REQUEST_SIZE : NBD_REQUEST_SIZE;
  if (avail < 4)
    return 0;
  uint32_t magic = get_be32(buf);
  if (magic != (extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC))
    return -1;
  if (avail < need)
    return 0;
  req->flags = get_be16(buf + 4);
  req->type = get_be16(buf + 6);
  req->cookie = get_be64(buf + 8);
  req->offset = get_be64(buf + 16);
  req->length = extended ? get_be64(buf + 24) : get_be32(buf + 24);
  return (int)need;
}

uint64_t wire_request_payload(const struct wire_tx *tx,
                              const struct wire_request *req) {
  /* With extended headers the flag alone says whether a payload follows,
   * for any command: a WRITE without it has none (and is refused). */
  if (tx->extended)
    return (req->flags & NBD_CMD_FLAG_PAYLOAD_LEN) ? req->length : 0;
  return req->type == NBD_CMD_WRITE ? req->length : 0;
}

bool wire_request_overlong(const struct wire_tx *tx,
                           const struct wire_request *req) {
  return tx->extended && (req->flags & NBD_CMD_FLAG_PAYLOAD_LEN) &&
         req->length > tx->max_payload;
}

/* Flags each command accepts; FUA is accepted (and ignored) everywhere the
 * spec lets clients send it. */
static uint16_t allowed_flags(const struct wire_tx *tx, uint16_t type) {
  uint16_t fua = (tx->tflags & NBD_FLAG_SEND_FUA) ? NBD_CMD_FLAG_FUA : 0;
  uint16_t plen = tx->extended ? NBD_CMD_FLAG_PAYLOAD_LEN : 0;
  switch (type) {
  case NBD_CMD_READ: return fua | (tx->structured ? NBD_CMD_FLAG_DF : 0);
  case NBD_CMD_WRITE: return fua | plen;
  case NBD_CMD_TRIM:
  case NBD_CMD_FLUSH:
  case NBD_CMD_CACHE: return fua;
  case NBD_CMD_WRITE_ZEROES:
    return fua | NBD_CMD_FLAG_NO_HOLE |
           ((tx->tflags & NBD_FLAG_SEND_FAST_ZERO) ? NBD_CMD_FLAG_FAST_ZERO
                                                   : 0);
  case NBD_CMD_BLOCK_STATUS:
    return fua | NBD_CMD_FLAG_REQ_ONE |
           ((tx->tflags & NBD_FLAG_BLOCK_STAT_PAYLOAD) ? plen : 0);
  default: return 0;
  }
}

static bool is_write(uint16_t type) {
  return type == NBD_CMD_WRITE || type == NBD_CMD_TRIM ||
         type == NBD_CMD_WRITE_ZEROES;
}

uint32_t wire_validate_request(const struct wire_tx *tx,
                               const struct wire_request *req,
                               const char **msg) {
  uint16_t type = req->type;
  if (type > NBD_CMD_BLOCK_STATUS || type == NBD_CMD_DISC) {
    *msg = "unknown command";
    return NBD_EINVAL;
  }
  if (type == NBD_CMD_WRITE && tx->extended &&
      !(req->flags & NBD_CMD_FLAG_PAYLOAD_LEN)) {
    *msg = "write without NBD_CMD_FLAG_PAYLOAD_LEN (extended headers)";
    return NBD_EINVAL;
  }
  /* Read-only first: a write with FUA on a read-only export is refused for
   * being a write, not for the FUA flag (not advertised there). */
  if (is_write(type) && (tx->tflags & NBD_FLAG_READ_ONLY)) {
    *msg = "the export is read-only";
    return NBD_EPERM;
  }
  if (req->flags & ~allowed_flags(tx, type)) {
    *msg = "command flags not valid for this command";
    return NBD_EINVAL;
  }
  if (type == NBD_CMD_TRIM && !(tx->tflags & NBD_FLAG_SEND_TRIM)) {
    *msg = "trim is not supported";
    return (tx->tflags & NBD_FLAG_READ_ONLY) ? NBD_EPERM : NBD_EINVAL;
  }
  if (type == NBD_CMD_WRITE_ZEROES &&
      !(tx->tflags & NBD_FLAG_SEND_WRITE_ZEROES)) {
    *msg = "write zeroes is not supported";
    return (tx->tflags & NBD_FLAG_READ_ONLY) ? NBD_EPERM : NBD_EINVAL;
  }
  if (type == NBD_CMD_CACHE && !(tx->tflags & NBD_FLAG_SEND_CACHE)) {
    *msg = "cache is not supported";
    return NBD_EINVAL;
  }
  if (type == NBD_CMD_BLOCK_STATUS && tx->ncontexts == 0) {
    *msg = "no meta context was negotiated";
    return NBD_EINVAL;
  }
  if (type == NBD_CMD_FLUSH)
    return 0;
  /* With PAYLOAD_LEN on block status, length is the payload; the effect
   * length inside it is checked once the payload is read. */
  bool plen_bs =
      type == NBD_CMD_BLOCK_STATUS && (req->flags & NBD_CMD_FLAG_PAYLOAD_LEN);
  if (plen_bs)
    return 0;
  if (req->length == 0) {
    *msg = "zero-length request";
    return NBD_EINVAL;
  }
  if ((type == NBD_CMD_READ || type == NBD_CMD_WRITE) &&
      req->length > tx->max_payload) {
    *msg = "request is larger than the maximum payload";
    return tx->extended ? NBD_EOVERFLOW : NBD_EINVAL;
  }
  if (req->offset > tx->size || req->length > tx->size - req->offset) {
    *msg = "request is beyond the end of the export";
    return (type == NBD_CMD_WRITE || type == NBD_CMD_WRITE_ZEROES) ? NBD_ENOSPC
                                                                   : NBD_EINVAL;
  }
  return 0;
}

uint32_t wire_errno_from(int negerr) {
  switch (-negerr) {
  case 0: return 0;
  case EPERM:
  case EROFS: return NBD_EPERM;
  case ENOMEM: return NBD_ENOMEM;
  case EINVAL: return NBD_EINVAL;
  case ENOSPC:
  case EFBIG:
  case EDQUOT: return NBD_ENOSPC;
  case EOVERFLOW: return NBD_EOVERFLOW;
  case ENOTSUP: return NBD_ENOTSUP;
  case ESHUTDOWN: return NBD_ESHUTDOWN;
  default: return NBD_EIO;
  }
}

size_t wire_put_simple_reply(uint8_t *p, uint32_t error, uint64_t cookie) {
  put_be32(p, NBD_SIMPLE_REPLY_MAGIC);
  put_be32(p + 4, error);
  put_be64(p + 8, cookie);
  return NBD_SIMPLE_REPLY_SIZE;
}

size_t wire_put_chunk(uint8_t *p, bool extended, uint16_t flags, uint16_t type,
                      uint64_t cookie, uint64_t offset, uint64_t length) {
  put_be16(p + 4, flags);
  put_be16(p + 6, type);
  put_be64(p + 8, cookie);
  if (extended) {
    put_be32(p, NBD_EXTENDED_REPLY_MAGIC);
    put_be64(p + 16, offset);
    put_be64(p + 24, length);
    return NBD_EXTENDED_REPLY_SIZE;
  }
  put_be32(p, NBD_STRUCTURED_REPLY_MAGIC);
  put_be32(p + 16, (uint32_t)length);
  return NBD_STRUCTURED_REPLY_SIZE;
}

#define ZERO_GRAIN 4096u

static bool all_zero(const uint8_t *p, uint64_t n) {
  /* Check the first bytes cheaply, then compare the block with itself
   * shifted: zero iff p[0] == 0 and p[i] == p[i+1] for all i. */
  if (n == 0)
    return true;
  if (p[0] != 0)
    return false;
  return memcmp(p, p + 1, n - 1) == 0;
}

size_t wire_split_zero_runs(const uint8_t *buf, uint64_t len,
                            struct wire_run *runs, size_t maxruns) {
  size_t n = 0;
  uint64_t off = 0;
  if (maxruns == 0)
    return 0;
  while (off < len) {
    uint64_t step = len - off < ZERO_GRAIN ? len - off : ZERO_GRAIN;
    bool hole = all_zero(buf + off, step);
    if (n > 0 && runs[n - 1].hole == hole) {
      runs[n - 1].length += step;
    } else if (n == maxruns) {
      /* Out of runs: the rest goes into the last run as data. */
      runs[n - 1].hole = false;
      runs[n - 1].length = len - runs[n - 1].offset;
      return n;
    } else {
      runs[n++] = (struct wire_run){off, step, hole};
    }
    off += step;
  }
  return n;
}
