/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport info: facts about an image, as `qemu-img info` prints them.
 * Everything read from the file is checked before it is used: a corrupt
 * image gets a message and exit status 1. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/filelock.h"
#include "core/io.h"
#include "core/open.h"
#include "formats/formats.h"
#include "formats/probe.h"
#include "formats/qcow2/qcow2.h"
#include "formats/qcow2/snapshot.h"
#include "formats/rbd-admin.h"
#include "formats/rbd-spec.h"

#include "cli.h"
#include "commands.h"
#include "formats/qcow2/backing-path.h"
#include "formats/qcow2/info.h"
#include "snapshot-table.h"

#define MAX_CHAIN 256

static const char info_usage[] =
    "Usage: blockport info [OPTIONS] IMAGE\n"
    "Show the format, sizes and format-specific facts of a disk image.\n"
    "IMAGE may be an NBD URI (nbd://, nbd+unix://): its size, read as raw;\n"
    "or a Ceph RBD image (rbd:POOL/IMAGE[@SNAP]): raw, with its object\n"
    "size, features and snapshots.\n"
    "\n"
    "  -f, --format FMT    image format instead of probing: raw, qcow2\n"
    "      --json          print JSON with the field names of `qemu-img info\n"
    "                      --output=json`\n"
    "      --output=human|json   the same, as qemu-img spells it\n"
    "      --backing-chain show every image of the backing chain\n"
    "  -U, --force-share   read a qcow2 image that another process writes\n"
    "                      (without it, such an image is refused, as\n"
    "                      qemu-img refuses it; a raw file never is)\n"
    "  -h, --help          show this help\n"
    "\n"
    "Exit status: 0 success, 1 bad usage, or the image cannot be read or\n"
    "is corrupt.\n";

struct image {
  char *filename;
  const char *format;
  uint64_t vsize, actual, file_size;
  dev_t dev;
  ino_t ino;
  bool qcow2;
  bool remote; /* an NBD export: no file, so no disk or file size */
  bool rbd;    /* an RBD image: r holds its facts */
  struct rbd_admin_info r;
  struct qcow2_info q; /* when qcow2 */
  char *full_backing;  /* q.backing as opened; NULL without one */
};

static bool force_share; /* -U */

/* -1 with the reason in bd_errmsg(). */
#define fail(...) (bd_set_error(__VA_ARGS__), -1)

static void free_image(struct image *im) {
  free(im->filename);
  free(im->full_backing);
  qcow2_info_free(&im->q);
  rbd_admin_info_free(&im->r);
  memset(im, 0, sizeof *im);
}

/* MSG without a leading "PATH: " (the caller names the image). */
static const char *without_path(const char *msg, const char *path) {
  size_t n = strlen(path);
  if (!strncmp(msg, path, n) && !strncmp(msg + n, ": ", 2))
    return msg + n + 2;
  return msg;
}

static int read_qcow2(int fd, struct image *im) {
  if (qcow2_read_info(fd, im->file_size, &im->q) < 0)
    return fail("%s", bd_errmsg());
  im->vsize = im->q.size;
  if (im->q.backing &&
      !(im->full_backing = qcow2_backing_path(im->filename, im->q.backing)))
    return fail("out of memory");
  return 0;
}

/* An NBD export shows only its guest view: a raw disk of some size. */
static int read_remote(const char *uri, struct image *im) {
  struct bd *bd = bd_open(uri, NULL, true);
  if (!bd)
    return fail("%s", bd_errmsg());
  im->format = "raw";
  im->remote = true;
  im->vsize = bd->size;
  bd_close(bd);
  return 0;
}

/* An RBD image: raw, with the facts librbd gives. */
static int read_rbd(const char *spec, struct image *im) {
  if (rbd_admin_info(spec, RBD_TIMEOUT_DEFAULT, &im->r) < 0)
    return -1;
  im->format = "raw";
  im->remote = im->rbd = true;
  im->vsize = im->r.size;
  return 0;
}

/* Locked as qemu-img info locks a qcow2 image: a reader that refuses
 * writers, its metadata must hold still.  A raw file is not locked at
 * all: qemu-img info opens it without I/O, and QEMU's raw then asks
 * nothing of the file (a writer of it may be running). */
