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
#include "core/open.h"
#include "formats/formats.h"
#include "formats/qcow2/backing-path.h"
#include "formats/qcow2/create.h"
#include "formats/rbd-admin.h"
#include "formats/rbd-spec.h"

#include "backing.h"
#include "cli.h"
#include "commands.h"
#include "image-opts.h"

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
    "  -F, --backing-format FMT  backing file format: raw or qcow2 (needed "
    "with -b)\n"
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
    "  data_file=FILE            guest data in FILE (relative to the\n"
    "                            image's directory), created too\n"
    "  data_file_raw=on|off      keep FILE a raw image of the disk\n"
    "raw options:\n"
    "  preallocation=off|falloc|full\n"
    "RBD options:\n"
    "  cluster_size=SIZE         object size: 4k to 32M, a power of two\n"
    "                            (default: the cluster's, usually 4M)\n";

struct create_args {
  const char *fmt, *file;
  bool unsafe, quiet;
  struct image_opts o; /* -o, and -b, -F and SIZE into it */
  bool rbd;            /* FILE is rbd:POOL/IMAGE */
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

static int parse_size_arg(const char *s, uint64_t *out) {
  if (cli_parse_qemu_size(s, out) < 0)
    return -1;
  if (*out > UINT64_MAX - 511)
    return -1;
  *out = (*out + 511) & ~511ull;
  return 0;
}

/* An RBD image: raw, a size, and at most an object size. */
static int check_rbd_args(struct create_args *a) {
  if (a->o.backing || a->o.backing_fmt)
    return err_usage("%s", "RBD images cannot have a backing file");
  if (a->o.qcow2_only && strcmp(a->o.bad_opt, "cluster_size"))
    return err_usage("RBD images do not take the option '%s'", a->o.bad_opt);
  if (a->o.q.prealloc != QCOW2_PREALLOC_OFF)
    return err_usage("%s", "RBD images take no preallocation");
  int bits = a->o.cluster_size ? image_opts_log2(a->o.cluster_size) : 0;
  if (a->o.cluster_size &&
      (bits < RBD_ADMIN_MIN_ORDER || bits > RBD_ADMIN_MAX_ORDER))
    return err_usage("invalid cluster_size %llu for RBD (a power of two from "
                     "4k to 32M)",
                     (unsigned long long)a->o.cluster_size);
  if (!a->o.has_size)
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
      if (image_opts_parse("create", &a->o, optarg) < 0)
        return -1;
      break;
    case 'b': a->o.backing = optarg; break;
    case 'F': a->o.backing_fmt = optarg; break;
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
  if (a->o.help) {
    image_opts_help(a->fmt);
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
    if (parse_size_arg(argv[optind], &a->o.size) < 0)
      return err_usage("invalid size '%s' (suffixes k, M, G, T, P, E; "
                       "1.5G is 1.5 GiB)",
                       argv[optind]);
    a->o.has_size = true;
    optind++;
  }
  if (optind < argc)
    return err_usage("unexpected argument '%s'", argv[optind]);
  if (a->rbd)
    return check_rbd_args(a);
  if (!strcmp(a->fmt, "raw") && (a->o.backing || a->o.backing_fmt))
    return err_usage("%s", "raw images cannot have a backing file");
  if (image_opts_check("create", &a->o, a->fmt) < 0)
    return -1;
  if (a->o.backing_fmt && strcmp(a->o.backing_fmt, "raw") &&
      strcmp(a->o.backing_fmt, "qcow2"))
    return err_usage("unknown backing format '%s' (raw or qcow2)",
                     a->o.backing_fmt);
  if (!a->o.has_size && !a->o.backing)
    return err_usage("%s", "no size given");
  return 0;
}

/* Probe the backing file's format and size (unless -u). */
static int check_backing(struct create_args *a) {
  /* The backing file as opened: relative to the new image's directory. */
  char *path = qcow2_backing_path(a->file, a->o.backing);
  if (!path) {
    cli_error("create", NULL, "out of memory");
    return -1;
  }
  struct stat bst, fst;
  if (stat(path, &bst) == 0 && stat(a->file, &fst) == 0 &&
      bst.st_dev == fst.st_dev && bst.st_ino == fst.st_ino) {
    cli_error("create", a->file, "the image cannot be its own backing file");
    free(path);
    return -1;
  }
  /* As qemu-img 7.2: a probed backing format is refused (a raw base whose
   * data looks like another format would be read as that format). */
  bool no_fmt = !a->o.backing_fmt;
  if (a->unsafe) {
    free(path);
    if (no_fmt) {
      cli_error("create", a->file,
                "backing file specified without backing format (-F)");
      return -1;
    }
    if (!a->o.has_size) {
      cli_error("create", NULL, "-u needs a size");
      return -1;
    }
    return 0;
  }
  free(path);
  struct bd *b =
      cli_open_backing(a->file, a->o.backing, &a->o.backing_fmt, &path);
  if (!b) {
    cli_error("create", NULL, "cannot open backing file %s: %s",
              path ? path : a->o.backing, bd_errmsg());
    free(path);
    return -1;
  }
  if (no_fmt) {
    cli_error("create", a->file,
              "backing file specified without backing format (-F); "
              "detected format of %s: %s",
              a->o.backing, a->o.backing_fmt);
    bd_close(b);
    free(path);
    return -1;
  }
  if (!a->o.has_size) {
    a->o.size = (b->size + 511) & ~511ull;
    a->o.has_size = true;
  }
  bd_close(b);
  free(path);
  return 0;
}

static int create_raw(const struct create_args *a, int fd) {
  return image_opts_raw_file(fd, a->o.size, a->o.q.prealloc);
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
  int order = a->o.cluster_size ? image_opts_log2(a->o.cluster_size) : 0;
  if (!a->quiet) {
    printf("Formatting '%s', fmt=raw size=%llu", a->file,
           (unsigned long long)a->o.size);
    if (a->o.cluster_size)
      printf(" cluster_size=%llu", (unsigned long long)a->o.cluster_size);
    printf("\n");
    fflush(stdout);
  }
  if (rbd_admin_create(a->file, a->o.size, order, RBD_TIMEOUT_DEFAULT) < 0) {
    cli_error("create", NULL, "%s", bd_errmsg());
    return 1;
  }
  return 0;
}

/* The image the parsed arguments AP describe. */
static int create(const struct create_args *ap) {
  struct create_args a = *ap; /* the -o strings stay the caller's */
  if (a.rbd)
    return create_rbd(&a);
  if (a.o.backing && check_backing(&a) < 0)
    return 1;

  bool qcow2 = !strcmp(a.fmt, "qcow2");
  struct qcow2_layout l;
  char err[512];
  if (qcow2) {
    a.o.q.size = a.o.size;
    a.o.q.backing_file = a.o.backing;
    a.o.q.backing_fmt = a.o.backing ? a.o.backing_fmt : NULL;
    if (qcow2_create_layout(&a.o.q, &l) < 0) {
      cli_error("create", a.file, "%s", bd_errmsg());
      return 1;
    }
  }
  if (!a.quiet) {
    printf("Formatting '%s', fmt=%s", a.file, a.fmt);
    if (qcow2)
      printf(" cluster_size=%llu compat=%s", (unsigned long long)l.csize,
             a.o.q.version == 3 ? "1.1" : "0.10");
    if (a.o.backing)
      printf(" backing_file=%s", a.o.backing);
    if (a.o.backing && a.o.backing_fmt)
      printf(" backing_fmt=%s", a.o.backing_fmt);
    if (a.o.q.data_file)
      printf(" data_file=%s%s", a.o.q.data_file,
             a.o.q.data_file_raw ? " data_file_raw=on" : "");
    printf(" preallocation=%s size=%llu\n", prealloc_name(a.o.q.prealloc),
           (unsigned long long)a.o.size);
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
    r = qcow2_create_write(fd, &a.o.q, &l);
    if (r < 0)
      snprintf(err, sizeof err, "%s", bd_errmsg());
    if (r == 0 && image_opts_data_file("create", a.file, &a.o, a.o.size) < 0) {
      close(fd);
      return 1;
    }
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

int create_main(int argc, char **argv) {
  struct create_args a = {0};
  image_opts_init(&a.o);
  int ret = parse_args(argc, argv, &a) < 0 ? 1 : create(&a);
  image_opts_free(&a.o);
  return ret;
}
