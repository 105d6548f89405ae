/* SPDX-License-Identifier: BSD-3-Clause */
/* File I/O that finishes the job: restarts on EINTR and short transfers. */
#ifndef BLOCKPORT_IO_H
#define BLOCKPORT_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Write all LEN bytes at OFF.  Returns 0 or -errno. */
int io_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* Read LEN bytes at OFF; what lies past the end of the file reads as
 * zeroes.  Returns 0 or -errno. */
int io_pread_zero(int fd, void *buf, size_t len, uint64_t off);
/* Read exactly LEN bytes at OFF: the end of the file is -EIO. */
int io_pread_exact(int fd, void *buf, size_t len, uint64_t off);
/* Give [OFF, OFF+LEN) of FD space on disk: posix_fallocate, or with
 * WRITE_ZEROES zeroes written (qemu's preallocation=falloc and full).
 * Returns 0 or -errno. */
int io_preallocate(int fd, uint64_t off, uint64_t len, bool write_zeroes);
/* copy_file_range LEN bytes from SFD at SOFF to DFD at DOFF; *DONE says
 * how many went.  -ENOTSUP when the source file ends first; else 0 or the
 * kernel's -errno (-EXDEV, -EINVAL, -EOPNOTSUPP: copy through memory). */
int io_copy_range(int sfd, uint64_t soff, int dfd, uint64_t doff, uint64_t len,
                  uint64_t *done);
/* fdatasync.  Returns 0 or -errno. */
int io_fdatasync(int fd);
/* All of them go through fault_check() (core/fault.h). */

/* The alignment O_DIRECT needs on FD: of file offsets and lengths (*OFF)
 * and of memory (*MEM).  From statx(STATX_DIOALIGN), a device's logical
 * block size, or 4096 where neither says. */
void io_dio_alignment(int fd, uint32_t *off, uint32_t *mem);
/* io_pread_zero() and io_pwrite_all() on an O_DIRECT descriptor: OFF and
 * LEN aligned, BUF anywhere (an aligned bounce is used when it is not on
 * a multiple of MEM). */
int io_dio_pread(int fd, void *buf, size_t len, uint64_t off, uint32_t mem);
int io_dio_pwrite(int fd, const void *buf, size_t len, uint64_t off,
                  uint32_t mem);

/* PATH made absolute against the current directory (a copy when it is
 * already), so that a later chdir (a daemon's) cannot change what it
 * names.  NULL when memory or getcwd() fails. */
char *io_absolute_path(const char *path);

#endif