static int lock_qcow2(int fd, const char *path) {
  enum filelock_use use = force_share ? FILELOCK_USE_SHARED : FILELOCK_USE_READ;
  if (filelock_take(fd, path, use, false) < 0)
    return fail("%s", without_path(bd_errmsg(), path));
  return 0;
}

static int read_image(const char *path, const char *format, struct image *im) {
  memset(im, 0, sizeof *im);
  if (!(im->filename = strdup(path)))
    return fail("out of memory");
  if (rbd_spec_matches(path))
    return format && strcmp(format, "raw")
               ? fail("an RBD image is raw, not %s", format)
               : read_rbd(path, im);
  if (nbdsrc_is_uri(path))
    return format && strcmp(format, "raw")
               ? fail("an NBD export is read as raw, not %s", format)
               : read_remote(path, im);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail("%s", strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
    close(fd);
    return fail("not a regular file or block device");
  }
  im->dev = st.st_dev;
  im->ino = st.st_ino;
  im->file_size = (uint64_t)st.st_size;
  im->actual = (uint64_t)st.st_blocks * 512;
  if (S_ISBLK(st.st_mode)) {
    off_t end = lseek(fd, 0, SEEK_END);
    im->file_size = end < 0 ? 0 : (uint64_t)end;
  }
  uint8_t head[PROBE_HEAD] = {0};
  ssize_t got = pread(fd, head, sizeof head, 0);
  const char *probed = probe_format(head, got > 0 ? (size_t)got : 0, path);
  bool is_qcow2 = !strcmp(probed, "qcow2");
  if (!format && !probe_supported(probed)) {
    close(fd);
    return fail("%s image: not supported; convert it with qemu-img convert",
                probed);
  }
  if (!format)
    format = probed;
  if (!strcmp(format, "qcow2") && lock_qcow2(fd, path) < 0) {
    close(fd);
    return -1;
  }
  int r = 0;
  if (!strcmp(format, "qcow2")) {
    im->format = "qcow2";
    im->qcow2 = true;
    r = is_qcow2 ? read_qcow2(fd, im) : fail("not a qcow2 image");
  } else {
    im->format = "raw";
    /* Whole 512-byte sectors, as QEMU sizes a raw file (formats/raw.c). */
    im->vsize = (im->file_size + 511) & ~511ull;
  }
  close(fd);
  return r;
}

/* ---- output ---- */

/* FEATURES by the names `rbd info` prints, after SEP. */
static void print_rbd_features(uint64_t features, const char *sep,
                               bool quoted) {
  const char *q = quoted ? "\"" : "";
  for (unsigned b = 0, n = 0; b < 64; b++) {
    if (!(features & (1ull << b)))
      continue;
    const char *name = rbd_admin_feature_name(b);
    printf("%s %s", n++ ? sep : "", q);
    if (name)
      printf("%s%s", name, q);
    else
      printf("unknown-%u%s", b, q);
  }
}

/* Snapshots as QEMU's rbd driver lists them (the name is the ID too, the
 * image size at the snapshot as VM SIZE), then RBD's own facts. */
static void print_rbd_human(const struct rbd_admin_info *r) {
  printf("cluster_size: %" PRIu64 "\n", r->object_size);
  if (r->nsnaps) {
    cli_snapshot_header();
    for (size_t i = 0; i < r->nsnaps; i++) {
      struct qcow2_snapshot s = {.id = r->snaps[i].name,
                                 .name = r->snaps[i].name,
                                 .vm_state_size = r->snaps[i].size,
                                 .date_sec = (uint32_t)r->snaps[i].date_sec,
                                 .icount = UINT64_MAX};
      cli_snapshot_line(&s);
    }
  }
  char a[32];
  cli_human_size(a, sizeof a, r->object_size);
  printf("Format specific information:\n    features:");
  print_rbd_features(r->features, ",", false);
  printf("\n    object size: %s\n    order: %d\n", a, r->order);
}

