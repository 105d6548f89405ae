/* SPDX-License-Identifier: BSD-3-Clause */
/* librados connection for RBD specs (rbd-cluster.h). */
#include "rbd-cluster.h"
#include "rbd-lib.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

/* The timeouts librados leaves at "wait for ever" (OSD and monitor
 * operations) or at five minutes (the first connection). */
static int set_timeouts(rados_t c, unsigned timeout) {
  static const char *const keys[] = {
      "rados_osd_op_timeout", "rados_mon_op_timeout", "client_mount_timeout"};
  char v[16];
  snprintf(v, sizeof v, "%u", timeout);
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    int r = rados_conf_set(c, keys[i], v);
    if (r < 0)
      return r;
  }
  return 0;
}

static int configure(const struct rbd_spec *s, unsigned timeout, bool nocache,
                     const char *name, rados_t c) {
  int r = rados_conf_read_file(c, s->conf);
  if (r < 0 && (s->conf || r != -ENOENT)) {
    bd_set_error("rbd %s: cannot read the Ceph configuration %s: %s", name,
                 s->conf ? s->conf : "($CEPH_CONF or /etc/ceph/ceph.conf)",
                 strerror(-r));
    return r;
  }
  /* librbd's own cache is what --cache none bypasses, as QEMU's rbd
   * driver does; otherwise the configuration decides.  An rbd_cache in
   * the spec, set below, still wins. */
  if ((r = rados_conf_parse_env(c, NULL)) < 0 ||
      (timeout && (r = set_timeouts(c, timeout)) < 0) ||
      (nocache && (r = rados_conf_set(c, "rbd_cache", "false")) < 0)) {
    bd_set_error("rbd %s: cannot configure librados: %s", name, strerror(-r));
    return r;
  }
  for (size_t i = 0; i < s->nopts; i++) {
    if ((r = rados_conf_set(c, s->opts[i].key, s->opts[i].value)) < 0) {
      bd_set_error("rbd %s: Ceph option %s=%s: %s", name, s->opts[i].key,
                   s->opts[i].value,
                   r == -ENOENT ? "no such option" : strerror(-r));
      return r;
    }
  }
  return 0;
}

static int open_pool(const struct rbd_spec *s, const char *name,
                     struct rbd_cluster *c) {
  int r = rados_ioctx_create(c->cluster, s->pool, &c->io);
  if (r < 0) {
    bd_set_error("rbd %s: cannot open pool '%s': %s", name, s->pool,
                 r == -ENOENT ? "no such pool" : strerror(-r));
    c->io = NULL;
    return r;
  }
  if (s->ns)
    rados_ioctx_set_namespace(c->io, s->ns);
  return 0;
}

/* rbd://FSID/...: the cluster reached must be the one the URI names. */
static int check_fsid(const struct rbd_spec *s, const char *name, rados_t c) {
  char fsid[64];
  if (!s->fsid || !*s->fsid)
    return 0;
  int r = rados_cluster_fsid(c, fsid, sizeof fsid);
  if (r < 0) {
    bd_set_error("rbd %s: cannot read the cluster's fsid: %s", name,
                 strerror(-r));
    return r;
  }
  if (strcasecmp(fsid, s->fsid) != 0) {
    bd_set_error("rbd %s: the configuration reaches cluster %s, not %s", name,
                 fsid, s->fsid);
    return -ENOENT;
  }
  return 0;
}

int rbd_cluster_connect(const struct rbd_spec *s, unsigned timeout,
                        bool nocache, const char *name, struct rbd_cluster *c) {
  c->io = NULL;
  c->cluster = NULL;
  int r = rbd_lib_load();
  if (r < 0)
    return r;
  r = rados_create(&c->cluster, s->id);
  if (r < 0) {
    bd_set_error("rbd %s: cannot create a cluster handle: %s", name,
                 strerror(-r));
    c->cluster = NULL;
    return r;
  }
  if ((r = configure(s, timeout, nocache, name, c->cluster)) < 0)
    goto fail;
  if ((r = rados_connect(c->cluster)) < 0) {
    bd_set_error("rbd %s: cannot connect to the Ceph cluster: %s", name,
                 r == -ETIMEDOUT ? "no monitor answered in time"
                                 : strerror(-r));
    goto fail;
  }
  if ((r = check_fsid(s, name, c->cluster)) < 0 ||
      (r = open_pool(s, name, c)) < 0)
    goto fail;
  return 0;
fail:
  rados_shutdown(c->cluster);
  c->cluster = NULL;
  return r;
}

void rbd_cluster_close(struct rbd_cluster *c) {
  if (c->io)
    rados_ioctx_destroy(c->io);
  if (c->cluster)
    rados_shutdown(c->cluster);
  c->io = NULL;
  c->cluster = NULL;
}
