/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport create: make a new raw or qcow2 image, as `qemu-img create`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/filelock.h"
#include "formats/qcow2/backing-path.h"
#include "formats/qcow2/create.h"
#include "formats/rbd-admin.h"
#include "formats/rbd-spec.h"

#include "backing.h"
#include "cli.h"
#include "commands.h"

static const char create_usage[] =
    "Usage: blockport create [-f FMT] [-o OPTIONS] [-b BACKING [-F FMT]] FILE "
    "[SIZE]\n"
    "       blockport create [-f raw] [-o cluster_size=SIZE] "
    "rbd:POOL/IMAGE SIZE\n"
    "Create a new disk image FILE (an existing file is overwritten), or a\n"
    "new Ceph RBD image (an existing one is an error) with the cluster's\n"
    "default features.\n"
    "\n"
    "FMT is qcow2 or raw (default raw, as qemu-img's; RBD images: raw).\n"
    "SIZE is read as qemu-img reads it: a number with at most one suffix\n"
    "k, M, G, T, P, E (powers of 1024; a fraction with one: 1.5G), rounded\n"
    "up to 512 bytes; with a backing file it defaults to the backing file's\n"
    "size.  -o help lists the options of FMT.\n"
    "\n"
    "  -f, --format FMT          image format: qcow2 or raw\n"
    "  -o, --options OPTS        comma separated KEY=VALUE options (below)\n"
    "  -b, --backing FILE        backing file (qcow2; relative to FILE's "
    "directory),\n"
    "                            or an NBD URI (its data read as raw)\n"
    "  -F, --backing-format FMT  backing file format: raw or qcow2 (default: "
    "probed)\n"
    "  -u, --unsafe              do not open the backing file\n"
    "  -q, --quiet               print nothing on success\n"
    "  -h, --help                show this help\n"
    "\n"
    "qcow2 options:\n"
    "  cluster_size=SIZE         512 to 2M, a power of two (default 64k)\n"
    "  compat=0.10|1.1           qcow2 version 2 or 3 (default 1.1)\n"
    "  backing_file=FILE, backing_fmt=FMT   as -b and -F\n"
    "  extended_l2=on|off        subclusters (cluster_size >= 16k)\n"
    "  compression_type=zlib|zstd\n"
    "  lazy_refcounts=on|off\n"
    "  refcount_bits=N           1, 2, 4, 8, 16 (default), 32 or 64\n"
    "  preallocation=off|metadata|falloc|full\n"
    "raw options:\n"
    "  preallocation=off|falloc|full\n"
    "RBD options:\n"
    "  cluster_size=SIZE         object size: 4k to 32M, a power of two\n"
    "                            (default: the cluster's, usually 4M)\n";

struct create_args {
  const char *fmt, *file, *backing, *backing_fmt;
  bool has_size, unsafe, quiet;
  bool help; /* -o help */
  uint64_t size;
  struct qcow2_create_opts q;
  bool raw_opt_seen; /* an option raw does not take */
  char bad_opt[64];
  bool rbd;              /* FILE is rbd:POOL/IMAGE */
  uint64_t cluster_size; /* -o cluster_size, checked for the format */
};

static int err_usage(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static int err_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror("create", NULL, fmt, ap);
  va_end(ap);
  fputs("Try 'blockport create --help'.\n", stderr);
  return -1;
}

static int parse_bool(const char *v, bool *out) {
  if (!strcmp(v, "on") || !strcmp(v, "true") || !strcmp(v, "yes"))
    *out = true;
  else if (!strcmp(v, "off") || !strcmp(v, "false") || !strcmp(v, "no"))
    *out = false;
  else
    return -1;
  return 0;
}

static int log2_exact(uint64_t v) {
  if (v == 0 || (v & (v - 1)))
    return -1;
  int n = 0;
  while (v > 1) {
    v >>= 1;
    n++;
  }
  return n;
}

