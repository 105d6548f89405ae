/* SPDX-License-Identifier: BSD-3-Clause */
/* The FUSE front end: a disk (any struct bd) as a file, or as a directory
 * holding the disk and one file per partition.
 *
 *   m = fm_create(bd, &cfg);   mounts (the kernel starts talking at once)
 *   fm_run(m);                 serves until fm_stop() or an unmount
 *   fm_destroy(m);             drains, flushes, unmounts, frees
 *
 * Operations submit to the disk and reply from the completion; no FUSE
 * thread waits for I/O. */
#ifndef BLOCKPORT_FRONTEND_FUSE_MOUNT_H
#define BLOCKPORT_FRONTEND_FUSE_MOUNT_H

#include <stdbool.h>

struct bd;
struct fm;
struct metrics_reqs;

struct fm_config {
  const char *mountpoint; /* a directory, or a regular file to mount over */
  const char *name;       /* the disk file's name in a directory mount */
  bool allow_other;       /* let other users in (mode 0666 / 0444) */
  bool direct_io;         /* bypass the kernel page cache (--cache=none) */
  bool partitions;        /* expose NAME-pN files for an MBR or GPT */
  unsigned threads;       /* threads receiving FUSE requests */
  /* How long a partition table read that fails with EIO is tried again
   * when the source's caps say EIO may pass (transient_eio): the source's
   * NBD time-out, as a remote server may be reconnecting. */
  unsigned table_retry_s;
  /* Called once, on a FUSE thread, when the kernel has initialised the
   * mount: from then on it serves. */
  void (*live)(void *opaque);
  void *opaque;
  /* --metrics: where reads, writes, flushes and fallocates are counted
   * (core/reqstats.h), or NULL. */
  struct metrics_reqs *reqs;
};

/* Mount BD (not owned) at cfg->mountpoint.  NULL with bd_errmsg() set. */
struct fm *fm_create(struct bd *bd, const struct fm_config *cfg);
/* Serve until fm_stop() or an unmount.  Returns 0, or -errno on a loop
 * error (bd_errmsg() says which). */
int fm_run(struct fm *m);
/* Make fm_run() return soon; from any thread but a FUSE one, any time
 * after fm_create() (also before fm_run()). */
void fm_stop(struct fm *m);
/* Wait for requests in flight, flush the disk when writable, unmount and
 * free.  Returns 0, -1 when the flush failed, or -2 when requests were
 * still in flight after a minute: then the mount is gone but the device
 * must not be closed (their completions are still to come). */
int fm_destroy(struct fm *m);

#endif
