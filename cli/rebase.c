/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport rebase: give an image another backing file, as `qemu-img
 * rebase` does (its options, messages and exit statuses): in safe mode,
 * what the old backing chain shows where the new backing file differs is
 * copied into the image first, so that it reads the same; with -u only
 * the header changes. */
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
#include "formats/qcow2/backing-path.h"
#include "formats/qcow2/qcow2.h"
#include "formats/qcow2/set-backing.h"

#include "chain.h"
#include "cli.h"
#include "commands.h"
#include "layer-copy.h"
#include "progress.h"

static const char rebase_usage[] =
    "Usage: blockport rebase [-f FMT] [-t CACHE] [-T SRC_CACHE] [-p] [-u] "
    "[-q] [-U]\n"
    "                        -b BACKING [-F BACKING_FMT] FILENAME\n"
    "Make BACKING the backing file of the qcow2 image FILENAME "
    "(qemu-img rebase).\n"
    "Safe mode (the default) first copies into FILENAME what its old "
    "backing\n"
    "chain shows where BACKING differs, so that FILENAME reads the same; "
    "-b \"\"\n"
    "removes the backing file, copying in all the chain shows.\n"
    "\n"
    "  -b BACKING      the new backing file, as the header will name it\n"
    "                  (relative names from FILENAME's directory); \"\": none\n"
    "  -F BACKING_FMT  its format: raw or qcow2 (needed with a BACKING)\n"
    "  -f FMT          format of FILENAME (default: probed)\n"
    "  -u              unsafe: change the header only (BACKING need not "
    "exist)\n"
    "  -t CACHE        cache mode of FILENAME: writeback (default), none,\n"
    "                  writethrough, directsync or unsafe\n"
    "  -T SRC_CACHE    cache mode of BACKING (the same modes)\n"
    "  -U, --force-share  open BACKING even if another process writes it\n"
    "  -p              show progress\n"
    "  -q              quiet\n"
    "  -h, --help      show this help\n"
    "\n"
    "Exit status: 0 rebased, 1 on error.\n";

struct rebase_args {
  const char *path, *fmt, *backing, *bfmt;
  enum bd_cache cache, src_cache;
  bool unsafe, progress, quiet, share;
};

struct rebase_job {
  const struct rebase_args *a;
  struct bd *img; /* writable, with its old chain (none with -u) */
  struct bd *nb;  /* the new backing file; NULL for "" */
  struct chain chain;
  int prefix; /* the new backing file's index in the old chain, or -1 */
  struct progress prog;
};

static void change_error(const struct rebase_args *a, const char *why) {
  cli_error("rebase", NULL, "Could not change the backing file to '%s': %s",
            a->backing ? a->backing : "", why);
}

/* Whether the old chain may differ from the new backing file where an
 * extent at DEPTH (of the image's block status) reads. */
static bool may_differ(const void *opaque, uint32_t depth) {
  const struct rebase_job *j = opaque;
  if (depth == 1)
    return false; /* the image's own data */
  if (j->prefix < 0)
    return true;
  /* The new backing file is in the old chain: only what the images above
   * it hold can differ. */
  return depth >= 2 && depth <= (uint32_t)j->prefix;
}

/* Safe mode: where the old chain and the new backing file differ, the old
 * chain's data into the image. */
static int copy_differences(struct rebase_job *j) {
  uint64_t grain = j->chain.v[0].cluster_size;
  struct lcopy c = {.src = j->img,
                    .dst = j->img,
                    .compare = true,
                    .cmp = j->nb,
                    .grain = grain ? grain : 65536,
                    .slots_max = 2};
  int r = lcopy_walk(&c, j->img, "rebase", "error while reading image metadata",
                     may_differ, j, &j->prog);
  if (r == 0 && (r = bd_flush(j->img)) < 0)
    cli_error("rebase", NULL, "%s", bd_errmsg());
  return r;
}

/* The new backing file, as the image will open it (relative to its
 * directory); an image of the old chain is recognised. */
static int open_new_backing(struct rebase_job *j) {
  const struct rebase_args *a = j->a;
  j->prefix = -1;
  if (chain_read(a->path, j->img->format, &j->chain) < 0) {
    cli_error("rebase", NULL, "%s", bd_errmsg());
    return -1;
  }
  if (!a->backing[0])
    return 0;
  char *path = qcow2_backing_path(a->path, a->backing);
  if (!path) {
    cli_error("rebase", NULL, "%s", bd_errmsg());
    return -1;
  }
  j->prefix = chain_index(&j->chain, path);
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->bfmt;
  o.flags = a->share ? BD_OPEN_SHARE : BD_OPEN_READONLY;
  o.cache = a->src_cache;
  j->nb = bd_open_with(path, &o);
  free(path);
  if (!j->nb) {
    cli_error("rebase", NULL, "Could not open new backing file '%s': %s",
              a->backing, bd_errmsg());
    return -1;
  }
  return 0;
}