static int parse_size_arg(const char *s, uint64_t *out) {
  if (cli_parse_qemu_size(s, out) < 0)
    return -1;
  if (*out > UINT64_MAX - 511)
    return -1;
  *out = (*out + 511) & ~511ull;
  return 0;
}

/* Copies of -o values that outlive the option string. */
static char *opt_backing, *opt_backing_fmt;

/* One KEY=VALUE option.  Returns 0 or -1 (message printed). */
static int set_option(struct create_args *a, char *kv) {
  char *v = strchr(kv, '=');
  if (!v)
    return err_usage("option '%s' needs a value (KEY=VALUE)", kv);
  *v++ = 0;
  struct qcow2_create_opts *q = &a->q;
  bool b;
  uint64_t n;
  int bits;
  if (!strcmp(kv, "preallocation")) {
    if (!strcmp(v, "off"))
      q->prealloc = QCOW2_PREALLOC_OFF;
    else if (!strcmp(v, "metadata"))
      q->prealloc = QCOW2_PREALLOC_METADATA;
    else if (!strcmp(v, "falloc"))
      q->prealloc = QCOW2_PREALLOC_FALLOC;
    else if (!strcmp(v, "full"))
      q->prealloc = QCOW2_PREALLOC_FULL;
    else
      return err_usage("invalid preallocation mode '%s'", v);
    return 0;
  }
  if (!strcmp(kv, "size")) {
    if (parse_size_arg(v, &a->size) < 0)
      return err_usage("invalid size '%s' (suffixes k, M, G, T, P, E; "
                       "1.5G is 1.5 GiB)",
                       v);
    a->has_size = true;
    return 0;
  }
  if (!a->raw_opt_seen)
    snprintf(a->bad_opt, sizeof a->bad_opt, "%s", kv);
  a->raw_opt_seen = true;
  if (!strcmp(kv, "cluster_size")) {
    if (cli_parse_qemu_size(v, &n) < 0 || log2_exact(n) < 0)
      return err_usage("invalid cluster_size '%s' (a power of two)", v);
    a->cluster_size = n;
  } else if (!strcmp(kv, "compat")) {
    if (!strcmp(v, "0.10") || !strcmp(v, "v2"))
      q->version = 2;
    else if (!strcmp(v, "1.1") || !strcmp(v, "v3"))
      q->version = 3;
    else
      return err_usage("invalid compat '%s' (0.10 or 1.1)", v);
  } else if (!strcmp(kv, "backing_file")) {
    free(opt_backing);
    a->backing = opt_backing = strdup(v);
  } else if (!strcmp(kv, "backing_fmt")) {
    free(opt_backing_fmt);
    a->backing_fmt = opt_backing_fmt = strdup(v);
  } else if (!strcmp(kv, "extended_l2")) {
    if (parse_bool(v, &b) < 0)
      return err_usage("invalid extended_l2 '%s' (on or off)", v);
    q->extended_l2 = b;
  } else if (!strcmp(kv, "lazy_refcounts")) {
    if (parse_bool(v, &b) < 0)
      return err_usage("invalid lazy_refcounts '%s' (on or off)", v);
    q->lazy_refcounts = b;
  } else if (!strcmp(kv, "compression_type")) {
    if (!strcmp(v, "zlib"))
      q->compression_type = 0;
    else if (!strcmp(v, "zstd"))
      q->compression_type = 1;
    else
      return err_usage("invalid compression_type '%s' (zlib or zstd)", v);
  } else if (!strcmp(kv, "refcount_bits")) {
    char *end;
    errno = 0;
    unsigned long r = strtoul(v, &end, 10);
    if (errno || *end || (bits = log2_exact(r)) < 0 || bits > 6)
      return err_usage("invalid refcount_bits '%s' (1, 2, 4, ... 64)", v);
    q->refcount_order = (unsigned)bits;
  } else {
    return err_usage("unknown option '%s'", kv);
  }
  return 0;
}

