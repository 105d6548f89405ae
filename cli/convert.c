/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport convert: copy an image into a new raw or qcow2 file, skipping
 * what reads as zeroes, with many requests in flight through the block
 * device interface (any source blockport opens, any chain). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "formats/rbd-admin.h"
#include "formats/rbd-spec.h"

#include "backing.h"
#include "cli.h"
#include "commands.h"
#include "copy-bitmaps.h"
#include "image-opts.h"

#define CHUNK (2u * 1024 * 1024) /* bytes per request, at least */
#define SLOTS 16                 /* requests in flight, at most (-m) */
/* By default as qemu-img's -m: more writers into one local file contend
 * for its inode lock (docs/BENCHMARKS.md, convert of a 4 GiB chain). */
#define SLOTS_DEFAULT 8
#define WALK (256ull << 20)    /* block status asked per step */
#define MAX_SPARSE (16u << 20) /* -S, as qemu-img allows it */
#define MAX_SOURCES 64         /* SRC... concatenated */
#define SALVAGE_BLOCK 512u     /* --salvage rereads a failed read so */

static const char convert_usage[] =
    "Usage: blockport convert [-p] [-c] [-C] [-U] [-n] [-W] [-f FMT]\n"
    "                         [-l SNAPSHOT_PARAM]\n"
    "                         -O raw|qcow2\n"
    "                         [-o OPTIONS] [-B BACKING [-F FMT]] [-S SIZE]\n"
    "                         [-m N] [-t CACHE] [-T CACHE]\n"
    "                         [--target-is-zero] [--bitmaps "
    "[--skip-broken-bitmaps]]\n"
    "                         [-r RATE] [--salvage] [-q] SRC... DST\n"
    "       blockport convert [-p] [-c] -O raw|qcow2 --plugin PLUGIN "
    "[KEY=VALUE...] DST\n"
    "Copy SRC (raw, qcow2 with its backing chain, null:SIZE, memory:SIZE,\n"
    "an NBD URI, rbd:POOL/IMAGE[@SNAP]) into a new image DST, skipping\n"
    "ranges that read as zeroes, with many requests in flight.  DST is\n"
    "created (or overwritten); a DST rbd:POOL/IMAGE is a new RBD image\n"
    "(-O raw; an existing one is an error).\n"
    "  -p            show progress on a terminal\n"
    "  -c            compress the clusters of a qcow2 DST (deflate)\n"
    "  -C            copy offloading: data that lies in files on both\n"
    "                sides (a raw DST) is copied inside the kernel\n"
    "                (copy_file_range), zeroes in it included; not with\n"
    "                -S or -c\n"
    "  -f FMT        format of SRC instead of probing\n"
    "  -l SNAPSHOT_PARAM  copy the internal snapshot of a qcow2 SRC that\n"
    "                snapshot.id=ID and/or snapshot.name=NAME names, or\n"
    "                one whose ID, else name, is SNAPSHOT_PARAM\n"
    "  -U            read a SRC that another process writes (without it,\n"
    "                such a SRC is refused, as by qemu-img)\n"
    "  -O FMT        format of DST: raw or qcow2 (64k clusters, v3)\n"
    "  -o OPTIONS    options of the new DST, as create's -o (cluster_size,\n"
    "                compat, extended_l2, compression_type, refcount_bits,\n"
    "                lazy_refcounts, preallocation, backing_file,\n"
    "                backing_fmt, data_file, data_file_raw); -o help\n"
    "                lists them\n"
    "  -n            DST exists: write into it, do not create it (it must\n"
    "                be as large as SRC); zeroes are written too\n"
    "  --target-is-zero  with -n: DST reads as zeroes, skip writing them\n"
    "  --bitmaps     copy the persistent bitmaps of a qcow2 SRC into a\n"
    "                qcow2 DST (names, granularities, enabled or not, bits)\n"
    "  --skip-broken-bitmaps  with --bitmaps: leave out inconsistent\n"
    "                bitmaps (with a warning) instead of refusing\n"
    "  -S SIZE       zeroes are left unwritten (sparse) in aligned runs of\n"
    "                SIZE, a multiple of 512 up to 16M (default: 4k for raw,\n"
    "                the cluster size for qcow2); 0: write everything, the\n"
    "                DST fully allocated\n"
    "  -m N          requests in flight, 1-16 (default 8)\n"
    "  -W            accepted for qemu-img's sake: writes are always out of\n"
    "                order here\n"
    "  -B BACKING    DST (qcow2) gets BACKING as its backing file (a file\n"
    "                name relative to DST's directory, or an NBD URI) and\n"
    "                only the clusters where SRC differs from it\n"
    "  -F FMT        format of BACKING: raw or qcow2 (default: probed)\n"
    "  -t CACHE      cache mode of DST, as qemu-img's: writeback (default),\n"
    "                none (O_DIRECT), writethrough, directsync, unsafe\n"
    "  -T CACHE      cache mode of SRC (the same modes)\n"
    "  --plugin PLUGIN  SRC is an nbdkit plugin (a .so path or a name in\n"
    "                nbdkit's plugin directory) with its KEY=VALUE "
    "parameters\n"
    "  --source-option KEY=VALUE  an option of SRC's format (repeatable;\n"
    "                l2-cache-size for qcow2, connections and timeout for\n"
    "                an NBD URI, ...): a key it does not take is refused\n"
    "  -r RATE       copy at most RATE bytes per second (suffixes k, M, G,\n"
    "                T, P, E; 0: no limit)\n"
    "  --salvage     a read that fails is retried 512 bytes at a time; what\n"
    "                cannot be read is written as zeroes, with a warning\n"
    "                (none with -q), and the copy goes on (exit status 0)\n"
    "  -q            quiet: no --salvage warnings, no progress\n"
    "Several SRC are copied one after another into DST (not with -B or\n"
    "--bitmaps), each probed for its format unless -f names it.\n"
    "DST may not be SRC or a file of its backing chain.  Exit status: 0\n"
    "success, 1 bad usage or failure.\n";

