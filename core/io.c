/* SPDX-License-Identifier: BSD-3-Clause */
#include "io.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"

int io_pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
  const uint8_t *p = buf;
  int f = fault_check(FAULT_WRITE, off, len);
  if (f < 0)
    return f;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

static int pread_loop(int fd, void *buf, size_t len, uint64_t off,
                      bool zero_eof) {
  uint8_t *p = buf;
  int f = fault_check(FAULT_READ, off, len);
  if (f < 0)
    return f;
  while (len > 0) {
    ssize_t n = pread(fd, p, len, (off_t)off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0) {
      if (!zero_eof)
        return -EIO;
      memset(p, 0, len);
      return 0;
    }
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

int io_pread_zero(int fd, void *buf, size_t len, uint64_t off) {
  return pread_loop(fd, buf, len, off, true);
}

int io_pread_exact(int fd, void *buf, size_t len, uint64_t off) {
  return pread_loop(fd, buf, len, off, false);
}

int io_fdatasync(int fd) {
  int f = fault_check(FAULT_SYNC, 0, 0);
  if (f < 0)
    return f;
  return fdatasync(fd) < 0 ? -errno : 0;
}
