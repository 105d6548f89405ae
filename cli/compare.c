/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport compare: whether two images hold the same bytes, as
 * `qemu-img compare` says it (its messages, options and exit statuses). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/open.h"
#include "formats/map.h"

#include "cli.h"
#include "commands.h"

static const char compare_usage[] =
    "Usage: blockport compare [-f FMT] [-F FMT] [-T CACHE] [-p] [-q] [-s] "
    "[-U]\n"
    "                         IMAGE1 IMAGE2\n"
    "Whether IMAGE1 and IMAGE2 have the same content, whatever their formats\n"
    "(qemu-img compare).  By default images of different sizes are the same\n"
    "when the larger one reads as zeroes past the end of the other, and a\n"
    "range allocated in one image and not in the other is the same when it\n"
    "reads as zeroes.\n"
    "\n"
    "  -f FMT      format of IMAGE1 (default: probed)\n"
    "  -F FMT      format of IMAGE2 (default: probed)\n"
    "  -T CACHE    cache mode of both images (as convert's -T)\n"
    "  -p          show progress on a terminal\n"
    "  -q          quiet: print nothing, the exit status says it\n"
    "  -s          strict: a different size, or any difference of block\n"
    "              status (allocated, zero, data, host offset, reaching the\n"
    "              end, as qemu-img compares it), makes the images differ\n"
    "  -U          --force-share: images another process writes\n"
    "  -h, --help  show this help\n"
    "\n"
    "The first difference is reported by the offset of its 512-byte sector.\n"
    "IMAGE may be an NBD URI or rbd:POOL/IMAGE[@SNAP].\n"
    "Exit status: 0 identical, 1 different, 2 an image cannot be opened (or\n"
    "bad usage), 3 block status failed, 4 a read failed.\n";

enum { SAME = 0, DIFFERENT = 1, E_OPEN = 2, E_STATUS = 3, E_READ = 4 };

#define CHUNK (1u << 20)

/* The status of the run at OFF of one image, as qemu-img compare reads
 * it: its length, whether it is allocated in any layer and reads as
 * zeroes; for -s the rest of QEMU's status word, all compared: holds
 * data, has a host offset, ends at the image's end. */
struct run {
  uint64_t n;
  bool allocated, zero, data, has_offset, eof;
};

struct side {
  struct bd *bd;
  const char *name;
  uint8_t *buf;
  struct run run; /* -s: the last run asked for, [run_start, run_end) */
  uint64_t run_start, run_end;
  unsigned stop_bits; /* -s: where QEMU's answers stop (map_status_run()) */
};

struct cmp {
  struct side a, b;
  bool quiet, strict, progress;
  uint64_t done, total;
};

