/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport measure: how large a new image would be, as `qemu-img measure`
 * (QEMU 7.2) prints it: for a size, or for the data of an existing image
 * converted into the output format. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "formats/map.h"
#include "formats/qcow2/info.h"
#include "formats/qcow2/measure.h"

#include "cli.h"
#include "commands.h"
#include "image-opts.h"

static const char measure_usage[] =
    "Usage: blockport measure [--output=human|json] [-O FMT] [-o OPTIONS]\n"
    "                         (--size SIZE | [-f FMT] [-U] FILE)\n"
    "Print the size a new image of format FMT (raw, the default, or qcow2)\n"
    "created with OPTIONS needs: for SIZE bytes of virtual disk, or for\n"
    "converting FILE (an image, an NBD URI, rbd:...) into it.  \"required\n"
    "size\" is what holds the data there is, \"fully allocated size\" what\n"
    "the image takes once every cluster is written, and \"bitmaps size\"\n"
    "(qcow2 compat=1.1 from a qcow2 FILE) what its persistent bitmaps add,\n"
    "as qemu-img measure estimates them.\n"
    "\n"
    "      --output=human|json   the form (json: qemu-img's field names)\n"
    "  -O FMT                    output format: raw or qcow2\n"
    "  -o OPTIONS                qcow2 creation options, as `create -o`\n"
    "                            (cluster_size, compat, refcount_bits,\n"
    "                            extended_l2, preallocation, backing_file)\n"
    "      --size SIZE           measure an empty image of SIZE bytes\n"
    "  -f FMT                    FILE's format (default: probed)\n"
    "  -U, --force-share         open FILE even if another process writes it\n"
    "  -h, --help                show this help\n"
    "Exit status: 0 success, 1 bad usage or FILE cannot be read.\n";

struct measure_args {
  bool json, share, has_size;
  uint64_t size;
  const char *out_fmt, *in_fmt, *file;
  struct image_opts o;
};

struct measure {
  uint64_t required, fully;
  bool has_bitmaps;
  uint64_t bitmaps;
};

static int parse_args(int argc, char **argv, struct measure_args *a) {
  enum { OPT_SIZE = 256, OPT_OUTPUT };
  static const struct option longopts[] = {
      {"output", required_argument, NULL, OPT_OUTPUT},
      {"size", required_argument, NULL, OPT_SIZE},
      {"format", required_argument, NULL, 'f'},
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "O:o:f:Uh", longopts, NULL)) != -1) {
    switch (ch) {
    case OPT_OUTPUT:
      if (strcmp(optarg, "json") && strcmp(optarg, "human")) {
        cli_usage_error("measure", "--output must be human or json");
        return -1;
      }
      a->json = !strcmp(optarg, "json");
      break;
    case OPT_SIZE:
      if (cli_parse_qemu_size(optarg, &a->size) < 0) {
        cli_usage_error("measure", "--size %s: not a size", optarg);
        return -1;
      }
      a->has_size = true;
      break;
    case 'O': a->out_fmt = optarg; break;
    case 'o':
      if (image_opts_parse("measure", &a->o, optarg) < 0)
        return -1;
      break;
    case 'f': a->in_fmt = optarg; break;
    case 'U': a->share = true; break;
    case 'h': fputs(measure_usage, stdout); exit(0);
    default: cli_usage_error("measure", NULL); return -1;
    }
  }
  if (optind < argc)
    a->file = argv[optind++];
  if (optind < argc || a->has_size == (a->file != NULL)) {
    cli_usage_error("measure", "%s",
                    a->has_size ? "--size cannot be used together with a file"
                                : "give either --size SIZE or one file");
    return -1;
  }
  return 0;
}

/* The output format's options, checked as `create` checks them. */
static int check_output(struct measure_args *a) {
  if (strcmp(a->out_fmt, "raw") && strcmp(a->out_fmt, "qcow2")) {
    cli_usage_error("measure", "-O %s: measures raw or qcow2", a->out_fmt);
    return -1;
  }
  if (a->o.help) {
    image_opts_help(a->out_fmt);
    exit(0);
  }
  if (image_opts_check("measure", &a->o, a->out_fmt) < 0)
    return -1;
  if (strcmp(a->out_fmt, "qcow2"))
    return 0;
  /* The layout of an empty image validates the combination (refcount
   * width against compat, the L1 table's limit for the size). */
  struct qcow2_create_opts q = a->o.q;
  q.size = a->has_size ? (a->size + 511) / 512 * 512 : 0;
  q.prealloc = QCOW2_PREALLOC_OFF;
  q.backing_file = q.backing_fmt = q.data_file = NULL;
  struct qcow2_layout l;
  if (qcow2_create_layout(&q, &l) < 0) {
    cli_error("measure", NULL, "%s", bd_errmsg());
    return -1;
  }
  return 0;
}

/* Bytes of BD's data a copy has to write: every run that holds data and
 * does not read as zeroes, each extended to the end of its cluster, as
 * QEMU counts it. */
