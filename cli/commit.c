/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport commit: copy what an image holds (and the images between it
 * and the base) into its base, then empty it, as `qemu-img commit` does
 * (its options, messages and exit statuses). */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"
#include "core/pool.h"
#include "formats/qcow2/make-empty.h"

#include "chain.h"
#include "cli.h"
#include "commands.h"
#include "layer-copy.h"
#include "progress.h"

static const char commit_usage[] =
    "Usage: blockport commit [-f FMT] [-t CACHE] [-b BASE] [-r RATE] [-d] "
    "[-p] [-q]\n"
    "                        FILENAME\n"
    "Copy the data of the qcow2 image FILENAME, and of the images between it\n"
    "and BASE in its backing chain, into BASE (by default its backing "
    "file),\n"
    "then empty FILENAME so that it reads as BASE again (qemu-img commit).\n"
    "\n"
    "  -f FMT     format of FILENAME (default: probed)\n"
    "  -t CACHE   cache mode: writeback (default), none, writethrough,\n"
    "             directsync or unsafe\n"
    "  -b BASE    the image of the backing chain to commit into (a name as\n"
    "             the image above it names it, or a path); implies -d\n"
    "  -r RATE    copy at most RATE bytes per second (suffixes k, M, G...)\n"
    "  -d         leave FILENAME as it is (do not empty it)\n"
    "  -p         show progress\n"
    "  -q         quiet: print nothing on success\n"
    "  -h, --help show this help\n"
    "\n"
    "BASE grows to FILENAME's size when it is smaller.  The images are locked\n"
    "while they change.  Exit status: 0 committed, 1 on error.\n";

struct commit_args {
  const char *path, *fmt, *base;
  enum bd_cache cache;
  uint64_t rate;
  bool drop, progress, quiet;
};

/* What the copy works with: the chain read (locking nothing), the image
 * (locked for writing, without its backing file), the base (writable). */
struct commit_job {
  const struct commit_args *a;
  struct chain chain;
  int base;              /* index of the base in chain */
  struct bd *top, *view; /* FILENAME alone; the whole chain read */
  struct bd *dst;        /* the base, writable */
  struct progress prog;
};

static struct bd *open_image(const char *path, const char *fmt,
                             enum bd_cache cache, unsigned flags) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = fmt;
  o.flags = flags;
  o.cache = cache;
  struct bd *bd = bd_open_with(path, &o);
  if (!bd)
    cli_error("commit", NULL, "%s", bd_errmsg());
  return bd;
}

/* Extents allocated above the base are copied. */
static bool above_base(const void *opaque, uint32_t depth) {
  const struct commit_job *j = opaque;
  return depth >= 1 && depth <= (uint32_t)j->base;
}

static int copy_above_base(struct commit_job *j) {
  struct lcopy c = {.src = j->view,
                    .dst = j->dst,
                    .grain = 65536,
                    .rate = j->a->rate,
                    .zero_flags = BD_F_MAY_TRIM,
                    .slots_max = 4};
  return lcopy_walk(&c, j->view, "commit", NULL, above_base, j, &j->prog);
}

/* The base, writable, as large as the image. */
static int open_base(struct commit_job *j) {
  const struct chain_image *b = &j->chain.v[j->base];
  j->dst = open_image(b->path, b->format, j->a->cache, 0);
  if (!j->dst)
    return -1;
  if (j->dst->size < j->view->size &&
      bd_resize(j->dst, j->view->size, BD_PREALLOC_OFF) < 0) {
    cli_error("commit", NULL, "%s", bd_errmsg());
    return -1;
  }
  return 0;
}

