/* SPDX-License-Identifier: BSD-3-Clause */
/* The -o KEY=VALUE options of a new image, as qemu-img create and convert
 * take them: one parser for both commands. */
#ifndef BLOCKPORT_CLI_IMAGE_OPTS_H
#define BLOCKPORT_CLI_IMAGE_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/qcow2/create.h"

struct image_opts {
  struct qcow2_create_opts q; /* version, refcount order, preallocation... */
  uint64_t cluster_size;      /* cluster_size=, 0: the format's default */
  bool has_size;              /* size= (create; convert takes SRC's) */
  uint64_t size;
  const char *backing, *backing_fmt; /* backing_file=, backing_fmt= */
  bool qcow2_only;  /* an option only qcow2 (or RBD's cluster_size) takes */
  char bad_opt[64]; /* the first of them, for the message */
  bool help;        /* -o help or -o ? */
  char *owned[3];   /* the copies backing, backing_fmt, q.data_file point to */
};

/* Defaults: qcow2 v3, 64k clusters, 16-bit refcounts, no preallocation. */
void image_opts_init(struct image_opts *o);
void image_opts_free(struct image_opts *o);
/* One -o LIST (KEY=VALUE,...) for command CMD.  0, or -1 (said). */
int image_opts_parse(const char *cmd, struct image_opts *o, const char *list);
/* The options against the format FMT ("raw" or "qcow2"): cluster size into
 * bits, options raw does not take refused.  0, or -1 (said). */
int image_opts_check(const char *cmd, struct image_opts *o, const char *fmt);
/* -o help for FMT, as qemu-img lists it. */
void image_opts_help(const char *fmt);
/* A raw image file of SIZE bytes on FD (empty), preallocated as PREALLOC
 * says (off, falloc, full), made durable.  0 or -errno. */
int image_opts_raw_file(int fd, uint64_t size, enum qcow2_prealloc prealloc);
/* With -o data_file: the data file of the qcow2 image IMAGE (just made),
 * created (or emptied) with SIZE bytes, as its preallocation says.  0, or
 * -1 when CMD has said why. */
int image_opts_data_file(const char *cmd, const char *image,
                         const struct image_opts *o, uint64_t size);
/* A new image file PATH of format FMT ("raw" or "qcow2") and SIZE bytes,
 * laid out as O says, made under its write lock taken before the
 * truncation (a busy image is refused, never emptied).  0, or -1 when CMD
 * has said why. */
int image_opts_create_file(const char *cmd, const char *path, const char *fmt,
                           const struct image_opts *o, uint64_t size);
/* log2 of V when V is a power of two, else -1. */
int image_opts_log2(uint64_t v);

#endif
