/* SPDX-License-Identifier: BSD-3-Clause */
#include "image-opts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/blockdev.h"
#include "core/filelock.h"
#include "core/io.h"

void image_opts_init(struct image_opts *o) {
  *o = (struct image_opts){
      .q = {.version = 3, .cluster_bits = 16, .refcount_order = 4}};
}

void image_opts_free(struct image_opts *o) {
  for (size_t i = 0; i < sizeof o->owned / sizeof *o->owned; i++) {
    free(o->owned[i]);
    o->owned[i] = NULL;
  }
}

int image_opts_log2(uint64_t v) {
  if (v == 0 || (v & (v - 1)))
    return -1;
  int n = 0;
  while (v > 1) {
    v >>= 1;
    n++;
  }
  return n;
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

/* "invalid KEY 'VALUE' (WHAT)". */
static int bad(const char *cmd, const char *key, const char *v,
               const char *what) {
  cli_usage_error(cmd, "invalid %s '%s'%s%s%s", key, v, what ? " (" : "",
                  what ? what : "", what ? ")" : "");
  return -1;
}

/* A string value kept past the option list (slot I of o->owned). */
static const char *keep(struct image_opts *o, int i, const char *v) {
  free(o->owned[i]);
  o->owned[i] = strdup(v);
  return o->owned[i];
}

static int set_prealloc(const char *cmd, struct image_opts *o, const char *v) {
  if (!strcmp(v, "off"))
    o->q.prealloc = QCOW2_PREALLOC_OFF;
  else if (!strcmp(v, "metadata"))
    o->q.prealloc = QCOW2_PREALLOC_METADATA;
  else if (!strcmp(v, "falloc"))
    o->q.prealloc = QCOW2_PREALLOC_FALLOC;
  else if (!strcmp(v, "full"))
    o->q.prealloc = QCOW2_PREALLOC_FULL;
  else
    return bad(cmd, "preallocation mode", v, NULL);
  return 0;
}

/* The options only qcow2 takes (cluster_size also RBD).  0, 1 when K is
 * none of them, or -1 (said). */
static int set_qcow2(const char *cmd, struct image_opts *o, const char *k,
                     const char *v) {
  struct qcow2_create_opts *q = &o->q;
  bool b;
  int bits;
  if (!strcmp(k, "cluster_size")) {
    if (cli_parse_qemu_size(v, &o->cluster_size) < 0 ||
        image_opts_log2(o->cluster_size) < 0)
      return bad(cmd, "cluster_size", v, "a power of two");
  } else if (!strcmp(k, "compat")) {
    if (!strcmp(v, "0.10") || !strcmp(v, "v2"))
      q->version = 2;
    else if (!strcmp(v, "1.1") || !strcmp(v, "v3"))
      q->version = 3;
    else
      return bad(cmd, "compat", v, "0.10 or 1.1");
  } else if (!strcmp(k, "backing_file")) {
    o->backing = keep(o, 0, v);
  } else if (!strcmp(k, "backing_fmt")) {
    o->backing_fmt = keep(o, 1, v);
  } else if (!strcmp(k, "data_file")) {
    q->data_file = keep(o, 2, v);
  } else if (!strcmp(k, "data_file_raw")) {
    if (parse_bool(v, &b) < 0)
      return bad(cmd, "data_file_raw", v, "on or off");
    q->data_file_raw = b;
  } else if (!strcmp(k, "extended_l2")) {
    if (parse_bool(v, &b) < 0)
      return bad(cmd, "extended_l2", v, "on or off");
    q->extended_l2 = b;
  } else if (!strcmp(k, "lazy_refcounts")) {
    if (parse_bool(v, &b) < 0)
      return bad(cmd, "lazy_refcounts", v, "on or off");
    q->lazy_refcounts = b;
  } else if (!strcmp(k, "compression_type")) {
    if (!strcmp(v, "zlib"))
      q->compression_type = 0;
    else if (!strcmp(v, "zstd"))
      q->compression_type = 1;
    else
      return bad(cmd, "compression_type", v, "zlib or zstd");
  } else if (!strcmp(k, "refcount_bits")) {
    char *end;
    errno = 0;
    unsigned long r = strtoul(v, &end, 10);
    if (errno || *end || (bits = image_opts_log2(r)) < 0 || bits > 6)
      return bad(cmd, "refcount_bits", v, "1, 2, 4, ... 64");
    q->refcount_order = (unsigned)bits;
  } else {
    return 1;
  }
  return 0;
}

/* One KEY=VALUE.  0 or -1 (said). */
static int set_option(const char *cmd, struct image_opts *o, char *kv) {
  char *v = strchr(kv, '=');
  if (!v)
    return bad(cmd, "option", kv, "it needs a value: KEY=VALUE");
  *v++ = 0;
  if (!strcmp(kv, "preallocation"))
    return set_prealloc(cmd, o, v);
  if (!strcmp(kv, "size")) {
    if (cli_parse_qemu_size(v, &o->size) < 0 || o->size > UINT64_MAX - 511)
      return bad(cmd, "size", v, "suffixes k, M, G, T, P, E");
    o->size = (o->size + 511) & ~511ull;
    o->has_size = true;
    return 0;
  }
  if (!o->qcow2_only)
    snprintf(o->bad_opt, sizeof o->bad_opt, "%s", kv);
  o->qcow2_only = true;
  int r = set_qcow2(cmd, o, kv, v);
  if (r == 1)
    cli_usage_error(cmd, "unknown option '%s'", kv);
  return r == 1 ? -1 : r;
}

int image_opts_parse(const char *cmd, struct image_opts *o, const char *list) {
  if (!strcmp(list, "help") || !strcmp(list, "?")) {
    o->help = true;
    return 0;
  }
  char *copy = strdup(list);
  if (!copy)
    return -1;
  int r = 0;
  char *save = NULL;
  for (char *kv = strtok_r(copy, ",", &save); kv && r == 0;
       kv = strtok_r(NULL, ",", &save))
    r = set_option(cmd, o, kv);
  free(copy);
  return r;
}

int image_opts_check(const char *cmd, struct image_opts *o, const char *fmt) {
  if (!strcmp(fmt, "raw")) {
    if (o->qcow2_only) {
      cli_usage_error(cmd, "raw images do not take the option '%s'",
                      o->bad_opt);
      return -1;
    }
    if (o->q.prealloc == QCOW2_PREALLOC_METADATA) {
      cli_usage_error(cmd, "raw images take preallocation=off, falloc or "
                           "full");
      return -1;
    }
    return 0;
  }
  if (o->cluster_size) {
    int bits = image_opts_log2(o->cluster_size);
    if (bits < 9 || bits > 21) {
      cli_usage_error(cmd,
                      "invalid cluster_size %llu (a power of two from 512 "
                      "to 2M)",
                      (unsigned long long)o->cluster_size);
      return -1;
    }
    o->q.cluster_bits = (unsigned)bits;
  }
  return 0;
}

int image_opts_raw_file(int fd, uint64_t size, enum qcow2_prealloc prealloc) {
  if (ftruncate(fd, (off_t)size) < 0)
    return -errno;
  int r = 0;
  if (prealloc == QCOW2_PREALLOC_FALLOC || prealloc == QCOW2_PREALLOC_FULL)
    r = io_preallocate(fd, 0, size, prealloc == QCOW2_PREALLOC_FULL);
  return r < 0 ? r : io_fdatasync(fd);
}

/* The data file's path: its name taken relative to IMAGE's directory. */
static char *data_file_path(const char *image, const char *name) {
  const char *slash = strrchr(image, '/');
  int dir = name[0] == '/' || !slash ? 0 : (int)(slash - image + 1);
  char *p = NULL;
  return asprintf(&p, "%.*s%s", dir, image, name) < 0 ? NULL : p;
}

int image_opts_data_file(const char *cmd, const char *image,
                         const struct image_opts *o, uint64_t size) {
  if (!o->q.data_file)
    return 0;
  char *path = data_file_path(image, o->q.data_file);
  int fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
  const char *why = NULL;
  if (fd < 0)
    why = strerror(path ? errno : ENOMEM);
  else if (filelock_take(fd, path, FILELOCK_USE_WRITE, true) < 0)
    why = bd_errmsg();
  int r = why ? -1 : ftruncate(fd, 0) < 0 ? -errno : 0;
  /* Metadata preallocation maps the clusters; the file reads as zeroes. */
  if (r == 0)
    r = image_opts_raw_file(fd, size,
                            o->q.prealloc == QCOW2_PREALLOC_METADATA
                                ? QCOW2_PREALLOC_OFF
                                : o->q.prealloc);
  if (r < -1)
    why = strerror(-r);
  if (why)
    cli_error(cmd, path ? path : o->q.data_file, "%s", why);
  if (fd >= 0)
    close(fd);
  free(path);
  return why ? -1 : 0;
}

void image_opts_help(const char *fmt) {
  if (fmt && !strcmp(fmt, "qcow2"))
    fputs("Supported qcow2 options:\n"
          "  backing_file=<str>     - File name of a base image\n"
          "  backing_fmt=<str>      - Image format of the base image\n"
          "  cluster_size=<size>    - qcow2 cluster size\n"
          "  compat=<str>           - Compatibility level (v2 [0.10] or v3 "
          "[1.1])\n"
          "  compression_type=<str> - Compression method used for image "
          "cluster compression (zlib, zstd)\n"
          "  data_file=<str>        - File name of an external data file\n"
          "  data_file_raw=<bool (on/off)> - The external data file must "
          "stay valid as a raw data file\n"
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

/* The layout of a new qcow2 image of SIZE bytes on FD.  0, or -errno with
 * the reason in bd_errmsg(). */
static int qcow2_file(int fd, const struct image_opts *io, uint64_t size) {
  struct qcow2_create_opts o = io->q;
  o.size = size;
  o.backing_file = io->backing;
  o.backing_fmt = io->backing ? io->backing_fmt : NULL;
  struct qcow2_layout l;
  int r = qcow2_create_layout(&o, &l);
  return r < 0 ? r : qcow2_create_write(fd, &o, &l);
}

int image_opts_create_file(const char *cmd, const char *path, const char *fmt,
                           const struct image_opts *o, uint64_t size) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* locks read */
  if (fd < 0) {
    cli_error(cmd, path, "%s", strerror(errno));
    return -1;
  }
  const char *why = NULL;
  if (filelock_take(fd, path, FILELOCK_USE_WRITE, true) < 0)
    why = bd_errmsg();
  else if (ftruncate(fd, 0) < 0)
    why = strerror(errno);
  if (why) {
    cli_error(cmd, NULL, "%s", why);
    close(fd);
    return -1;
  }
  char err[256] = "";
  int r;
  if (!strcmp(fmt, "raw")) {
    r = image_opts_raw_file(fd, size, o->q.prealloc);
    if (r < 0)
      snprintf(err, sizeof err, "%s", strerror(-r));
  } else {
    r = qcow2_file(fd, o, size);
    if (r < 0)
      snprintf(err, sizeof err, "%s", bd_errmsg());
    if (r == 0 && image_opts_data_file(cmd, path, o, size) < 0) {
      close(fd);
      return -1;
    }
  }
  close(fd);
  if (r < 0)
    cli_error(cmd, path, "%s", err);
  return r < 0 ? -1 : 0;
}