/* Where a slot is: reading the source, reading what the destination's
 * backing file holds there (-B), or writing. */
enum phase { READ_SRC, READ_BASE, WRITING, SALVAGE };

/* One request slot: read from the source, then write to the destination.
 * With -B, read the destination too (its backing file shows through) and
 * write only the clusters that differ, one run after another. */
struct slot {
  struct bd_req req; /* first: completions find the slot */
  struct copy *cp;
  uint8_t *buf, *base;
  enum phase phase;
  uint64_t start, len, pos; /* the range, and how far -B has written it */
  uint64_t salv;            /* --salvage: the piece being read again */
};

struct copy {
  struct bd *src, *dst; /* SRC: the one being copied, of SRCS */
  struct bd **srcs;
  size_t nsrcs;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct slot slots[SLOTS];
  struct slot *free[SLOTS];
  unsigned nfree;
  int err;
  uint64_t done, total;
  bool progress;
  uint32_t write_flags; /* BD_F_COMPRESS with -c */
  bool diff;            /* -B: write only what differs from the backing */
  unsigned nslots;      /* -m */
  uint64_t chunk;       /* bytes per request */
  uint64_t grain;       /* -S: compared (and left sparse) per this much */
  bool full;            /* -S 0: every byte written, as data */
  bool dirty_dst;       /* -n without --target-is-zero: zeroes written */
  bool offload;         /* -C: copy_file_range where both are files */
  uint64_t base;        /* where the source goes in the destination */
  bool salvage, quiet;  /* --salvage, -q */
  uint64_t rate;        /* -r: bytes per second, 0: no limit */
  struct timespec t0;   /* -r: when the copy started */
  uint64_t sent;        /* -r: bytes asked of the sources so far */
};

static void add_done(struct copy *cp, uint64_t n) {
  pthread_mutex_lock(&cp->lock);
  cp->done += n;
  pthread_mutex_unlock(&cp->lock);
}

/* The end of the grain of POS, or END. */
static uint64_t grain_end(const struct copy *cp, uint64_t pos, uint64_t end) {
  uint64_t e = (pos / cp->grain + 1) * cp->grain;
  return e < end ? e : end;
}

static bool all_zero(const uint8_t *p, uint64_t n) {
  return p[0] == 0 && !memcmp(p, p + 1, n - 1);
}

/* Whether the source's [a, b) equals what the destination holds there:
 * with -B its backing file's data, else zeroes (it is new, or -n with
 * --target-is-zero).  Never, when everything is written (-S 0, -n). */
static bool same_at(const struct slot *s, uint64_t a, uint64_t b) {
  const uint8_t *p = s->buf + (a - s->start);
  if (s->cp->full || s->cp->dirty_dst)
    return false;
  return s->base ? !memcmp(p, s->base + (a - s->start), b - a)
                 : all_zero(p, b - a);
}

/* The next run of clusters from S->pos on where the source and the
 * destination differ, as [*A, *B); false when there is none. */
static bool next_diff(const struct slot *s, uint64_t *a, uint64_t *b) {
  uint64_t pos = s->pos, end = s->start + s->len;
  const struct copy *cp = s->cp;
  while (pos < end && same_at(s, pos, grain_end(cp, pos, end)))
    pos = grain_end(cp, pos, end);
  if (pos == end)
    return false;
  *a = pos;
  while (pos < end && !same_at(s, pos, grain_end(cp, pos, end)))
    pos = grain_end(cp, pos, end);
  *b = pos;
  return true;
}

/* Write the next differing run of S (zeroes as a zero write, so
 * that qcow2 marks whole clusters zero).  False when S is done. */
static bool write_next_diff(struct slot *s) {
  uint64_t a, b;
  if (!next_diff(s, &a, &b))
    return false;
  uint8_t *p = s->buf + (a - s->start);
  bool zero = !s->cp->full && all_zero(p, b - a); /* -S 0: zeroes as data */
  s->phase = WRITING;
  s->pos = b;
  s->req = (struct bd_req){.cmd = zero ? BD_ZERO : BD_WRITE,
                           .flags = zero ? 0 : s->cp->write_flags,
                           .offset = a + s->cp->base,
                           .length = b - a,
                           .buf = p,
                           .done = s->req.done};
  bd_submit(s->cp->dst, &s->req);
  return true;
}

static const char *phase_name(enum phase p) {
  return p == READ_SRC || p == SALVAGE ? "read"
         : p == READ_BASE              ? "read of the backing file"
                                       : "write";
}

static void slot_done(struct bd_req *req, int err);

