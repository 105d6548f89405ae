/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport bitmap: add, remove, clear, enable, disable and merge the
 * persistent dirty bitmaps of a qcow2 image, as `qemu-img bitmap` does
 * (its options, order of operations, messages and exit statuses). */
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
#include "formats/qcow2/bitmap-edit.h"

#include "cli.h"
#include "commands.h"

static const char bitmap_usage[] =
    "Usage: blockport bitmap [-f FMT] [-q] {--add [-g GRANULARITY] "
    "[--disable] |\n"
    "                        --remove | --clear | --enable | --disable |\n"
    "                        --merge SOURCE [-b SOURCE_FILE [-F "
    "SOURCE_FMT]]}...\n"
    "                        FILENAME BITMAP\n"
    "Change the persistent dirty bitmap BITMAP of the qcow2 image FILENAME\n"
    "(qemu-img bitmap).  The operations run in the order given; if one\n"
    "fails, the ones before it are kept and the rest are not run.\n"
    "\n"
    "  --add                  add BITMAP, recording writes from now on\n"
    "  -g, --granularity G    bytes per bit of an added bitmap: a power of\n"
    "                         two from 512 to 2G (default: the cluster\n"
    "                         size, within 4k..64k)\n"
    "  --remove               delete BITMAP (an inconsistent one too)\n"
    "  --clear                clear every bit of BITMAP\n"
    "  --enable               BITMAP records writes\n"
    "  --disable              BITMAP stops recording writes (with --add:\n"
    "                         it is added disabled)\n"
    "  --merge SOURCE         set in BITMAP every bit set in the bitmap\n"
    "                         SOURCE\n"
    "  -b, --source-file FILE  SOURCE is in the image FILE (of the same\n"
    "                         size), not in FILENAME\n"
    "  -F, --source-format FMT  format of FILE (default: probed)\n"
    "  -f, --format FMT       format of FILENAME (default: probed)\n"
    "  -q, --quiet            print nothing on success\n"
    "  -h, --help             show this help\n"
    "\n"
    "G takes a suffix k, M or G (powers of 1024).  The image is locked\n"
    "while it changes: not while it is served or used by QEMU.  A bitmap\n"
    "left in use by a writer that stopped (inconsistent) can only be\n"
    "removed.  Exit status: 0 done, 1 on error.\n";

enum op { OP_ADD, OP_REMOVE, OP_CLEAR, OP_ENABLE, OP_DISABLE, OP_MERGE };
static const char *const op_names[] = {"add",    "remove",  "clear",
                                       "enable", "disable", "merge"};

struct action {
  enum op op;
  const char *src; /* --merge */
};

struct bitmap_args {
  struct action *acts;
  size_t nacts;
  const char *format, *src_file, *src_format, *path, *name;
  uint64_t granularity;
  bool add, add_disabled, merge;
};

enum {
  OPT_ADD = 256,
  OPT_REMOVE,
  OPT_CLEAR,
  OPT_ENABLE,
  OPT_DISABLE,
  OPT_MERGE
};

/* One operation on the image's bitmaps (E NULL: it has none). */
static int run_one(struct qcow2_bm_edit *e, struct qcow2_bm_edit *src,
                   const struct bitmap_args *a, const struct action *act) {
  if (!e && act->op == OP_ADD) {
    bd_set_error("Can't store persistent bitmaps to %s: Operation not "
                 "supported (only qcow2 images have persistent bitmaps)",
                 a->path);
    return -ENOTSUP;
  }
  if (!e || (act->op == OP_MERGE && !src)) {
    bd_set_error("Dirty bitmap '%s' not found",
                 !e || act->op != OP_MERGE ? a->name : act->src);
    return -ENOENT;
  }
  switch (act->op) {
  case OP_ADD: return qcow2_bm_add(e, a->name, a->granularity, a->add_disabled);
  case OP_REMOVE: return qcow2_bm_remove(e, a->name);
  case OP_CLEAR: return qcow2_bm_clear(e, a->name);
  case OP_ENABLE: return qcow2_bm_enable(e, a->name, true);
  case OP_DISABLE: return qcow2_bm_enable(e, a->name, false);
  case OP_MERGE: return qcow2_bm_merge(e, a->name, src, act->src);
  }
  return -EINVAL;
}

/* The operations in order; what was done before a failure is kept, as
 * qemu-img stores its bitmaps when it closes the image either way. */
static int run_all(struct bd *bd, struct bd *src_bd,
                   const struct bitmap_args *a) {
  struct qcow2_bm_edit *e = NULL, *src = NULL;
  int r = 0;
  if (!strcmp(bd->format, "qcow2")) /* v2 too: QEMU's refusal is add's */
    r = qcow2_bm_open(bd, &e);
  if (r == 0 && src_bd && !strcmp(src_bd->format, "qcow2"))
    r = qcow2_bm_open(src_bd, &src);
  if (r < 0) {
    cli_error("bitmap", NULL, "%s", bd_errmsg());
    qcow2_bm_close(e);
    return 1;
  }
  int ret = 0;
  for (size_t i = 0; ret == 0 && i < a->nacts; i++) {
    if (run_one(e, src_bd ? src : e, a, &a->acts[i]) < 0) {
      cli_error("bitmap", NULL, "Operation %s on bitmap %s failed: %s",
                op_names[a->acts[i].op], a->name, bd_errmsg());
      ret = 1;
    }
  }
  if (e && qcow2_bm_commit(e) < 0) {
    cli_error("bitmap", NULL, "%s", bd_errmsg());
    ret = 1;
  }
  qcow2_bm_close(src);
  qcow2_bm_close(e);
  return ret;
}

