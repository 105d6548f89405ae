/* SPDX-License-Identifier: BSD-3-Clause */
/* The FUSE front end (libfuse3 low-level API): see fuse-mount.h.
 *
 * Inodes are fixed at mount time: in a directory mount the root directory
 * is inode 1 and the files (the disk, then its partitions) 2, 3, ...; over
 * a regular file the root is the disk itself.  Every file is a view
 * (offset, length) of the one disk.  Reads, writes, flushes, trims and
 * block status go to the disk with disk_submit() and are answered from the
 * completion, which may run on any thread. */
#define FUSE_USE_VERSION 35 /* libfuse 3.5 and later (Debian 12: 3.14) */
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/disk.h"
#include "core/log.h"
#include "core/reqstats.h"
#include "fuse-flags.h"
#include "fuse-loop.h"
#include "fuse-mount.h"
#include "partition.h"

#define MAX_IO (1u << 20)      /* max_write, and reads of that size */
#define MAX_BACKGROUND 256     /* async requests the kernel keeps going */
#define ATTR_TIMEOUT 1.0       /* st_blocks changes with writes */
#define ENTRY_TIMEOUT 3600.0   /* the files never change */
#define WALK_STEP (1ull << 30) /* block status asked per step */
#define WALK_EXTENTS 1024      /* extents per step */
#define DRAIN_SECONDS 120      /* wait for requests in flight at exit */
#define BIG_IO (128u * 1024)   /* larger requests use the loop's buffers */
#define BIG_CACHED 32          /* loop buffers kept for reuse */
#define REPLIERS 2             /* threads that copy large reads out */

struct mfile {
  char *name;
  fuse_ino_t ino;
  uint64_t offset, length; /* the view of the disk */
  pthread_mutex_t lock;    /* everything below */
  mode_t mode;
  uid_t uid;
  gid_t gid;
  /* Allocated bytes, valid while the disk's write count is alloc_gen. */
  bool alloc_known;
  uint64_t alloc, alloc_gen;
};

struct fm {
  struct fuse_flags_hook hook; /* first: the session's custom I/O finds it */
  struct disk disk;
  struct bd *bd;
  struct fuse_session *se;
  int late_fd; /* see keep_fuse_fd_late() */
  struct fm_config cfg;
  char *mountpoint;
  bool file_mode; /* mounted over a regular file */
  bool readonly;
  struct mfile *files;
  size_t nfiles;
  struct timespec mtime;
  uid_t uid;
  gid_t gid;
  /* Requests in flight, for the drain at exit. */
  atomic_uint inflight;
  atomic_bool stopping;
  struct fuse_loop *loop;
  pthread_mutex_t run_lock; /* idle, and the error log's fields */
  pthread_cond_t idle;
  /* Error log rate limit. */
  time_t last_error_log;
  unsigned errors_unlogged;
  /* Large read replies of an asynchronous source, copied into the kernel
   * by these threads rather than by the source's event thread. */
  pthread_mutex_t reply_lock;
  pthread_cond_t reply_cond;
  struct fio *reply_head, **reply_tail;
  bool reply_stop;
  pthread_t repliers[REPLIERS];
  unsigned nrepliers;
};

/* ---- helpers ---- */

static struct mfile *file_of(struct fm *m, fuse_ino_t ino) {
  fuse_ino_t first = m->file_mode ? FUSE_ROOT_ID : FUSE_ROOT_ID + 1;
  if (ino < first || ino - first >= m->nfiles)
    return NULL;
  return &m->files[ino - first];
}

static bool is_root_dir(const struct fm *m, fuse_ino_t ino) {
  return !m->file_mode && ino == FUSE_ROOT_ID;
}

static void inflight_get(struct fm *m) {
  atomic_fetch_add(&m->inflight, 1);
}

static void inflight_put(struct fm *m) {
  if (atomic_fetch_sub(&m->inflight, 1) == 1 && atomic_load(&m->stopping)) {
    pthread_mutex_lock(&m->run_lock);
    pthread_cond_broadcast(&m->idle);
    pthread_mutex_unlock(&m->run_lock);
  }
}

/* Log an I/O error, at most one line a second (a lost server fails every
 * request). */
static void log_io_error(struct fm *m, const char *what, uint64_t off,
                         int err) {
  time_t now = time(NULL);
  pthread_mutex_lock(&m->run_lock);
  bool log = now != m->last_error_log;
  unsigned skipped = m->errors_unlogged;
  if (log) {
    m->last_error_log = now;
    m->errors_unlogged = 0;
  } else {
    m->errors_unlogged++;
  }
  pthread_mutex_unlock(&m->run_lock);
  if (!log)
    return;
  if (skipped)
    log_error("%s at offset %llu: %s (and %u more errors)", what,
              (unsigned long long)off, strerror(-err), skipped);
  else
    log_error("%s at offset %llu: %s", what, (unsigned long long)off,
              strerror(-err));
}

