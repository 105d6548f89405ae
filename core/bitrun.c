/* SPDX-License-Identifier: BSD-3-Clause */
/* Runs of equal bits as extents: see bitrun.h. */
#include "bitrun.h"

uint64_t bitrun_end(bitrun_word_fn *word, const void *b, uint64_t g,
                    uint64_t end, bool set) {
  uint64_t w = g / 64;
  uint64_t v = (set ? ~word(b, w) : word(b, w)) & (~0ull << (g % 64));
  while (v == 0) {
    if (++w * 64 >= end)
      return end;
    v = set ? ~word(b, w) : word(b, w);
  }
  uint64_t n = w * 64 + (uint64_t)__builtin_ctzll(v);
  return n < end ? n : end;
}

int bitrun_extents(bitrun_word_fn *word, const void *b, uint64_t nbits,
                   unsigned gran_bits, uint64_t len, uint64_t off,
                   uint32_t flags, struct bd_extents *ext) {
  uint64_t end = off + len, gend = ((end - 1) >> gran_bits) + 1;
  if (gend > nbits)
    gend = nbits; /* the core keeps requests inside the device */
  uint64_t g = off >> gran_bits;
  bool set = g < gend && ((word(b, g / 64) >> (g % 64)) & 1);
  /* Each run ends where the bit flips: the next one has the other value. */
  for (; off < end && g < gend; set = !set) {
    uint64_t next = bitrun_end(word, b, g, gend, set);
    uint64_t stop = next << gran_bits;
    if (stop > end || next == gend)
      stop = end;
    int r = bd_extents_add(ext, stop - off, set ? BD_CTX_DIRTY : 0, 0);
    if (r != 0 || (flags & BD_F_REQ_ONE))
      return r < 0 ? r : 0;
    off = stop;
    g = next;
  }
  return 0;
}