/* --salvage: the next SALVAGE_BLOCK of a failed read, read again. */
static void salvage_next(struct slot *s) {
  struct copy *cp = s->cp;
  uint64_t end = s->start + s->len, blk = SALVAGE_BLOCK;
  if (cp->src->caps.min_block > blk)
    blk = cp->src->caps.min_block;
  uint64_t n = end - s->salv < blk ? end - s->salv : blk;
  s->req.offset = s->salv;
  s->req.length = n;
  s->req.buf = s->buf + (s->salv - s->start);
  bd_submit(cp->src, &s->req);
}

/* A piece read again: what cannot be read is zeroes, said unless -q;
 * once the range is done, it goes on as read. */
static void salvage_done(struct bd_req *req, int err) {
  struct slot *s = (struct slot *)req;
  struct copy *cp = s->cp;
  if (err < 0) {
    if (!cp->quiet)
      cli_error("convert", NULL, "warning: error while reading offset %llu: %s",
                (unsigned long long)req->offset, strerror(-err));
    memset(req->buf, 0, req->length);
  }
  s->salv += req->length;
  if (s->salv < s->start + s->len) {
    salvage_next(s);
    return;
  }
  s->phase = READ_SRC;
  s->req = (struct bd_req){.cmd = BD_READ,
                           .offset = s->start,
                           .length = s->len,
                           .buf = s->buf,
                           .done = slot_done};
  slot_done(&s->req, 0);
}

static void slot_done(struct bd_req *req, int err) {
  struct slot *s = (struct slot *)req;
  struct copy *cp = s->cp;
  if (err < 0 && s->phase == READ_SRC && cp->salvage) {
    s->phase = SALVAGE;
    s->salv = s->start;
    s->req.done = salvage_done;
    salvage_next(s);
    return;
  }
  if (err == 0 && s->phase == READ_SRC && cp->diff) {
    /* The destination reads as its backing file: what is there now. */
    s->phase = READ_BASE;
    s->req.buf = s->base;
    bd_submit(cp->dst, &s->req);
    return;
  }
  /* The data is in: the runs of clusters that are not zeroes go out to
   * the new destination (it reads as zeroes already: an RBD image keeps
   * no object, a file no block for the rest), then with -B those that
   * differ from its backing file, one after another. */
  if (err == 0 && write_next_diff(s))
    return;
  pthread_mutex_lock(&cp->lock);
  if (err < 0 && cp->err == 0) {
    cp->err = err;
    cli_error("convert", NULL, "%s at offset %llu: %s", phase_name(s->phase),
              (unsigned long long)req->offset, req->errmsg);
  }
  if (err == 0)
    cp->done += s->len;
  cp->free[cp->nfree++] = s;
  pthread_cond_signal(&cp->cond);
  pthread_mutex_unlock(&cp->lock);
}

static void show_progress(struct copy *cp) {
  /* Grains widened around data may count a few bytes twice. */
  uint64_t done = cp->done < cp->total ? cp->done : cp->total;
  if (cp->progress && cp->total)
    fprintf(stderr, "\r    (%6.2f/100%%)",
            100.0 * (double)done / (double)cp->total);
}

/* -C: copy what lies in host files on both sides inside the kernel, up to
 * the first piece that does not (it goes through memory, and the next
 * one is tried again).  0, or -errno for a failure of the copy itself. */
static int offload(struct copy *cp, uint64_t *off, uint64_t *len) {
  uint64_t done = 0;
  int r = bd_copy_range(cp->src, cp->dst, *off, *len, &done);
  add_done(cp, done);
  *off += done;
  *len -= done;
  if (r == -EIO || r == -ENOSPC || r == -EDQUOT || r == -EFBIG) {
    cli_error("convert", NULL, "copy_file_range at offset %llu: %s",
              (unsigned long long)*off, strerror(-r));
    return r;
  }
  return 0;
}

/* -r: wait until the N bytes about to be read keep the copy within its
 * rate since it started (the first piece goes at once, as in qemu-img). */