/* -o help, as qemu-img create -o help lists them. */
static void options_help(const char *fmt) {
  if (fmt && !strcmp(fmt, "qcow2"))
    fputs("Supported qcow2 options:\n"
          "  backing_file=<str>     - File name of a base image\n"
          "  backing_fmt=<str>      - Image format of the base image\n"
          "  cluster_size=<size>    - qcow2 cluster size\n"
          "  compat=<str>           - Compatibility level (v2 [0.10] or v3 "
          "[1.1])\n"
          "  compression_type=<str> - Compression method used for image "
          "cluster compression (zlib, zstd)\n"
          "  extended_l2=<bool (on/off)> - Extended L2 tables\n"
          "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
          "  preallocation=<str>    - Preallocation mode (allowed values: "
          "off, metadata, falloc, full)\n"
          "  refcount_bits=<num>    - Width of a reference count entry in "
          "bits\n"
          "  size=<size>            - Virtual disk size\n",
          stdout);
  else
    fputs("Supported raw options:\n"
          "  preallocation=<str>    - Preallocation mode (allowed values: "
          "off, falloc, full)\n"
          "  size=<size>            - Virtual disk size\n",
          stdout);
}

static bool is_help(const char *list) {
  return !strcmp(list, "help") || !strcmp(list, "?");
}

static int set_options(struct create_args *a, const char *list) {
  char *copy = strdup(list);
  if (!copy)
    return -1;
  int r = 0;
  char *save = NULL;
  for (char *kv = strtok_r(copy, ",", &save); kv && r == 0;
       kv = strtok_r(NULL, ",", &save))
    r = set_option(a, kv);
  free(copy);
  return r;
}

/* An RBD image: raw, a size, and at most an object size. */
static int check_rbd_args(struct create_args *a) {
  if (a->backing || a->backing_fmt)
    return err_usage("%s", "RBD images cannot have a backing file");
  if (a->raw_opt_seen && strcmp(a->bad_opt, "cluster_size"))
    return err_usage("RBD images do not take the option '%s'", a->bad_opt);
  if (a->q.prealloc != QCOW2_PREALLOC_OFF)
    return err_usage("%s", "RBD images take no preallocation");
  int bits = a->cluster_size ? log2_exact(a->cluster_size) : 0;
  if (a->cluster_size &&
      (bits < RBD_ADMIN_MIN_ORDER || bits > RBD_ADMIN_MAX_ORDER))
    return err_usage("invalid cluster_size %llu for RBD (a power of two from "
                     "4k to 32M)",
                     (unsigned long long)a->cluster_size);
  if (!a->has_size)
    return err_usage("%s", "no size given");
  return 0;
}

