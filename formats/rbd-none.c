/* SPDX-License-Identifier: BSD-3-Clause */
/* Ceph RBD in a build without it (BLOCKPORT_RBD=OFF), compiled instead of
 * rbd.c, rbd-admin.c, rbd-cluster.c and rbd-lib.c: rbd: specs are still
 * recognised (rbd-spec.c), and refused. */
#include <stddef.h>

#include "core/features.h"
#include "core/open.h"
#include "formats.h"
#include "rbd-admin.h"

struct bd *rbd_source_open(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  (void)o;
  feature_missing(FEATURE_RBD);
  return NULL;
}

int rbd_admin_create(const char *spec, uint64_t size, int order,
                     unsigned timeout) {
  (void)spec;
  (void)size;
  (void)order;
  (void)timeout;
  return feature_missing(FEATURE_RBD);
}

int rbd_admin_info(const char *spec, unsigned timeout,
                   struct rbd_admin_info *out) {
  (void)spec;
  (void)timeout;
  *out = (struct rbd_admin_info){0};
  return feature_missing(FEATURE_RBD);
}

void rbd_admin_info_free(struct rbd_admin_info *info) {
  (void)info;
}

const char *rbd_admin_feature_name(unsigned bit) {
  (void)bit;
  return NULL;
}
