/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared mmap of direct-I/O files, which libfuse 3.14 cannot ask for.
 *
 * Since 6.6 the kernel lets a FOPEN_DIRECT_IO file be mapped shared when
 * the daemon's INIT reply sets FUSE_DIRECT_IO_ALLOW_MMAP (flags2), keeping
 * the mapping's pages coherent with direct reads and writes.  libfuse
 * learnt the flag in 3.16; 3.14 builds the reply from a 32-bit want mask
 * it maps bit by bit, so the flag cannot pass through its API.  This hook
 * installs libfuse's custom I/O (3.13 and later) on the mounted session:
 * reads and writes go to /dev/fuse as before, except that the INIT reply
 * gets the flag when the kernel's INIT offered it. */
#ifndef BLOCKPORT_FRONTEND_FUSE_INIT_H
#define BLOCKPORT_FRONTEND_FUSE_INIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct fuse_session;

struct fuse_init_hook {
  bool want_mmap;              /* ask for it when offered */
  atomic_bool offered;         /* the kernel's INIT offered the flag */
  atomic_uint_fast64_t unique; /* the INIT request's id, 0 before it */
};

/* On a session after fuse_session_mount(), whose userdata points at a
 * struct starting with its struct fuse_init_hook (the custom I/O finds it
 * there).  0 or -errno. */
int fih_install(struct fuse_session *se);

#endif
