/* SPDX-License-Identifier: BSD-3-Clause */
/* The image tools' RBD operations (create, info) through librbd, for
 * cli/, which sees no librbd type: everything here is plain C. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Object sizes QEMU's rbd driver accepts as cluster_size: 4K to 32M. */
#define RBD_ADMIN_MIN_ORDER 12
#define RBD_ADMIN_MAX_ORDER 25

struct rbd_admin_snap {
  char *name;
  uint64_t id, size;
  int64_t date_sec; /* creation time; 0 when librbd does not say */
};

struct rbd_admin_info {
  uint64_t size, object_size, features, flags;
  int order;
  size_t nsnaps;
  struct rbd_admin_snap *snaps;
};

/* Creates the image SPEC (rbd:POOL/[NS/]IMAGE, no snapshot) of SIZE
 * bytes with the cluster's default features and objects of 2^ORDER bytes
 * (0: the cluster's default).  An existing image is left alone: -EEXIST.
 * TIMEOUT as struct bd_open_opts rbd_timeout.  Returns 0, or -errno with
 * a message in bd_errmsg(). */
int rbd_admin_create(const char *spec, uint64_t size, int order,
                     unsigned timeout);
/* Reads the facts of SPEC (the image, or its snapshot) into OUT, which then
 * needs rbd_admin_info_free().  Returns 0, or -errno with a message. */
int rbd_admin_info(const char *spec, unsigned timeout,
                   struct rbd_admin_info *out);
void rbd_admin_info_free(struct rbd_admin_info *info);
/* The name `rbd info` prints for feature bit BIT (0-63), or NULL for a
 * bit it does not know. */
const char *rbd_admin_feature_name(unsigned bit);