static void fill_dir_stat(const struct fm *m, struct stat *st) {
  memset(st, 0, sizeof *st);
  st->st_ino = FUSE_ROOT_ID;
  st->st_mode = S_IFDIR | (m->cfg.allow_other ? 0755 : 0700);
  st->st_nlink = 2;
  st->st_uid = m->uid;
  st->st_gid = m->gid;
  st->st_atim = st->st_mtim = st->st_ctim = m->mtime;
}

static void fill_file_stat(const struct fm *m, struct mfile *f, uint64_t alloc,
                           struct stat *st) {
  memset(st, 0, sizeof *st);
  pthread_mutex_lock(&f->lock);
  st->st_mode = S_IFREG | f->mode;
  st->st_uid = f->uid;
  st->st_gid = f->gid;
  pthread_mutex_unlock(&f->lock);
  st->st_ino = f->ino;
  st->st_nlink = 1;
  st->st_size = (off_t)f->length;
  st->st_blocks = (blkcnt_t)((alloc + 511) / 512);
  uint32_t pref = m->bd->caps.pref_block;
  st->st_blksize = pref > 4096 && pref <= MAX_IO ? (blksize_t)pref : 4096;
  st->st_atim = st->st_mtim = st->st_ctim = m->mtime;
}

/* ---- walks: block status over a file, step by step ---- */

enum walk_kind { WALK_ATTR, WALK_ENTRY, WALK_SEEK_DATA, WALK_SEEK_HOLE };

struct walk {
  struct disk_req dr; /* first: completions find the walk */
  struct fm *m;
  struct mfile *f;
  fuse_req_t req;
  enum walk_kind kind;
  uint64_t pos, end; /* disk coordinates */
  uint64_t alloc, gen;
  struct bd_extents ext;
  atomic_int turn; /* submitter and completion: the second one goes on */
  int err;
};

static void reply_attr_now(struct fm *m, fuse_req_t req, struct mfile *f,
                           enum walk_kind kind, uint64_t alloc) {
  if (kind == WALK_ENTRY) {
    struct fuse_entry_param e = {.ino = f->ino,
                                 .attr_timeout = ATTR_TIMEOUT,
                                 .entry_timeout = ENTRY_TIMEOUT};
    fill_file_stat(m, f, alloc, &e.attr);
    fuse_reply_entry(req, &e);
  } else {
    struct stat st;
    fill_file_stat(m, f, alloc, &st);
    fuse_reply_attr(req, &st, ATTR_TIMEOUT);
  }
}

static void walk_end(struct walk *w) {
  struct fm *m = w->m;
  bd_extents_free(&w->ext);
  free(w);
  inflight_put(m);
}

/* The walk reached the end of the file. */
static void walk_complete(struct walk *w) {
  struct mfile *f = w->f;
  switch (w->kind) {
  case WALK_ATTR:
  case WALK_ENTRY:
    pthread_mutex_lock(&f->lock);
    f->alloc = w->alloc;
    f->alloc_gen = w->gen;
    f->alloc_known = true;
    pthread_mutex_unlock(&f->lock);
    reply_attr_now(w->m, w->req, f, w->kind, w->alloc);
    break;
  case WALK_SEEK_DATA: fuse_reply_err(w->req, ENXIO); break;
  case WALK_SEEK_HOLE: fuse_reply_lseek(w->req, (off_t)f->length); break;
  }
  walk_end(w);
}

static void walk_fail(struct walk *w, int err) {
  if (w->kind == WALK_ATTR || w->kind == WALK_ENTRY) {
    /* Still answer a stat: the whole file counted as allocated. */
    reply_attr_now(w->m, w->req, w->f, w->kind, w->f->length);
  } else {
    log_io_error(w->m, "block status", w->pos, err);
    fuse_reply_err(w->req, -err);
  }
  walk_end(w);
}

/* Take in one step's extents.  True when the walk is over (answered and
 * freed). */
static bool walk_consume(struct walk *w) {
  if (w->err < 0) {
    walk_fail(w, w->err);
    return true;
  }
  if (w->ext.end <= w->pos) {
    walk_fail(w, -EIO); /* no progress: the device answered nothing */
    return true;
  }
  uint64_t s = w->ext.start;
  for (size_t i = 0; i < w->ext.n; i++) {
    const struct bd_extent *e = &w->ext.v[i];
    uint64_t es = s > w->pos ? s : w->pos;
    uint64_t ee = s + e->length < w->end ? s + e->length : w->end;
    s += e->length;
    if (es >= ee)
      continue;
    /* A hole for lseek must read as zeroes, not just be unallocated. */
    bool hole =
        (e->flags & (BD_EXT_HOLE | BD_EXT_ZERO)) == (BD_EXT_HOLE | BD_EXT_ZERO);
    if (w->kind == WALK_SEEK_DATA && !hole) {
      fuse_reply_lseek(w->req, (off_t)(es - w->f->offset));
      walk_end(w);
      return true;
    }
    if (w->kind == WALK_SEEK_HOLE && hole) {
      fuse_reply_lseek(w->req, (off_t)(es - w->f->offset));
      walk_end(w);
      return true;
    }
    if (!(e->flags & BD_EXT_HOLE))
      w->alloc += ee - es;
  }
  w->pos = w->ext.end < w->end ? w->ext.end : w->end;
  if (w->pos >= w->end) {
    walk_complete(w);
    return true;
  }
  return false;
}

