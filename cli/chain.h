/* SPDX-License-Identifier: BSD-3-Clause */
/* An image's backing chain as its headers name it, for `commit` and
 * `rebase`: each image's path (as opened: relative names from the
 * directory of the image naming them), format and backing name, read
 * from the headers without opening the images as block devices. */
#ifndef BLOCKPORT_CLI_CHAIN_H
#define BLOCKPORT_CLI_CHAIN_H

#include <stdbool.h>

#define CHAIN_MAX 64

struct chain_image {
  char *path;    /* as opened */
  char *format;  /* "raw" or "qcow2" */
  char *backing; /* the name in its header, NULL without one */
  unsigned long long cluster_size; /* qcow2; 0 for raw */
};

struct chain {
  struct chain_image v[CHAIN_MAX];
  int n;
};

/* The chain of the image at PATH, of format FORMAT (NULL: probed).  0, or
 * -1 with the reason in bd_errmsg(); free it with chain_free() either
 * way. */
int chain_read(const char *path, const char *format, struct chain *c);
void chain_free(struct chain *c);

/* The index (>= 1) of the image of C that NAME names, as QEMU's
 * bdrv_find_backing_image() finds it: NAME taken from the directory of
 * the image above each one, compared by real path; -1 when none. */
int chain_find(const struct chain *c, const char *name);

/* Whether the files at A and B are the same (by real path), for specs
 * that are not files: the same string. */
bool chain_same_file(const char *a, const char *b);
/* The index (>= 1) of the image of C at PATH (a path as opened), or -1. */
int chain_index(const struct chain *c, const char *path);

#endif