static void say(const struct cmp *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The result line on stdout, unless -q. */
static void say(const struct cmp *c, const char *fmt, ...) {
  if (c->quiet)
    return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

static void show_progress(struct cmp *c, uint64_t n) {
  c->done += n;
  if (c->progress && c->total)
    fprintf(stderr, "\r    (%6.2f/100%%)",
            100.0 * (double)c->done / (double)c->total);
}

/* The first extent at OFF, at most LEN.  0 or -1 (said). */
static int status(struct side *s, uint64_t off, uint64_t len, struct run *r) {
  struct bd_extents e;
  bd_extents_init(&e, off, 1);
  struct bd_req q = {.cmd = BD_BLOCK_STATUS,
                     .offset = off,
                     .length = len,
                     .flags = BD_F_REQ_ONE,
                     .extents = &e};
  int err = bd_run(s->bd, &q);
  if (err == 0 && e.n == 0)
    err = -EIO;
  if (err < 0) {
    cli_error("compare", s->name, "block status at offset %llu: %s",
              (unsigned long long)off, bd_errmsg());
    bd_extents_free(&e);
    return -1;
  }
  *r = (struct run){.n = e.v[0].length < len ? e.v[0].length : len,
                    .allocated = e.v[0].depth > 0,
                    .zero = e.v[0].flags & BD_EXT_ZERO};
  bd_extents_free(&e);
  return 0;
}

/* -s: the whole run at OFF as QEMU answers it, up to the image's end
 * (map_status_run()), so that whether it reaches the end is known
 * (QEMU's BDRV_BLOCK_EOF: a hole to the end differs from a hole followed
 * by data).  The run is kept: asked again from inside it, QEMU gives its
 * rest.  0 or -1 (said). */
static int strict_status(struct side *s, uint64_t off, struct run *r) {
  if (off < s->run_start || off >= s->run_end) {
    struct map_entry e;
    int err = map_status_run(s->bd, off, s->stop_bits, &e);
    if (err == 0 && e.length == 0)
      err = -EIO;
    if (err < 0) {
      cli_error("compare", s->name, "block status at offset %llu: %s",
                (unsigned long long)off,
                *bd_errmsg() ? bd_errmsg() : strerror(-err));
      return -1;
    }
    s->run = (struct run){.allocated = e.present,
                          .zero = e.zero,
                          .data = e.data,
                          .has_offset = e.has_offset,
                          .eof = off + e.length >= s->bd->size};
    s->run_start = off;
    s->run_end = off + e.length;
  }
  *r = s->run;
  r->n = s->run_end - off;
  return 0;
}

static bool same_status(const struct run *a, const struct run *b) {
  return a->allocated == b->allocated && a->zero == b->zero &&
         a->data == b->data && a->has_offset == b->has_offset &&
         a->eof == b->eof;
}

static int read_side(struct side *s, uint64_t off, uint64_t n) {
  if (bd_pread(s->bd, s->buf, n, off) == 0)
    return 0;
  cli_error("compare", s->name, "read at offset %llu: %s",
            (unsigned long long)off, bd_errmsg());
  return -1;
}

/* The offset of the first differing sector of [OFF, OFF+N), or -1. */
static int64_t first_diff(const uint8_t *x, const uint8_t *y, uint64_t off,
                          uint64_t n) {
  if (memcmp(x, y, n) == 0)
    return -1;
  uint64_t i = 0;
  while (x[i] == y[i])
    i++;
  return (int64_t)((off + i) & ~511ull);
}

static int64_t first_nonzero(const uint8_t *x, uint64_t off, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (x[i])
      return (int64_t)((off + i) & ~511ull);
  return -1;
}

/* [off, off+n) of both images, N at most CHUNK. */
static int compare_piece(struct cmp *c, uint64_t off, uint64_t n) {
  if (read_side(&c->a, off, n) < 0 || read_side(&c->b, off, n) < 0)
    return E_READ;
  int64_t d = first_diff(c->a.buf, c->b.buf, off, n);
  if (d >= 0) {
    say(c, "Content mismatch at offset %llu!\n", (unsigned long long)d);
    return DIFFERENT;
  }
  return SAME;
}

static int side_status(const struct cmp *c, struct side *s, uint64_t off,
                       uint64_t want, struct run *r) {
  return c->strict ? strict_status(s, off, r) : status(s, off, want, r);
}

static int compare_common(struct cmp *c, uint64_t end) {
  for (uint64_t off = 0, n; off < end; off += n) {
    struct run ra, rb;
    uint64_t want = end - off < CHUNK ? end - off : CHUNK;
    if (side_status(c, &c->a, off, want, &ra) < 0 ||
        side_status(c, &c->b, off, want, &rb) < 0)
      return E_STATUS;
    n = ra.n < rb.n ? ra.n : rb.n;
    n = n < want ? n : want;
    if (c->strict && !same_status(&ra, &rb)) {
      say(c, "Strict mode: Offset %llu block status mismatch!\n",
          (unsigned long long)off);
      return DIFFERENT;
    }
    int r = ra.zero && rb.zero ? SAME : compare_piece(c, off, n);
    if (r != SAME)
      return r;
    show_progress(c, n);
  }
  return SAME;
}

/* Past the end of the smaller image: the larger one must read as zeroes. */
static int compare_tail(struct cmp *c, struct side *s, uint64_t off) {
  for (uint64_t n; off < s->bd->size; off += n) {
    uint64_t want = s->bd->size - off < CHUNK ? s->bd->size - off : CHUNK;
    struct run r;
    if (status(s, off, want, &r) < 0)
      return E_STATUS;
    n = r.n;
    if (!r.zero) {
      if (read_side(s, off, n) < 0)
        return E_READ;
      int64_t d = first_nonzero(s->buf, off, n);
      if (d >= 0) {
        say(c, "Content mismatch at offset %llu!\n", (unsigned long long)d);
        return DIFFERENT;
      }
    }
    show_progress(c, n);
  }
  return SAME;
}

static int compare(struct cmp *c) {
  uint64_t sa = c->a.bd->size, sb = c->b.bd->size;
  if (sa != sb && c->strict) {
    say(c, "Strict mode: Image size mismatch!\n");
    return DIFFERENT;
  }
  c->total = sa > sb ? sa : sb;
  int r = compare_common(c, sa < sb ? sa : sb);
  /* As qemu-img: the warning once the common part is the same. */
  if (r == SAME && sa != sb) {
    say(c, "Warning: Image size mismatch!\n");
    r = compare_tail(c, sa > sb ? &c->a : &c->b, sa < sb ? sa : sb);
  }
  if (c->progress)
    fputc('\n', stderr);
  if (r == SAME)
    say(c, "Images are identical.\n");
  return r;
}

/* log2 of the guest bytes one L2 table of the qcow2 image at PATH covers:
 * QEMU's qcow2 answers a block status query within one (with the default
 * l2-cache-entry-size).  From the header (cluster_bits at byte 20, the
 * extended-L2 bit of the version 3 incompatible features at byte 72); 0
 * when it cannot be read, then runs are not cut. */
static unsigned qcow2_l2_bits(const char *path) {
  uint8_t h[80] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t got = fd < 0 ? -1 : pread(fd, h, sizeof h, 0);
  if (fd >= 0)
    close(fd);
  if (got < 24)
    return 0;
  uint32_t version = get_be32(h + 4), cbits = get_be32(h + 20);
  bool extl2 = version >= 3 && got >= 80 && (get_be64(h + 72) & (1u << 4));
  if (cbits < 9 || cbits > 21)
    return 0;
  return cbits + cbits - (extl2 ? 4 : 3);
}

static struct bd *open_side(const char *spec, const char *fmt,
                            enum bd_cache cache, bool share) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = fmt;
  o.cache = cache;
  o.flags = share ? BD_OPEN_SHARE : BD_OPEN_READONLY;
  struct bd *bd = bd_open_with(spec, &o);
  if (!bd)
    cli_error("compare", NULL, "%s", bd_errmsg());
  return bd;
}

int compare_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  struct cmp c = {0};
  const char *fa = NULL, *fb = NULL;
  enum bd_cache cache = BD_CACHE_WRITEBACK;
  bool share = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "f:F:T:pqsUh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f': fa = optarg; break;
    case 'F': fb = optarg; break;
    case 'T':
      if (bd_cache_parse(optarg, &cache) < 0) {
        cli_error("compare", NULL,
                  "-T %s: expected none, writeback, writethrough, "
                  "directsync or unsafe",
                  optarg);
        return E_OPEN;
      }
      break;
    case 'p': c.progress = isatty(2); break;
    case 'q': c.quiet = true; break;
    case 's': c.strict = true; break;
    case 'U': share = true; break;
    case 'h': fputs(compare_usage, stdout); return SAME;
    default: cli_usage_error("compare", NULL); return E_OPEN;
    }
  }
  if (argc - optind != 2) {
    cli_usage_error("compare", "expected two images");
    return E_OPEN;
  }
  c.a.name = argv[optind];
  c.b.name = argv[optind + 1];
  int r = E_OPEN;
  c.a.bd = open_side(c.a.name, fa, cache, share);
  c.b.bd = c.a.bd ? open_side(c.b.name, fb, cache, share) : NULL;
  if (c.a.bd && !strcmp(c.a.bd->format, "qcow2"))
    c.a.stop_bits = qcow2_l2_bits(c.a.name);
  if (c.b.bd && !strcmp(c.b.bd->format, "qcow2"))
    c.b.stop_bits = qcow2_l2_bits(c.b.name);
  c.a.buf = aligned_alloc(4096, CHUNK);
  c.b.buf = aligned_alloc(4096, CHUNK);
  if (c.a.bd && c.b.bd && c.a.buf && c.b.buf)
    r = compare(&c);
  bd_close(c.a.bd);
  bd_close(c.b.bd);
  free(c.a.buf);
  free(c.b.buf);
  return r;
}
