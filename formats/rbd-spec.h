/* SPDX-License-Identifier: BSD-3-Clause */
/* Ceph RBD image specs as QEMU writes them:
 *
 *   rbd:POOL/[NAMESPACE/]IMAGE[@SNAP][:KEY=VALUE]...
 *
 * KEY "conf" names a ceph.conf, "id" the client (user) name without
 * "client."; any other KEY is a Ceph option handed to the cluster handle
 * (keyring, mon_host, rados_osd_op_timeout, ...).  A backslash takes the
 * next character literally (an image name with ':' or '@').
 *
 * Also OpenStack Glance's location URIs, rbd://FSID/POOL/IMAGE[/SNAP]
 * (components percent-encoded; FSID, when not empty, must be the cluster's
 * fsid; the configuration comes from $CEPH_CONF).
 *
 * Pure: no librados here, so it is tested and fuzzed alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define RBD_SPEC_PREFIX "rbd:"
#define RBD_URI_PREFIX "rbd://"
#define RBD_SPEC_MAX_OPTS 32

struct rbd_spec {
  char *pool, *ns, *image, *snap; /* ns and snap NULL when absent */
  char *conf, *id;                /* NULL when absent */
  char *fsid;                     /* rbd:// only: NULL or "" when absent */
  struct rbd_spec_opt {
    char *key, *value;
  } opts[RBD_SPEC_MAX_OPTS];
  size_t nopts;
  char *buf; /* owns every string above */
};

/* Whether SPEC starts with "rbd:" (which rbd:// does too). */
bool rbd_spec_matches(const char *spec);
/* Parses SPEC into S.  Returns 0, or -EINVAL (or -ENOMEM) with a message in
 * bd_errmsg(); S then needs no rbd_spec_free(). */
int rbd_spec_parse(const char *spec, struct rbd_spec *s);
void rbd_spec_free(struct rbd_spec *s);
/* "POOL/[NS/]IMAGE[@SNAP]" into BUF (for messages); returns BUF. */
const char *rbd_spec_name(const struct rbd_spec *s, char *buf, size_t len);
