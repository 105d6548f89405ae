/* SPDX-License-Identifier: BSD-3-Clause */
/* Runs of equal bits in a bitmap read one 64-bit word at a time: the
 * block status of dirty bitmaps (a checkpoint's, a qcow2 image's). */
#ifndef BLOCKPORT_BITRUN_H
#define BLOCKPORT_BITRUN_H

#include <stdbool.h>
#include <stdint.h>

/* Word W of the bitmap B (bit G is bit G % 64 of word G / 64). */
typedef uint64_t bitrun_word_fn(const void *b, uint64_t w);

/* The first bit in (G, END) that is not SET (bit G itself is), or END. */
static inline uint64_t bitrun_end(bitrun_word_fn *word, const void *b,
                                  uint64_t g, uint64_t end, bool set) {
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

#endif
