/* SPDX-License-Identifier: BSD-3-Clause */
/* The state of the persistent bitmaps an image opened for writing keeps
 * (dirty-bitmaps.c), shared with bitmap-live.c, which starts and stops
 * bitmaps while the image is written. */
#ifndef BLOCKPORT_QCOW2_DIRTY_BITMAPS_H
#define BLOCKPORT_QCOW2_DIRTY_BITMAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitmap.h"
#include "core/source.h"
#include "qcow2-internal.h"

struct tracked {
  const struct qcow2_bitmap *b;
  bool enabled;       /* tracks writes; a disabled one only follows resizes */
  uint32_t size;      /* table entries (b->table_size until a resize) */
  uint64_t table_off; /* where the table is written at close */
  bool moved;         /* a resize gave it a new table: write it whole */
  uint64_t zero_from; /* bits from here to their cluster's end are cleared
                       * on disk at close (past an old or new end) */
  uint64_t *table;    /* host-endian entries */
  uint64_t *bits;     /* set since open: size clusters' worth */
  uint8_t *touched;   /* per table entry: bits were set there */
  uint64_t nbits;     /* bits that cover the image */
};

/* A range freed once the directory no longer points at it. */
struct stale {
  uint64_t off, len;
};

struct qcow2_bitmaps {
  /* The parsed directory (q->h.bitmaps_nb entries), the flags as they
   * were at open: IN_USE there means inconsistent.  A bitmap started since
   * has AUTO; bitmap_enable() changes AUTO here and in RAW. */
  struct qcow2_bitmap *dir;
  uint8_t *raw; /* the directory as stored (IN_USE set while tracked) */
  struct tracked *t;
  uint32_t nt;
  struct stale *stale;
  size_t nstale;
};

/* dirty-bitmaps.c.  Q's bitmaps loaded (q->bitmaps set, with nothing more
 * tracked), for an image that tracks none. */
int qcow2_bitmaps_load(struct qcow2dev *q);
/* Take directory entry B into tracking as T: its table read and checked,
 * its bits in memory (zero). */
int qcow2_bitmaps_track(struct qcow2dev *q, struct tracked *t,
                        const struct qcow2_bitmap *b);

/* bitmap-edit.c.  New bitmap metadata holding BUF (BYTES, zero-padded to
 * whole clusters) in new clusters at *OFF (metadata lock held).  The
 * header pointed at the directory of NB bitmaps (SIZE bytes at OFF),
 * crash-safely, then read back into *H. */
int qcow2_bm_write_new(struct qcow2dev *q, const void *buf, uint64_t bytes,
                       uint64_t *off);
int qcow2_bm_write_header(struct qcow2dev *q, uint32_t nb, uint64_t size,
                          uint64_t off, struct qcow2_header *h);

/* bitmap-live.c: the bd_ops bitmap_* of a qcow2 image (core/blockdev.h). */
int qcow2_bitmap_resume(struct bd *bd, char **name);
int qcow2_bitmap_start(struct bd *bd, const char *name, uint32_t granularity);
int qcow2_bitmap_enable(struct bd *bd, const char *name, bool on);
int qcow2_bitmap_bits(struct bd *bd, const char *name,
                      int (*dirty)(void *opaque, uint64_t off, uint64_t len),
                      void *opaque);

#endif
