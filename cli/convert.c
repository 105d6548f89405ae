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
#include <unistd.h>

#include "core/blockdev.h"
#include "core/filelock.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "formats/qcow2/create.h"
#include "formats/rbd-admin.h"
#include "formats/rbd-spec.h"

#include "backing.h"
#include "cli.h"
#include "commands.h"

#define CHUNK (2u * 1024 * 1024) /* bytes per request */
#define SLOTS 16                 /* requests in flight */
#define WALK (256ull << 20)      /* block status asked per step */
#define GRAIN (64u * 1024)       /* compared and written per cluster */

static const char convert_usage[] =
    "Usage: blockport convert [-p] [-c] [-U] [-f FMT] -O raw|qcow2\n"
    "                         [-B BACKING [-F FMT]] [-t CACHE] [-T CACHE]\n"
    "                         SRC DST\n"
    "       blockport convert [-p] [-c] -O raw|qcow2 --plugin PLUGIN "
    "[KEY=VALUE...] DST\n"
    "Copy SRC (raw, qcow2 with its backing chain, null:SIZE, memory:SIZE,\n"
    "an NBD URI, rbd:POOL/IMAGE[@SNAP]) into a new image DST, skipping\n"
    "ranges that read as zeroes, with many requests in flight.  DST is\n"
    "created (or overwritten); a DST rbd:POOL/IMAGE is a new RBD image\n"
    "(-O raw; an existing one is an error).\n"
    "  -p            show progress on a terminal\n"
    "  -c            compress the clusters of a qcow2 DST (deflate)\n"
    "  -f FMT        format of SRC instead of probing\n"
    "  -U            read a SRC that another process writes (without it,\n"
    "                such a SRC is refused, as by qemu-img)\n"
    "  -O FMT        format of DST: raw or qcow2 (64k clusters, v3)\n"
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
    "DST may not be SRC or a file of its backing chain.  Exit status: 0\n"
    "success, 1 bad usage or failure.\n";

/* Where a slot is: reading the source, reading what the destination's
 * backing file holds there (-B), or writing. */
enum phase { READ_SRC, READ_BASE, WRITING };

/* One request slot: read from the source, then write to the destination.
 * With -B, read the destination too (its backing file shows through) and
 * write only the clusters that differ, one run after another. */
struct slot {
  struct bd_req req; /* first: completions find the slot */
  struct copy *cp;
  uint8_t *buf, *base;
  enum phase phase;
  uint64_t start, len, pos; /* the range, and how far -B has written it */
};

struct copy {
  struct bd *src, *dst;
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
};

static void add_done(struct copy *cp, uint64_t n) {
  pthread_mutex_lock(&cp->lock);
  cp->done += n;
  pthread_mutex_unlock(&cp->lock);
}

/* The end of the cluster of POS, or END. */
static uint64_t grain_end(uint64_t pos, uint64_t end) {
  uint64_t e = (pos / GRAIN + 1) * GRAIN;
  return e < end ? e : end;
}

static bool all_zero(const uint8_t *p, uint64_t n) {
  return p[0] == 0 && !memcmp(p, p + 1, n - 1);
}

/* Whether the source's [a, b) equals what the destination holds there:
 * with -B its backing file's data, else zeroes (it is new). */
static bool same_at(const struct slot *s, uint64_t a, uint64_t b) {
  const uint8_t *p = s->buf + (a - s->start);
  return s->base ? !memcmp(p, s->base + (a - s->start), b - a)
                 : all_zero(p, b - a);
}

/* The next run of clusters from S->pos on where the source and the
 * destination differ, as [*A, *B); false when there is none. */
static bool next_diff(const struct slot *s, uint64_t *a, uint64_t *b) {
  uint64_t pos = s->pos, end = s->start + s->len;
  while (pos < end && same_at(s, pos, grain_end(pos, end)))
    pos = grain_end(pos, end);
  if (pos == end)
    return false;
  *a = pos;
  while (pos < end && !same_at(s, pos, grain_end(pos, end)))
    pos = grain_end(pos, end);
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
  bool zero = all_zero(p, b - a);
  s->phase = WRITING;
  s->pos = b;
  s->req = (struct bd_req){.cmd = zero ? BD_ZERO : BD_WRITE,
                           .flags = zero ? 0 : s->cp->write_flags,
                           .offset = a,
                           .length = b - a,
                           .buf = p,
                           .done = s->req.done};
  bd_submit(s->cp->dst, &s->req);
  return true;
}

static const char *phase_name(enum phase p) {
  return p == READ_SRC    ? "read"
         : p == READ_BASE ? "read of the backing file"
                          : "write";
}

static void slot_done(struct bd_req *req, int err) {
  struct slot *s = (struct slot *)req;
  struct copy *cp = s->cp;
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
              (unsigned long long)req->offset, bd_errmsg());
  }
  if (err == 0)
    cp->done += s->len;
  cp->free[cp->nfree++] = s;
  pthread_cond_signal(&cp->cond);
  pthread_mutex_unlock(&cp->lock);
}