static void walk_next(struct walk *w);

static void walk_done(struct disk_req *r, int err) {
  struct walk *w = (struct walk *)r;
  w->err = err;
  if (atomic_fetch_add(&w->turn, 1) == 0)
    return; /* the submitter goes on */
  if (!walk_consume(w))
    walk_next(w);
}

/* Submit steps until one completes on another thread (or the walk ends):
 * a source that completes inline does not recurse. */
static void walk_next(struct walk *w) {
  for (;;) {
    uint64_t len = w->end - w->pos < WALK_STEP ? w->end - w->pos : WALK_STEP;
    bd_extents_reset(&w->ext, w->pos, WALK_EXTENTS);
    w->err = 0;
    w->dr = (struct disk_req){.cmd = BD_BLOCK_STATUS,
                              .offset = w->pos,
                              .length = len,
                              .extents = &w->ext,
                              .done = walk_done};
    atomic_store(&w->turn, 0);
    disk_submit(&w->m->disk, &w->dr);
    if (atomic_fetch_add(&w->turn, 1) == 0)
      return; /* the completion goes on */
    if (walk_consume(w))
      return;
  }
}

static void walk_start(struct fm *m, fuse_req_t req, struct mfile *f,
                       enum walk_kind kind, uint64_t from) {
  struct walk *w = calloc(1, sizeof *w);
  if (!w) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  w->m = m;
  w->f = f;
  w->req = req;
  w->kind = kind;
  w->pos = f->offset + from;
  w->end = f->offset + f->length;
  w->gen = atomic_load(&m->disk.writes);
  bd_extents_init(&w->ext, w->pos, WALK_EXTENTS);
  inflight_get(m);
  walk_next(w);
}

/* Attributes with st_blocks from block status, cached until the next
 * write. */
static void reply_attr(struct fm *m, fuse_req_t req, struct mfile *f,
                       enum walk_kind kind) {
  if (!m->bd->caps.can_extents) {
    reply_attr_now(m, req, f, kind, f->length);
    return;
  }
  uint64_t gen = atomic_load(&m->disk.writes);
  pthread_mutex_lock(&f->lock);
  bool fresh = f->alloc_known && f->alloc_gen == gen;
  uint64_t alloc = f->alloc;
  pthread_mutex_unlock(&f->lock);
  if (fresh)
    reply_attr_now(m, req, f, kind, alloc);
  else
    walk_start(m, req, f, kind, 0);
}

/* ---- I/O requests ---- */

struct fio {
  struct disk_req dr; /* first: completions find the request */
  struct fm *m;
  fuse_req_t req;
  uint64_t file_off; /* for messages */
  void *block;       /* a loop buffer holding the data, given back at the end */
  struct fio *next;  /* on the reply queue */
  /* --metrics: what was counted in flight, and when */
  uint64_t t0, mlen;
  enum metrics_cmd mcmd;
  bool failed;
  uint8_t data[]; /* the data of small requests */
};

/* A request with room for DATALEN bytes at *DATA: inline when small, else
 * in a loop buffer. */
static struct fio *fio_new(struct fm *m, fuse_req_t req, size_t datalen,
                           uint8_t **data) {
  bool big = datalen > BIG_IO;
  struct fio *io = malloc(sizeof *io + (big ? 0 : datalen));
  if (!io)
    return NULL;
  io->block = big ? fl_buf_get(m->loop) : NULL;
  if (big && (!io->block || datalen > FL_BUF_SIZE)) {
    fl_buf_put(m->loop, io->block);
    free(io);
    return NULL;
  }
  io->m = m;
  io->req = req;
  io->failed = false;
  if (data)
    *data = big ? io->block : io->data;
  inflight_get(m);
  return io;
}

static void fio_end(struct fio *io) {
  struct fm *m = io->m;
  if (m->cfg.reqs)
    metrics_req_done(m->cfg.reqs, io->mcmd, io->t0, io->mlen, io->failed);
  fl_buf_put(m->loop, io->block);
  free(io);
  inflight_put(m);
}

static void fio_error(struct fio *io, const char *what, int err) {
  io->failed = true;
  log_io_error(io->m, what, io->file_off, err);
  fuse_reply_err(io->req, -err);
}