/* The base the arguments name: -b, or the image's backing file. */
static int find_base(struct commit_job *j) {
  const struct commit_args *a = j->a;
  if (chain_read(a->path, j->top->format, &j->chain) < 0) {
    cli_error("commit", NULL, "%s", bd_errmsg());
    return -1;
  }
  if (j->chain.n < 2) {
    cli_error("commit", NULL, "Image does not have a backing file");
    return -1;
  }
  j->base = a->base ? chain_find(&j->chain, a->base) : 1;
  if (j->base < 0) {
    cli_error("commit", NULL, "Did not find '%s' in the backing chain of '%s'",
              a->base, a->path);
    return -1;
  }
  return 0;
}

static int run_commit(struct commit_job *j) {
  const struct commit_args *a = j->a;
  if (find_base(j) < 0)
    return -1;
  /* The chain as the image shows it, read only, locking nothing: the
   * image and the base are locked by their writable openings. */
  j->view = open_image(a->path, j->top->format, a->cache, BD_OPEN_SHARE);
  if (!j->view || open_base(j) < 0)
    return -1;
  if (copy_above_base(j) < 0)
    return -1;
  int r = bd_close(j->dst);
  j->dst = NULL;
  if (r < 0) {
    cli_error("commit", NULL, "%s", bd_errmsg());
    return -1;
  }
  progress_at(&j->prog, 1, 1);
  if (!a->drop && qcow2_make_empty(j->top) < 0) {
    cli_error("commit", NULL, "%s", bd_errmsg());
    return -1;
  }
  return 0;
}

static int commit(const struct commit_args *a) {
  struct commit_job j = {.a = a};
  /* As qemu-img: the image is opened for writing first, whatever else. */
  j.top = open_image(a->path, a->fmt, a->cache, BD_OPEN_NO_BACKING);
  if (!j.top)
    return 1;
  progress_init(&j.prog, a->progress, 1.0f);
  int r = run_commit(&j);
  progress_end(&j.prog);
  if (j.dst)
    bd_close(j.dst);
  if (j.view)
    bd_close(j.view);
  if (bd_close(j.top) < 0 && r == 0) {
    cli_error("commit", NULL, "%s", bd_errmsg());
    r = -1;
  }
  chain_free(&j.chain);
  if (r == 0 && !a->quiet)
    puts("Image committed.");
  return r == 0 ? 0 : 1;
}

static int commit_option(struct commit_args *a, int ch, const char *arg) {
  switch (ch) {
  case 'f': a->fmt = arg; return 0;
  case 'b':
    a->base = arg;
    a->drop = true; /* as qemu-img: -b implies -d */
    return 0;
  case 'd': a->drop = true; return 0;
  case 'p': a->progress = true; return 0;
  case 'q': a->quiet = true; return 0;
  case 't':
    if (bd_cache_parse(arg, &a->cache) == 0)
      return 0;
    cli_error("commit", NULL, "Invalid cache option: %s", arg);
    return -1;
  case 'r':
    if (cli_parse_qemu_size(arg, &a->rate) == 0)
      return 0;
    cli_error("commit", NULL,
              "Invalid rate limit specified. You may use k, M, G, T, P or E "
              "suffixes for");
    cli_error("commit", NULL,
              "kilobytes, megabytes, gigabytes, terabytes, petabytes and "
              "exabytes.");
    return -1;
  default: cli_usage_error("commit", NULL); return -1;
  }
}

int commit_main(int argc, char **argv) {
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                           {0, 0, 0, 0}};
  struct commit_args a = {.cache = BD_CACHE_WRITEBACK};
  log_threshold = LOG_LEVEL_WARN;
  int ch;
  while ((ch = getopt_long(argc, argv, "f:ht:b:dpqr:", longopts, NULL)) != -1) {
    if (ch == 'h') {
      fputs(commit_usage, stdout);
      return 0;
    }
    if (commit_option(&a, ch, optarg) < 0)
      return 1;
  }
  if (optind != argc - 1) {
    cli_usage_error("commit", "Expecting one image file name");
    return 1;
  }
  a.path = argv[optind];
  a.progress = a.progress && !a.quiet;
  if (bd_pool_start(4) < 0)
    return 1;
  int r = commit(&a);
  bd_pool_stop();
  return r;
}
