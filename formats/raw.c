/* SPDX-License-Identifier: BSD-3-Clause */
/* raw: a file or block device whose bytes are the disk.
 *
 * Data goes through pread/pwrite (restarted on EINTR and short transfers),
 * flush and FUA through fdatasync, trim and zero through fallocate, and
 * block status through SEEK_DATA/SEEK_HOLE.  The file is locked as QEMU's
 * raw locks it, as its user asks (lock_perms(), core/filelock.h).  A raw
 * format guessed by probing guards its first sector: a write, zero or trim
 * there that would make the next probe find another format (a guest
 * writing a qcow2 header that names a host file as its backing file) fails
 * with EPERM, as in QEMU.
 *
 * --cache none and directsync open the file with O_DIRECT.  The alignment
 * it then needs (statx STATX_DIOALIGN, a device's logical block size, or
 * 4096 when neither says) becomes the minimum block, and the core aligns
 * every request to it (caps.aligned_only, core/disk.c).  What is left
 * here: a caller's buffer that is not aligned in memory goes through an
 * aligned bounce, and the last block of a file whose size is not a
 * multiple of the alignment goes through a second, buffered descriptor
 * (an O_DIRECT write of the whole block would grow the file). */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/fault.h"
#include "core/filelock.h"
#include "core/io.h"
#include "core/log.h"
#include "core/source.h"
#include "core/uring.h"
#include "formats.h"
#include "probe.h"

struct rawdev {
  int fd;
  bool is_block;
  bool can_punch, can_zero_range;    /* cleared once the kernel says no */
  atomic_bool nowait_writes;         /* cleared if RWF_NOWAIT writes fail */
  bool guard_head;                   /* probed as raw: guard the first sector */
  unsigned lock_perm, lock_unshared; /* how the file is locked */
  pthread_mutex_t head_lock;         /* one guarded change at a time */
  /* O_DIRECT (--cache none, directsync). */
  bool direct;
  uint32_t align;      /* offsets and lengths are multiples of this */
  uint32_t mem_align;  /* buffers start on a multiple of this */
  uint64_t tail_start; /* the size rounded down to the alignment */
  int bfd;             /* buffered, for [tail_start, size); -1: none */
  bool ring;           /* reads, writes and flushes through io_uring */
};

/* A direct read of a range that is not aligned (our own reads, such as
 * the probe guard's of the first sector; the core aligns the others):
 * the aligned range around it, then the part asked for. */
static int dio_read_widened(struct rawdev *r, void *buf, uint64_t len,
                            uint64_t off) {
  uint64_t s = off - off % r->align, e = off + len;
  e = e % r->align ? e + (r->align - e % r->align) : e;
  void *b = NULL;
  if (posix_memalign(&b, 4096, e - s) != 0)
    return -ENOMEM;
  int err = io_dio_pread(r->fd, b, e - s, s, r->mem_align);
  if (err == 0)
    memcpy(buf, (uint8_t *)b + (off - s), len);
  free(b);
  return err;
}

/* A read or write in direct mode: the aligned part with O_DIRECT, the
 * unaligned tail of the file through the buffered descriptor. */
static int dio_rw(struct rawdev *r, bool write, void *buf, uint64_t len,
                  uint64_t off) {
  uint64_t end = off + len;
  uint64_t mid = end < r->tail_start ? end : r->tail_start;
  int e = 0;
  bool aligned = (off | mid) % r->align == 0;
  if (off < mid && !aligned && !write)
    e = dio_read_widened(r, buf, mid - off, off);
  else if (off < mid && !aligned)
    e = -EINVAL; /* the core's aligner sends aligned writes only */
  else if (off < mid)
    e = write
            ? io_dio_pwrite(r->fd, buf, (size_t)(mid - off), off, r->mem_align)
            : io_dio_pread(r->fd, buf, (size_t)(mid - off), off, r->mem_align);
  if (e == 0 && end > r->tail_start) {
    uint64_t s = off > r->tail_start ? off : r->tail_start;
    uint8_t *p = (uint8_t *)buf + (s - off);
    e = write ? io_pwrite_all(r->bfd, p, (size_t)(end - s), s)
              : io_pread_zero(r->bfd, p, (size_t)(end - s), s);
  }
  return e;
}

