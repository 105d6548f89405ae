/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport amend: change the options of an existing qcow2 image (version,
 * lazy refcounts, refcount width, data file, size), as `qemu-img amend`
 * does: its options, its -o syntax and messages, its exit statuses. */
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
#include "formats/qcow2/amend.h"

#include "cli.h"
#include "commands.h"
#include "image-opts.h"

static const char amend_usage[] =
    "Usage: blockport amend [-f FMT] [-t CACHE] [-p] [-q] [--force]\n"
    "                       -o OPTIONS FILENAME\n"
    "Change the options of the qcow2 image FILENAME in place (qemu-img\n"
    "amend), under its write lock.\n"
    "\n"
    "  -o OPTIONS     KEY=VALUE,... (repeatable; -o help lists them):\n"
    "                 compat=0.10|1.1, lazy_refcounts=on|off,\n"
    "                 refcount_bits=1|2|4|...|64, data_file=NAME (an\n"
    "                 image with an external data file only),\n"
    "                 data_file_raw=off, size=SIZE\n"
    "  -f, --format FMT  format of FILENAME (default: probed)\n"
    "  -t CACHE       cache mode: writeback (default), none,\n"
    "                 writethrough, directsync, unsafe\n"
    "  -p             show progress\n"
    "  -q             quiet: no progress\n"
    "  --force        accepted for qemu-img's sake (it concerns encryption)\n"
    "  -h, --help     show this help\n"
    "\n"
    "compat=0.10 turns zero clusters into what reads the same in version\n"
    "2 and drops the persistent bitmaps; it is refused with other refcount\n"
    "widths than 16, an external data file, extended L2 entries, or\n"
    "snapshots of another size.  Exit status: 0 done, 1 on error.\n";

static const char amend_help_qcow2[] =
    "Amend options for 'qcow2':\n"
    "  backing_file=<str>     - File name of a base image\n"
    "  backing_fmt=<str>      - Image format of the base image\n"
    "  compat=<str>           - Compatibility level (v2 [0.10] or v3 [1.1])\n"
    "  data_file=<str>        - File name of an external data file\n"
    "  data_file_raw=<bool (on/off)> - The external data file must stay "
    "valid as a raw image\n"
    "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
    "  refcount_bits=<num>    - Width of a reference count entry in bits\n"
    "  size=<size>            - Virtual disk size\n";

/* Options qemu-img takes for qcow2 images only when it creates them. */
static const char *const create_only[] = {
    "cluster_size", "preallocation",  "extended_l2", "compression_type",
    "encryption",   "encrypt.format", NULL};

struct amend_args {
  const char *format, *path;
  char *options; /* every -o, joined by commas */
  enum bd_cache cache;
  bool progress, quiet;
};

static bool one_of(const char *k, const char *const *list) {
  for (; *list; list++)
    if (!strcmp(k, *list))
      return true;
  return false;
}

static int parse_bool(const char *k, const char *v, int *out) {
  static const char *const on[] = {"on", "yes", "true", "y", NULL};
  static const char *const off[] = {"off", "no", "false", "n", NULL};
  if (one_of(v, on) || one_of(v, off)) {
    *out = one_of(v, on);
    return 0;
  }
  cli_error("amend", NULL, "Parameter '%s' expects 'on' or 'off'", k);
  return -1;
}

static int parse_compat(const char *v, unsigned *out) {
  if (!strcmp(v, "0.10") || !strcmp(v, "v2"))
    *out = 2;
  else if (!strcmp(v, "1.1") || !strcmp(v, "v3"))
    *out = 3;
  else
    return -1;
  return 0;
}

/* refcount_bits: a number, then a power of two up to 64 (checked when
 * the options are applied, as QEMU does: after the others parsed). */
static int parse_number(const char *k, const char *v, long long *out) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 0);
  if (errno || end == v || *end || v[0] == '-') {
    cli_error("amend", NULL, "Parameter '%s' expects a number", k);
    return -1;
  }
  *out = (long long)(int)n; /* QEMU reads it into an int */
  return 0;
}