static int parse_args(int argc, char **argv, struct create_args *a) {
  static const struct option longopts[] = {
      {"format", required_argument, NULL, 'f'},
      {"options", required_argument, NULL, 'o'},
      {"backing", required_argument, NULL, 'b'},
      {"backing-format", required_argument, NULL, 'F'},
      {"unsafe", no_argument, NULL, 'u'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "f:o:b:F:uqh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f': a->fmt = optarg; break;
    case 'o':
      if (is_help(optarg)) {
        a->help = true;
        break;
      }
      if (set_options(a, optarg) < 0)
        return -1;
      break;
    case 'b': a->backing = optarg; break;
    case 'F': a->backing_fmt = optarg; break;
    case 'u': a->unsafe = true; break;
    case 'q': a->quiet = true; break;
    case 'h': fputs(create_usage, stdout); exit(0);
    default: cli_usage_error("create", NULL); return -1;
    }
  }
  if (optind < argc)
    a->rbd = rbd_spec_matches(argv[optind]);
  if (!a->fmt)
    a->fmt = "raw"; /* as qemu-img create */
  if (a->help) {
    options_help(a->fmt);
    exit(0);
  }
  if (a->rbd && strcmp(a->fmt, "raw"))
    return err_usage("%s images cannot be made on RBD: an RBD image is raw "
                     "(-f raw)",
                     a->fmt);
  if (strcmp(a->fmt, "qcow2") && strcmp(a->fmt, "raw"))
    return err_usage("unknown format '%s' (qcow2 or raw)", a->fmt);
  if (optind >= argc)
    return err_usage("%s", "no file given");
  a->file = argv[optind++];
  if (optind < argc) {
    if (parse_size_arg(argv[optind], &a->size) < 0)
      return err_usage("invalid size '%s' (suffixes k, M, G, T, P, E; "
                       "1.5G is 1.5 GiB)",
                       argv[optind]);
    a->has_size = true;
    optind++;
  }
  if (optind < argc)
    return err_usage("unexpected argument '%s'", argv[optind]);
  if (a->rbd)
    return check_rbd_args(a);
  if (a->cluster_size) {
    int bits = log2_exact(a->cluster_size);
    if (bits < 9 || bits > 21)
      return err_usage("invalid cluster_size %llu (a power of two from 512 "
                       "to 2M)",
                       (unsigned long long)a->cluster_size);
    a->q.cluster_bits = (unsigned)bits;
  }
  if (!strcmp(a->fmt, "raw")) {
    if (a->raw_opt_seen)
      return err_usage("raw images do not take the option '%s'", a->bad_opt);
    if (a->backing || a->backing_fmt)
      return err_usage("%s", "raw images cannot have a backing file");
    if (a->q.prealloc == QCOW2_PREALLOC_METADATA)
      return err_usage("%s", "raw images take preallocation=off, falloc or "
                             "full");
  }
  if (a->backing_fmt && strcmp(a->backing_fmt, "raw") &&
      strcmp(a->backing_fmt, "qcow2"))
    return err_usage("unknown backing format '%s' (raw or qcow2)",
                     a->backing_fmt);
  if (!a->has_size && !a->backing)
    return err_usage("%s", "no size given");
  return 0;
}

/* Probe the backing file's format and size (unless -u). */
static int check_backing(struct create_args *a) {
  /* The backing file as opened: relative to the new image's directory. */
  char *path = qcow2_backing_path(a->file, a->backing);
  if (!path) {
    fprintf(stderr, "blockport create: out of memory\n");
    return -1;
  }
  struct stat bst, fst;
  if (stat(path, &bst) == 0 && stat(a->file, &fst) == 0 &&
      bst.st_dev == fst.st_dev && bst.st_ino == fst.st_ino) {
    fprintf(stderr,
            "blockport create: %s: the image cannot be its own backing "
            "file\n",
            a->file);
    free(path);
    return -1;
  }
  if (a->unsafe) {
    free(path);
    if (!a->has_size) {
      fprintf(stderr, "blockport create: -u needs a size\n");
      return -1;
    }
    return 0;
  }
  free(path);
  struct bd *b = cli_open_backing(a->file, a->backing, &a->backing_fmt, &path);
  if (!b) {
    fprintf(stderr, "blockport create: cannot open backing file %s: %s\n",
            path ? path : a->backing, bd_errmsg());
    free(path);
    return -1;
  }
  if (!a->has_size) {
    a->size = (b->size + 511) & ~511ull;
    a->has_size = true;
  }
  bd_close(b);
  free(path);
  return 0;
}

static int create_raw(const struct create_args *a, int fd) {
  if (ftruncate(fd, (off_t)a->size) < 0)
    return -errno;
  if (a->q.prealloc == QCOW2_PREALLOC_FALLOC && a->size) {
    int e = posix_fallocate(fd, 0, (off_t)a->size);
    if (e)
      return -e;
  }
  if (a->q.prealloc == QCOW2_PREALLOC_FULL) {
    static const uint8_t zero[65536];
    for (uint64_t off = 0; off < a->size;) {
      size_t n =
          a->size - off < sizeof zero ? (size_t)(a->size - off) : sizeof zero;
      ssize_t w = pwrite(fd, zero, n, (off_t)off);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0)
        return -errno;
      off += (uint64_t)w;
    }
  }
  return fdatasync(fd) < 0 ? -errno : 0;
}