static void rate_wait(struct copy *cp, uint64_t n) {
  if (!cp->rate)
    return;
  double due = (double)cp->sent / (double)cp->rate;
  cp->sent += n;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  double elapsed = (double)(now.tv_sec - cp->t0.tv_sec) +
                   (double)(now.tv_nsec - cp->t0.tv_nsec) / 1e9;
  if (due <= elapsed)
    return;
  double wait = due - elapsed;
  struct timespec ts = {.tv_sec = (time_t)wait,
                        .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

/* Copy [off, off+len) in CHUNK pieces. */
static int copy_range(struct copy *cp, uint64_t off, uint64_t len) {
  while (len > 0) {
    int r = cp->offload && cp->base == 0 ? offload(cp, &off, &len) : 0;
    if (r < 0 || len == 0)
      return r;
    pthread_mutex_lock(&cp->lock);
    while (cp->nfree == 0)
      pthread_cond_wait(&cp->cond, &cp->lock);
    int err = cp->err;
    struct slot *s = err ? NULL : cp->free[--cp->nfree];
    pthread_mutex_unlock(&cp->lock);
    if (err)
      return err;
    /* Pieces end on chunk boundaries: clusters are written whole. */
    uint64_t n = cp->chunk - off % cp->chunk;
    n = len < n ? len : n;
    rate_wait(cp, n);
    s->phase = READ_SRC;
    s->start = s->pos = off;
    s->len = n;
    s->req = (struct bd_req){.cmd = BD_READ,
                             .offset = off,
                             .length = n,
                             .buf = s->buf,
                             .done = slot_done};
    bd_submit(cp->src, &s->req);
    off += n;
    len -= n;
  }
  return 0;
}

/* With -B, where the source reads as zeroes: copy the parts where the
 * destination (its backing file) does not. */
static int copy_zero_range(struct copy *cp, uint64_t off, uint64_t len) {
  struct bd_extents ext;
  bd_extents_init(&ext, off, 256);
  int r = 0;
  while (r == 0 && len > 0) {
    bd_extents_reset(&ext, off, 256);
    struct bd_req bs = {
        .cmd = BD_BLOCK_STATUS, .offset = off, .length = len, .extents = &ext};
    r = bd_run(cp->dst, &bs);
    if (r == 0 && ext.n == 0)
      r = -EIO;
    for (size_t i = 0; r == 0 && i < ext.n && len > 0; i++) {
      uint64_t n = ext.v[i].length < len ? ext.v[i].length : len;
      if (ext.v[i].flags & BD_EXT_ZERO)
        add_done(cp, n);
      else
        r = copy_range(cp, off, n);
      off += n;
      len -= n;
    }
  }
  bd_extents_free(&ext);
  return r;
}

/* One extent of the source's block status, [OFF, OFF+N).  *MARK is where
 * the copies made so far end. */
static int copy_extent(struct copy *cp, uint64_t off, uint64_t n, bool zero,
                       uint64_t *mark) {
  uint64_t end = off + n, size = cp->src->size;
  if (zero && cp->diff) {
    uint64_t a = off > *mark ? off : *mark;
    *mark = end > *mark ? end : *mark;
    return a < end ? copy_zero_range(cp, a, end - a) : 0;
  }
  if (zero && !cp->full && !cp->dirty_dst) {
    add_done(cp, n); /* the destination reads as zeroes already */
    return 0;
  }
  /* Whole grains, so that a run of zeroes shorter than a grain around the
   * data is written too, as qemu-img -S writes it. */
  uint64_t a = off - off % cp->grain;
  uint64_t b = end % cp->grain ? end + cp->grain - end % cp->grain : end;
  a = a > *mark ? a : *mark;
  b = b < size ? b : size;
  if (a >= b)
    return 0;
  *mark = b;
  return copy_range(cp, a, b - a);
}

/* Walk the source's block status; copy what does not read as zeroes (the
 * new destination reads as zeroes everywhere already, or with -B as its
 * backing file: then zero ranges are compared too). */
static int copy_source(struct copy *cp) {
  struct bd_extents ext;
  bd_extents_init(&ext, 0, 1024);
  uint64_t off = 0, size = cp->src->size, mark = 0;
  int r = 0;
  while (r == 0 && off < size) {
    uint64_t len = size - off < WALK ? size - off : WALK;
    bd_extents_reset(&ext, off, 1024);
    struct bd_req bs = {
        .cmd = BD_BLOCK_STATUS, .offset = off, .length = len, .extents = &ext};
    r = bd_run(cp->src, &bs);
    if (r == 0 && ext.n == 0)
      r = -EIO;
    for (size_t i = 0; r == 0 && i < ext.n && off < size; i++) {
      uint64_t n = ext.v[i].length < size - off ? ext.v[i].length : size - off;
      r = copy_extent(cp, off, n, ext.v[i].flags & BD_EXT_ZERO, &mark);
      off += n;
      show_progress(cp);
    }
  }
  bd_extents_free(&ext);
  /* Wait for every slot to come home. */
  pthread_mutex_lock(&cp->lock);
  while (cp->nfree < cp->nslots)
    pthread_cond_wait(&cp->cond, &cp->lock);
  if (r == 0)
    r = cp->err;
  pthread_mutex_unlock(&cp->lock);
  return r;
}

/* Each source in turn, one after another in the destination. */
static int copy_all(struct copy *cp) {
  int r = 0;
  clock_gettime(CLOCK_MONOTONIC, &cp->t0);
  cp->base = 0;
  for (size_t i = 0; r == 0 && i < cp->nsrcs; i++) {
    cp->src = cp->srcs[i];
    r = copy_source(cp);
    cp->base += cp->src->size;
  }
  cp->src = cp->srcs[0];
  show_progress(cp);
  if (cp->progress)
    fputc('\n', stderr);
  return r;
}

/* Is PATH a file this process has open: the source, or a file of its
 * backing chain (however it is named: symlinks, hard links, relative
 * backing names)?  The open files are the truth, so nothing is missed. */
static bool is_open_here(const char *path) {
  struct stat dst, st;
  if (stat(path, &dst) < 0)
    return false; /* a new file */
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
      continue;
    found = fstat(atoi(e->d_name), &st) == 0 &&
            (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) &&
            st.st_dev == dst.st_dev && st.st_ino == dst.st_ino;
  }
  closedir(d);
  return found;
}

/* What DST is made of: its format, -o (with -B as its backing file),
 * and how it is written. */
struct dst_opts {
  const char *fmt;
  struct image_opts o;            /* -o; -B and -F land in it */
  enum bd_cache cache, src_cache; /* -t, -T */
  bool existing;                  /* -n */
  bool target_zero;               /* --target-is-zero */
  int64_t sparse;                 /* -S; -1: the format's default */
  bool offload;                   /* -C */
  unsigned slots;                 /* -m */
  bool bitmaps, skip_broken;      /* --bitmaps, --skip-broken-bitmaps */
};

/* A new RBD image, as big as the source; an existing one is refused. */
static int create_rbd_dst(const char *spec, uint64_t size) {
  if (rbd_admin_create(spec, size, 0, RBD_TIMEOUT_DEFAULT) < 0) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    return -1;
  }
  return 0;
}