static void print_human(const struct image *im) {
  char a[32];
  printf("image: %s\nfile format: %s\n", im->filename, im->format);
  cli_human_size(a, sizeof a, im->vsize);
  printf("virtual size: %s (%" PRIu64 " bytes)\n", a, im->vsize);
  if (im->remote) {
    printf("disk size: unavailable\n");
    if (im->rbd)
      print_rbd_human(&im->r);
    return;
  }
  /* qemu-img 7.2's lines only: scripts compare them (no file size). */
  cli_human_size(a, sizeof a, im->actual);
  printf("disk size: %s\n", a);
  /* A raw file has nowhere to keep a bitmap: a checkpoint's lives in the
   * server (docs/BACKUP.md).  Said last, after qemu-img's lines. */
  if (!strcmp(im->format, "raw"))
    printf("dirty bitmaps: none in a raw file; a server's checkpoints keep "
           "theirs in memory, so after a restart the next backup is a full "
           "one\n");
  if (!im->qcow2)
    return;
  const struct qcow2_info *q = &im->q;
  printf("cluster_size: %" PRIu64 "\n", q->cluster_size);
  if (q->backing) {
    printf("backing file: %s", q->backing);
    if (strcmp(q->backing, im->full_backing))
      printf(" (actual path: %s)", im->full_backing);
    printf("\n");
    if (q->backing_format[0])
      printf("backing file format: %s\n", q->backing_format);
  }
  if (q->dirty)
    printf("cleanly shut down: no\n");
  if (q->nsnaps) {
    cli_snapshot_header();
    for (uint32_t i = 0; i < q->nsnaps; i++)
      cli_snapshot_line(&q->snaps[i]);
  }
  printf("Format specific information:\n");
  printf("    compat: %s\n", q->version >= 3 ? "1.1" : "0.10");
  printf("    compression type: %s\n", q->compression);
  if (q->version >= 3)
    printf("    lazy refcounts: %s\n", q->lazy_refcounts ? "true" : "false");
  if (q->nbitmaps) {
    printf("    bitmaps:\n");
    for (uint32_t i = 0; i < q->nbitmaps; i++) {
      const struct qcow2_bitmap *bm = &q->bitmaps[i];
      printf("        [%u]:\n            flags:\n", i);
      if (bm->flags & 1)
        printf("                [0]: in-use\n");
      if (bm->flags & 2)
        printf("                [%d]: auto\n", bm->flags & 1 ? 1 : 0);
      printf("            name: %s\n            granularity: %llu\n", bm->name,
             1ull << bm->granularity_bits);
    }
  }
  printf("    refcount bits: %u\n", q->refcount_bits);
  if (q->has_data_file) {
    printf("    data file: %s\n", q->data_file);
    printf("    data file raw: %s\n", q->data_file_raw ? "true" : "false");
  }
  if (q->version < 3)
    return; /* QEMU shows these for version 3 only */
  printf("    corrupt: %s\n", q->corrupt ? "true" : "false");
  printf("    extended l2: %s\n", q->extended_l2 ? "true" : "false");
}

static const char *tf(bool b) {
  return b ? "true" : "false";
}

/* As `qemu-img info --output=json` shows an RBD image, and RBD's own
 * facts as format-specific data of type "rbd". */
static void print_rbd_json(const struct rbd_admin_info *r, const char *ind) {
  printf("%s    \"cluster-size\": %" PRIu64 ",\n", ind, r->object_size);
  if (r->nsnaps) {
    printf("%s    \"snapshots\": [\n", ind);
    for (size_t i = 0; i < r->nsnaps; i++) {
      const struct rbd_admin_snap *s = &r->snaps[i];
      printf("%s        {\n%s            \"id\": ", ind, ind);
      cli_json_str(s->name);
      printf(",\n%s            \"name\": ", ind);
      cli_json_str(s->name);
      printf(",\n%s            \"vm-state-size\": %" PRIu64 ",\n", ind,
             s->size);
      printf("%s            \"date-sec\": %" PRId64 ",\n", ind, s->date_sec);
      printf("%s            \"date-nsec\": 0,\n", ind);
      printf("%s            \"vm-clock-sec\": 0,\n", ind);
      printf("%s            \"vm-clock-nsec\": 0\n", ind);
      printf("%s        }%s\n", ind, i + 1 < r->nsnaps ? "," : "");
    }
    printf("%s    ],\n", ind);
  }
  printf("%s    \"format-specific\": {\n%s        \"type\": \"rbd\",\n"
         "%s        \"data\": {\n%s            \"features\": [",
         ind, ind, ind, ind);
  print_rbd_features(r->features, ",", true);
  printf("],\n%s            \"object-size\": %" PRIu64 ",\n", ind,
         r->object_size);
  printf("%s            \"order\": %d\n%s        }\n%s    },\n", ind, r->order,
         ind, ind);
}

