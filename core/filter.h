/* SPDX-License-Identifier: BSD-3-Clause */
/* Filters: a source that wraps another source and may intercept each
 * request (nbdkit's filters, with INNER as their next_ops).
 *
 * bd_filter_new(INNER, OPS, STATE) makes a struct bd that users talk to
 * instead of INNER.  It has INNER's size, caps (aligned_only and min_block
 * included: a request of any range goes on to INNER's aligner), named
 * contexts and cache mode, and is BD_EXEC_ASYNC: OPS->submit() sees each
 * request it intercepts in the submitting thread, and ends it with
 * bd_filter_forward() (on to INNER, at once or later, from any thread), or
 * bd_complete() (answered by the filter itself), or hands it to a pool
 * worker first with bd_filter_offload() (for work that blocks).  What it
 * does not intercept is forwarded unchanged.
 *
 * Everything else passes through: flush at close, list_exports,
 * hold_locks, and INNER's persistent bitmaps (bd_ops bitmap_*, for a
 * checkpoint over a filter over qcow2).  Connections: when INNER keeps
 * per-connection state or cancels requests (bd_ops conn_open or cancel), each
 * connection of the filter opens one of INNER, forwarded requests name it, and
 * cancelling the filter's connection cancels INNER's.  Filters stack: INNER may
 * be a filter.
 *
 * Ownership of INNER passes to the filter on success; closing the filter
 * closes INNER, or hands it to OPS->close().  Filters here: the
 * copy-before-write of checkpoint views (core/checkpoint.c), copy-on-read
 * over qcow2 (formats/qcow2/copy-on-read.c). */
#ifndef BLOCKPORT_FILTER_H
#define BLOCKPORT_FILTER_H

#include <stdbool.h>

#include "blockdev.h"
#include "source.h"

/* Which requests a filter's submit() sees (bd_filter_ops.intercept). */
#define BD_FILTER_CMD(c) (1u << (c))
#define BD_FILTER_READS BD_FILTER_CMD(BD_READ)
/* A filter that guards writes: everything that changes data. */
#define BD_FILTER_WRITES                                                       \
  (BD_FILTER_CMD(BD_WRITE) | BD_FILTER_CMD(BD_ZERO) | BD_FILTER_CMD(BD_TRIM))
#define BD_FILTER_ALL 0xffffffffu

struct bd_filter_ops {
  const char *name;
  unsigned intercept; /* BD_FILTER_*: what submit() sees */
  /* REQ (validated by the core) to end as the header says; NULL: every
   * request forwarded. */
  void (*submit)(struct bd *bd, struct bd_req *req);
  /* Optional: the filter device closes (no request in flight): free
   * STATE, and close INNER now or later (INNER may outlive the filter:
   * a checkpoint's views read it).  NULL: INNER is closed. */
  void (*close)(void *state, struct bd *inner);
};

/* Wraps INNER.  NULL with bd_errmsg() (no memory), INNER then still the
 * caller's. */
struct bd *bd_filter_new(struct bd *inner, const struct bd_filter_ops *ops,
                         void *state);
/* The filter's ops when BD is a filter device, else NULL. */
const struct bd_filter_ops *bd_filter_ops_of(const struct bd *bd);
struct bd *bd_filter_inner(const struct bd *bd);
void *bd_filter_state(const struct bd *bd);

/* Runs when a forwarded request finished on INNER, before REQ completes,
 * in the thread that completed it; returns the error REQ completes with
 * (ERR, or another). */
typedef int bd_filter_after_fn(struct bd_req *req, int err, void *arg);
/* Sends REQ (a request of the filter device) on to INNER as it is; REQ
 * completes when INNER's request does, with INNER's error and message,
 * after AFTER(REQ, err, ARG) when AFTER is not NULL. */
void bd_filter_forward(struct bd_req *req, bd_filter_after_fn *after,
                       void *arg);
/* Runs WORK(filter, REQ) on a pool worker, where it may block (reading
 * INNER with bd_run(), say); WORK then ends REQ as submit() would.
 * Returns 0, or -ENOMEM with REQ still the caller's to end. */
int bd_filter_offload(struct bd_req *req,
                      void (*work)(struct bd *bd, struct bd_req *req));

#endif