static void show_progress(struct copy *cp) {
  if (cp->progress && cp->total)
    fprintf(stderr, "\r    (%6.2f/100%%)",
            100.0 * (double)cp->done / (double)cp->total);
}

/* Copy [off, off+len) in CHUNK pieces. */
static int copy_range(struct copy *cp, uint64_t off, uint64_t len) {
  while (len > 0) {
    pthread_mutex_lock(&cp->lock);
    while (cp->nfree == 0)
      pthread_cond_wait(&cp->cond, &cp->lock);
    int err = cp->err;
    struct slot *s = err ? NULL : cp->free[--cp->nfree];
    pthread_mutex_unlock(&cp->lock);
    if (err)
      return err;
    /* Pieces end on CHUNK boundaries: clusters are written whole. */
    uint64_t n = CHUNK - off % CHUNK;
    n = len < n ? len : n;
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

/* Walk the source's block status; copy what does not read as zeroes (the
 * new destination reads as zeroes everywhere already, or with -B as its
 * backing file: then zero ranges are compared too). */
static int copy_all(struct copy *cp) {
  struct bd_extents ext;
  bd_extents_init(&ext, 0, 1024);
  uint64_t off = 0, size = cp->src->size;
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
      if ((ext.v[i].flags & BD_EXT_ZERO) && cp->diff) {
        r = copy_zero_range(cp, off, n);
      } else if (ext.v[i].flags & BD_EXT_ZERO) {
        add_done(cp, n);
      } else {
        r = copy_range(cp, off, n);
      }
      off += n;
      show_progress(cp);
    }
  }
  bd_extents_free(&ext);
  /* Wait for every slot to come home. */
  pthread_mutex_lock(&cp->lock);
  while (cp->nfree < SLOTS)
    pthread_cond_wait(&cp->cond, &cp->lock);
  if (r == 0)
    r = cp->err;
  pthread_mutex_unlock(&cp->lock);
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

/* What DST is made of: its format, and with -B its backing file. */
struct dst_opts {
  const char *fmt, *backing, *backing_fmt;
  enum bd_cache cache, src_cache; /* -t, -T */
};

/* A new RBD image, as big as the source; an existing one is refused. */
static int create_rbd_dst(const char *spec, uint64_t size) {
  if (rbd_admin_create(spec, size, 0, BD_RBD_TIMEOUT_DEFAULT) < 0) {
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
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* locks read */
  if (fd < 0) {
    cli_error("convert", path, "%s", strerror(errno));
    return -1;
  }
  const char *why = NULL;
  if (filelock_take(fd, path, FILELOCK_USE_WRITE, true) < 0)
    why = bd_errmsg();
  else if (ftruncate(fd, 0) < 0)
    why = strerror(errno);
  if (why) {
    cli_error("convert", NULL, "%s", why);
    close(fd);
    return -1;
  }
  char err[256] = "";
  int r = 0;
  if (!strcmp(fmt, "raw")) {
    if (ftruncate(fd, (off_t)size) < 0)
      snprintf(err, sizeof err, "%s", strerror(errno)), r = -1;
  } else {
    struct qcow2_create_opts o = {.size = size,
                                  .version = 3,
                                  .cluster_bits = 16,
                                  .refcount_order = 4,
                                  .backing_file = d->backing,
                                  .backing_fmt = d->backing_fmt};
    struct qcow2_layout l;
    r = qcow2_create_layout(&o, &l);
    if (r == 0)
      r = qcow2_create_write(fd, &o, &l);
    if (r < 0)
      snprintf(err, sizeof err, "%s", bd_errmsg());
  }
  close(fd);
  if (r < 0)
    cli_error("convert", path, "%s", err);
  return r < 0 ? -1 : 0;
}

/* With -B: open the backing file as DST will (its format found, checked
 * as the image will check it), so that a bad one is refused before DST
 * is touched, and DST naming it is caught as DST naming the source. */
static struct bd *open_dst_backing(const char *dst_path, struct dst_opts *d) {
  char *path = NULL;
  struct bd *b = cli_open_backing(dst_path, d->backing, &d->backing_fmt, &path);
  if (!b)
    cli_error("convert", NULL, "cannot open backing file %s: %s",
              path ? path : d->backing, bd_errmsg());
  free(path);
  return b;
}

static int convert(const char *src_path, const char *sfmt, const char *dst_path,
                   struct dst_opts *d, bool progress, bool compress,
                   bool share) {
  const char *ofmt = d->fmt;
  struct copy cp = {.progress = progress && isatty(2),
                    .write_flags = compress ? BD_F_COMPRESS : 0,
                    .diff = d->backing != NULL};
  struct bd_open_opts so = BD_OPEN_OPTS_INIT;
  so.format = sfmt;
  so.flags = share ? BD_OPEN_SHARE : BD_OPEN_READONLY;
  so.cache = d->src_cache;
  cp.src = bd_open_with(src_path, &so);
  if (!cp.src) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    return 1;
  }
  int ret = 1;
  struct bd *backing = d->backing ? open_dst_backing(dst_path, d) : NULL;
  if (d->backing && !backing)
    goto out;
  uint64_t size = cp.src->size;
  if (!strcmp(ofmt, "qcow2") && size % 512) {
    cli_error("convert", NULL,
              "qcow2 needs a size that is a multiple of 512 (%s has %llu "
              "bytes)",
              src_path, (unsigned long long)size);
    goto out;
  }
  int made = create_dst(dst_path, d, size);
  if (backing)
    bd_close(backing); /* DST opens its own */
  backing = NULL;
  if (made < 0)
    goto out;
  struct bd_open_opts oo = BD_OPEN_OPTS_INIT;
  oo.format = ofmt;
  oo.cache = d->cache;
  cp.dst = bd_open_with(dst_path, &oo);
  if (!cp.dst) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    goto out;
  }
  pthread_mutex_init(&cp.lock, NULL);
  pthread_cond_init(&cp.cond, NULL);
  cp.total = size;
  for (unsigned i = 0; i < SLOTS; i++) {
    cp.slots[i].cp = &cp;
    cp.slots[i].buf = malloc(CHUNK);
    cp.slots[i].base = cp.diff ? malloc(CHUNK) : NULL;
    if (!cp.slots[i].buf || (cp.diff && !cp.slots[i].base))
      cp.err = -ENOMEM;
    cp.free[cp.nfree++] = &cp.slots[i];
  }
  int r = cp.err ? cp.err : copy_all(&cp);
  if (r == 0)
    r = bd_flush(cp.dst);
  if (r == 0)
    ret = 0;
  for (unsigned i = 0; i < SLOTS; i++) {
    free(cp.slots[i].buf);
    free(cp.slots[i].base);
  }
  pthread_cond_destroy(&cp.cond);
  pthread_mutex_destroy(&cp.lock);
out:
  if (backing)
    bd_close(backing);
  if (cp.dst && bd_close(cp.dst) < 0)
    ret = 1;
  bd_close(cp.src);
  return ret;
}