/* The encryption options qemu-img amend takes (for LUKS images). */
static const char *const encrypt_keys[] = {
    "encrypt.iter-time",  "encrypt.keyslot", "encrypt.new-secret",
    "encrypt.old-secret", "encrypt.state",   NULL};

struct parsed {
  struct qcow2_amend_opts o;
  bool encrypt;       /* an encrypt.* option: this image has none */
  const char *compat; /* as given, checked when applied */
  bool has_bits;
  long long bits;
};

static int bad_key(const char *k) {
  cli_error("amend", NULL, "Invalid parameter '%s'", k);
  if (one_of(k, create_only) || !strncmp(k, "encrypt.", 8))
    fputs("This option is only supported for image creation\n", stderr);
  return -1;
}

/* One KEY=VALUE (a bare KEY is KEY=on).  0 or -1 (said). */
static int set_one(struct parsed *p, char *k) {
  char *v = strchr(k, '=');
  if (v)
    *v++ = 0;
  else
    v = "on";
  struct qcow2_amend_opts *o = &p->o;
  uint64_t size;
  if (!strcmp(k, "compat"))
    p->compat = v;
  else if (one_of(k, encrypt_keys))
    p->encrypt = true;
  else if (!strcmp(k, "lazy_refcounts"))
    return parse_bool(k, v, &o->lazy_refcounts);
  else if (!strcmp(k, "data_file_raw"))
    return parse_bool(k, v, &o->data_file_raw);
  else if (!strcmp(k, "data_file"))
    o->data_file = v;
  else if (!strcmp(k, "backing_file"))
    o->backing_file = v, o->backing_given = true;
  else if (!strcmp(k, "backing_fmt"))
    o->backing_fmt = v, o->backing_given = true;
  else if (!strcmp(k, "refcount_bits")) {
    p->has_bits = true;
    return parse_number(k, v, &p->bits);
  } else if (!strcmp(k, "size")) {
    if (cli_parse_qemu_size(v, &size) < 0) {
      cli_error("amend", NULL,
                "Parameter 'size' expects a non-negative number below 2^64");
      fputs("Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, "
            "tera-, peta-\nand exabytes, respectively.\n",
            stderr);
      return -1;
    }
    o->size = size;
  } else {
    return bad_key(k);
  }
  return 0;
}

/* The checks QEMU makes as it applies the options, before it changes
 * anything. */
static int check_values(struct parsed *p) {
  if (p->encrypt) {
    cli_error("amend", NULL,
              "Can't amend encryption options - encryption not present");
    return -1;
  }
  if (p->compat && parse_compat(p->compat, &p->o.version) < 0) {
    cli_error("amend", NULL, "Unknown compatibility level %s", p->compat);
    return -1;
  }
  if (p->has_bits) {
    int order = image_opts_log2((uint64_t)p->bits);
    if (p->bits <= 0 || p->bits > 64 || order < 0) {
      cli_error("amend", NULL,
                "Refcount width must be a power of two and "
                "may not exceed 64 bits");
      return -1;
    }
    p->o.refcount_order = order;
  }
  return 0;
}

/* LIST (kept: the values point into it). */
static int parse_list(char *list, struct parsed *p) {
  p->o = (struct qcow2_amend_opts){
      .lazy_refcounts = -1, .refcount_order = -1, .data_file_raw = -1};
  char *save = NULL;
  for (char *kv = strtok_r(list, ",", &save); kv;
       kv = strtok_r(NULL, ",", &save))
    if (set_one(p, kv) < 0)
      return -1;
  return check_values(p);
}

static bool has_help(const char *list) {
  char *copy = strdup(list), *save = NULL;
  bool help = false;
  for (char *kv = copy ? strtok_r(copy, ",", &save) : NULL; kv && !help;
       kv = strtok_r(NULL, ",", &save))
    help = !strcmp(kv, "help") || !strcmp(kv, "?");
  free(copy);
  return help;
}

