/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport compare: whether two images hold the same bytes, as
 * `qemu-img compare` says it (its messages, options and exit statuses). */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"

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
    "  -s          strict: a different size, or a range allocated in one\n"
    "              image only, makes the images differ\n"
    "  -U          --force-share: images another process writes\n"
    "  -h, --help  show this help\n"
    "\n"
    "The first difference is reported by the offset of its 512-byte sector.\n"
    "IMAGE may be an NBD URI or rbd:POOL/IMAGE[@SNAP].\n"
    "Exit status: 0 identical, 1 different, 2 an image cannot be opened (or\n"
    "bad usage), 3 block status failed, 4 a read failed.\n";

enum { SAME = 0, DIFFERENT = 1, E_OPEN = 2, E_STATUS = 3, E_READ = 4 };

#define CHUNK (1u << 20)

struct side {
  struct bd *bd;
  const char *name;
  uint8_t *buf;
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

/* The first extent at OFF (at most LEN): its length, whether it is
 * allocated in any layer, and whether it reads as zeroes.  0 or -1
 * (said). */
static int status(struct side *s, uint64_t off, uint64_t len, uint64_t *n,
                  bool *allocated, bool *zero) {
  struct bd_extents e;
  bd_extents_init(&e, off, 1);
  struct bd_req r = {.cmd = BD_BLOCK_STATUS,
                     .offset = off,
                     .length = len,
                     .flags = BD_F_REQ_ONE,
                     .extents = &e};
  int err = bd_run(s->bd, &r);
  if (err == 0 && e.n == 0)
    err = -EIO;
  if (err < 0) {
    cli_error("compare", s->name, "block status at offset %llu: %s",
              (unsigned long long)off, bd_errmsg());
    bd_extents_free(&e);
    return -1;
  }
  *n = e.v[0].length < len ? e.v[0].length : len;
  *allocated = e.v[0].depth > 0;
  *zero = e.v[0].flags & BD_EXT_ZERO;
  bd_extents_free(&e);
  return 0;
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

static int compare_common(struct cmp *c, uint64_t end) {
  for (uint64_t off = 0, n; off < end; off += n) {
    uint64_t na, nb;
    bool aa, za, ab, zb;
    uint64_t want = end - off < CHUNK ? end - off : CHUNK;
    if (status(&c->a, off, want, &na, &aa, &za) < 0 ||
        status(&c->b, off, want, &nb, &ab, &zb) < 0)
      return E_STATUS;
    n = na < nb ? na : nb;
    if (c->strict && aa != ab) {
      say(c, "Strict mode: Offset %llu block status mismatch!\n",
          (unsigned long long)off);
      return DIFFERENT;
    }
    int r = za && zb ? SAME : compare_piece(c, off, n);
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
    bool allocated, zero;
    if (status(s, off, want, &n, &allocated, &zero) < 0)
      return E_STATUS;
    if (!zero) {
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