static int raw_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct rawdev *r = bd->priv;
  /* A file that shrank under us reads as zeroes past its end. */
  int e = r->direct ? dio_rw(r, false, buf, len, off)
                    : io_pread_zero(r->fd, buf, len, off);
  if (e < 0)
    bd_set_error("raw: read at %llu: %s", (unsigned long long)off,
                 strerror(-e));
  return e;
}

static int raw_flush(struct bd *bd) {
  struct rawdev *r = bd->priv;
  int e = io_fdatasync(r->fd);
  if (e < 0)
    bd_set_error("raw: fdatasync: %s", strerror(-e));
  return e;
}

static int raw_pwrite(struct bd *bd, const void *buf, uint64_t len,
                      uint64_t off, uint32_t flags) {
  struct rawdev *r = bd->priv;
  int e = r->direct ? dio_rw(r, true, (void *)buf, len, off)
                    : io_pwrite_all(r->fd, buf, len, off);
  if (e < 0) {
    bd_set_error("raw: write at %llu: %s", (unsigned long long)off,
                 strerror(-e));
    return e;
  }
  return (flags & BD_F_FUA) ? raw_flush(bd) : 0;
}

static int do_fallocate(struct rawdev *r, int mode, uint64_t len,
                        uint64_t off) {
  int ret = fault_check(FAULT_WRITE, off, len);
  if (ret < 0)
    return ret;
  do
    ret = fallocate(r->fd, mode, (off_t)off, (off_t)len);
  while (ret < 0 && errno == EINTR);
  return ret < 0 ? -errno : 0;
}

static bool unsupported(int err) {
  return err == -EOPNOTSUPP || err == -ENOSYS || err == -ENODEV;
}

static int raw_trim(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  struct rawdev *r = bd->priv;
  int ret = 0;
  if (r->can_punch) {
    ret = do_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
    if (unsupported(ret)) {
      r->can_punch = false;
      ret = 0; /* trim is advisory */
    }
  }
  if (ret < 0) {
    bd_set_error("raw: punch hole: %s", strerror(-ret));
    return ret;
  }
  return (flags & BD_F_FUA) ? raw_flush(bd) : 0;
}

/* Zero a range efficiently, or return -ENOTSUP so the core writes zeroes
 * (or fails a fast-zero request). */
static int raw_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  struct rawdev *r = bd->priv;
  int ret = -ENOTSUP;
  /* A punched hole reads as zeroes in a regular file. */
  if ((flags & BD_F_MAY_TRIM) && r->can_punch && !r->is_block) {
    ret = do_fallocate(r, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
    if (unsupported(ret)) {
      r->can_punch = false;
      ret = -ENOTSUP;
    }
  }
  if (ret == -ENOTSUP && r->can_zero_range) {
    ret = do_fallocate(r, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, len, off);
    if (unsupported(ret)) {
      r->can_zero_range = false;
      ret = -ENOTSUP;
    }
  }
  if (ret == -ENOTSUP) {
    bd_set_error("raw: the file system cannot zero without writing");
    return ret;
  }
  if (ret < 0) {
    bd_set_error("raw: zero range: %s", strerror(-ret));
    return ret;
  }
  return (flags & BD_F_FUA) ? raw_flush(bd) : 0;
}

/* ---- the first sector of a probed raw image ---- */

enum head_op { HEAD_WRITE, HEAD_ZERO, HEAD_TRIM };

static bool touches_head(const struct rawdev *r, uint64_t off) {
  return r->guard_head && off < PROBE_HEAD;
}

/* Would the first sector, changed by writing BUF (or zeroes when BUF is
 * NULL) over [OFF, OFF + LEN), still probe as raw?  Called with head_lock
 * held, so two changes cannot each pass and together form a header. */
