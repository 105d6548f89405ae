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

#include "cli.h"
#include "commands.h"

#define CHUNK (2u * 1024 * 1024) /* bytes per request */
#define SLOTS 16                 /* requests in flight */
#define WALK (256ull << 20)      /* block status asked per step */

static const char convert_usage[] =
    "Usage: blockport convert [-p] [-c] [-U] [-f FMT] -O raw|qcow2 SRC DST\n"
    "       blockport convert [-p] [-c] -O raw|qcow2 --plugin PLUGIN "
    "[KEY=VALUE...] DST\n"
    "Copy SRC (raw, qcow2 with its backing chain, null:SIZE, memory:SIZE)\n"
    "into a new image DST, skipping ranges that read as zeroes, with many\n"
    "requests in flight.  DST is created (or overwritten).\n"
    "  -p            show progress on a terminal\n"
    "  -c            compress the clusters of a qcow2 DST (deflate)\n"
    "  -f FMT        format of SRC instead of probing\n"
    "  -U            read a SRC that another process writes (without it,\n"
    "                such a SRC is refused, as by qemu-img)\n"
    "  -O FMT        format of DST: raw or qcow2 (64k clusters, v3)\n"
    "  --plugin PLUGIN  SRC is an nbdkit plugin (a .so path or a name in\n"
    "                nbdkit's plugin directory) with its KEY=VALUE "
    "parameters\n"
    "DST may not be SRC or a file of its backing chain.  Exit status: 0\n"
    "success, 1 bad usage or failure.\n";

/* One request slot: read from the source, then write to the destination. */
struct slot {
  struct bd_req req; /* first: completions find the slot */
  struct copy *cp;
  uint8_t *buf;
  bool writing;
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
};

static void slot_done(struct bd_req *req, int err) {
  struct slot *s = (struct slot *)req;
  struct copy *cp = s->cp;
  if (err == 0 && !s->writing) {
    /* The data is in: the same buffer goes out to the destination. */
    s->writing = true;
    s->req.cmd = BD_WRITE;
    s->req.flags = cp->write_flags;
    bd_submit(cp->dst, &s->req);
    return;
  }
  pthread_mutex_lock(&cp->lock);
  if (err < 0 && cp->err == 0) {
    cp->err = err;
    cli_error("convert", NULL, "%s at offset %llu: %s",
              s->writing ? "write" : "read", (unsigned long long)req->offset,
              bd_errmsg());
  }
  if (err == 0)
    cp->done += req->length;
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
    uint64_t n = len < CHUNK ? len : CHUNK;
    s->writing = false;
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

/* Walk the source's block status; copy what does not read as zeroes (the
 * new destination reads as zeroes everywhere already). */
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
      if (ext.v[i].flags & BD_EXT_ZERO) {
        pthread_mutex_lock(&cp->lock);
        cp->done += n;
        pthread_mutex_unlock(&cp->lock);
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

/* Truncate and lay out DST, holding its write lock from before the
 * truncation: a busy image is refused, never emptied. */
static int create_dst(const char *path, const char *fmt, uint64_t size) {
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
    struct qcow2_create_opts o = {
        .size = size, .version = 3, .cluster_bits = 16, .refcount_order = 4};
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

static int convert(const char *src_path, const char *sfmt, const char *dst_path,
                   const char *ofmt, bool progress, bool compress, bool share) {
  struct copy cp = {.progress = progress && isatty(2),
                    .write_flags = compress ? BD_F_COMPRESS : 0};
  cp.src =
      bd_open_flags(src_path, sfmt, share ? BD_OPEN_SHARE : BD_OPEN_READONLY);
  if (!cp.src) {
    cli_error("convert", NULL, "%s", bd_errmsg());
    return 1;
  }
  int ret = 1;
  uint64_t size = cp.src->size;
  if (!strcmp(ofmt, "qcow2") && size % 512) {
    cli_error("convert", NULL,
              "qcow2 needs a size that is a multiple of 512 (%s has %llu "
              "bytes)",
              src_path, (unsigned long long)size);
    goto out;
  }
  if (create_dst(dst_path, ofmt, size) < 0)
    goto out;
  cp.dst = bd_open(dst_path, ofmt, false);
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
    if (!cp.slots[i].buf)
      cp.err = -ENOMEM;
    cp.free[cp.nfree++] = &cp.slots[i];
  }
  int r = cp.err ? cp.err : copy_all(&cp);
  if (r == 0)
    r = bd_flush(cp.dst);
  if (r == 0)
    ret = 0;
  for (unsigned i = 0; i < SLOTS; i++)
    free(cp.slots[i].buf);
  pthread_cond_destroy(&cp.cond);
  pthread_mutex_destroy(&cp.lock);
out:
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
  bool progress = false, compress = false, share = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "pcUf:O:h", longopts, NULL)) != -1) {
    switch (ch) {
    case 'U': share = true; break;
    case 'G': plugin = optarg; break;
    case 'p': progress = true; break;
    case 'c': compress = true; break;
    case 'f': sfmt = optarg; break;
    case 'O': ofmt = optarg; break;
    case 'h': fputs(convert_usage, stdout); return 0;
    default: fputs(convert_usage, stderr); return 1;
    }
  }
  /* --plugin: the last argument is DST, the others the parameters. */
  char *spec = plugin && optind < argc
                   ? plugin_spec(plugin, argv + optind, argc - optind - 1)
                   : NULL;
  if ((plugin ? !spec : optind + 2 != argc) || !ofmt ||
      (strcmp(ofmt, "raw") != 0 && strcmp(ofmt, "qcow2") != 0)) {
    fputs(convert_usage, stderr);
    free(spec);
    return 1;
  }
  if (compress && strcmp(ofmt, "qcow2") != 0) {
    cli_error("convert", NULL, "-c needs -O qcow2");
    free(spec);
    return 1;
  }
  /* Four workers: more only contend for the destination file's inode
   * lock (buffered writes to one file serialise in the kernel); reads from
   * the page cache do not need them. */
  if (bd_pool_start(4) < 0) {
    free(spec);
    return 1;
  }
  int r = convert(spec ? spec : argv[optind], sfmt, argv[argc - 1], ofmt,
                  progress, compress, share);
  bd_pool_stop();
  free(spec);
  return r;
}
