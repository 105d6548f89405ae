/* SPDX-License-Identifier: BSD-3-Clause */
/* The snapshot table as qemu-img prints it (see snapshot-table.h). */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "formats/qcow2/snapshot.h"

#include "snapshot-table.h"

/* Sizes as QEMU's size_to_str: three significant digits, binary units. */
void cli_human_size(char *buf, size_t len, uint64_t v) {
  static const char *const suffix[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  double x = (double)v / (1000.0 / 1024.0);
  int e = 0;
  while (x >= 1.0) { /* frexp's exponent without libm */
    x /= 2;
    e++;
  }
  int i = e > 0 ? (e - 1) / 10 : 0;
  if (i > 6)
    i = 6;
  snprintf(buf, len, "%0.3g %sB", (double)v / (double)(1ull << (i * 10)),
           suffix[i]);
}

void cli_snapshot_line(const struct qcow2_snapshot *s) {
  char size[32], date[32], clock[32], icount[24] = "";
  cli_human_size(size, sizeof size, s->vm_state_size);
  time_t t = (time_t)s->date_sec;
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
  uint64_t secs = s->vm_clock_nsec / 1000000000;
  snprintf(clock, sizeof clock, "%02d:%02d:%02d.%03d", (int)(secs / 3600),
           (int)((secs / 60) % 60), (int)(secs % 60),
           (int)((s->vm_clock_nsec / 1000000) % 1000));
  if (s->icount != UINT64_MAX)
    snprintf(icount, sizeof icount, "%" PRIu64, s->icount);
  printf("%-9s %-16s %8s%20s%13s%11s\n", s->id, s->name, size, date, clock,
         icount);
}

void cli_snapshot_header(void) {
  printf("Snapshot list:\n%-10s%-17s%8s%20s%13s%11s\n", "ID", "TAG", "VM SIZE",
         "DATE", "VM CLOCK", "ICOUNT");
}
