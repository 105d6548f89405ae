/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport dd: copy part of an image into a new one, as `qemu-img dd`
 * (QEMU 7.2) does, with its operands, its sizes and its quirks: COUNT
 * blocks are counted from the start of the input, not from SKIP, and a
 * SKIP past the end makes an empty image with a warning. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/open.h"

#include "cli.h"
#include "commands.h"
#include "image-opts.h"

static const char dd_usage[] =
    "Usage: blockport dd [-f FMT] [-O FMT] [-U] [bs=BLOCK_SIZE] "
    "[count=BLOCKS]\n"
    "                    [skip=BLOCKS] if=INPUT of=OUTPUT\n"
    "Copy INPUT (an image, an NBD URI, rbd:...) from block SKIP on into a\n"
    "new image OUTPUT (raw or qcow2; an existing file is overwritten), as\n"
    "qemu-img dd does.  BLOCK_SIZE defaults to 512; with COUNT, at most\n"
    "COUNT blocks from the start of INPUT are read (so SKIP blocks of them\n"
    "are left out).  Sizes and counts take the suffixes k, M, G, T, P, E.\n"
    "\n"
    "  -f FMT             INPUT's format (default: probed)\n"
    "  -O FMT             OUTPUT's format: raw (default) or qcow2\n"
    "  -U, --force-share  open INPUT even if another process writes it\n"
    "  -h, --help         show this help\n"
    "Exit status: 0 success, 1 bad usage or a failed read or write.\n";

#define DD_MAX_BS 2147483647ull /* qemu-img's limit */
#define DD_CHUNK (4u << 20)     /* at most this much in memory at once */

struct dd_args {
  const char *in, *out, *in_fmt, *out_fmt;
  bool share, has_count, has_skip;
  uint64_t bs, count, skip;
};

static int bad_number(const char *what) {
  cli_error("dd", NULL,
            "invalid %s specified; use a number with at most one of the "
            "suffixes k, M, G, T, P or E",
            what);
  return -1;
}

/* One KEY=VALUE operand into A.  0, or -1 (said). */
static int operand(struct dd_args *a, const char *arg) {
  const char *eq = strchr(arg, '=');
  size_t klen = eq ? (size_t)(eq - arg) : strlen(arg);
  const char *v = eq ? eq + 1 : "";
#define KEY(k) (klen == strlen(k) && !strncmp(arg, k, klen))
  if (eq && KEY("if"))
    a->in = v;
  else if (eq && KEY("of"))
    a->out = v;
  else if (eq && KEY("bs")) {
    if (cli_parse_qemu_size(v, &a->bs) < 0)
      return bad_number("bs");
    if (a->bs < 1 || a->bs > DD_MAX_BS) {
      cli_error("dd", NULL, "invalid bs specified: must be between 1 and %llu",
                DD_MAX_BS);
      return -1;
    }
  } else if (eq && KEY("count")) {
    if (cli_parse_qemu_size(v, &a->count) < 0)
      return bad_number("count");
    a->has_count = true;
  } else if (eq && KEY("skip")) {
    if (cli_parse_qemu_size(v, &a->skip) < 0)
      return bad_number("skip");
    a->has_skip = true;
  } else {
    cli_error("dd", NULL, "unrecognized operand %.*s", (int)klen, arg);
    return -1;
  }
#undef KEY
  return 0;
}

static int parse_args(int argc, char **argv, struct dd_args *a) {
  static const struct option longopts[] = {
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "f:O:Uh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f': a->in_fmt = optarg; break;
    case 'O': a->out_fmt = optarg; break;
    case 'U': a->share = true; break;
    case 'h': fputs(dd_usage, stdout); exit(0);
    default: cli_usage_error("dd", NULL); return -1;
    }
  }
  for (; optind < argc; optind++)
    if (operand(a, argv[optind]) < 0)
      return -1;
  if (!a->in || !a->out || !*a->in || !*a->out) {
    cli_usage_error("dd", "give both if=INPUT and of=OUTPUT");
    return -1;
  }
  if (strcmp(a->out_fmt, "raw") && strcmp(a->out_fmt, "qcow2")) {
    cli_usage_error("dd", "-O %s: the output is raw or qcow2", a->out_fmt);
    return -1;
  }
  return 0;
}

/* Copy [from, to) of IN to OUT from offset 0, in chunks. */
static int copy(struct bd *in, struct bd *out, uint64_t from, uint64_t to) {
  uint8_t *buf = malloc(DD_CHUNK);
  if (!buf) {
    cli_error("dd", NULL, "out of memory");
    return -1;
  }
  int r = 0;
  for (uint64_t pos = from; r == 0 && pos < to;) {
    uint64_t n = to - pos < DD_CHUNK ? to - pos : DD_CHUNK;
    if (bd_pread(in, buf, n, pos) < 0) {
      cli_error("dd", NULL, "reading at %llu: %s", (unsigned long long)pos,
                bd_errmsg());
      r = -1;
    } else if (bd_pwrite(out, buf, n, pos - from, 0) < 0) {
      cli_error("dd", NULL, "writing at %llu: %s",
                (unsigned long long)(pos - from), bd_errmsg());
      r = -1;
    }
    pos += n;
  }
  free(buf);
  if (r == 0 && bd_flush(out) < 0) {
    cli_error("dd", NULL, "flush: %s", bd_errmsg());
    r = -1;
  }
  return r;
}

/* Where the copy ends and starts: COUNT blocks from the input's start at
 * most; a SKIP past that end (or overflowing) copies nothing. */
static void bounds(const struct dd_args *a, uint64_t size, uint64_t *from,
                   uint64_t *to, bool *past_end) {
  if (a->has_count && a->count <= UINT64_MAX / a->bs && a->count * a->bs < size)
    size = a->count * a->bs;
  *to = size;
  *past_end =
      a->has_skip && (a->skip > UINT64_MAX / a->bs || a->skip * a->bs > size);
  *from = *past_end || !a->has_skip ? (*past_end ? size : 0) : a->skip * a->bs;
}

static int dd(const struct dd_args *a) {
  struct bd *in = bd_open_flags(a->in, a->in_fmt,
                                a->share ? BD_OPEN_SHARE : BD_OPEN_READONLY);
  if (!in) {
    cli_error("dd", NULL, "%s", bd_errmsg());
    return 1;
  }
  uint64_t from, to;
  bool past_end;
  bounds(a, in->size, &from, &to, &past_end);
  struct image_opts o;
  image_opts_init(&o);
  /* A new image is whole sectors, as qemu-img makes it (the rest reads
   * as zeroes). */
  uint64_t osize = (to - from + 511) / 512 * 512;
  int r = image_opts_create_file("dd", a->out, a->out_fmt, &o, osize);
  struct bd *out = NULL;
  if (r == 0 && !(out = bd_open(a->out, a->out_fmt, false))) {
    cli_error("dd", NULL, "%s", bd_errmsg());
    r = -1;
  }
  if (r == 0 && past_end) /* as dd(1): a warning and an empty image */
    cli_error("dd", a->in, "cannot skip to the specified offset");
  if (r == 0)
    r = copy(in, out, from, to);
  if (out && bd_close(out) < 0)
    r = -1;
  bd_close(in);
  image_opts_free(&o);
  return r < 0 ? 1 : 0;
}

int dd_main(int argc, char **argv) {
  struct dd_args a = {.out_fmt = "raw", .bs = 512};
  if (parse_args(argc, argv, &a) < 0)
    return 1;
  return dd(&a);
}