/* What --metrics calls a disk request: punching a hole is a trim. */
static enum metrics_cmd metrics_cmd_of(const struct disk_req *r) {
  switch (r->cmd) {
  case BD_READ: return METRICS_READ;
  case BD_WRITE: return METRICS_WRITE;
  case BD_FLUSH: return METRICS_FLUSH;
  case BD_ZERO:
    return r->flags & BD_F_MAY_TRIM ? METRICS_TRIM : METRICS_WRITE_ZEROES;
  default: return METRICS_OTHER;
  }
}

/* Send IO's request to the disk, counted in flight for --metrics. */
static void fio_submit(struct fm *m, struct fio *io) {
  if (m->cfg.reqs) {
    io->mcmd = metrics_cmd_of(&io->dr);
    io->mlen = io->dr.length;
    io->t0 = metrics_req_start(m->cfg.reqs, io->mcmd, io->mlen);
  }
  disk_submit(&m->disk, &io->dr);
}

/* ---- large read replies off the source's thread ---- */

/* An asynchronous source completes on its own event thread (one for an
 * NBD device), which also reads the next replies from the network:
 * copying a large read into the kernel there holds up every other
 * completion, so such replies go to the repliers.  Small ones are sent at
 * once: a hand-off would cost more than the copy. */
static bool reply_later(struct fm *m, struct fio *io) {
  if (m->nrepliers == 0 || io->dr.length < BIG_IO)
    return false;
  io->next = NULL;
  pthread_mutex_lock(&m->reply_lock);
  *m->reply_tail = io;
  m->reply_tail = &io->next;
  pthread_cond_signal(&m->reply_cond);
  pthread_mutex_unlock(&m->reply_lock);
  return true;
}

static void *replier(void *arg) {
  struct fm *m = arg;
  pthread_mutex_lock(&m->reply_lock);
  for (;;) {
    while (!m->reply_head && !m->reply_stop)
      pthread_cond_wait(&m->reply_cond, &m->reply_lock);
    struct fio *io = m->reply_head;
    if (!io)
      break;
    m->reply_head = io->next;
    if (!m->reply_head)
      m->reply_tail = &m->reply_head;
    pthread_mutex_unlock(&m->reply_lock);
    fuse_reply_buf(io->req, io->dr.buf, io->dr.length);
    fio_end(io);
    pthread_mutex_lock(&m->reply_lock);
  }
  pthread_mutex_unlock(&m->reply_lock);
  return NULL;
}

static void repliers_start(struct fm *m) {
  pthread_mutex_init(&m->reply_lock, NULL);
  pthread_cond_init(&m->reply_cond, NULL);
  m->reply_tail = &m->reply_head;
  if (m->bd->exec != BD_EXEC_ASYNC)
    return;
  while (m->nrepliers < REPLIERS &&
         pthread_create(&m->repliers[m->nrepliers], NULL, replier, m) == 0)
    pthread_setname_np(m->repliers[m->nrepliers++], "bp-fuse-reply");
}

/* After the drain: the queue is empty. */
static void repliers_stop(struct fm *m) {
  pthread_mutex_lock(&m->reply_lock);
  m->reply_stop = true;
  pthread_cond_broadcast(&m->reply_cond);
  pthread_mutex_unlock(&m->reply_lock);
  for (unsigned i = 0; i < m->nrepliers; i++)
    pthread_join(m->repliers[i], NULL);
  m->nrepliers = 0;
  pthread_cond_destroy(&m->reply_cond);
  pthread_mutex_destroy(&m->reply_lock);
}

static void read_done(struct disk_req *r, int err) {
  struct fio *io = (struct fio *)r;
  if (err < 0)
    fio_error(io, "read", err);
  else if (reply_later(io->m, io))
    return;
  else
    fuse_reply_buf(io->req, r->buf, r->length);
  fio_end(io);
}

static void write_done(struct disk_req *r, int err) {
  struct fio *io = (struct fio *)r;
  if (err < 0)
    fio_error(io, "write", err);
  else
    fuse_reply_write(io->req, r->length);
  fio_end(io);
}

static void status_done(struct disk_req *r, int err) {
  struct fio *io = (struct fio *)r;
  if (err < 0)
    fio_error(io, r->cmd == BD_FLUSH ? "flush" : "zero", err);
  else
    fuse_reply_err(io->req, 0);
  fio_end(io);
}

/* Submit a request without data: flush, zero. */
static void submit_status(struct fm *m, fuse_req_t req, enum bd_cmd cmd,
                          uint32_t flags, uint64_t off, uint64_t len) {
  struct fio *io = fio_new(m, req, 0, NULL);
  if (!io) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  io->file_off = off;
  io->dr = (struct disk_req){
      .cmd = cmd, .flags = flags, .offset = off, .length = len};
  io->dr.done = status_done;
  fio_submit(m, io);
}