/* What qemu-img refuses when it changes the header, refused before
 * anything is written. */
static int check_header_change(const struct rebase_args *a,
                               const struct bd *img) {
  bool named = a->backing && a->backing[0];
  if (strcmp(img->format, "qcow2")) {
    change_error(a, strerror(ENOTSUP));
    return -1;
  }
  if (named && !a->bfmt) {
    change_error(a, "backing format must be specified");
    return -1;
  }
  if (named && strlen(a->backing) > QCOW2_MAX_BACKING_NAME) {
    change_error(a, strerror(EINVAL));
    return -1;
  }
  return 0;
}

static int run_rebase(struct rebase_job *j) {
  const struct rebase_args *a = j->a;
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->fmt;
  o.flags = a->unsafe ? BD_OPEN_NO_BACKING : 0;
  o.cache = a->cache;
  j->img = bd_open_with(a->path, &o);
  if (!j->img) {
    cli_error("rebase", NULL, "%s", bd_errmsg());
    return -1;
  }
  if (a->bfmt && strcmp(a->bfmt, "raw") && strcmp(a->bfmt, "qcow2")) {
    cli_error("rebase", NULL, "Invalid format name: '%s'", a->bfmt);
    return -1;
  }
  if (check_header_change(a, j->img) < 0)
    return -1;
  if (!a->unsafe && (open_new_backing(j) < 0 || copy_differences(j) < 0))
    return -1;
  bool named = a->backing && a->backing[0];
  int r = qcow2_change_backing(j->img, named ? a->backing : NULL,
                               named ? a->bfmt : NULL);
  if (r < 0) {
    change_error(a, r == -ENOSPC ? "No space left in the file header"
                                 : bd_errmsg());
    return -1;
  }
  progress_at(&j->prog, 1, 1);
  return 0;
}

static int rebase(const struct rebase_args *a) {
  struct rebase_job j = {.a = a};
  /* As qemu-img: progress starts before anything is opened. */
  progress_init(&j.prog, a->progress, 2.0f);
  int r = run_rebase(&j);
  progress_end(&j.prog);
  if (j.nb)
    bd_close(j.nb);
  if (j.img && bd_close(j.img) < 0 && r == 0) {
    cli_error("rebase", NULL, "%s", bd_errmsg());
    r = -1;
  }
  chain_free(&j.chain);
  return r == 0 ? 0 : 1;
}

static int rebase_option(struct rebase_args *a, int ch, const char *arg) {
  switch (ch) {
  case 'f': a->fmt = arg; return 0;
  case 'F': a->bfmt = arg; return 0;
  case 'b': a->backing = arg; return 0;
  case 'u': a->unsafe = true; return 0;
  case 'p': a->progress = true; return 0;
  case 'q': a->quiet = true; return 0;
  case 'U': a->share = true; return 0;
  case 't':
  case 'T':
    if (bd_cache_parse(arg, ch == 't' ? &a->cache : &a->src_cache) == 0)
      return 0;
    cli_error("rebase", NULL, "Invalid %scache option: %s",
              ch == 't' ? "" : "source ", arg);
    return -1;
  default: cli_usage_error("rebase", NULL); return -1;
  }
}

int rebase_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"force-share", no_argument, NULL, 'U'},
      {0, 0, 0, 0}};
  struct rebase_args a = {.cache = BD_CACHE_WRITEBACK};
  log_threshold = LOG_LEVEL_WARN;
  int ch;
  /* Cache modes are checked after the file names, as qemu-img does. */
  const char *t = NULL, *tt = NULL;
  while ((ch = getopt_long(argc, argv, "hf:F:b:upt:T:qU", longopts, NULL)) !=
         -1) {
    if (ch == 'h') {
      fputs(rebase_usage, stdout);
      return 0;
    }
    if (ch == 't' || ch == 'T')
      *(ch == 't' ? &t : &tt) = optarg;
    else if (rebase_option(&a, ch, optarg) < 0)
      return 1;
  }
  if (optind != argc - 1) {
    cli_usage_error("rebase", "Expecting one image file name");
    return 1;
  }
  if (!a.unsafe && !a.backing) {
    cli_usage_error("rebase",
                    "Must specify backing file (-b) or use unsafe mode (-u)");
    return 1;
  }
  if ((t && rebase_option(&a, 't', t) < 0) ||
      (tt && rebase_option(&a, 'T', tt) < 0))
    return 1;
  a.path = argv[optind];
  a.progress = a.progress && !a.quiet;
  if (bd_pool_start(4) < 0)
    return 1;
  int r = rebase(&a);
  bd_pool_stop();
  return r;
}