static int head_stays_raw(struct bd *bd, const void *buf, uint64_t len,
                          uint64_t off) {
  uint8_t head[PROBE_HEAD];
  size_t n = bd->size < PROBE_HEAD ? (size_t)bd->size : PROBE_HEAD;
  int e = raw_pread(bd, head, n, 0);
  if (e < 0)
    return e;
  size_t k = len < n - off ? (size_t)len : n - (size_t)off;
  if (buf)
    memcpy(head + off, buf, k);
  else
    memset(head + off, 0, k);
  const char *fmt = probe_format(head, n, NULL);
  if (strcmp(fmt, "raw") == 0)
    return 0;
  bd_set_error("raw: refusing a write to the first sector that would make "
               "the image probe as %s (the format was guessed; give "
               "--format raw to allow it)",
               fmt);
  return -EPERM;
}

static int raw_change(struct bd *bd, enum head_op op, const void *buf,
                      uint64_t len, uint64_t off, uint32_t flags) {
  switch (op) {
  case HEAD_WRITE: return raw_pwrite(bd, buf, len, off, flags);
  case HEAD_ZERO: return raw_zero(bd, len, off, flags);
  default: return raw_trim(bd, len, off, flags);
  }
}

/* Every change goes through here; only those reaching the first sector of
 * a probed image pay for the check. */
static int guarded(struct bd *bd, enum head_op op, const void *buf,
                   uint64_t len, uint64_t off, uint32_t flags) {
  struct rawdev *r = bd->priv;
  if (!touches_head(r, off))
    return raw_change(bd, op, buf, len, off, flags);
  pthread_mutex_lock(&r->head_lock);
  int e = head_stays_raw(bd, op == HEAD_WRITE ? buf : NULL, len, off);
  if (e == 0)
    e = raw_change(bd, op, buf, len, off, flags);
  pthread_mutex_unlock(&r->head_lock);
  return e;
}

static int raw_pwrite_guarded(struct bd *bd, const void *buf, uint64_t len,
                              uint64_t off, uint32_t flags) {
  return guarded(bd, HEAD_WRITE, buf, len, off, flags);
}

static int raw_zero_guarded(struct bd *bd, uint64_t len, uint64_t off,
                            uint32_t flags) {
  return guarded(bd, HEAD_ZERO, NULL, len, off, flags);
}

static int raw_trim_guarded(struct bd *bd, uint64_t len, uint64_t off,
                            uint32_t flags) {
  return guarded(bd, HEAD_TRIM, NULL, len, off, flags);
}