/* Truncate and lay out DST, holding its write lock from before the
 * truncation: a busy image is refused, never emptied. */
static int create_dst(const char *path, const struct dst_opts *d,
                      uint64_t size) {
  const char *fmt = d->fmt;
  if (rbd_spec_matches(path))
    return create_rbd_dst(path, size);
  if (is_open_here(path)) {
    cli_error("convert", path,
              "the output is the input, or a file of its backing chain");
    return -1;
  }
  return image_opts_create_file("convert", path, fmt, &d->o, size);
}

/* With -B: open the backing file as DST will (its format found, checked
 * as the image will check it), so that a bad one is refused before DST
 * is touched, and DST naming it is caught as DST naming the source. */
static struct bd *open_dst_backing(const char *dst_path, struct dst_opts *d) {
  char *path = NULL;
  struct bd *b =
      cli_open_backing(dst_path, d->o.backing, &d->o.backing_fmt, &path);
  if (!b)
    cli_error("convert", NULL, "cannot open backing file %s: %s",
              path ? path : d->o.backing, bd_errmsg());
  free(path);
  return b;
}

/* How the copy goes: slots, chunk and grain (-m, -S), what is written. */
static void copy_shape(struct copy *cp, const struct dst_opts *d) {
  cp->nslots = d->slots ? d->slots : SLOTS_DEFAULT;
  cp->full = d->sparse == 0;
  cp->dirty_dst = d->existing && !d->target_zero;
  cp->offload = d->offload;
  uint64_t csize = !strcmp(d->fmt, "qcow2") ? 1ull << d->o.q.cluster_bits : 0;
  /* Zeroes are compared per cluster for qcow2 (whole clusters are then
   * left unallocated), per 4k for raw, as qemu-img's default -S. */
  cp->grain = d->sparse > 0 ? (uint64_t)d->sparse : csize ? csize : 4096;
  cp->chunk = cp->grain > CHUNK ? cp->grain : CHUNK;
}

/* DST (made by create_dst(), or with -n as it is), checked to be large
 * enough for SIZE bytes.  NULL (said) on failure. */
static struct bd *open_dst(const char *dst_path, struct dst_opts *d,
                           uint64_t size) {
  if (d->existing && is_open_here(dst_path)) {
    cli_error("convert", dst_path,
              "the output is the input, or a file of its backing chain");
    return NULL;
  }
  struct bd_open_opts oo = BD_OPEN_OPTS_INIT;
  oo.format = d->fmt;
  oo.cache = d->cache;
  struct bd *dst = bd_open_with(dst_path, &oo);
  if (!dst) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    return NULL;
  }
  if (dst->size < size) {
    cli_error("convert", dst_path,
              "%llu bytes: smaller than the source (%llu bytes)",
              (unsigned long long)dst->size, (unsigned long long)size);
    bd_close(dst);
    return NULL;
  }
  return dst;
}

/* Page-aligned, so that -t none / -T none move it without a bounce (malloc
 * of 2 MiB returns a page plus a 16-byte header). */
static uint8_t *slot_buffer(uint64_t n) {
  void *p = NULL;
  return posix_memalign(&p, 4096, n) == 0 ? p : NULL;
}

static int run_copy(struct copy *cp) {
  pthread_mutex_init(&cp->lock, NULL);
  pthread_cond_init(&cp->cond, NULL);
  for (unsigned i = 0; i < cp->nslots; i++) {
    cp->slots[i].cp = cp;
    cp->slots[i].buf = slot_buffer(cp->chunk);
    cp->slots[i].base = cp->diff ? slot_buffer(cp->chunk) : NULL;
    if (!cp->slots[i].buf || (cp->diff && !cp->slots[i].base))
      cp->err = -ENOMEM;
    cp->free[cp->nfree++] = &cp->slots[i];
  }
  int r = cp->err ? cp->err : copy_all(cp);
  if (r == 0)
    r = bd_flush(cp->dst);
  for (unsigned i = 0; i < cp->nslots; i++) {
    free(cp->slots[i].buf);
    free(cp->slots[i].base);
  }
  pthread_cond_destroy(&cp->cond);
  pthread_mutex_destroy(&cp->lock);
  return r;
}

#define MAX_SOURCE_OPTS 64

struct convert_args {
  const char *sfmt, *ofmt, *plugin;
  struct dst_opts d;
  bool progress, compress, share, salvage, quiet;
  uint64_t rate; /* -r, 0: no limit */
  /* --source-option: SRC's format judges them when it opens */
  const char *src_opts[MAX_SOURCE_OPTS];
  size_t nsrc_opts;
  /* -l: the source options it makes (owned), a qcow2 SRC's snapshot */
  char *snap_opts[2];
  size_t nsnap;
};

