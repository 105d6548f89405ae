/* SPDX-License-Identifier: BSD-3-Clause */
/* The block status of a dirty bitmap read one 64-bit word at a time (a
 * checkpoint's, a qcow2 image's): runs of equal bits as extents. */
#ifndef BLOCKPORT_BITRUN_H
#define BLOCKPORT_BITRUN_H

#include <stdbool.h>
#include <stdint.h>

#include "blockdev.h"

/* Word W of the bitmap B (bit G is bit G % 64 of word G / 64). */
typedef uint64_t bitrun_word_fn(const void *b, uint64_t w);

/* The first bit in (G, END) that is not SET (bit G itself is), or END. */
uint64_t bitrun_end(bitrun_word_fn *word, const void *b, uint64_t g,
                    uint64_t end, bool set);

/* Extents of [OFF, OFF+LEN) for bitmap B of NBITS bits, each bit
 * covering 2^GRAN_BITS bytes: BD_CTX_DIRTY where set, 0 where clear
 * (depth 0), one run per extent, into EXT; only the first with
 * BD_F_REQ_ONE in FLAGS.  Returns 0 or bd_extents_add()'s error. */
int bitrun_extents(bitrun_word_fn *word, const void *b, uint64_t nbits,
                   unsigned gran_bits, uint64_t len, uint64_t off,
                   uint32_t flags, struct bd_extents *ext);

#endif
