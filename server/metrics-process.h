/* SPDX-License-Identifier: BSD-3-Clause */
/* The process' own figures for process_cpu_seconds_total,
 * process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds and process_max_fds (Prometheus' standard names). */
#ifndef BLOCKPORT_SERVER_METRICS_PROCESS_H
#define BLOCKPORT_SERVER_METRICS_PROCESS_H

#include <stdbool.h>
#include <stdint.h>

struct metrics_process {
  uint64_t cpu_us; /* user and system */
  uint64_t resident_bytes;
  uint64_t virtual_bytes;
  uint64_t open_fds;
  uint64_t max_fds; /* the soft limit */
};

/* Fill P from /proc/self and getrusage().  0, or -1 when the kernel would
 * not say (no /proc): the metrics are then left out. */
int metrics_process_read(struct metrics_process *p);

#endif
