/* SPDX-License-Identifier: BSD-3-Clause */
/* Connecting to the Ceph cluster an RBD spec names (librados), shared by
 * the RBD source and the image tools' RBD operations. */
#pragma once

#include <rados/librados.h>

#include "rbd-spec.h"

struct rbd_cluster {
  rados_t cluster;
  rados_ioctx_t io;
};

/* Connects as S says (its conf, id and options, over the defaults:
 * $CEPH_CONF or /etc/ceph/ceph.conf) and opens S's pool and namespace.
 * TIMEOUT seconds bound every monitor and OSD operation (0: librados's
 * defaults, which wait for ever), so a lost daemon gives an error rather
 * than a hang; options in S override it.  NOCACHE turns librbd's cache
 * off (rbd_cache=false, unless S sets it): the cache modes that bypass
 * the page cache.  Returns 0, or -errno with a message in bd_errmsg()
 * naming NAME. */
int rbd_cluster_connect(const struct rbd_spec *s, unsigned timeout,
                        bool nocache, const char *name, struct rbd_cluster *c);
void rbd_cluster_close(struct rbd_cluster *c);
