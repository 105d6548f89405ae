/* SPDX-License-Identifier: BSD-3-Clause */
/* qemu-img's -p progress lines (progress.h). */
#include <stdio.h>

#include "progress.h"

static void print_at(struct progress *p, float pct) {
  p->last = pct;
  printf("    (%3.2f/100%%)\r", (double)pct);
  fflush(stdout);
}

void progress_init(struct progress *p, bool on, float step) {
  *p = (struct progress){.on = on, .step = step};
  if (on)
    print_at(p, 0);
}

void progress_at(struct progress *p, uint64_t done, uint64_t total) {
  if (!p->on)
    return;
  float pct = total ? (float)((double)done * 100.0 / (double)total) : 100.0f;
  pct = pct > 100.0f ? 100.0f : pct;
  if (pct > p->last + p->step || pct == 100.0f)
    print_at(p, pct);
}

void progress_end(struct progress *p) {
  if (p->on) {
    putchar('\n');
    fflush(stdout);
  }
}