/* ---- operations ---- */

static void op_init(void *userdata, struct fuse_conn_info *conn) {
  struct fm *m = userdata;
  conn->max_write = MAX_IO;
  conn->max_background = MAX_BACKGROUND;
  conn->congestion_threshold = MAX_BACKGROUND * 3 / 4;
  /* Several reads of one file at once, and O_DIRECT aio kept in flight. */
  conn->want |= conn->capable & (FUSE_CAP_ASYNC_READ | FUSE_CAP_ASYNC_DIO);
  /* O_TRUNC comes as a setattr, which a disk answers by keeping its size;
   * an atomic O_TRUNC would make the kernel believe the size is 0. */
  conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
  /* Requests arrive in memory buffers, which a write may keep (see
   * fuse-loop.h); spliced ones would arrive in a pipe. */
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_MOVE);
  if (m->cfg.direct_io && !atomic_load(&m->hook.offered))
    log_warn("this kernel cannot map a direct-I/O file shared (no "
             "FUSE_DIRECT_IO_ALLOW_MMAP, Linux < 6.6): a shared writable "
             "mmap of the disk fails with ENODEV; --cache page allows it");
  if (m->cfg.live)
    m->cfg.live(m->cfg.opaque);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  struct fm *m = fuse_req_userdata(req);
  if (!is_root_dir(m, parent)) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  for (size_t i = 0; i < m->nfiles; i++) {
    if (strcmp(m->files[i].name, name) == 0) {
      reply_attr(m, req, &m->files[i], WALK_ENTRY);
      return;
    }
  }
  fuse_reply_err(req, ENOENT);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
                       struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  if (f) {
    reply_attr(m, req, f, WALK_ATTR);
  } else if (is_root_dir(m, ino)) {
    struct stat st;
    fill_dir_stat(m, &st);
    fuse_reply_attr(req, &st, ATTR_TIMEOUT);
  } else {
    fuse_reply_err(req, ENOENT);
  }
}

/* A disk keeps its size.  The O_TRUNC of an open (which comes without a
 * file handle) is ignored, as a block device ignores it; any other size
 * change fails.  Mode and owner live in memory; times are accepted. */
static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
                       int to_set, struct fuse_file_info *fi) {
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  if (!f) {
    fuse_reply_err(req, is_root_dir(m, ino) ? EPERM : ENOENT);
    return;
  }
  if ((to_set & FUSE_SET_ATTR_SIZE) && (uint64_t)attr->st_size != f->length &&
      !(fi == NULL && attr->st_size == 0)) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  pthread_mutex_lock(&f->lock);
  if (to_set & FUSE_SET_ATTR_MODE)
    f->mode = attr->st_mode & 07777;
  if (to_set & FUSE_SET_ATTR_UID)
    f->uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID)
    f->gid = attr->st_gid;
  pthread_mutex_unlock(&f->lock);
  reply_attr(m, req, f, WALK_ATTR);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  struct fm *m = fuse_req_userdata(req);
  if (!file_of(m, ino)) {
    fuse_reply_err(req, is_root_dir(m, ino) ? EISDIR : ENOENT);
    return;
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY && m->readonly) {
    fuse_reply_err(req, EROFS);
    return;
  }
  fi->direct_io = m->cfg.direct_io;
  fi->keep_cache = !m->cfg.direct_io;
  fi->noflush = 1; /* close does not flush; fsync does */
  fflags_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  if (!f || off < 0) {
    fuse_reply_err(req, f ? EINVAL : ENOENT);
    return;
  }
  if ((uint64_t)off >= f->length || size == 0) {
    fuse_reply_buf(req, NULL, 0); /* reads past the end are empty */
    return;
  }
  uint64_t n =
      f->length - (uint64_t)off < size ? f->length - (uint64_t)off : size;
  uint8_t *data;
  struct fio *io = fio_new(m, req, n, &data);
  if (!io) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  io->file_off = (uint64_t)off;
  io->dr = (struct disk_req){.cmd = BD_READ,
                             .flags = BD_F_INLINE_BIG,
                             .offset = f->offset + (uint64_t)off,
                             .length = n,
                             .buf = data,
                             .done = read_done};
  fio_submit(m, io);
}

/* A write request holding N bytes of BUF: a large one keeps the buffer
 * the request arrived in; a small one copies (cheaper than a buffer).
 * Reads and writes carry BD_F_INLINE_BIG: with several receive threads,
 * one copying a large request into the page cache itself costs less than
 * handing it to another thread and waking it. */
