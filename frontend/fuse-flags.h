/* SPDX-License-Identifier: BSD-3-Clause */
/* Reply flags the kernel knows and libfuse 3.14 cannot send.
 *
 * - FUSE_DIRECT_IO_ALLOW_MMAP (INIT, flags2; Linux 6.6): a FOPEN_DIRECT_IO
 *   file may be mapped shared, the kernel keeping the mapping's pages
 *   coherent with direct reads and writes.  libfuse learnt it in 3.16;
 *   3.14 builds the INIT reply from a 32-bit want mask it maps bit by bit.
 * - FOPEN_PARALLEL_DIRECT_WRITES (OPEN; Linux 6.2): direct writes to the
 *   file take the inode lock shared, so a synchronous write waiting for a
 *   slow or lost source does not hold up the others (libfuse 3.15).
 *
 * fflags_install() puts libfuse's custom I/O (3.13 and later) on the
 * mounted session: plain read(2) and writev(2) on /dev/fuse, except that
 * the INIT reply gets ALLOW_MMAP when the kernel's INIT offered it, and an
 * OPEN reply sent with fflags_reply_open() gets PARALLEL_DIRECT_WRITES. */
#ifndef BLOCKPORT_FRONTEND_FUSE_FLAGS_H
#define BLOCKPORT_FRONTEND_FUSE_FLAGS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct fuse_session;
struct fuse_file_info;
typedef struct fuse_req *fuse_req_t;

struct fuse_flags_hook {
  bool want_mmap;              /* ask for ALLOW_MMAP when offered */
  atomic_bool offered;         /* the kernel's INIT offered ALLOW_MMAP */
  atomic_bool init_done;       /* the INIT reply went out */
  atomic_uint_fast64_t unique; /* the INIT request's id, 0 before it */
};

/* On a session after fuse_session_mount(), whose userdata points at a
 * struct starting with its struct fuse_flags_hook (the custom I/O finds it
 * there).  0 or -errno. */
int fflags_install(struct fuse_session *se);

/* fuse_reply_open(), with FOPEN_PARALLEL_DIRECT_WRITES added when
 * fi->direct_io. */
int fflags_reply_open(fuse_req_t req, const struct fuse_file_info *fi);

#endif
