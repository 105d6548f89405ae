/* SPDX-License-Identifier: BSD-3-Clause */
/* io_uring for the sources on local files (--aio io_uring).
 *
 * A source hands a request's reads or writes (or its fdatasync) to
 * uring_start() instead of the worker pool.  Which ring takes them
 * depends on the submitting thread:
 *
 * - A front end's event-loop thread that declared itself a poller
 *   (bd_poller_begin(), core/blockdev.h) gets a ring of its own.  It
 *   submits without a lock and reaps its completions itself when the
 *   ring's descriptor (bd_poller_fd()) is readable.  This is the fast
 *   path: the kernel completes an io_uring read or write as task work of
 *   the thread that submitted it, waking that thread anyway, so the same
 *   thread reaping costs no further wake-up or hand-off.
 * - Any other thread (FUSE, vhost, a worker) shares one ring per process,
 *   submitting under a lock, and a reaper thread ("bp-uring-reap")
 *   completes its requests.
 *
 * Between bd_plug_begin() and bd_plug_end() a ring's submission waits for
 * the end of the plug: one io_uring_enter for a batch of requests.
 * Completions are delivered as one bd_batch (bd_batch_begin()), so a
 * front end can answer them with one send.
 *
 * When the kernel refuses io_uring (an old kernel, seccomp,
 * kernel.io_uring_disabled) uring_available() says no, logging why once
 * (at info level: the fallback loses nothing),
 * and the sources use the worker pool. */
#ifndef BLOCKPORT_CORE_URING_H
#define BLOCKPORT_CORE_URING_H

#include <stdbool.h>
#include <stdint.h>

#include "core/blockdev.h"

/* One piece of a request on the file: its bytes at OFF. */
struct uring_seg {
  void *buf;
  uint64_t off;
  uint32_t len;
};

enum uring_op {
  URING_READ,
  URING_WRITE,
  URING_WRITE_DSYNC, /* durable when complete (FUA) */
  URING_FDATASYNC,   /* no segments */
};

/* The most segments one request may have. */
#define URING_MAX_SEGS 64

/* Whether io_uring works in this process: tried once; when it does not,
 * one log line says why and that the worker pool is used instead. */
bool uring_available(void);

/* Start REQ as OP on FD over SEGS (N of them; none for URING_FDATASYNC).
 * DIRECT: FD has O_DIRECT, and a short read means the end of the file.
 * A read past the end of the file reads zeroes; a short transfer
 * otherwise continues where it stopped.  Returns 0 when started (REQ's
 * done() is called later, once), or -EAGAIN when the rings are full or
 * unavailable: the caller then runs REQ another way (the worker pool). */
int uring_start(struct bd_req *req, enum uring_op op, int fd, bool direct,
                const struct uring_seg *segs, unsigned n);

#endif
