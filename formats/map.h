/* SPDX-License-Identifier: BSD-3-Clause */
/* Where the bytes of an image live, layer by layer: what `qemu-img map`
 * prints, for `blockport map`.  A tool's view: it knows the formats. */
#ifndef BLOCKPORT_MAP_H
#define BLOCKPORT_MAP_H

#include <stdbool.h>
#include <stdint.h>

struct bd;

struct map_entry {
  uint64_t start, length;
  unsigned depth;  /* layer the answer came from: 0 is the image itself */
  bool present;    /* allocated in some layer */
  bool zero, data; /* reads as zeroes; holds data */
  bool has_offset;
  uint64_t offset;  /* host offset in the layer's file */
  const char *file; /* that file */
};

/* The first run of [off, off+len) with one answer (its length may be
 * shorter than LEN).  DEPTH is the layer of BD.  Returns 0 or -errno. */
int map_first(struct bd *bd, unsigned depth, uint64_t off, uint64_t len,
              struct map_entry *e);
/* The run at OFF as one answer of QEMU's block status gives it, for
 * `qemu-img compare -s`, which compares those answers whole: the first
 * runs of map_first() joined while they say the same (host offsets
 * following on, one compressed cluster at a time), not past a multiple of
 * 2^STOP_BITS (0: none), where QEMU's driver stops (a qcow2 image: the
 * coverage of an L2 table).  Returns 0 or -errno. */
int map_status_run(struct bd *bd, uint64_t off, unsigned stop_bits,
                   struct map_entry *e);
/* For formats/: qcow2's own first run, one layer at a time. */
int qcow2_map(struct bd *bd, unsigned depth, uint64_t off, uint64_t len,
              struct map_entry *e);

#endif