static void print_json(const struct image *im, const char *ind) {
  const struct qcow2_info *q = &im->q;
  printf("%s{\n%s    \"filename\": ", ind, ind);
  cli_json_str(im->filename);
  printf(",\n%s    \"format\": \"%s\",\n", ind, im->format);
  printf("%s    \"virtual-size\": %" PRIu64 ",\n", ind, im->vsize);
  if (!im->remote) {
    printf("%s    \"actual-size\": %" PRIu64 ",\n", ind, im->actual);
  }
  if (im->rbd)
    print_rbd_json(&im->r, ind);
  if (im->qcow2) {
    printf("%s    \"cluster-size\": %" PRIu64 ",\n", ind, q->cluster_size);
    if (q->backing) {
      printf("%s    \"backing-filename\": ", ind);
      cli_json_str(q->backing);
      printf(",\n%s    \"full-backing-filename\": ", ind);
      cli_json_str(im->full_backing);
      printf(",\n");
      if (q->backing_format[0]) {
        printf("%s    \"backing-filename-format\": ", ind);
        cli_json_str(q->backing_format);
        printf(",\n");
      }
    }
    if (q->nsnaps) {
      printf("%s    \"snapshots\": [\n", ind);
      for (uint32_t i = 0; i < q->nsnaps; i++) {
        const struct qcow2_snapshot *s = &q->snaps[i];
        printf("%s        {\n%s            \"id\": ", ind, ind);
        cli_json_str(s->id);
        printf(",\n%s            \"name\": ", ind);
        cli_json_str(s->name);
        printf(",\n%s            \"vm-state-size\": %" PRIu64 ",\n", ind,
               s->vm_state_size);
        printf("%s            \"date-sec\": %u,\n", ind, s->date_sec);
        printf("%s            \"date-nsec\": %u,\n", ind, s->date_nsec);
        printf("%s            \"vm-clock-sec\": %" PRIu64 ",\n", ind,
               s->vm_clock_nsec / 1000000000);
        if (s->icount != UINT64_MAX)
          printf("%s            \"icount\": %" PRIu64 ",\n", ind, s->icount);
        printf("%s            \"vm-clock-nsec\": %" PRIu64 "\n", ind,
               s->vm_clock_nsec % 1000000000);
        printf("%s        }%s\n", ind, i + 1 < q->nsnaps ? "," : "");
      }
      printf("%s    ],\n", ind);
    }
    printf("%s    \"format-specific\": {\n%s        \"type\": \"qcow2\",\n"
           "%s        \"data\": {\n",
           ind, ind, ind);
    const char *d = "            ";
    printf("%s%s\"compat\": \"%s\",\n", ind, d,
           q->version >= 3 ? "1.1" : "0.10");
    printf("%s%s\"compression-type\": \"%s\",\n", ind, d, q->compression);
    bool v3 = q->version >= 3;
    if (v3)
      printf("%s%s\"lazy-refcounts\": %s,\n", ind, d, tf(q->lazy_refcounts));
    if (q->nbitmaps) {
      printf("%s%s\"bitmaps\": [\n", ind, d);
      for (uint32_t i = 0; i < q->nbitmaps; i++) {
        const struct qcow2_bitmap *bm = &q->bitmaps[i];
        printf("%s%s    {\"flags\": [", ind, d);
        if (bm->flags & 1)
          printf("\"in-use\"%s", bm->flags & 2 ? ", " : "");
        if (bm->flags & 2)
          printf("\"auto\"");
        printf("], \"name\": ");
        cli_json_str(bm->name);
        printf(", \"granularity\": %llu}%s\n", 1ull << bm->granularity_bits,
               i + 1 < q->nbitmaps ? "," : "");
      }
      printf("%s%s],\n", ind, d);
    }
    printf("%s%s\"refcount-bits\": %u%s\n", ind, d, q->refcount_bits,
           v3 || (q->has_data_file) ? "," : "");
    if (q->has_data_file) {
      printf("%s%s\"data-file\": ", ind, d);
      cli_json_str(q->data_file);
      printf(",\n%s%s\"data-file-raw\": %s%s\n", ind, d, tf(q->data_file_raw),
             v3 ? "," : "");
    }
    if (v3) {
      printf("%s%s\"corrupt\": %s,\n", ind, d, tf(q->corrupt));
      printf("%s%s\"extended-l2\": %s\n", ind, d, tf(q->extended_l2));
    }
    printf("%s        }\n%s    },\n", ind, ind);
  }
  printf("%s    \"dirty-flag\": %s\n%s}", ind, tf(im->qcow2 && (q->dirty)),
         ind);
}

