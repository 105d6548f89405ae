/* SPDX-License-Identifier: BSD-3-Clause */
/* See fuse-flags.h. */
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <linux/fuse.h>

#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuse-flags.h"

/* Newer than the headers here may be. */
#define ALLOW_MMAP_FLAGS2 (1u << (36 - 32)) /* FUSE_DIRECT_IO_ALLOW_MMAP */
#define PARALLEL_DIRECT_WRITES (1u << 6)    /* FOPEN_PARALLEL_DIRECT_WRITES */

/* Set by fflags_reply_open() around its reply, which libfuse writes from
 * the calling thread. */
static _Thread_local bool patch_open;

static ssize_t hook_read(int fd, void *buf, size_t len, void *userdata) {
  struct fuse_flags_hook *h = userdata;
  ssize_t n = read(fd, buf, len);
  const size_t need = sizeof(struct fuse_in_header) +
                      offsetof(struct fuse_init_in, flags2) + sizeof(uint32_t);
  if (n < (ssize_t)need || atomic_load(&h->unique) != 0)
    return n;
  struct fuse_in_header in;
  memcpy(&in, buf, sizeof in);
  if (in.opcode != FUSE_INIT)
    return n;
  struct fuse_init_in init;
  memset(&init, 0, sizeof init);
  memcpy(&init, (const char *)buf + sizeof in,
         (size_t)n - sizeof in < sizeof init ? (size_t)n - sizeof in
                                             : sizeof init);
  bool ext = init.flags & FUSE_INIT_EXT;
  atomic_store(&h->offered, ext && (init.flags2 & ALLOW_MMAP_FLAGS2));
  atomic_store(&h->unique, in.unique);
  return n;
}

/* Is IOV the successful reply to the INIT request? */
static bool is_init_reply(struct fuse_flags_hook *h, const struct iovec *iov,
                          int count) {
  const size_t need = offsetof(struct fuse_init_out, flags2) + sizeof(uint32_t);
  if (count != 2 || iov[0].iov_len != sizeof(struct fuse_out_header) ||
      iov[1].iov_len < need)
    return false;
  struct fuse_out_header out;
  memcpy(&out, iov[0].iov_base, sizeof out);
  uint64_t unique = atomic_load(&h->unique);
  return unique != 0 && out.unique == unique && out.error == 0;
}

static ssize_t write_init(struct fuse_flags_hook *h, int fd,
                          struct iovec *iov) {
  atomic_store(&h->init_done, true);
  /* A copy with the flag; libfuse set FUSE_INIT_EXT (the kernel did). */
  struct fuse_init_out init;
  memset(&init, 0, sizeof init);
  size_t len = iov[1].iov_len < sizeof init ? iov[1].iov_len : sizeof init;
  memcpy(&init, iov[1].iov_base, len);
  if (!(init.flags & FUSE_INIT_EXT))
    return writev(fd, iov, 2);
  init.flags2 |= ALLOW_MMAP_FLAGS2;
  struct iovec v[2] = {iov[0], {.iov_base = &init, .iov_len = len}};
  return writev(fd, v, 2);
}

static ssize_t write_open(int fd, struct iovec *iov, int count) {
  if (count != 2 || iov[1].iov_len != sizeof(struct fuse_open_out))
    return writev(fd, iov, count);
  struct fuse_open_out open;
  memcpy(&open, iov[1].iov_base, sizeof open);
  open.open_flags |= PARALLEL_DIRECT_WRITES;
  struct iovec v[2] = {iov[0], {.iov_base = &open, .iov_len = sizeof open}};
  return writev(fd, v, 2);
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count,
                           void *userdata) {
  struct fuse_flags_hook *h = userdata;
  if (patch_open)
    return write_open(fd, iov, count);
  if (atomic_load(&h->init_done) || !is_init_reply(h, iov, count))
    return writev(fd, iov, count);
  if (!h->want_mmap || !atomic_load(&h->offered)) {
    atomic_store(&h->init_done, true);
    return writev(fd, iov, count);
  }
  return write_init(h, fd, iov);
}

int fflags_install(struct fuse_session *se) {
  static const struct fuse_custom_io io = {.read = hook_read,
                                           .writev = hook_writev};
  return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

int fflags_reply_open(fuse_req_t req, const struct fuse_file_info *fi) {
  patch_open = fi->direct_io;
  int r = fuse_reply_open(req, fi);
  patch_open = false;
  return r;
}
