/* SPDX-License-Identifier: BSD-3-Clause */
/* RBD image creation and facts for the image tools (rbd-admin.h). */
#include "rbd-admin.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

#include "rbd-cluster.h"
#include "rbd-lib.h"
#include "rbd-spec.h"

const char *rbd_admin_feature_name(unsigned bit) {
  static const char *const names[] = {
      RBD_FEATURE_NAME_LAYERING,       RBD_FEATURE_NAME_STRIPINGV2,
      RBD_FEATURE_NAME_EXCLUSIVE_LOCK, RBD_FEATURE_NAME_OBJECT_MAP,
      RBD_FEATURE_NAME_FAST_DIFF,      RBD_FEATURE_NAME_DEEP_FLATTEN,
      RBD_FEATURE_NAME_JOURNALING,     RBD_FEATURE_NAME_DATA_POOL,
      RBD_FEATURE_NAME_OPERATIONS,     RBD_FEATURE_NAME_MIGRATING,
      RBD_FEATURE_NAME_NON_PRIMARY,    RBD_FEATURE_NAME_DIRTY_CACHE};
  return bit < sizeof names / sizeof *names ? names[bit] : NULL;
}

/* Parses SPEC and connects to its pool; NAME gets "pool/image@snap". */
static int connect_spec(const char *spec, unsigned timeout, struct rbd_spec *s,
                        struct rbd_cluster *c, char *name, size_t len) {
  if (rbd_spec_parse(spec, s) < 0)
    return -EINVAL;
  rbd_spec_name(s, name, len);
  int r = rbd_cluster_connect(s, timeout, false, name, c);
  if (r < 0)
    rbd_spec_free(s);
  return r;
}

static int create_image(const struct rbd_spec *s, const char *name,
                        rados_ioctx_t io, uint64_t size, int order) {
  if (s->snap) {
    bd_set_error("rbd %s: a snapshot cannot be created as an image", name);
    return -EINVAL;
  }
  rbd_image_options_t opts;
  rbd_image_options_create(&opts);
  int r = order ? rbd_image_options_set_uint64(opts, RBD_IMAGE_OPTION_ORDER,
                                               (uint64_t)order)
                : 0;
  if (r == 0)
    r = rbd_create4(io, s->image, size, opts);
  rbd_image_options_destroy(opts);
  if (r == -EEXIST)
    bd_set_error("rbd %s: the image already exists", name);
  else if (r < 0)
    bd_set_error("rbd %s: cannot create the image: %s", name, strerror(-r));
  return r;
}

int rbd_admin_create(const char *spec, uint64_t size, int order,
                     unsigned timeout) {
  struct rbd_spec s;
  struct rbd_cluster c;
  char name[256];
  int r = connect_spec(spec, timeout, &s, &c, name, sizeof name);
  if (r < 0)
    return r;
  r = create_image(&s, name, c.io, size, order);
  rbd_cluster_close(&c);
  rbd_spec_free(&s);
  return r;
}

/* The snapshots of IMG into OUT. */
static int read_snaps(rbd_image_t img, const char *name,
                      struct rbd_admin_info *out) {
  int max = 16, r;
  rbd_snap_info_t *v = NULL;
  for (;;) {
    free(v);
    if (!(v = calloc((size_t)max, sizeof *v)))
      return -ENOMEM;
    if ((r = rbd_snap_list(img, v, &max)) != -ERANGE)
      break;
  }
  if (r < 0) {
    free(v);
    bd_set_error("rbd %s: cannot list the snapshots: %s", name, strerror(-r));
    return r;
  }
  out->snaps = calloc((size_t)r + 1, sizeof *out->snaps);
  for (int i = 0; out->snaps && i < r; i++) {
    struct rbd_admin_snap *sn = &out->snaps[out->nsnaps];
    struct timespec ts = {0};
    if (!(sn->name = strdup(v[i].name)))
      break;
    sn->id = v[i].id;
    sn->size = v[i].size;
    if (rbd_snap_get_timestamp(img, v[i].id, &ts) == 0)
      sn->date_sec = ts.tv_sec;
    out->nsnaps++;
  }
  bool complete = out->snaps && out->nsnaps == (size_t)r;
  rbd_snap_list_end(v);
  free(v);
  return complete ? 0 : -ENOMEM;
}

static int read_info(rbd_image_t img, const char *name,
                     struct rbd_admin_info *out) {
  rbd_image_info_t st;
  int r = rbd_stat(img, &st, sizeof st);
  if (r < 0) {
    bd_set_error("rbd %s: cannot read the image: %s", name, strerror(-r));
    return r;
  }
  out->size = st.size;
  out->object_size = st.obj_size;
  out->order = st.order;
  if ((r = rbd_get_features(img, &out->features)) < 0 ||
      (r = rbd_get_flags(img, &out->flags)) < 0) {
    bd_set_error("rbd %s: cannot read the features: %s", name, strerror(-r));
    return r;
  }
  r = read_snaps(img, name, out);
  if (r == -ENOMEM)
    bd_set_error("rbd %s: out of memory", name);
  return r;
}

int rbd_admin_info(const char *spec, unsigned timeout,
                   struct rbd_admin_info *out) {
  memset(out, 0, sizeof *out);
  struct rbd_spec s;
  struct rbd_cluster c;
  char name[256];
  int r = connect_spec(spec, timeout, &s, &c, name, sizeof name);
  if (r < 0)
    return r;
  rbd_image_t img;
  r = rbd_open_read_only(c.io, s.image, &img, s.snap);
  if (r < 0) {
    bd_set_error("rbd %s: cannot open the image: %s", name,
                 r == -ENOENT
                     ? (s.snap ? "no such image or snapshot" : "no such image")
                     : strerror(-r));
  } else {
    r = read_info(img, name, out);
    rbd_close(img);
  }
  if (r < 0)
    rbd_admin_info_free(out);
  rbd_cluster_close(&c);
  rbd_spec_free(&s);
  return r;
}

void rbd_admin_info_free(struct rbd_admin_info *info) {
  for (size_t i = 0; i < info->nsnaps; i++)
    free(info->snaps[i].name);
  free(info->snaps);
  memset(info, 0, sizeof *info);
}