static struct fio *write_request(struct fm *m, fuse_req_t req, const char *buf,
                                 size_t n) {
  void *block = n > BIG_IO ? fl_take_request_buf(buf) : NULL;
  uint8_t *data = (uint8_t *)buf;
  struct fio *io = fio_new(m, req, block ? 0 : n, block ? NULL : &data);
  if (!io) {
    fl_buf_put(m->loop, block);
    return NULL;
  }
  if (block)
    io->block = block;
  else
    memcpy(data, buf, n);
  io->dr = (struct disk_req){.cmd = BD_WRITE,
                             .flags = BD_F_INLINE_BIG,
                             .length = n,
                             .buf = data,
                             .done = write_done};
  return io;
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
                     size_t size, off_t off, struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  if (!f || off < 0) {
    fuse_reply_err(req, f ? EINVAL : ENOENT);
    return;
  }
  if (size == 0) {
    fuse_reply_write(req, 0);
    return;
  }
  if ((uint64_t)off >= f->length) {
    fuse_reply_err(req, ENOSPC);
    return;
  }
  /* A write across the end is short; the rest then gets ENOSPC. */
  uint64_t n =
      f->length - (uint64_t)off < size ? f->length - (uint64_t)off : size;
  struct fio *io = write_request(m, req, buf, n);
  if (!io) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  io->file_off = (uint64_t)off;
  io->dr.offset = f->offset + (uint64_t)off;
  fio_submit(m, io);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                     struct fuse_file_info *fi) {
  (void)ino, (void)datasync, (void)fi;
  struct fm *m = fuse_req_userdata(req);
  if (m->readonly) {
    fuse_reply_err(req, 0);
    return;
  }
  submit_status(m, req, BD_FLUSH, 0, 0, 0);
}

/* PUNCH_HOLE deallocates and must read back as zeroes: a zero that may
 * trim.  ZERO_RANGE zeroes and keeps the blocks.  Plain allocation has
 * nothing to do inside a disk and cannot grow it. */
static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
                         off_t len, struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  const int known =
      FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
  if (!f) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  if (mode & ~known) {
    fuse_reply_err(req, EOPNOTSUPP);
    return;
  }
  if (off < 0 || len <= 0 || len > INT64_MAX - off) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  if (m->readonly) {
    fuse_reply_err(req, EROFS);
    return;
  }
  uint64_t s = (uint64_t)off, e = (uint64_t)off + (uint64_t)len;
  if (e > f->length) {
    if (!(mode & FALLOC_FL_KEEP_SIZE)) {
      fuse_reply_err(req, ENOSPC);
      return;
    }
    e = f->length;
  }
  if (s >= e || !(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))) {
    fuse_reply_err(req, 0);
    return;
  }
  uint32_t flags = (mode & FALLOC_FL_PUNCH_HOLE) ? BD_F_MAY_TRIM : 0;
  submit_status(m, req, BD_ZERO, flags, f->offset + s, e - s);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
                     struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  struct mfile *f = file_of(m, ino);
  if (!f) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  if (whence != SEEK_DATA && whence != SEEK_HOLE) {
    fuse_reply_err(req, EINVAL); /* the kernel answers the others itself */
    return;
  }
  if (off < 0 || (uint64_t)off >= f->length) {
    fuse_reply_err(req, ENXIO);
    return;
  }
  walk_start(m, req, f, whence == SEEK_DATA ? WALK_SEEK_DATA : WALK_SEEK_HOLE,
             (uint64_t)off);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
  (void)fi;
  struct fm *m = fuse_req_userdata(req);
  if (!is_root_dir(m, ino)) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  char *buf = malloc(size ? size : 1);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  size_t used = 0;
  /* Entry i: 0 ".", 1 "..", then the files; the offset of entry i is the
   * index of the next. */
  for (size_t i = off < 0 ? 0 : (size_t)off; i < m->nfiles + 2; i++) {
    struct stat st = {.st_ino = FUSE_ROOT_ID, .st_mode = S_IFDIR};
    const char *name = i == 0 ? "." : "..";
    if (i >= 2) {
      name = m->files[i - 2].name;
      st.st_ino = m->files[i - 2].ino;
      st.st_mode = S_IFREG;
    }
    size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st,
                                    (off_t)i + 1);
    if (need > size - used)
      break;
    used += need;
  }
  fuse_reply_buf(req, buf, used);
  free(buf);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino) {
  (void)ino;
  struct fm *m = fuse_req_userdata(req);
  struct statvfs sv = {.f_bsize = 4096,
                       .f_frsize = 4096,
                       .f_blocks = (m->disk.size + 4095) / 4096,
                       .f_files = m->nfiles + 1,
                       .f_namemax = 255};
  fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops fm_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .fsync = op_fsync,
    .readdir = op_readdir,
    .statfs = op_statfs,
    .fallocate = op_fallocate,
    .lseek = op_lseek,
};

/* ---- setting up ---- */

static int out_of_memory(void) {
  bd_set_error("%s", strerror(ENOMEM));
  return -ENOMEM;
}

