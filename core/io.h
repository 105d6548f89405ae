/* SPDX-License-Identifier: BSD-3-Clause */
/* File I/O that finishes the job: restarts on EINTR and short transfers. */
#ifndef BLOCKPORT_IO_H
#define BLOCKPORT_IO_H

#include <stddef.h>
#include <stdint.h>

/* Write all LEN bytes at OFF.  Returns 0 or -errno. */
int io_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* Read LEN bytes at OFF; what lies past the end of the file reads as
 * zeroes.  Returns 0 or -errno. */
int io_pread_zero(int fd, void *buf, size_t len, uint64_t off);
/* Read exactly LEN bytes at OFF: the end of the file is -EIO. */
int io_pread_exact(int fd, void *buf, size_t len, uint64_t off);
/* fdatasync.  Returns 0 or -errno. */
int io_fdatasync(int fd);
/* All three go through fault_check() (core/fault.h). */

#endif