/* The command line of info. */
struct info_args {
  const char *format;
  bool json, chain;
  const char *path;
};

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct info_args *a) {
  static const struct option longopts[] = {
      {"format", required_argument, NULL, 'f'},
      {"json", no_argument, NULL, 'j'},
      {"output", required_argument, NULL, 'O'},
      {"backing-chain", no_argument, NULL, 'B'},
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "f:Uh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f':
      if (strcmp(optarg, "raw") && strcmp(optarg, "qcow2")) {
        cli_error("info", NULL, "unknown format '%s'", optarg);
        return 1;
      }
      a->format = optarg;
      break;
    case 'j': a->json = true; break;
    case 'O':
      if (strcmp(optarg, "json") && strcmp(optarg, "human")) {
        cli_error("info", NULL, "--output is human or json");
        return 1;
      }
      a->json = !strcmp(optarg, "json");
      break;
    case 'B': a->chain = true; break;
    case 'U': force_share = true; break;
    case 'h': fputs(info_usage, stdout); return 0;
    default: cli_usage_error("info", NULL); return 1;
    }
  }
  if (optind + 1 != argc) {
    cli_usage_error("info", "%s",
                    optind >= argc ? "no image given"
                                   : "more than one image given");
    return 1;
  }
  a->path = argv[optind];
  return -1;
}

/* The backing file of IMS[N-1], the last image read: its format into
 * *FORMAT, NULL (said) when it cannot be followed. */
static const char *next_backing(const struct image *ims, int n,
                                const char **format) {
  const struct image *im = &ims[n - 1];
  *format = im->q.backing_format[0] ? im->q.backing_format : NULL;
  if (*format && strcmp(*format, "raw") && strcmp(*format, "qcow2")) {
    cli_error("info", im->filename, "backing format '%s' is not supported",
              *format);
    return NULL;
  }
  const char *path = im->full_backing;
  struct stat st;
  bool loop = false;
  if (stat(path, &st) == 0)
    for (int i = 0; i < n; i++)
      loop |= ims[i].dev == st.st_dev && ims[i].ino == st.st_ino;
  if (loop || n >= MAX_CHAIN) {
    cli_error("info", im->filename, "%s",
              loop ? "backing file loop" : "backing chain is too deep");
    return NULL;
  }
  return path;
}

/* The image, and with --backing-chain its backing files, into IMS (*N of
 * them, to free whatever happens).  Returns 0, or 1 (said). */
static int read_chain(const struct info_args *a, struct image *ims, int *n) {
  const char *format = a->format, *path = a->path;
  for (;;) {
    struct image *im = &ims[*n];
    int r = read_image(path, format, im);
    (*n)++;
    if (r < 0) {
      cli_error("info", path, "%s", bd_errmsg());
      return 1;
    }
    if (!a->chain || !im->q.backing)
      return 0;
    if (!(path = next_backing(ims, *n, &format)))
      return 1;
  }
}

static void print_chain(const struct info_args *a, const struct image *ims,
                        int n) {
  if (a->json && a->chain)
    printf("[\n");
  for (int i = 0; i < n; i++) {
    if (a->json) {
      print_json(&ims[i], a->chain ? "    " : "");
      printf("%s\n", a->chain && i + 1 < n ? "," : "");
    } else {
      if (i)
        printf("\n");
      print_human(&ims[i]);
    }
  }
  if (a->json && a->chain)
    printf("]\n");
}

int info_main(int argc, char **argv) {
  struct info_args a = {0};
  int ret = parse_args(argc, argv, &a);
  if (ret >= 0)
    return ret;
  /* Read the whole chain first, so a corrupt image prints nothing but the
   * error. */
  struct image *ims = calloc(MAX_CHAIN, sizeof *ims);
  if (!ims) {
    cli_error("info", NULL, "out of memory");
    return 1;
  }
  int n = 0;
  ret = read_chain(&a, ims, &n);
  if (ret == 0)
    print_chain(&a, ims, n);
  for (int i = 0; i < n; i++)
    free_image(&ims[i]);
  free(ims);
  return ret;
}