static int add_file(struct fm *m, const char *name, uint64_t off,
                    uint64_t len) {
  struct mfile *v = realloc(m->files, (m->nfiles + 1) * sizeof *v);
  if (!v)
    return out_of_memory();
  m->files = v;
  struct mfile *f = &v[m->nfiles];
  memset(f, 0, sizeof *f);
  if (!(f->name = strdup(name)))
    return out_of_memory();
  m->nfiles++;
  f->ino = m->file_mode ? FUSE_ROOT_ID : FUSE_ROOT_ID + m->nfiles;
  f->offset = off;
  f->length = len;
  f->mode = m->readonly ? 0400 : 0600;
  if (m->cfg.allow_other)
    f->mode |= m->readonly ? 0044 : 0066;
  f->uid = m->uid;
  f->gid = m->gid;
  pthread_mutex_init(&f->lock, NULL);
  return 0;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A read of the table; on a source whose EIO may pass (transient_eio)
 * EIO is tried again every 0.5 s for table_retry_s, so that one lost
 * request to a remote source does not fail the mount.  A local file's EIO
 * fails the mount at once. */
static int read_for_table(void *opaque, uint64_t off, void *buf, size_t len) {
  struct fm *m = opaque;
  int64_t retry_ms =
      m->bd->caps.transient_eio ? (int64_t)m->cfg.table_retry_s * 1000 : 0;
  int64_t deadline = mono_ms() + retry_ms;
  for (;;) {
    int r = disk_pread(&m->disk, buf, len, off);
    if (r != -EIO || mono_ms() >= deadline)
      return r;
    log_warn("reading the partition table at %llu: %s; trying again",
             (unsigned long long)off, strerror(-r));
    nanosleep(&(struct timespec){.tv_nsec = 500000000}, NULL);
  }
}

/* NAME-pN for each partition of an MBR or GPT. */
static int add_partitions(struct fm *m) {
  struct pt_table *t = malloc(sizeof *t);
  if (!t)
    return out_of_memory();
  int r = pt_parse(read_for_table, m, m->disk.size, t);
  if (r < 0) {
    bd_set_error("reading the partition table: %s", strerror(-r));
    free(t);
    return r;
  }
  if (t->nwarnings)
    log_warn("partition table: %s%s", t->warning,
             t->nwarnings > 1 ? " (and more)" : "");
  for (size_t i = 0; i < t->n && r == 0; i++) {
    char name[512];
    snprintf(name, sizeof name, "%s-p%u", m->cfg.name, t->parts[i].number);
    r = add_file(m, name, t->parts[i].offset, t->parts[i].length);
  }
  if (t->n)
    log_info("%s partition table: %zu partition%s",
             t->type == PT_GPT ? "GPT" : "MBR", t->n, t->n == 1 ? "" : "s");
  free(t);
  return r;
}

static int check_mountpoint(struct fm *m, const char *path) {
  struct stat st;
  if (stat(path, &st) < 0) {
    int e = errno;
    if (e == ENOTCONN)
      bd_set_error("%s: %s (a FUSE mount whose daemon is gone? "
                   "fusermount3 -u it)",
                   path, strerror(e));
    else
      bd_set_error("mount point %s: %s", path, strerror(e));
    return -e;
  }
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    bd_set_error("mount point %s is neither a directory nor a regular file",
                 path);
    return -EINVAL;
  }
  m->file_mode = S_ISREG(st.st_mode);
  return 0;
}

static bool name_ok(const char *name) {
  return *name && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 &&
         !strchr(name, '/') && strlen(name) < 200;
}

static struct fuse_session *session_new(struct fm *m) {
  char opts[256];
  snprintf(
      opts, sizeof opts,
      "fsname=blockport,subtype=blockport,default_permissions,auto_unmount%s%s",
      m->cfg.allow_other ? ",allow_other" : "", m->readonly ? ",ro" : "");
  char *argv[] = {"blockport", "-o", opts, NULL};
  struct fuse_args args = FUSE_ARGS_INIT(3, argv);
  struct fuse_session *se = fuse_session_new(&args, &fm_ops, sizeof fm_ops, m);
  fuse_opt_free_args(&args);
  if (!se)
    bd_set_error("cannot create a FUSE session");
  return se;
}

static void fm_free(struct fm *m) {
  if (m->reply_tail)
    repliers_stop(m);
  for (size_t i = 0; i < m->nfiles; i++) {
    free(m->files[i].name);
    pthread_mutex_destroy(&m->files[i].lock);
  }
  free(m->files);
  free(m->mountpoint);
  fl_free(m->loop);
  pthread_cond_destroy(&m->idle);
  pthread_mutex_destroy(&m->run_lock);
  disk_fini(&m->disk);
  free(m);
}

