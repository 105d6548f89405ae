/* SPDX-License-Identifier: BSD-3-Clause */
/* Probing files (the pure magic table is probe.c). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/io.h"
#include "probe.h"

void probe_set_unsupported_error(const char *path, const char *fmt) {
  bd_set_error("%s: %s image: not supported; convert it with qemu-img "
               "convert",
               path, fmt);
}

int probe_file(const char *path, const char **fmt) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    bd_set_error("%s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
    close(fd);
    bd_set_error("%s: not a regular file or block device", path);
    return -EINVAL;
  }
  uint8_t head[PROBE_HEAD];
  size_t n = sizeof head;
  if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < n)
    n = (size_t)st.st_size;
  int r = io_pread_zero(fd, head, n, 0);
  close(fd);
  if (r < 0) {
    bd_set_error("%s: cannot read: %s", path, strerror(-r));
    return r;
  }
  *fmt = probe_format(head, n, path);
  return 0;
}