static int print_help(const char *fmt) {
  if (strcmp(fmt, "qcow2")) {
    cli_error("amend", NULL,
              "Format driver '%s' does not support option amendment", fmt);
    return 1;
  }
  fputs(amend_help_qcow2, stdout);
  return 0;
}

static void progress(double done, void *ctx) {
  const struct amend_args *a = ctx;
  if (a->progress) {
    printf("    (%3.2f/100%%)\r", 100.0 * done);
    fflush(stdout);
  }
}

static int amend_image(struct bd *bd, struct amend_args *a) {
  if (has_help(a->options))
    return print_help(bd->format);
  if (strcmp(bd->format, "qcow2")) {
    cli_error("amend", NULL,
              "Format driver '%s' does not support option amendment",
              bd->format);
    return 1;
  }
  struct parsed p = {0};
  if (parse_list(a->options, &p) < 0)
    return 1;
  progress(0, a);
  int r = qcow2_amend(bd, &p.o, progress, a);
  progress(1, a);
  if (r < 0)
    cli_error("amend", NULL, "%s", bd_errmsg());
  return r < 0 ? 1 : 0;
}

static int amend_run(struct amend_args *a) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->format;
  o.cache = a->cache;
  struct bd *bd = bd_open_with(a->path, &o);
  if (!bd) {
    cli_error("amend", NULL, "%s", bd_errmsg());
    return 1;
  }
  int ret = amend_image(bd, a);
  if (bd_close(bd) < 0 && ret == 0) {
    cli_error("amend", NULL, "%s", bd_errmsg());
    ret = 1;
  }
  if (a->progress)
    putchar('\n');
  return ret;
}

/* -o LIST, appended to the earlier ones as qemu-img joins them. */
static int add_options(struct amend_args *a, const char *list) {
  char *n = NULL;
  if (asprintf(&n, "%s%s%s", a->options ? a->options : "",
               a->options ? "," : "", list) < 0)
    return -1;
  free(a->options);
  a->options = n;
  return 0;
}

static int parse(int argc, char **argv, struct amend_args *a) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"format", required_argument, NULL, 'f'},
      {"force", no_argument, NULL, 'F'},
      {0, 0, 0, 0}};
  const char *cache = NULL;
  int ch;
  while ((ch = getopt_long(argc, argv, "ho:f:t:pq", longopts, NULL)) != -1) {
    switch (ch) {
    case 'h': fputs(amend_usage, stdout); exit(0);
    case 'o':
      if (add_options(a, optarg) < 0)
        return -1;
      break;
    case 'f': a->format = optarg; break;
    case 't': cache = optarg; break;
    case 'p': a->progress = true; break;
    case 'q': a->quiet = true; break;
    case 'F': break; /* qemu-img's --force concerns encryption only */
    default: cli_usage_error("amend", NULL); return -1;
    }
  }
  if (!a->options) {
    cli_usage_error("amend", "Must specify options (-o)");
    return -1;
  }
  a->progress = a->progress && !a->quiet;
  if (a->format && has_help(a->options))
    exit(print_help(a->format));
  if (optind != argc - 1) {
    cli_error("amend", NULL, "Expecting one image file name");
    return -1;
  }
  a->path = argv[optind];
  if (cache && bd_cache_parse(cache, &a->cache) < 0) {
    cli_error("amend", NULL, "Invalid cache option: %s", cache);
    return -1;
  }
  return 0;
}

int amend_main(int argc, char **argv) {
  struct amend_args a = {0};
  /* qemu-img's lines only: what a source logs on opening is for servers. */
  log_threshold = LOG_LEVEL_WARN;
  int r = parse(argc, argv, &a) < 0 ? 1 : amend_run(&a);
  free(a.options);
  return r;
}
