/* SPDX-License-Identifier: BSD-3-Clause */
/* qemu-img's -p progress, as it prints it: "    (P/100%)\r" on stdout,
 * P with two decimals, a line each time P moves by more than a step (and
 * at 0 and 100), and a newline at the end. */
#ifndef BLOCKPORT_CLI_PROGRESS_H
#define BLOCKPORT_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct progress {
  bool on;
  float step; /* percent between lines */
  float last;
};

/* Start (prints 0 when ON). */
void progress_init(struct progress *p, bool on, float step);
/* DONE of TOTAL bytes. */
void progress_at(struct progress *p, uint64_t done, uint64_t total);
/* The newline that ends the lines (when ON). */
void progress_end(struct progress *p);

#endif
