/* SPDX-License-Identifier: BSD-3-Clause */
/* Request counters of one front end's disk (an NBD export, a mount, a
 * vhost-user-blk device) for --metrics: by command, a latency histogram,
 * bytes moved and what is in flight, kept with relaxed atomics (they need
 * no ordering with anything else).  The front end counts; server/metrics.c
 * renders them.  A front end without --metrics has no struct metrics_reqs
 * and takes no timestamps. */
#ifndef BLOCKPORT_REQSTATS_H
#define BLOCKPORT_REQSTATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum metrics_cmd {
  METRICS_READ,
  METRICS_WRITE,
  METRICS_FLUSH,
  METRICS_TRIM,
  METRICS_WRITE_ZEROES,
  METRICS_BLOCK_STATUS,
  METRICS_CACHE,
  METRICS_OTHER, /* rejected commands of unknown type */
  METRICS_NCMDS
};

/* Latency bucket bounds in ns: 1 µs to 10 s, four per decade (1, 1.778,
 * 3.162, 5.623 times a power of ten); the last bucket is +Inf. */
#define METRICS_NBOUNDS 29
#define METRICS_NBUCKETS (METRICS_NBOUNDS + 1)
extern const uint64_t metrics_bounds_ns[METRICS_NBOUNDS];
/* The bucket a request of NS nanoseconds falls in. */
size_t metrics_bucket_of(uint64_t ns);
/* Monotonic nanoseconds. */
uint64_t metrics_now_ns(void);

struct metrics_cmd_stats {
  atomic_uint_least64_t bucket[METRICS_NBUCKETS]; /* not cumulative */
  atomic_uint_least64_t sum_ns;
  atomic_uint_least64_t errors;
};

struct metrics_reqs {
  atomic_uint_least64_t inflight;
  atomic_uint_least64_t inflight_bytes; /* of reads and writes */
  atomic_uint_least64_t bytes_read, bytes_written;
  struct metrics_cmd_stats cmd[METRICS_NCMDS];
};

/* A request of command CMD for LENGTH bytes has arrived: counted in
 * flight (with its bytes, for a read or write).  Returns its start time. */
uint64_t metrics_req_start(struct metrics_reqs *r, enum metrics_cmd cmd,
                           uint64_t length);
/* That request is answered (or will never be): START and LENGTH as given
 * to metrics_req_start(), ERR when it failed.  A successful read or write
 * counts LENGTH bytes moved. */
void metrics_req_done(struct metrics_reqs *r, enum metrics_cmd cmd,
                      uint64_t start, uint64_t length, bool err);
/* That request will be answered by another session (a vhost request its
 * front end left behind, to be submitted again): out of flight, not
 * counted as answered. */
void metrics_req_dropped(struct metrics_reqs *r, enum metrics_cmd cmd,
                         uint64_t length);
/* Count a finished request that took NS nanoseconds (for tests). */
void metrics_observe(struct metrics_reqs *r, enum metrics_cmd cmd, uint64_t ns,
                     uint64_t bytes, bool err);

#endif
