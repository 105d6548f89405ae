/* SPDX-License-Identifier: BSD-3-Clause */
/* Copying ranges of one image into another with many requests in flight,
 * for `commit` (a chain's upper layers into its base) and `rebase` (what
 * an image's old backing chain shows where the new one differs, into the
 * image).  lcopy_walk() walks block status over an image and hands over
 * the extents its caller picks; the calls below take ranges directly. */
#ifndef BLOCKPORT_CLI_LAYER_COPY_H
#define BLOCKPORT_CLI_LAYER_COPY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/blockdev.h"

#define LCOPY_SLOTS 16

struct lcopy_slot;

struct lcopy {
  /* Set by the caller before lcopy_start(). */
  struct bd *src, *dst;
  /* Compare mode (rebase): a grain is written only where SRC differs from
   * CMP (NULL: zeroes; past CMP's end: zeroes). */
  bool compare;
  struct bd *cmp;
  uint64_t grain;      /* compared per this much (a cluster) */
  uint64_t rate;       /* bytes per second at most (0: no limit) */
  uint32_t zero_flags; /* flags of the zero writes (BD_F_MAY_TRIM) */
  /* Requests in flight at most (0: LCOPY_SLOTS).  Allocating writes into
   * one qcow2 image contend for its metadata: a few go faster than many
   * (measured: docs/BENCHMARKS.md). */
  unsigned slots_max;
  /* Internal. */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct lcopy_slot *slots;
  struct lcopy_slot *free[LCOPY_SLOTS];
  unsigned nfree, nslots;
  uint64_t chunk;
  int err;
  char errmsg[BD_REQ_ERRMSG_MAX + 64];
  uint64_t done;      /* bytes handled */
  uint64_t submitted; /* bytes read so far, for the rate limit */
  uint64_t t0_ns;
};

/* Buffers and slots.  0, or -ENOMEM. */
int lcopy_start(struct lcopy *c);
/* Copy [OFF, OFF+LEN): read from SRC (and CMP), write to DST. */
int lcopy_data(struct lcopy *c, uint64_t off, uint64_t len);
/* [OFF, OFF+LEN) of SRC reads as zeroes: a zero write on DST (compare
 * mode: only where CMP does not read as zeroes already). */
int lcopy_zero(struct lcopy *c, uint64_t off, uint64_t len);
/* Count LEN bytes as handled without I/O. */
void lcopy_skip(struct lcopy *c, uint64_t len);
/* Bytes handled so far. */
uint64_t lcopy_done(struct lcopy *c);
/* Wait for every request; the first error (its message in
 * lcopy.errmsg), or 0.  Frees what lcopy_start() took. */
int lcopy_finish(struct lcopy *c);

struct progress;
/* Whether an extent at allocation DEPTH of the walked image's block
 * status is to be copied. */
typedef bool lcopy_pick_fn(const void *opaque, uint32_t depth);

/* The whole copy: lcopy_start(), then block status over WALKED (its whole
 * size, a step at a time), each extent PICK chooses copied (zeroes as
 * zero writes) and the rest skipped, PROG advanced; then lcopy_finish().
 * Errors are printed as CMD's; a failed block status as BS_WHAT (NULL:
 * "block status at offset N") followed by its message.  0 or -errno. */
int lcopy_walk(struct lcopy *c, struct bd *walked, const char *cmd,
               const char *bs_what, lcopy_pick_fn *pick, const void *opaque,
               struct progress *prog);

#endif
