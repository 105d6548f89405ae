/* SPDX-License-Identifier: BSD-3-Clause */
/* Which optional parts were built (core/features.h).  The build passes
 * BLOCKPORT_WITH_<PART> as 0 or 1 to this file only. */
#include "features.h"

#include <errno.h>

#include "error.h"

static const struct {
  const char *id, *name;
  bool built;
} features[FEATURE_COUNT] = {
    [FEATURE_RBD] = {"rbd", "RBD", BLOCKPORT_WITH_RBD},
    [FEATURE_FUSE] = {"fuse", "FUSE", BLOCKPORT_WITH_FUSE},
    [FEATURE_VHOST] = {"vhost", "vhost-user", BLOCKPORT_WITH_VHOST},
    [FEATURE_PLUGINS] = {"plugins", "nbdkit plugins", BLOCKPORT_WITH_PLUGINS},
    [FEATURE_TLS] = {"tls", "TLS", BLOCKPORT_WITH_TLS},
    [FEATURE_IO_URING] = {"io_uring", "io_uring", BLOCKPORT_WITH_IO_URING},
};

bool feature_built(enum feature f) {
  return (unsigned)f < FEATURE_COUNT && features[f].built;
}

const char *feature_id(enum feature f) {
  return (unsigned)f < FEATURE_COUNT ? features[f].id : "?";
}

int feature_missing(enum feature f) {
  bd_set_error("built without %s",
               (unsigned)f < FEATURE_COUNT ? features[f].name : "?");
  return -ENOTSUP;
}
