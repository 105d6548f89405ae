/* SPDX-License-Identifier: BSD-3-Clause */
/* Compressed clusters: raw deflate (no zlib header) or zstd, each
 * decompressing to exactly one cluster.  The input may carry trailing
 * bytes of the next compressed cluster: decompression stops at a full
 * cluster. */
#include <errno.h>
#include <zlib.h>
#include <zstd.h>

#include "qcow2-internal.h"

static int inflate_cluster(const uint8_t *in, size_t inlen, uint8_t *out,
                           size_t outlen) {
  z_stream z = {0};
  if (inflateInit2(&z, -15) != Z_OK) /* raw deflate, any window size */
    return -ENOMEM;
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)inlen;
  z.next_out = out;
  z.avail_out = (uInt)outlen;
  int r = inflate(&z, Z_FINISH);
  bool full = z.avail_out == 0;
  inflateEnd(&z);
  /* Z_BUF_ERROR with a full output just means trailing input remained. */
  return (r == Z_STREAM_END || r == Z_BUF_ERROR || r == Z_OK) && full ? 0
                                                                      : -EIO;
}

static int zstd_cluster(const uint8_t *in, size_t inlen, uint8_t *out,
                        size_t outlen) {
  ZSTD_DCtx *d = ZSTD_createDCtx();
  if (!d)
    return -ENOMEM;
  ZSTD_inBuffer ib = {in, inlen, 0};
  ZSTD_outBuffer ob = {out, outlen, 0};
  int ret = 0;
  while (ob.pos < ob.size) {
    size_t r = ZSTD_decompressStream(d, &ob, &ib);
    if (ZSTD_isError(r)) {
      ret = -EIO;
      break;
    }
    if (r == 0 || ib.pos == ib.size) /* frame ended or input exhausted */
      break;
  }
  ZSTD_freeDCtx(d);
  return ret == 0 && ob.pos == ob.size ? 0 : -EIO;
}

int qcow2_decompress(unsigned type, const uint8_t *in, size_t inlen,
                     uint8_t *out, size_t outlen) {
  return type == 1 ? zstd_cluster(in, inlen, out, outlen)
                   : inflate_cluster(in, inlen, out, outlen);
}

/* Raw deflate with a 4 KiB window, as QEMU writes it. */
static long deflate_cluster(const uint8_t *in, size_t inlen, uint8_t *out,
                            size_t outlen) {
  z_stream z = {0};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9,
                   Z_DEFAULT_STRATEGY) != Z_OK)
    return -ENOMEM;
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)inlen;
  z.next_out = out;
  z.avail_out = (uInt)outlen;
  int r = deflate(&z, Z_FINISH);
  long n = r == Z_STREAM_END ? (long)(outlen - z.avail_out) : 0;
  deflateEnd(&z);
  return n;
}

long qcow2_compress(unsigned type, const uint8_t *in, size_t inlen,
                    uint8_t *out, size_t outlen) {
  if (type != 1)
    return deflate_cluster(in, inlen, out, outlen);
  size_t n = ZSTD_compress(out, outlen, in, inlen, ZSTD_CLEVEL_DEFAULT);
  return ZSTD_isError(n) ? 0 : (long)n;
}