int convert_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"plugin", required_argument, NULL, 'G'},
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  const char *sfmt = NULL, *ofmt = NULL, *plugin = NULL;
  struct dst_opts d = {0};
  bool progress = false, compress = false, share = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "pcUf:O:B:F:t:T:h", longopts, NULL)) !=
         -1) {
    switch (ch) {
    case 't':
    case 'T':
      if (bd_cache_parse(optarg, ch == 't' ? &d.cache : &d.src_cache) < 0) {
        cli_error("convert", NULL,
                  "-%c %s: expected none, writeback, writethrough, "
                  "directsync or unsafe",
                  ch, optarg);
        return 1;
      }
      break;
    case 'U': share = true; break;
    case 'G': plugin = optarg; break;
    case 'p': progress = true; break;
    case 'c': compress = true; break;
    case 'f': sfmt = optarg; break;
    case 'O': ofmt = optarg; break;
    case 'B': d.backing = optarg; break;
    case 'F': d.backing_fmt = optarg; break;
    case 'h': fputs(convert_usage, stdout); return 0;
    default: cli_usage_error("convert", NULL); return 1;
    }
  }
  /* --plugin: the last argument is DST, the others the parameters. */
  char *spec = plugin && optind < argc
                   ? plugin_spec(plugin, argv + optind, argc - optind - 1)
                   : NULL;
  if ((plugin ? !spec : optind + 2 != argc) || !ofmt ||
      (strcmp(ofmt, "raw") != 0 && strcmp(ofmt, "qcow2") != 0)) {
    cli_usage_error("convert", "%s",
                    !ofmt ? "no output format given (-O raw or -O qcow2)"
                    : strcmp(ofmt, "raw") && strcmp(ofmt, "qcow2")
                        ? "-O: expected raw or qcow2"
                        : "expected SRC and DST");
    free(spec);
    return 1;
  }
  bool rbd_dst = argc > optind && rbd_spec_matches(argv[argc - 1]);
  const char *why = rbd_dst && strcmp(ofmt, "raw")
                        ? "an RBD image is raw: qcow2 on RBD is not supported "
                          "(-O raw)"
                    : compress && strcmp(ofmt, "qcow2")  ? "-c needs -O qcow2"
                    : d.backing && strcmp(ofmt, "qcow2") ? "-B needs -O qcow2"
                    : d.backing_fmt && !d.backing        ? "-F needs -B"
                    : d.backing_fmt && strcmp(d.backing_fmt, "raw") &&
                            strcmp(d.backing_fmt, "qcow2")
                        ? "-F takes raw or qcow2"
                        : NULL;
  if (why) {
    cli_error("convert", NULL, "%s", why);
    free(spec);
    return 1;
  }
  d.fmt = ofmt;
  /* Four workers: more only contend for the destination file's inode
   * lock (buffered writes to one file serialise in the kernel); reads from
   * the page cache do not need them. */
  if (bd_pool_start(4) < 0) {
    free(spec);
    return 1;
  }
  int r = convert(spec ? spec : argv[optind], sfmt, argv[argc - 1], &d,
                  progress, compress, share);
  bd_pool_stop();
  free(spec);
  return r;
}
