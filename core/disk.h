/* SPDX-License-Identifier: BSD-3-Clause */
/* A disk as a front end sees it: one struct bd, and requests of any offset
 * and length made into requests the device accepts.
 *
 * - READ and WRITE longer than the device's maximum block (or BD_MAX_IO)
 *   are split, and complete when every piece has.
 * - Where the device has a minimum block (caps.min_block > 1), a read of
 *   an unaligned range reads the aligned range around it into a bounce
 *   buffer; an unaligned write or zero reads the partial blocks at its
 *   edges, patches them and writes them back.  Writes and zeroes then hold
 *   a lock on the aligned blocks they cover, so two writes that share a
 *   block (one of them read-modify-writing it) do not undo each other.
 *   Trim shrinks to the aligned blocks inside its range (it is advisory);
 *   block status widens to the aligned range.
 * - With a minimum block of 1 a request goes straight to the device: no
 *   allocation, no lock.
 *
 * The caller validates ranges (inside the disk) first.  done() is called
 * exactly once, on any thread, as for bd_submit(). */
#ifndef BLOCKPORT_CORE_DISK_H
#define BLOCKPORT_CORE_DISK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/blockdev.h"

#define DISK_MAX_ALIGN (64u * 1024) /* largest minimum block we accept */

struct disk_req;
struct disk_piece;
typedef void disk_done_fn(struct disk_req *r, int err);

struct disk {
  struct bd *bd;
  uint64_t size;
  uint32_t align; /* the device's minimum block (1: byte granular) */
  uint32_t maxio; /* largest READ/WRITE piece, a multiple of align */
  /* Completed writes, zeroes and trims: a generation number for caches
   * of allocation (st_blocks). */
  atomic_uint_fast64_t writes;
  /* Range locks, only with align > 1. */
  pthread_mutex_t lock;
  struct disk_req *locked, *waiting;
};

struct disk_req {
  /* Set by the caller. */
  enum bd_cmd cmd;
  uint32_t flags; /* BD_F_* */
  uint64_t offset, length;
  void *buf;                  /* READ: destination; WRITE: source */
  struct bd_extents *extents; /* BLOCK_STATUS: reset to start at the
                                 aligned offset, which may be before
                                 OFFSET */
  disk_done_fn *done;
  /* When done() gets an error: this request's message. */
  char errmsg[BD_REQ_ERRMSG_MAX];

  /* Private to disk.c while in flight. */
  struct disk *disk;
  struct bd_req one; /* the direct path: a single device request */
  struct disk_piece *pieces;
  size_t npieces;
  uint8_t *bounce;
  uint64_t lstart, lend;  /* the aligned range */
  struct disk_req *lnext; /* on the locked or waiting list */
  struct disk_req *rnext; /* on a list of waiters to start */
  atomic_int pending, err;
  int phase;
};

/* Take BD (not owned: the caller closes it after disk_fini). Returns 0, or
 * -EINVAL with a message in bd_errmsg() when its block sizes are not
 * usable. */
int disk_init(struct disk *d, struct bd *bd);
void disk_fini(struct disk *d);

void disk_submit(struct disk *d, struct disk_req *r);
/* Run a request to completion in the calling thread: 0 or -errno. */
int disk_run(struct disk *d, struct disk_req *r);

/* The core's own aligner (struct bd's aligner, for sources that set
 * caps.aligned_only): does REQ need it, and run REQ through it. */
bool disk_wants(const struct bd *bd, const struct bd_req *req);
void disk_submit_for(struct bd *bd, struct bd_req *req);
int disk_run_for(struct bd *bd, struct bd_req *req);
int disk_pread(struct disk *d, void *buf, uint64_t len, uint64_t off);

#endif