/* -l: only a qcow2 source has internal snapshots; qemu-img's refusal. */
static bool snapshot_format_refused(const char *path, const char *sfmt) {
  const char *probed = sfmt ? NULL : bd_probe_format(path);
  const char *fmt = sfmt ? sfmt : probed ? probed : "raw";
  if (!strcmp(fmt, "qcow2"))
    return false;
  cli_error("convert", NULL,
            "Failed to load snapshot: Block format '%s' used by device '' "
            "does not support temporarily loading internal snapshots",
            fmt);
  return true;
}

/* The sources, opened as qemu-img convert opens them: nobody may write or
 * resize them meanwhile (a raw file locks as asked; qcow2 always does).
 * Returns how many were opened (all, or -1 after saying why). */
static int open_sources(const char *const *paths, size_t n,
                        const struct convert_args *a, struct bd **out) {
  struct bd_open_opts so = BD_OPEN_OPTS_INIT;
  so.format = a->sfmt;
  so.flags = a->share ? BD_OPEN_SHARE
                      : BD_OPEN_READONLY | BD_OPEN_UNSHARE_WRITE |
                            BD_OPEN_UNSHARE_RESIZE;
  so.cache = a->d.src_cache;
  if (a->nsnap && snapshot_format_refused(paths[0], a->sfmt))
    return -1;
  so.options = a->src_opts;
  so.noptions = a->nsrc_opts;
  for (size_t i = 0; i < n; i++) {
    out[i] = bd_open_with(paths[i], &so);
    if (!out[i]) {
      cli_error("convert", NULL, "%s", bd_errmsg());
      while (i-- > 0)
        bd_close(out[i]);
      return -1;
    }
  }
  return (int)n;
}

static int convert(const char *const *src_paths, size_t nsrc,
                   const struct convert_args *a, const char *dst_path,
                   struct dst_opts *d) {
  struct bd *srcs[MAX_SOURCES];
  struct copy cp = {.progress = a->progress && !a->quiet && isatty(2),
                    .write_flags = a->compress ? BD_F_COMPRESS : 0,
                    .diff = d->o.backing != NULL,
                    .salvage = a->salvage,
                    .quiet = a->quiet,
                    .rate = a->rate,
                    .srcs = srcs,
                    .nsrcs = nsrc};
  copy_shape(&cp, d);
  /* -r: pieces of an eighth of a second, so that the rate holds within
   * a copy shorter than a chunk. */
  if (cp.rate && cp.rate / 8 < cp.chunk) {
    uint64_t c = cp.rate / 8 - cp.rate / 8 % cp.grain;
    cp.chunk = c > cp.grain ? c : cp.grain;
  }
  if (open_sources(src_paths, nsrc, a, srcs) < 0)
    return 1;
  cp.src = srcs[0];
  int ret = 1;
  /* As qemu-img: an inconsistent bitmap is refused before DST is made. */
  struct bd *backing = NULL;
  if (d->bitmaps && copy_bitmaps_check_src(cp.src, d->skip_broken) < 0)
    goto out;
  backing = d->o.backing ? open_dst_backing(dst_path, d) : NULL;
  if (d->o.backing && !backing)
    goto out;
  uint64_t size = 0;
  for (size_t i = 0; i < nsrc; i++)
    size += srcs[i]->size;
  /* A qcow2 image's size is whole sectors: rounded up, as qemu-img does
   * (the rest reads as zeroes). */
  uint64_t dsize =
      !strcmp(d->fmt, "qcow2") && size % 512 ? size + 512 - size % 512 : size;
  /* Made while the backing file is open: DST naming it is refused as DST
   * naming the source is. */
  int made = d->existing ? 0 : create_dst(dst_path, d, dsize);
  if (backing)
    bd_close(backing); /* DST opens its own */
  backing = NULL;
  cp.dst = made < 0 ? NULL : open_dst(dst_path, d, dsize);
  if (!cp.dst || (d->bitmaps && copy_bitmaps_check_dst(cp.dst) < 0))
    goto out;
  cp.total = size;
  if (run_copy(&cp) == 0 &&
      (!d->bitmaps || copy_bitmaps(cp.src, cp.dst, d->skip_broken) == 0))
    ret = 0;
out:
  if (backing)
    bd_close(backing);
  if (cp.dst && bd_close(cp.dst) < 0)
    ret = 1;
  for (size_t i = 0; i < nsrc; i++)
    bd_close(srcs[i]);
  return ret;
}

