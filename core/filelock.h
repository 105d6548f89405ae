/* SPDX-License-Identifier: BSD-3-Clause */
/* Image locks that QEMU honours.
 *
 * QEMU's file driver marks what each open file description of an image
 * uses and what it refuses to share with open-file-description byte locks
 * (F_OFD_SETLK: they belong to the open file, not to a thread or process,
 * so closing the file or kill -9 releases them): a read lock on byte
 * 100 + i while it holds permission i, on byte 200 + i while it does not
 * share permission i.  Before taking a permission it tests that nobody
 * holds the "not shared" byte of it, and before refusing to share one that
 * nobody holds it.  blockport takes the same bytes, so QEMU (qemu-img,
 * qemu-io, qemu-nbd, a VM) and blockport see each other's locks. */
#ifndef BLOCKPORT_FILELOCK_H
#define BLOCKPORT_FILELOCK_H

#include <stdbool.h>

/* QEMU's permission bits (BLK_PERM_*), in lock-byte order. */
enum {
  FILELOCK_READ = 1u << 0, /* consistent read */
  FILELOCK_WRITE = 1u << 1,
  FILELOCK_WRITE_UNCHANGED = 1u << 2,
  FILELOCK_RESIZE = 1u << 3,
  FILELOCK_ALL = 0xfu,
};

/* How an image is used, as QEMU's users of the same kind lock it. */
enum filelock_use {
  /* Written: uses read and write (and resize where the format grows the
   * file), shares neither write nor resize. */
  FILELOCK_USE_WRITE,
  /* Read only: uses read, shares neither write nor resize (qemu-img info
   * or a read-only qemu-nbd refuses a writer beside it). */
  FILELOCK_USE_READ,
  /* Read only with -U / force-share: uses read, shares everything. */
  FILELOCK_USE_SHARED,
};

/* The option that lets a reader open an image beside a writer, for the
 * message of a reader refused ("-U/--force-share" where the command has
 * it); NULL (the default): the message suggests nothing.  Set before
 * any thread starts. */
extern const char *filelock_share_hint;

/* Take the locks of USE on FD (the image at PATH, for messages).  RESIZE
 * adds the resize permission to a writer (formats that grow their file).
 * Returns 0, or -EBUSY when another open file holds what USE cannot share
 * (message "PATH: Failed to get ... lock: is another process using the
 * image?", with filelock_share_hint for a reader, in bd_errmsg()), or
 * -errno; on failure no lock is left held.
 * Files on which the system has no byte locks (ENOLCK, EINVAL) are used
 * without them, as QEMU does. */
int filelock_take(int fd, const char *path, enum filelock_use use, bool resize);

/* Take the locks of USE on FD without looking at anyone else's (taking
 * back locks dropped for a moment: see bd_hold_locks()). */
void filelock_retake(int fd, enum filelock_use use, bool resize);

/* filelock_take() and filelock_retake() with the permissions spelt out:
 * PERM used, UNSHARED not shared (FILELOCK_* bits).  For formats that
 * lock as their user asks, as QEMU's raw passes its user's permissions
 * straight to the file (formats/raw.c). */
int filelock_take_perms(int fd, const char *path, unsigned perm,
                        unsigned unshared);
void filelock_retake_perms(int fd, unsigned perm, unsigned unshared);

/* Drop every lock FD holds (closing FD does the same). */
void filelock_release(int fd);

#endif