static int data_bytes(struct bd *bd, uint64_t csize, uint64_t *out) {
  struct map_entry e;
  *out = 0;
  for (uint64_t off = 0; off < bd->size; off += e.length) {
    if (map_first(bd, 0, off, bd->size - off, &e) < 0 || !e.length) {
      cli_error("measure", NULL, "at offset %llu: %s", (unsigned long long)off,
                bd_errmsg());
      return -1;
    }
    if (e.zero || !e.data || !e.present)
      continue;
    uint64_t end = (off + e.length + csize - 1) / csize * csize;
    *out += off % csize + (end - off);
    e.length = end - off;
  }
  return 0;
}

/* The persistent bitmaps of the qcow2 image PATH, measured for the output's
 * clusters.  *HAS false when PATH keeps none (raw, qcow2 v2). */
static int bitmaps_of(const char *path, uint64_t vsize, unsigned cluster_bits,
                      bool *has, uint64_t *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    cli_error("measure", path, "%s", strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  struct qcow2_info info;
  int r = qcow2_read_info(fd, (uint64_t)st.st_size, &info);
  close(fd);
  if (r < 0) {
    cli_error("measure", path, "%s", bd_errmsg());
    return -1;
  }
  *has = info.version >= 3;
  struct qcow2_measure_bitmap *b =
      calloc(info.nbitmaps ? info.nbitmaps : 1, sizeof *b);
  if (!b) {
    qcow2_info_free(&info);
    cli_error("measure", NULL, "out of memory");
    return -1;
  }
  for (uint32_t i = 0; i < info.nbitmaps; i++)
    b[i] = (struct qcow2_measure_bitmap){
        .name_len = strlen(info.bitmaps[i].name),
        .granularity_bits = info.bitmaps[i].granularity_bits};
  *out = qcow2_measure_bitmaps(b, info.nbitmaps, vsize, cluster_bits);
  free(b);
  qcow2_info_free(&info);
  return 0;
}

/* FILE's size, the data it holds and its bitmaps, for the output A names. */
static int measure_input(const struct measure_args *a, uint64_t *vsize,
                         uint64_t *data, struct measure *m) {
  const char *fmt = a->in_fmt ? a->in_fmt : bd_probe_format(a->file);
  struct bd *bd = bd_open_flags(a->file, a->in_fmt,
                                a->share ? BD_OPEN_SHARE : BD_OPEN_READONLY);
  if (!bd) {
    cli_error("measure", NULL, "%s", bd_errmsg());
    return -1;
  }
  *vsize = bd->size;
  bool qcow2_out = !strcmp(a->out_fmt, "qcow2");
  uint64_t csize = 1ull << a->o.q.cluster_bits;
  int r = 0;
  if (qcow2_out && !a->o.backing)
    r = data_bytes(bd, csize, data);
  bd_close(bd);
  if (r == 0 && qcow2_out && a->o.q.version >= 3 && fmt &&
      !strcmp(fmt, "qcow2"))
    r = bitmaps_of(a->file, *vsize, a->o.q.cluster_bits, &m->has_bitmaps,
                   &m->bitmaps);
  return r;
}

static int measure(const struct measure_args *a, struct measure *m) {
  uint64_t vsize = a->size, data = 0;
  if (a->file && measure_input(a, &vsize, &data, m) < 0)
    return -1;
  if (strcmp(a->out_fmt, "qcow2")) {
    /* raw: every byte, the input's size or SIZE rounded to a sector */
    m->required = m->fully = a->file ? vsize : (vsize + 511) / 512 * 512;
    return 0;
  }
  const struct qcow2_create_opts *q = &a->o.q;
  uint64_t csize = 1ull << q->cluster_bits;
  uint64_t rounded = (vsize + csize - 1) / csize * csize;
  /* Without an input, or with a backing file whose share of the input is
   * unknown, or preallocated, every cluster counts. */
  if (!a->file)
    data = 0;
  else if (a->o.backing)
    data = rounded;
  if (q->prealloc == QCOW2_PREALLOC_FULL ||
      q->prealloc == QCOW2_PREALLOC_FALLOC)
    data = rounded;
  m->fully = qcow2_measure_full(vsize, q->cluster_bits, q->refcount_order,
                                q->extended_l2);
  m->required = m->fully - rounded + data;
  return 0;
}

static void print(const struct measure *m, bool json) {
  if (json) {
    printf("{\n");
    if (m->has_bitmaps)
      printf("    \"bitmaps\": %llu,\n", (unsigned long long)m->bitmaps);
    printf("    \"required\": %llu,\n    \"fully-allocated\": %llu\n}\n",
           (unsigned long long)m->required, (unsigned long long)m->fully);
    return;
  }
  printf("required size: %llu\nfully allocated size: %llu\n",
         (unsigned long long)m->required, (unsigned long long)m->fully);
  if (m->has_bitmaps)
    printf("bitmaps size: %llu\n", (unsigned long long)m->bitmaps);
}

int measure_main(int argc, char **argv) {
  struct measure_args a = {.out_fmt = "raw"};
  image_opts_init(&a.o);
  struct measure m = {0};
  int r = 1;
  if (parse_args(argc, argv, &a) == 0 && check_output(&a) == 0 &&
      measure(&a, &m) == 0) {
    print(&m, a.json);
    r = 0;
  }
  image_opts_free(&a.o);
  return r;
}
