/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport resize: grow or shrink an image, as `qemu-img resize` does (its
 * options, messages and exit statuses). */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"

#include "cli.h"
#include "commands.h"

static const char resize_usage[] =
    "Usage: blockport resize [-f FMT] [--preallocation=MODE] [-q] [--shrink]\n"
    "                        FILENAME [+|-]SIZE\n"
    "Change the virtual size of a raw or qcow2 image, or of an RBD image\n"
    "(rbd:POOL/IMAGE), to SIZE, or by +SIZE or -SIZE (qemu-img resize).\n"
    "What is added reads as zeroes.  Making an image smaller deletes the\n"
    "data past its new end, so it needs --shrink.\n"
    "\n"
    "  -f, --format FMT       format of FILENAME (default: probed)\n"
    "  --preallocation=MODE   space for what is added: off (default),\n"
    "                         metadata (qcow2), falloc or full\n"
    "  -q, --quiet            print nothing on success\n"
    "  --shrink               allow the image to become smaller\n"
    "  -h, --help             show this help\n"
    "\n"
    "SIZE is a number of bytes with an optional suffix k, M, G, T, P or E\n"
    "(powers of 1024); a qcow2 size is a multiple of 512.  The image is\n"
    "locked while it changes: it cannot be resized while it is served.\n"
    "Exit status: 0 resized, 1 on error.\n";

enum { OPT_PREALLOC = 256, OPT_SHRINK };

struct resize_args {
  const char *path, *format, *size;
  enum bd_prealloc prealloc;
  bool quiet, shrink;
};

/* SIZE as qemu-img reads it: absolute, or relative to OLD with + or -. */
static int new_size(const char *arg, uint64_t old, uint64_t *out) {
  bool rel = arg[0] == '+' || arg[0] == '-';
  uint64_t v;
  if (cli_parse_qemu_size(arg + rel, &v) < 0) {
    cli_error("resize", NULL,
              "%s: expected a size in bytes, with an optional suffix k, M, "
              "G, T, P or E",
              arg);
    return -1;
  }
  if (arg[0] == '-' && v >= old) {
    cli_error("resize", NULL, "New image size must be positive");
    return -1;
  }
  *out = arg[0] == '+' ? old + v : arg[0] == '-' ? old - v : v;
  if (*out == 0)
    cli_error("resize", NULL, "New image size must be positive");
  else if (*out > INT64_MAX || (arg[0] == '+' && *out < old))
    cli_error("resize", NULL, "%s: the new size is too large", arg);
  else
    return 0;
  return -1;
  return 0;
}

static int resize(const struct resize_args *a) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->format;
  struct bd *bd = bd_open_with(a->path, &o);
  if (!bd) {
    cli_error("resize", NULL, "%s", bd_errmsg());
    return 1;
  }
  uint64_t size = 0;
  int r = new_size(a->size, bd->size, &size);
  if (r == 0 && size < bd->size && !a->shrink) {
    cli_error("resize", NULL,
              "Use the --shrink option to perform a shrink operation.");
    cli_error("resize", NULL,
              "warning: Shrinking an image will delete all data beyond the "
              "shrunken image's end. Before performing such an operation, "
              "make sure there is no important data there.");
    r = -1;
  }
  if (r == 0 && size < bd->size && a->prealloc != BD_PREALLOC_OFF) {
    cli_error("resize", NULL, "--preallocation applies to growing only");
    r = -1;
  }
  /* A raw file is resized even to its own size, as qemu-img does: a file
   * whose length is not a whole number of sectors grows to its size. */
  bool same = size == bd->size && strcmp(bd->format, "raw") != 0;
  if (r == 0 && !same && bd_resize(bd, size, a->prealloc) < 0) {
    cli_error("resize", NULL, "%s", bd_errmsg());
    r = -1;
  }
  if (bd_close(bd) < 0 && r == 0) {
    cli_error("resize", NULL, "%s", bd_errmsg());
    r = -1;
  }
  if (r == 0 && !a->quiet)
    puts("Image resized.");
  return r == 0 ? 0 : 1;
}

/* The size is taken off the end before getopt sees it, so that "-2G"
 * is a size and not options, as qemu-img does it. */
int resize_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"format", required_argument, NULL, 'f'},
      {"preallocation", required_argument, NULL, OPT_PREALLOC},
      {"quiet", no_argument, NULL, 'q'},
      {"shrink", no_argument, NULL, OPT_SHRINK},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  struct resize_args a = {0};
  /* qemu-img's lines only: what a source logs on opening (the bitmaps it
   * tracks) is for servers. */
  log_threshold = LOG_LEVEL_WARN;
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(resize_usage, stdout);
      return 0;
    }
  if (argc < 3) {
    cli_usage_error("resize", "expected an image and a size");
    return 1;
  }
  a.size = argv[--argc];
  int ch;
  while ((ch = getopt_long(argc, argv, "f:qh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f': a.format = optarg; break;
    case 'q': a.quiet = true; break;
    case OPT_SHRINK: a.shrink = true; break;
    case OPT_PREALLOC:
      if (bd_prealloc_parse(optarg, &a.prealloc) == 0)
        break;
      cli_usage_error("resize",
                      "--preallocation: %s: expected off, metadata, falloc "
                      "or full",
                      optarg);
      return 1;
    default: cli_usage_error("resize", NULL); return 1;
    }
  }
  if (argc - optind != 1) {
    cli_usage_error("resize", "expected an image and a size");
    return 1;
  }
  a.path = argv[optind];
  return resize(&a);
}
