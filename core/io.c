/* SPDX-License-Identifier: BSD-3-Clause */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
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

int io_preallocate(int fd, uint64_t off, uint64_t len, bool write_zeroes) {
  if (len == 0)
    return 0;
  if (!write_zeroes) {
    int e = posix_fallocate(fd, (off_t)off, (off_t)len);
    return -e;
  }
  size_t chunk = 1u << 20;
  uint8_t *z = calloc(1, chunk);
  int r = z ? 0 : -ENOMEM;
  for (uint64_t done = 0; r == 0 && done < len;) {
    size_t n = len - done < chunk ? (size_t)(len - done) : chunk;
    r = io_pwrite_all(fd, z, n, off + done);
    done += n;
  }
  free(z);
  return r;
}

int io_copy_range(int sfd, uint64_t soff, int dfd, uint64_t doff, uint64_t len,
                  uint64_t *done) {
  int f = fault_check(FAULT_WRITE, doff, len);
  if (f < 0)
    return f;
  for (*done = 0; *done < len;) {
    loff_t si = (loff_t)(soff + *done), di = (loff_t)(doff + *done);
    ssize_t c = copy_file_range(sfd, &si, dfd, &di, (size_t)(len - *done), 0);
    if (c < 0 && errno == EINTR)
      continue;
    if (c <= 0) /* 0: the source file ends here */
      return c < 0 ? -errno : -ENOTSUP;
    *done += (uint64_t)c;
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

void io_dio_alignment(int fd, uint32_t *off, uint32_t *mem) {
  struct statx sx;
  struct stat st;
  *off = *mem = 4096; /* where nothing says: a multiple of every sector */
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0) {
    *off = sx.stx_dio_offset_align;
    *mem = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : *off;
    return;
  }
  int ssz = 0;
  if (fstat(fd, &st) == 0 && S_ISBLK(st.st_mode) &&
      ioctl(fd, BLKSSZGET, &ssz) == 0 && ssz > 0)
    *off = *mem = (uint32_t)ssz;
}

/* BUF itself when it sits on a multiple of MEM, else a page-aligned copy
 * of LEN bytes (copied from BUF when COPY).  NULL: out of memory. */
static void *dio_buffer(const void *buf, size_t len, uint32_t mem, bool copy) {
  if ((uintptr_t)buf % mem == 0)
    return (void *)buf;
  void *b = NULL;
  if (posix_memalign(&b, 4096, len ? len : 1) != 0)
    return NULL;
  if (copy)
    memcpy(b, buf, len);
  return b;
}

int io_dio_pread(int fd, void *buf, size_t len, uint64_t off, uint32_t mem) {
  int f = fault_check(FAULT_READ, off, len);
  if (f < 0)
    return f;
  uint8_t *b = dio_buffer(buf, len, mem, false);
  if (!b)
    return -ENOMEM;
  size_t done = 0;
  int r = 0;
  while (done < len) {
    ssize_t n = pread(fd, b + done, len - done, (off_t)(off + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      r = -errno;
      break;
    }
    bool short_read = (size_t)n < len - done;
    done += (size_t)n;
    /* Short: the end of the file, which need not be aligned, and a
     * second read from there would be refused. */
    if (short_read) {
      memset(b + done, 0, len - done);
      break;
    }
  }
  if (b != (uint8_t *)buf) {
    if (r == 0)
      memcpy(buf, b, len);
    free(b);
  }
  return r;
}

int io_dio_pwrite(int fd, const void *buf, size_t len, uint64_t off,
                  uint32_t mem) {
  void *b = dio_buffer(buf, len, mem, true);
  if (!b)
    return -ENOMEM;
  int r = io_pwrite_all(fd, b, len, off);
  if (b != buf)
    free(b);
  return r;
}

char *io_absolute_path(const char *path) {
  if (path[0] == '/')
    return strdup(path);
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd))
    return NULL;
  char *out;
  return asprintf(&out, "%s/%s", cwd, path) < 0 ? NULL : out;
}