static const char *prealloc_name(enum qcow2_prealloc p) {
  switch (p) {
  case QCOW2_PREALLOC_METADATA: return "metadata";
  case QCOW2_PREALLOC_FALLOC: return "falloc";
  case QCOW2_PREALLOC_FULL: return "full";
  default: return "off";
  }
}

/* rbd:POOL/IMAGE through librbd, printed as qemu-img prints it. */
static int create_rbd(const struct create_args *a) {
  int order = a->cluster_size ? log2_exact(a->cluster_size) : 0;
  if (!a->quiet) {
    printf("Formatting '%s', fmt=raw size=%llu", a->file,
           (unsigned long long)a->size);
    if (a->cluster_size)
      printf(" cluster_size=%llu", (unsigned long long)a->cluster_size);
    printf("\n");
    fflush(stdout);
  }
  if (rbd_admin_create(a->file, a->size, order, BD_RBD_TIMEOUT_DEFAULT) < 0) {
    cli_error("create", NULL, "%s", bd_errmsg());
    return 1;
  }
  return 0;
}

int create_main(int argc, char **argv) {
  struct create_args a = {
      .q = {.version = 3, .cluster_bits = 16, .refcount_order = 4}};
  if (parse_args(argc, argv, &a) < 0)
    return 1;
  if (a.rbd)
    return create_rbd(&a);
  if (a.backing && check_backing(&a) < 0)
    return 1;

  bool qcow2 = !strcmp(a.fmt, "qcow2");
  struct qcow2_layout l;
  char err[512];
  if (qcow2) {
    a.q.size = a.size;
    a.q.backing_file = a.backing;
    a.q.backing_fmt = a.backing ? a.backing_fmt : NULL;
    if (qcow2_create_layout(&a.q, &l) < 0) {
      cli_error("create", a.file, "%s", bd_errmsg());
      return 1;
    }
  }
  if (!a.quiet) {
    printf("Formatting '%s', fmt=%s", a.file, a.fmt);
    if (qcow2)
      printf(" cluster_size=%llu compat=%s", (unsigned long long)l.csize,
             a.q.version == 3 ? "1.1" : "0.10");
    if (a.backing)
      printf(" backing_file=%s", a.backing);
    if (a.backing && a.backing_fmt)
      printf(" backing_fmt=%s", a.backing_fmt);
    printf(" preallocation=%s size=%llu\n", prealloc_name(a.q.prealloc),
           (unsigned long long)a.size);
    fflush(stdout);
  }

  /* Read-write (byte locks need read access), not truncated before the
   * write lock is ours: an image in use is refused, never emptied. */
  int fd = open(a.file, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    cli_error("create", a.file, "%s", strerror(errno));
    return 1;
  }
  if (filelock_take(fd, a.file, FILELOCK_USE_WRITE, true) < 0) {
    cli_error("create", NULL, "%s", bd_errmsg());
    close(fd);
    return 1;
  }
  if (ftruncate(fd, 0) < 0) {
    cli_error("create", a.file, "%s", strerror(errno));
    close(fd);
    return 1;
  }
  int r;
  if (qcow2) {
    r = qcow2_create_write(fd, &a.q, &l);
    if (r < 0)
      snprintf(err, sizeof err, "%s", bd_errmsg());
  } else {
    r = create_raw(&a, fd);
    if (r < 0)
      snprintf(err, sizeof err, "%s", strerror(-r));
  }
  if (close(fd) < 0 && r == 0) {
    r = -errno;
    snprintf(err, sizeof err, "%s", strerror(errno));
  }
  if (r < 0) {
    cli_error("create", a.file, "%s", err);
    return 1;
  }
  return 0;
}
