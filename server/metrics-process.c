/* SPDX-License-Identifier: BSD-3-Clause */
/* The standard process_* metrics of Prometheus' client libraries, read
 * from the kernel: what a dashboard expects of any exporter. */
#include "metrics-process.h"

#include <dirent.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

/* Entries of /proc/self/fd, less the one the count itself opens. */
static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  long n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

int metrics_process_read(struct metrics_process *p) {
  struct rusage ru;
  unsigned long long vm_pages = 0, rss_pages = 0;
  struct rlimit rl;
  FILE *f = fopen("/proc/self/statm", "re");
  bool statm = f && fscanf(f, "%llu %llu", &vm_pages, &rss_pages) == 2;
  if (f)
    fclose(f);
  long page = sysconf(_SC_PAGESIZE), fds = open_fds();
  if (!statm || page <= 0 || fds < 0 || getrusage(RUSAGE_SELF, &ru) < 0 ||
      getrlimit(RLIMIT_NOFILE, &rl) < 0)
    return -1;
  p->cpu_us =
      (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec +
      (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
  p->resident_bytes = rss_pages * (uint64_t)page;
  p->virtual_bytes = vm_pages * (uint64_t)page;
  p->open_fds = (uint64_t)fds;
  p->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
  return 0;
}
