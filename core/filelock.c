/* SPDX-License-Identifier: BSD-3-Clause */
#include "filelock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "blockdev.h"

#define PERM_BASE 100   /* byte 100 + i: permission i is used */
#define SHARED_BASE 200 /* byte 200 + i: permission i is not shared */
#define NPERMS 4

static const char *const perm_names[NPERMS] = {"consistent read", "write",
                                               "write unchanged", "resize"};

static int ofd_lock(int fd, short type, int byte, int cmd) {
  struct flock fl = {
      .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
  int r;
  do
    r = fcntl(fd, cmd, &fl);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return -errno;
  /* F_OFD_GETLK: F_UNLCK when nobody else's lock is in the way. */
  return cmd == F_OFD_GETLK && fl.l_type != F_UNLCK ? -EAGAIN : 0;
}

/* Read-lock the bytes of PERMS at BASE. */
static int lock_bytes(int fd, unsigned perms, int base) {
  for (int i = 0; i < NPERMS; i++) {
    if (!(perms & (1u << i)))
      continue;
    int r = ofd_lock(fd, F_RDLCK, base + i, F_OFD_SETLK);
    if (r < 0)
      return r;
  }
  return 0;
}

/* Is any byte of PERMS at BASE read-locked by another open file?  Returns
 * the first such permission's index, or -1. */
static int find_held(int fd, unsigned perms, int base, int *err) {
  for (int i = 0; i < NPERMS; i++) {
    if (!(perms & (1u << i)))
      continue;
    int r = ofd_lock(fd, F_WRLCK, base + i, F_OFD_GETLK);
    if (r == -EAGAIN)
      return i;
    if (r < 0) {
      *err = r;
      return -1;
    }
  }
  return -1;
}

/* What USE holds and what it refuses to share. */
static void use_perms(enum filelock_use use, bool resize, unsigned *perm,
                      unsigned *unshared) {
  *perm = FILELOCK_READ;
  *unshared = FILELOCK_WRITE | FILELOCK_RESIZE;
  if (use == FILELOCK_USE_WRITE)
    *perm |= FILELOCK_WRITE | (resize ? FILELOCK_RESIZE : 0);
  else if (use == FILELOCK_USE_SHARED)
    *unshared = 0;
}

/* The system has no byte locks on this file (some network file systems):
 * go on without them, as QEMU's locking=auto does. */
static bool unsupported(int err) {
  return err == -ENOLCK || err == -EINVAL || err == -EOPNOTSUPP;
}

int filelock_take(int fd, const char *path, enum filelock_use use,
                  bool resize) {
  unsigned perm, unshared;
  use_perms(use, resize, &perm, &unshared);
  return filelock_take_perms(fd, path, perm, unshared);
}

const char *filelock_share_hint;

/* The message for a lock PATH could not take.  A READER that does not
 * share may be pointed at sharing: it cannot hurt the writer's image. */
static void refused(const char *path, const char *shared, const char *perm,
                    bool reader) {
  if (reader && filelock_share_hint)
    bd_set_error("%s: Failed to get %s\"%s\" lock: is another process using "
                 "the image? (%s reads it all the same)",
                 path, shared, perm, filelock_share_hint);
  else
    bd_set_error("%s: Failed to get %s\"%s\" lock: is another process using "
                 "the image?",
                 path, shared, perm);
}

int filelock_take_perms(int fd, const char *path, unsigned perm,
                        unsigned unshared) {
  /* As QEMU: take our bytes first, then look at the other side's, so two
   * openers racing see at least one of each other's locks. */
  int r = lock_bytes(fd, perm, PERM_BASE);
  if (r == 0)
    r = lock_bytes(fd, unshared, SHARED_BASE);
  if (r < 0) {
    filelock_release(fd);
    if (unsupported(r))
      return 0;
    bd_set_error("%s: cannot lock the image: %s", path, strerror(-r));
    return r;
  }
  int err = 0;
  /* A permission we use that someone does not share... */
  int i = find_held(fd, perm, SHARED_BASE, &err);
  const char *shared = "";
  if (i < 0 && !err) {
    /* ...or one we do not share that someone uses. */
    i = find_held(fd, unshared, PERM_BASE, &err);
    shared = "shared ";
  }
  if (i < 0 && !err)
    return 0;
  filelock_release(fd);
  if (err) {
    if (unsupported(err))
      return 0;
    bd_set_error("%s: cannot test the image's locks: %s", path, strerror(-err));
    return err;
  }
  refused(path, shared, perm_names[i],
          !(perm & FILELOCK_WRITE) && unshared != 0);
  return -EBUSY;
}

void filelock_retake(int fd, enum filelock_use use, bool resize) {
  unsigned perm, unshared;
  use_perms(use, resize, &perm, &unshared);
  filelock_retake_perms(fd, perm, unshared);
}

void filelock_retake_perms(int fd, unsigned perm, unsigned unshared) {
  if (lock_bytes(fd, perm, PERM_BASE) < 0 ||
      lock_bytes(fd, unshared, SHARED_BASE) < 0)
    filelock_release(fd);
}

void filelock_release(int fd) {
  struct flock fl = {.l_type = F_UNLCK,
                     .l_whence = SEEK_SET,
                     .l_start = PERM_BASE,
                     .l_len = SHARED_BASE + NPERMS - PERM_BASE};
  (void)fcntl(fd, F_OFD_SETLK, &fl);
}