static int raw_cache(struct bd *bd, uint64_t len, uint64_t off) {
  struct rawdev *r = bd->priv;
  int e = posix_fadvise(r->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
  if (e) {
    bd_set_error("raw: fadvise: %s", strerror(e));
    return -e;
  }
  return 0;
}

static int raw_extents(struct bd *bd, uint64_t len, uint64_t off,
                       uint32_t flags, struct bd_extents *ext) {
  struct rawdev *r = bd->priv;
  uint64_t end = off + len;
  while (off < end) {
    off_t data = lseek(r->fd, (off_t)off, SEEK_DATA);
    if (data < 0 && errno == ENXIO)
      data = (off_t)end; /* no data after off: the rest is a hole */
    else if (data < 0) {
      /* No SEEK_DATA here: report everything as data. */
      return bd_extents_add(ext, end - off, 0, 1) < 0 ? -ENOMEM : 0;
    }
    uint64_t d = (uint64_t)data < end ? (uint64_t)data : end;
    int ret = 0;
    if (d > off)
      ret = bd_extents_add(ext, d - off, BD_EXT_HOLE | BD_EXT_ZERO, 1);
    off = d;
    if (ret != 0 || off >= end || ((flags & BD_F_REQ_ONE) && ext->n > 0))
      return ret < 0 ? ret : 0;
    off_t hole = lseek(r->fd, (off_t)off, SEEK_HOLE);
    uint64_t h = hole < 0 || (uint64_t)hole > end ? end : (uint64_t)hole;
    ret = bd_extents_add(ext, h - off, 0, 1);
    off = h;
    if (ret != 0 || ((flags & BD_F_REQ_ONE) && ext->n > 0))
      return ret < 0 ? ret : 0;
  }
  return 0;
}

/* Page-cache I/O completes in the caller's thread, with no hand-off to a
 * worker: reads with RWF_NOWAIT (the kernel refuses instead of waiting for
 * the disk), writes with RWF_NOWAIT where the file system supports it.
 * Where it does not (ext4 buffered writes), small page-aligned writes are
 * done directly: they only copy into the page cache, needing no read of
 * the old page; the one wait they can meet is the kernel's dirty-page
 * throttling, which is back-pressure from the disk anyway.  Larger ones
 * too where the caller says it has threads to spare (BD_F_INLINE_BIG):
 * a hand-off costs more than the copy there.  Anything
 * short or refused goes to the pool whole (repeating a read, or a write
 * of the same bytes, is harmless). */
#define INLINE_WRITE_MAX (64 * 1024)

static int raw_try_nowait(struct bd *bd, struct bd_req *req) {
  struct rawdev *r = bd->priv;
  struct iovec iov = {req->buf, req->length};
  ssize_t n;
  if (fault_active() || r->direct)
    return -EAGAIN; /* the pool path checks for injected faults; direct
                     * I/O always waits for the device */
  if (req->cmd != BD_READ && touches_head(r, req->offset))
    return -EAGAIN; /* the guard reads and may wait */
  if (req->cmd == BD_READ) {
    n = preadv2(r->fd, &iov, 1, (off_t)req->offset, RWF_NOWAIT);
  } else if (atomic_load_explicit(&r->nowait_writes, memory_order_relaxed)) {
    n = pwritev2(r->fd, &iov, 1, (off_t)req->offset, RWF_NOWAIT);
    if (n < 0 && errno == EOPNOTSUPP)
      atomic_store(&r->nowait_writes, false);
  } else if ((req->length <= INLINE_WRITE_MAX ||
              (req->flags & BD_F_INLINE_BIG)) &&
             !r->is_block && (req->offset | req->length) % 4096 == 0) {
    n = pwrite(r->fd, req->buf, req->length, (off_t)req->offset);
  } else {
    return -EAGAIN;
  }
  return n == (ssize_t)req->length ? 0 : -EAGAIN;
}

/* --aio io_uring: reads, writes and flushes through a ring instead of a
 * worker (core/uring.h).  What the ring path cannot take goes to the
 * pool: the guarded first sector of a probed image, injected faults, and
 * in direct mode a buffer not aligned in memory or the buffered tail. */
static int raw_submit_async(struct bd *bd, struct bd_req *req) {
  struct rawdev *r = bd->priv;
  if (!r->ring || fault_active())
    return -EAGAIN;
  if (req->cmd == BD_FLUSH)
    return uring_start(req, URING_FDATASYNC, r->fd, r->direct, NULL, 0);
  if (req->cmd != BD_READ && req->cmd != BD_WRITE)
    return -EAGAIN;
  if (req->cmd == BD_WRITE && touches_head(r, req->offset))
    return -EAGAIN;
  if (r->direct && (req->offset + req->length > r->tail_start ||
                    (req->offset | req->length) % r->align ||
                    (uintptr_t)req->buf % r->mem_align))
    return -EAGAIN;
  struct uring_seg seg = {req->buf, req->offset, (uint32_t)req->length};
  enum uring_op op = req->cmd == BD_READ       ? URING_READ
                     : (req->flags & BD_F_FUA) ? URING_WRITE_DSYNC
                                               : URING_WRITE;
  return uring_start(req, op, r->fd, r->direct, &seg, 1);
}

static void raw_close(struct bd *bd) {
  struct rawdev *r = bd->priv;
  close(r->fd); /* releases the locks */
  if (r->bfd >= 0)
    close(r->bfd);
  pthread_mutex_destroy(&r->head_lock);
  free(r);
}

static void raw_hold_locks(struct bd *bd, bool hold) {
  struct rawdev *r = bd->priv;
  if (hold)
    filelock_retake_perms(r->fd, r->lock_perm, r->lock_unshared);
  else
    filelock_release(r->fd);
}

/* The new end is simply the file's; what is added is a hole unless asked
 * to take space.  A failure puts the old size back. */
/* The file's own length, not bd->size (rounded up to a sector). */
static uint64_t file_length(struct bd *bd) {
  struct rawdev *r = bd->priv;
  struct stat st;
  if (r->is_block || fstat(r->fd, &st) < 0)
    return bd->size;
  return (uint64_t)st.st_size;
}

static int raw_resize(struct bd *bd, uint64_t size, enum bd_prealloc pa) {
  struct rawdev *r = bd->priv;
  /* What is preallocated starts at the file's end; a failure restores
   * it.  A file already SIZE long is left alone. */
  uint64_t old = file_length(bd);
  int e = 0;
  if (size == old)
    return 0;
  if (r->is_block)
    bd_set_error("%s: a block device cannot be resized", bd->description);
  else if (pa == BD_PREALLOC_METADATA)
    bd_set_error("%s: raw images have no metadata to preallocate",
                 bd->description);
  else if (r->direct) /* its unaligned tail is set up at open */
    bd_set_error("%s: cannot resize with the page cache bypassed",
                 bd->description);
  if (r->is_block || pa == BD_PREALLOC_METADATA || r->direct)
    return -ENOTSUP;
  if (size > INT64_MAX || ftruncate(r->fd, (off_t)size) < 0)
    e = size > INT64_MAX ? -EFBIG : -errno;
  if (e == 0 && size > old &&
      (pa == BD_PREALLOC_FALLOC || pa == BD_PREALLOC_FULL))
    e = io_preallocate(r->fd, old, size - old, pa == BD_PREALLOC_FULL);
  if (e == 0)
    e = io_fdatasync(r->fd);
  if (e < 0) {
    bd_set_error("%s: resizing to %llu bytes: %s", bd->description,
                 (unsigned long long)size, strerror(-e));
    if (ftruncate(r->fd, (off_t)old) < 0)
      log_error("%s: could not restore the size: %s", bd->description,
                strerror(errno));
    return e;
  }
  return 0;
}

/* Every byte is at its own offset, but for the guarded first sector of a
 * probed image (its writes are checked). */
static int raw_host_range(struct bd *bd, uint64_t off, uint64_t len, int *fd,
                          uint64_t *host, uint64_t *n) {
  struct rawdev *r = bd->priv;
  if (touches_head(r, off))
    return -ENOTSUP;
  *fd = r->fd;
  *host = off;
  *n = len;
  return 0;
}

static const struct bd_ops raw_ops = {
    .name = "raw",
    .pread = raw_pread,
    .pwrite = raw_pwrite_guarded,
    .flush = raw_flush,
    .trim = raw_trim_guarded,
    .zero = raw_zero_guarded,
    .cache = raw_cache,
    .extents = raw_extents,
    .try_nowait = raw_try_nowait,
    .submit_async = raw_submit_async,
    .close = raw_close,
    .hold_locks = raw_hold_locks,
    .resize = raw_resize,
    .host_range = raw_host_range,
};

/* The locks of a raw file.  QEMU's raw format passes its user's
 * permissions to the file unchanged, so a reader refuses to share only
 * what its user does (BD_OPEN_UNSHARE_*): qemu-img map or compare share
 * everything, qemu-nbd -r refuses resizes, qemu-img convert's source
 * writers too.  A writer here refuses other writers and resizes (stricter
 * than qemu-nbd, which refuses resizes only). */
static void lock_perms(unsigned flags, unsigned *perm, unsigned *unshared) {
  *perm = FILELOCK_READ;
  *unshared = 0;
  if (flags & BD_OPEN_SHARE)
    return;
  if (!(flags & BD_OPEN_READONLY)) {
    *perm |= FILELOCK_WRITE;
    *unshared = FILELOCK_WRITE | FILELOCK_RESIZE;
    return;
  }
  if (flags & BD_OPEN_UNSHARE_WRITE)
    *unshared |= FILELOCK_WRITE;
  if (flags & BD_OPEN_UNSHARE_RESIZE)
    *unshared |= FILELOCK_RESIZE;
}

/* The size of a file of SIZE bytes as QEMU sees it: a whole number of
 * 512-byte sectors (qemu-img info, map, qemu-nbd's export).  The tail past
 * the file's end reads as zeroes, and a write there grows the file. */
static uint64_t sectors(uint64_t size) {
  return size > UINT64_MAX - 511 ? size : (size + 511) & ~511ull;
}

/* --cache none / directsync: the alignment, and the buffered descriptor
 * for an unaligned tail.  Returns the alignment, or -1 with a message. */
static int setup_direct(struct rawdev *r, const char *path, bool readonly,
                        uint64_t size) {
  uint32_t off, mem;
  io_dio_alignment(r->fd, &off, &mem);
  if (off > 64 * 1024 || (off & (off - 1)) || !mem || (mem & (mem - 1))) {
    bd_set_error("%s: unusable direct I/O alignment %u (memory %u)", path, off,
                 mem);
    return -1;
  }
  r->direct = true;
  r->align = off;
  r->mem_align = mem;
  r->tail_start = size - size % off;
  r->bfd = -1;
  if (r->tail_start < size &&
      (r->bfd = open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC)) < 0) {
    bd_set_error("%s: %s", path, strerror(errno));
    return -1;
  }
  log_debug("%s: direct I/O, alignment %u, memory %u", path, off, mem);
  return (int)off;
}