/* A number of bytes for -S: a multiple of 512 up to 16M, or 0. */
static int sparse_size(const char *arg, int64_t *out) {
  uint64_t v;
  if (cli_parse_qemu_size(arg, &v) < 0 || v % 512 || v > MAX_SPARSE) {
    cli_usage_error("convert",
                    "-S %s: expected a multiple of 512 up to 16M, or 0 "
                    "(fully allocated)",
                    arg);
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

static int cache_mode(int ch, const char *arg, enum bd_cache *out) {
  if (bd_cache_parse(arg, out) == 0)
    return 0;
  cli_usage_error("convert",
                  "-%c %s: expected none, writeback, writethrough, "
                  "directsync or unsafe",
                  ch, arg);
  return -1;
}

/* -B and -F, which are -o backing_file and backing_fmt by another name. */
static int backing_option(struct dst_opts *d, int ch, const char *arg) {
  const char **slot = ch == 'B' ? &d->o.backing : &d->o.backing_fmt;
  if (*slot && strcmp(*slot, arg)) {
    cli_usage_error("convert", "-%c %s and -o %s=%s disagree", ch, arg,
                    ch == 'B' ? "backing_file" : "backing_fmt", *slot);
    return -1;
  }
  *slot = arg;
  return 0;
}

/* -o LIST; its backing_file and backing_fmt must agree with -B and -F. */
static int dst_options(struct dst_opts *d, const char *list) {
  const char *b = d->o.backing, *f = d->o.backing_fmt;
  if (image_opts_parse("convert", &d->o, list) < 0)
    return -1;
  if ((b && strcmp(b, d->o.backing)) || (f && strcmp(f, d->o.backing_fmt))) {
    cli_usage_error("convert", "-B/-F and -o %s disagree",
                    b && strcmp(b, d->o.backing) ? "backing_file"
                                                 : "backing_fmt");
    return -1;
  }
  return 0;
}

/* -r: bytes per second, as qemu-img reads it (0: no limit). */
static int rate_limit(const char *arg, uint64_t *out) {
  if (cli_parse_qemu_size(arg, out) == 0)
    return 0;
  cli_error("convert", NULL,
            "Invalid rate limit specified. You may use k, M, G, T, P or E "
            "suffixes for");
  cli_error("convert", NULL,
            "kilobytes, megabytes, gigabytes, terabytes, "
            "petabytes and exabytes.");
  return -1;
}

/* One option: 0, or -1 (said). */
static int add_snap_opt(struct convert_args *a, const char *key, const char *v,
                        size_t vlen) {
  char *o = malloc(strlen(key) + vlen + 2);
  if (!o || a->nsrc_opts == MAX_SOURCE_OPTS) {
    free(o);
    cli_error("convert", NULL, "too many source options");
    return -1;
  }
  sprintf(o, "%s=%.*s", key, (int)vlen, v);
  a->snap_opts[a->nsnap++] = o;
  a->src_opts[a->nsrc_opts++] = o;
  return 0;
}

/* -l SNAPSHOT_PARAM, as qemu-img reads it: snapshot.id=ID and/or
 * snapshot.name=NAME (comma-separated), or an ID or name. */
static int snapshot_param(struct convert_args *a, const char *arg) {
  for (size_t i = 0; i < a->nsnap; i++)
    free(a->snap_opts[i]);
  a->nsnap = 0;
  if (strncmp(arg, "snapshot.", 9))
    return add_snap_opt(a, "snapshot", arg, strlen(arg));
  for (const char *p = arg; *p;) {
    size_t len = strcspn(p, ","), klen = strcspn(p, "=,");
    bool id = klen == 11 && !strncmp(p, "snapshot.id", 11);
    bool name = klen == 13 && !strncmp(p, "snapshot.name", 13);
    if ((!id && !name) || klen == len) {
      cli_error("convert", NULL, "Invalid parameter '%.*s'", (int)klen, p);
      cli_error("convert", NULL, "Failed in parsing snapshot param '%s'", arg);
      return -1;
    }
    if (add_snap_opt(a, id ? "snapshot.id" : "snapshot.name", p + klen + 1,
                     len - klen - 1) < 0)
      return -1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* --source-option KEY=VALUE: the form now, the key when SRC opens. */
static int source_option(struct convert_args *a, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || a->nsrc_opts == MAX_SOURCE_OPTS) {
    cli_usage_error("convert", "--source-option %s: expected %s", arg,
                    eq && eq != arg ? "at most 64 of them" : "KEY=VALUE");
    return -1;
  }
  a->src_opts[a->nsrc_opts++] = arg;
  return 0;
}

static int convert_option(struct convert_args *a, int ch, const char *arg) {
  struct dst_opts *d = &a->d;
  unsigned m;
  switch (ch) {
  case 't': return cache_mode(ch, arg, &d->cache);
  case 'T': return cache_mode(ch, arg, &d->src_cache);
  case 'U': a->share = true; return 0;
  case 'G': a->plugin = arg; return 0;
  case 'X': return source_option(a, arg);
  case 'l': return snapshot_param(a, arg);
  case 'p': a->progress = true; return 0;
  case 'q': a->quiet = true; return 0;
  case 'V': a->salvage = true; return 0;
  case 'r': return rate_limit(arg, &a->rate);
  case 'c': a->compress = true; return 0;
  case 'f': a->sfmt = arg; return 0;
  case 'O': a->ofmt = arg; return 0;
  case 'B':
  case 'F': return backing_option(d, ch, arg);
  case 'o': return dst_options(d, arg);
  case 'n': d->existing = true; return 0;
  case 'Z': d->target_zero = true; return 0;
  case 'W': return 0; /* always out of order here */
  case 'C': d->offload = true; return 0;
  case 'M': d->bitmaps = true; return 0;
  case 'K': d->skip_broken = true; return 0;
  case 'S': return sparse_size(arg, &d->sparse);
  case 'm':
    if (cli_parse_uint(arg, 1, SLOTS, &m) == 0) {
      d->slots = m;
      return 0;
    }
    cli_usage_error("convert", "-m %s: expected a number in 1-%u", arg, SLOTS);
    return -1;
  default: cli_usage_error("convert", NULL); return -1;
  }
}

/* Options that do not go together, or not with -O FMT. */
static const char *conflict(const struct convert_args *a, bool rbd_dst) {
  const struct dst_opts *d = &a->d;
  bool qcow2 = !strcmp(a->ofmt, "qcow2");
  if (rbd_dst && qcow2)
    return "an RBD image is raw: qcow2 on RBD is not supported (-O raw)";
  if (a->compress && !qcow2)
    return "-c needs -O qcow2";
  if (d->o.backing && !qcow2)
    return "-B needs -O qcow2";
  if (d->o.backing_fmt && !d->o.backing)
    return "-F needs -B";
  if (d->o.backing_fmt && strcmp(d->o.backing_fmt, "raw") &&
      strcmp(d->o.backing_fmt, "qcow2"))
    return "-F takes raw or qcow2";
  if (d->offload && d->sparse >= 0)
    return "Cannot enable copy offloading when -S is used";
  if (d->offload && a->compress)
    return "Cannot enable copy offloading when -c is used";
  if (d->skip_broken && !d->bitmaps)
    return "Use of --skip-broken-bitmaps requires --bitmaps";
  if (d->bitmaps && a->plugin)
    return "Source lacks bitmap support";
  if (d->target_zero && !d->existing)
    return "--target-is-zero needs -n";
  if (d->existing && (d->o.qcow2_only || d->o.has_size || d->o.q.prealloc))
    return "-o has no effect with -n: DST is not created";
  if (d->existing && d->o.backing)
    return "-B makes a new DST: not with -n";
  return NULL;
}

static int parse_convert_args(int argc, char **argv, struct convert_args *a) {
  static const struct option longopts[] = {
      {"plugin", required_argument, NULL, 'G'},
      {"source-option", required_argument, NULL, 'X'},
      {"force-share", no_argument, NULL, 'U'},
      {"target-is-zero", no_argument, NULL, 'Z'},
      {"bitmaps", no_argument, NULL, 'M'},
      {"skip-broken-bitmaps", no_argument, NULL, 'K'},
      {"salvage", no_argument, NULL, 'V'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "pqcCUnWf:O:B:F:l:t:T:o:S:m:r:h",
                           longopts, NULL)) != -1) {
    if (ch == 'h') {
      fputs(convert_usage, stdout);
      exit(0);
    }
    if (convert_option(a, ch, optarg) < 0)
      return -1;
  }
  if (a->d.o.help) {
    image_opts_help(a->ofmt ? a->ofmt : "raw");
    exit(0);
  }
  if (!a->ofmt || (strcmp(a->ofmt, "raw") && strcmp(a->ofmt, "qcow2"))) {
    cli_usage_error("convert", "%s",
                    !a->ofmt ? "no output format given (-O raw or -O qcow2)"
                             : "-O: expected raw or qcow2");
    return -1;
  }
  bool rbd_dst = argc > optind && rbd_spec_matches(argv[argc - 1]);
  const char *why = conflict(a, rbd_dst);
  if (why) {
    cli_usage_error("convert", "%s", why);
    return -1;
  }
  if (a->d.o.has_size) {
    cli_usage_error("convert", "-o size: DST takes the size of SRC");
    return -1;
  }
  return image_opts_check("convert", &a->d.o, a->ofmt);
}

/* What does not go with several sources, in qemu-img's words. */
static const char *several_sources(const struct convert_args *a, size_t n) {
  if (n <= 1)
    return NULL;
  if (n > MAX_SOURCES)
    return "too many sources (at most 64)";
  if (a->d.o.backing)
    return "Having a backing file for the target makes no sense when "
           "concatenating multiple input images";
  if (a->d.bitmaps)
    return "Copying bitmaps only possible with single source";
  if (a->nsnap)
    return "No support for concatenating multiple snapshot";
  return NULL;
}

int convert_main(int argc, char **argv) {
  struct convert_args a = {.d.sparse = -1};
  image_opts_init(&a.d.o);
  int r = 1;
  char *spec = NULL;
  if (parse_convert_args(argc, argv, &a) < 0)
    goto out;
  /* --plugin: the last argument is DST, the others the parameters. */
  spec = a.plugin && optind < argc
             ? plugin_spec(a.plugin, argv + optind, argc - optind - 1)
             : NULL;
  size_t nsrc = a.plugin ? 1 : (size_t)(argc - optind - 1);
  if (a.plugin ? !spec : argc - optind < 2) {
    cli_usage_error("convert", "expected SRC and DST");
    goto out;
  }
  const char *why = several_sources(&a, nsrc);
  if (why) {
    cli_error("convert", NULL, "%s", why);
    goto out;
  }
  a.d.fmt = a.ofmt;
  /* Four workers: more only contend for the destination file's inode
   * lock (buffered writes to one file serialise in the kernel); reads from
   * the page cache do not need them. */
  if (bd_pool_start(4) < 0)
    goto out;
  const char *one[1] = {spec};
  r = convert(spec ? one : (const char *const *)argv + optind, nsrc, &a,
              argv[argc - 1], &a.d);
  bd_pool_stop();
out:
  free(spec);
  for (size_t i = 0; i < a.nsnap; i++)
    free(a.snap_opts[i]);
  image_opts_free(&a.d.o);
  return r;
}