static int bitmap_run(const struct bitmap_args *a) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->format;
  struct bd *bd = bd_open_with(a->path, &o), *src = NULL;
  if (!bd) {
    cli_error("bitmap", NULL, "%s", bd_errmsg());
    return 1;
  }
  if (a->src_file) {
    struct bd_open_opts so = BD_OPEN_OPTS_INIT;
    so.format = a->src_format;
    so.flags = BD_OPEN_READONLY;
    src = bd_open_with(a->src_file, &so);
    if (!src) {
      cli_error("bitmap", NULL, "%s", bd_errmsg());
      bd_close(bd);
      return 1;
    }
  }
  int ret = run_all(bd, src, a);
  if (src)
    bd_close(src);
  if (bd_close(bd) < 0 && ret == 0) {
    cli_error("bitmap", NULL, "%s", bd_errmsg());
    ret = 1;
  }
  return ret;
}

static int push(struct bitmap_args *a, enum op op, const char *src) {
  struct action *n = realloc(a->acts, (a->nacts + 1) * sizeof *n);
  if (!n)
    return -1;
  a->acts = n;
  n[a->nacts++] = (struct action){op, src};
  return 0;
}

/* -g as qemu-img reads it; its 32 bits are what QEMU then checks, and 0
 * means the default. */
static int granularity(const char *arg, uint64_t *out) {
  uint64_t v;
  if (cli_parse_qemu_size(arg, &v) < 0) {
    cli_error("bitmap", NULL,
              "Invalid granularity specified. You may use k, M, G, T, P or E "
              "suffixes for");
    cli_error("bitmap", NULL,
              "kilobytes, megabytes, gigabytes, terabytes, "
              "petabytes and exabytes.");
    return -1;
  }
  /* Not 0 only when asked for: QEMU checks the value it truncated. */
  *out = v && !(uint32_t)v ? 1 : (uint32_t)v;
  return 0;
}

static int bitmap_option(struct bitmap_args *a, int ch, const char *arg) {
  switch (ch) {
  case 'f': a->format = arg; return 0;
  case 'F': a->src_format = arg; return 0;
  case 'b': a->src_file = arg; return 0;
  case 'q': return 0; /* nothing is printed on success anyway */
  case 'g': return granularity(arg, &a->granularity);
  case OPT_ADD: a->add = true; return push(a, OP_ADD, NULL);
  case OPT_REMOVE: return push(a, OP_REMOVE, NULL);
  case OPT_CLEAR: return push(a, OP_CLEAR, NULL);
  case OPT_ENABLE: return push(a, OP_ENABLE, NULL);
  case OPT_DISABLE: a->add_disabled = true; return push(a, OP_DISABLE, NULL);
  case OPT_MERGE: a->merge = true; return push(a, OP_MERGE, arg);
  default: cli_usage_error("bitmap", NULL); return -1;
  }
}

/* qemu-img's checks of the command line, in its order and words. */
static const char *bad_combination(const struct bitmap_args *a, int left) {
  if (!a->nacts)
    return "Need at least one of --add, --remove, --clear, --enable, "
           "--disable, or --merge";
  if (a->granularity && !a->add)
    return "granularity only supported with --add";
  if (a->src_format && !a->src_file)
    return "-F only supported with -b";
  if (a->src_file && !a->merge)
    return "Merge bitmap source file only supported with --merge";
  if (left != 2)
    return "Expecting filename and bitmap name";
  return NULL;
}

static int parse(int argc, char **argv, struct bitmap_args *a) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"format", required_argument, NULL, 'f'},
      {"quiet", no_argument, NULL, 'q'},
      {"add", no_argument, NULL, OPT_ADD},
      {"remove", no_argument, NULL, OPT_REMOVE},
      {"clear", no_argument, NULL, OPT_CLEAR},
      {"enable", no_argument, NULL, OPT_ENABLE},
      {"disable", no_argument, NULL, OPT_DISABLE},
      {"merge", required_argument, NULL, OPT_MERGE},
      {"granularity", required_argument, NULL, 'g'},
      {"source-file", required_argument, NULL, 'b'},
      {"source-format", required_argument, NULL, 'F'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "b:f:F:g:hq", longopts, NULL)) != -1) {
    if (ch == 'h') {
      fputs(bitmap_usage, stdout);
      exit(0);
    }
    if (bitmap_option(a, ch, optarg) < 0)
      return -1;
  }
  const char *why = bad_combination(a, argc - optind);
  if (why) {
    cli_error("bitmap", NULL, "%s", why);
    return -1;
  }
  a->path = argv[optind];
  a->name = argv[optind + 1];
  return 0;
}

int bitmap_main(int argc, char **argv) {
  struct bitmap_args a = {0};
  /* qemu-img's lines only: what a source logs on opening is for servers. */
  log_threshold = LOG_LEVEL_WARN;
  int r = parse(argc, argv, &a) < 0 ? 1 : bitmap_run(&a);
  free(a.acts);
  return r;
}