struct bd *raw_open(const char *path, const struct bd_open_opts *o) {
  unsigned flags = o->flags;
  bool readonly = flags & (BD_OPEN_READONLY | BD_OPEN_SHARE);
  bool direct = bd_cache_direct(o->cache);
  int fd = open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC |
                          (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) {
    bd_set_error("%s: the file system refuses direct I/O (O_DIRECT), which "
                 "--cache %s needs; use --cache writeback or writethrough",
                 path, bd_cache_name(o->cache));
    return NULL;
  }
  if (fd < 0) {
    bd_set_error("%s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  off_t size = -1;
  if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)))
    size = lseek(fd, 0, SEEK_END);
  if (size < 0) {
    bd_set_error("%s: not a regular file or block device", path);
    close(fd);
    return NULL;
  }
  unsigned perm, unshared;
  lock_perms(flags, &perm, &unshared);
  if (filelock_take_perms(fd, path, perm, unshared) < 0) {
    close(fd);
    return NULL;
  }
  struct rawdev *r = calloc(1, sizeof *r);
  struct bd *bd = r ? bd_new(&raw_ops, "raw", path) : NULL;
  if (!bd) {
    free(r);
    close(fd);
    bd_set_error("raw: out of memory");
    return NULL;
  }
  r->fd = fd;
  r->bfd = -1;
  r->lock_perm = perm;
  r->lock_unshared = unshared;
  r->is_block = S_ISBLK(st.st_mode);
  r->can_punch = r->can_zero_range = true;
  atomic_init(&r->nowait_writes, true);
  pthread_mutex_init(&r->head_lock, NULL);
  int align = direct ? setup_direct(r, path, readonly, (uint64_t)size) : 0;
  if (align < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", bd_errmsg());
    bd->priv = r;
    bd_close(bd);
    bd_set_error("%s", msg);
    return NULL;
  }
  r->ring = o->aio != BD_AIO_THREADS && uring_available();
  r->guard_head = !readonly && (flags & BD_OPEN_PROBED);
  if (r->guard_head)
    log_warn("%s: the image format was not given and probing guessed raw; "
             "writes that would change what a probe finds in its first "
             "sector are refused (give --format raw to remove the guard)",
             path);
  bd->priv = r;
  bd->size = sectors((uint64_t)size);
  bd->exec = BD_EXEC_POOL;
  bd->caps.readonly = readonly;
  bd->caps.can_extents = !r->is_block; /* no SEEK_DATA on devices */
  if (align > 1) {
    bd->caps.min_block = (uint32_t)align;
    bd->caps.pref_block = align > 4096 ? (uint32_t)align : 4096;
    bd->caps.aligned_only = true;
  }
  return bd;
}
