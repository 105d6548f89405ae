/* SPDX-License-Identifier: BSD-3-Clause */
/* An image's backing chain from its headers (chain.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chain.h"
#include "core/blockdev.h"
#include "core/open.h"
#include "formats/qcow2/backing-path.h"
#include "formats/qcow2/info.h"

/* The qcow2 header of PATH: *BACKING and *BFMT (NULL when none). */
static int read_backing_name(const char *path, struct chain_image *im,
                             char **bfmt) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    bd_set_error("Could not open '%s': %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  struct qcow2_info qi;
  int r = qcow2_read_info(fd, (uint64_t)st.st_size, &qi);
  close(fd);
  if (r < 0)
    return -1;
  im->backing = qi.backing ? strdup(qi.backing) : NULL;
  im->cluster_size = qi.cluster_size;
  *bfmt = qi.backing_format[0] ? strdup(qi.backing_format) : NULL;
  qcow2_info_free(&qi);
  return 0;
}

int chain_read(const char *path, const char *format, struct chain *c) {
  memset(c, 0, sizeof *c);
  char *p = strdup(path), *f = format ? strdup(format) : NULL;
  while (p) {
    if (c->n == CHAIN_MAX) {
      bd_set_error("backing chain deeper than %d", CHAIN_MAX);
      free(p);
      free(f);
      return -1;
    }
    struct chain_image *im = &c->v[c->n++];
    im->path = p;
    if (!f) {
      const char *probed = bd_probe_format(p);
      f = strdup(probed ? probed : "raw");
    }
    im->format = f;
    if (strcmp(f, "qcow2"))
      return 0; /* raw: no backing file */
    char *bfmt = NULL;
    if (read_backing_name(p, im, &bfmt) < 0)
      return -1;
    p = im->backing ? qcow2_backing_path(p, im->backing) : NULL;
    f = bfmt;
  }
  free(f);
  return 0;
}

void chain_free(struct chain *c) {
  for (int i = 0; i < c->n; i++) {
    free(c->v[i].path);
    free(c->v[i].format);
    free(c->v[i].backing);
  }
  c->n = 0;
}

bool chain_same_file(const char *a, const char *b) {
  if (bd_spec_is_backing_source(a) || bd_spec_is_backing_source(b))
    return !strcmp(a, b);
  char ra[PATH_MAX], rb[PATH_MAX];
  return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

int chain_find(const struct chain *c, const char *name) {
  for (int i = 1; i < c->n; i++) {
    char *p = qcow2_backing_path(c->v[i - 1].path, name);
    bool same = p && chain_same_file(p, c->v[i].path);
    free(p);
    if (same)
      return i;
  }
  return -1;
}

int chain_index(const struct chain *c, const char *path) {
  for (int i = 1; i < c->n; i++)
    if (chain_same_file(path, c->v[i].path))
      return i;
  return -1;
}