/* auto_unmount hands the unmount to a fusermount3 process that waits for
 * a socket of ours to close, then opens the mount point to check that it
 * is a dead FUSE mount (ENOTCONN) before unmounting.  When we are killed,
 * the kernel releases our descriptors in the reverse order of their
 * numbers, and libfuse's socket has a higher number than the FUSE device:
 * fusermount3 could wake while the connection was still up, its open()
 * then failed with ECONNABORTED as the connection went down, and it left a
 * dead mount behind.  A copy of the device's descriptor numbered above
 * every other is released first, so the connection is down before the
 * socket closes.  Best effort: without it auto_unmount is as racy as
 * libfuse makes it. */
static int keep_fuse_fd_late(int fuse_fd) {
  struct rlimit rl;
  int high = 4095;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur <= (rlim_t)high)
    high = (int)rl.rlim_cur - 1;
  int fd = fcntl(fuse_fd, F_DUPFD_CLOEXEC, high);
  if (fd < 0)
    log_debug("no late copy of the FUSE descriptor: %s", strerror(errno));
  return fd;
}

static void close_late_fd(struct fm *m) {
  if (m->late_fd >= 0)
    close(m->late_fd);
  m->late_fd = -1;
}

struct fm *fm_create(struct bd *bd, const struct fm_config *cfg) {
  if (!name_ok(cfg->name)) {
    bd_set_error("'%s' cannot be a file name", cfg->name);
    return NULL;
  }
  struct fm *m = calloc(1, sizeof *m);
  if (!m) {
    out_of_memory();
    return NULL;
  }
  if (disk_init(&m->disk, bd) < 0) {
    free(m);
    return NULL;
  }
  pthread_mutex_init(&m->run_lock, NULL);
  pthread_cond_init(&m->idle, NULL);
  m->bd = bd;
  m->late_fd = -1;
  m->cfg = *cfg;
  m->readonly = bd->caps.readonly;
  m->uid = getuid();
  m->gid = getgid();
  clock_gettime(CLOCK_REALTIME, &m->mtime);
  if (!(m->mountpoint = realpath(cfg->mountpoint, NULL))) {
    if (errno == ENOTCONN)
      check_mountpoint(m, cfg->mountpoint);
    else
      bd_set_error("mount point %s: %s", cfg->mountpoint, strerror(errno));
    goto fail;
  }
  if (check_mountpoint(m, m->mountpoint) < 0 ||
      add_file(m, cfg->name, 0, bd->size) < 0 ||
      (!m->file_mode && cfg->partitions && add_partitions(m) < 0))
    goto fail;
  if (!(m->se = session_new(m)))
    goto fail;
  if (!(m->loop = fl_new(m->se, cfg->threads, BIG_CACHED))) {
    out_of_memory();
    fuse_session_destroy(m->se);
    goto fail;
  }
  repliers_start(m);
  if (fuse_session_mount(m->se, m->mountpoint) != 0) {
    bd_set_error("cannot mount on %s", m->mountpoint);
    fuse_session_destroy(m->se);
    goto fail;
  }
  m->late_fd = keep_fuse_fd_late(fuse_session_fd(m->se));
  m->hook.want_mmap = m->cfg.direct_io;
  int r = fflags_install(m->se);
  if (r < 0) /* then shared mappings of the disk are refused */
    log_warn("cannot hook the FUSE replies: %s", strerror(-r));
  return m;
fail:
  fm_free(m);
  return NULL;
}

/* ---- running and stopping ---- */

int fm_run(struct fm *m) {
  return fl_run(m->loop);
}

void fm_stop(struct fm *m) {
  fl_stop(m->loop);
}

/* Wait for requests in flight; false if some are still out after the
 * deadline. */
static bool drain(struct fm *m) {
  atomic_store(&m->stopping, true);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += DRAIN_SECONDS;
  pthread_mutex_lock(&m->run_lock);
  while (atomic_load(&m->inflight) > 0 &&
         pthread_cond_timedwait(&m->idle, &m->run_lock, &deadline) != ETIMEDOUT)
    ;
  bool idle = atomic_load(&m->inflight) == 0;
  pthread_mutex_unlock(&m->run_lock);
  return idle;
}

int fm_destroy(struct fm *m) {
  int ret = 0;
  if (!drain(m)) {
    /* Their completions would touch freed memory: unmount, keep the rest
     * (the process is about to exit). */
    log_error("%u requests still in flight after %d s; unmounting anyway",
              atomic_load(&m->inflight), DRAIN_SECONDS);
    close_late_fd(m);
    fuse_session_unmount(m->se);
    return -2;
  }
  if (!m->readonly) {
    struct disk_req fl = {.cmd = BD_FLUSH};
    int r = disk_run(&m->disk, &fl);
    if (r < 0) {
      log_error("flush: %s", strerror(-r));
      ret = -1;
    }
  }
  close_late_fd(m);
  fuse_session_unmount(m->se);
  fuse_session_destroy(m->se);
  fm_free(m);
  return ret;
}
