/* SPDX-License-Identifier: BSD-3-Clause */
/* io_uring in a build without it (BLOCKPORT_IO_URING=OFF), compiled
 * instead of uring.c: never available, so local images use the worker
 * pool (--aio threads) and pollers have no ring to watch. */
#include "uring.h"

#include <errno.h>

bool uring_available(void) {
  return false;
}

int uring_start(struct bd_req *req, enum uring_op op, int fd, bool direct,
                const struct uring_seg *segs, unsigned n) {
  (void)req;
  (void)op;
  (void)fd;
  (void)direct;
  (void)segs;
  (void)n;
  return -EAGAIN;
}

void bd_poller_begin(void) {}

int bd_poller_fd(void) {
  return -1;
}

bool bd_poller_run(void) {
  return false;
}

void bd_poller_end(void) {}
