/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2 image opened read-only at one of its internal snapshots, as
 * qemu-img convert -l reads one: the snapshot's L1 table stands in for
 * the active one; the size, backing file and data stay the image's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/open.h"
#include "qcow2-internal.h"
#include "snapshot.h"

/* The snapshot the options name: "snapshot" an ID, else a name; or
 * "snapshot.id" and "snapshot.name", each matching if given.  -1: none. */
static int pick(const struct qcow2_snapshot *s, uint32_t n, const char *any,
                const char *id, const char *name) {
  if (any)
    return qcow2_snapshot_find(s, n, any, true);
  for (uint32_t i = 0; i < n; i++)
    if ((!id || !strcmp(s[i].id, id)) && (!name || !strcmp(s[i].name, name)))
      return (int)i;
  return -1;
}

static int use_l1(struct qcow2dev *q, const struct qcow2_snapshot *s) {
  size_t n = s->l1_size;
  uint64_t *l1 = calloc(n ? n : 1, sizeof *l1);
  if (!l1)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, l1, n * 8, s->l1_offset);
  for (size_t i = 0; r == 0 && i < n; i++) {
    l1[i] = get_be64((const uint8_t *)&l1[i]);
    if (l1[i] & QCOW2_L1_RESERVED)
      r = qcow2_err(-EINVAL,
                    "qcow2 %s: reserved bits in L1 entry 0x%llx of snapshot "
                    "'%s'",
                    q->path, (unsigned long long)l1[i], s->id);
  }
  if (r < 0) {
    free(l1);
    return r;
  }
  free(q->l1);
  q->l1 = l1;
  q->h.l1_size = s->l1_size;
  q->h.l1_offset = s->l1_offset;
  return 0;
}

int qcow2_snapshot_view(struct qcow2dev *q, const struct bd_open_opts *o) {
  const char *any = bd_opt_get(o, "qcow2", "snapshot");
  const char *id = bd_opt_get(o, "qcow2", "snapshot.id");
  const char *name = bd_opt_get(o, "qcow2", "snapshot.name");
  /* Lenient: the options are the overlay's, its snapshot not ours. */
  if ((!any && !id && !name) || (o->flags & BD_OPEN_LENIENT_OPTIONS))
    return 0;
  if (!(o->flags & (BD_OPEN_READONLY | BD_OPEN_SHARE)))
    return qcow2_err(-EINVAL, "qcow2 %s: a snapshot opens read-only only",
                     q->path);
  struct qcow2_snapshot *s = NULL;
  size_t used;
  uint32_t n = q->h.nb_snapshots;
  int r =
      n ? qcow2_read_snapshots(q->fd, q->file_size, &q->h, true, &s, &used) : 0;
  if (r < 0)
    return r == -ENOSPC ? -EINVAL : r;
  int i = pick(s, n, any, id, name);
  if (i < 0)
    r = qcow2_err(-ENOENT, "Failed to load snapshot: Can't find snapshot");
  else
    r = use_l1(q, &s[i]);
  qcow2_free_snapshots(s, n);
  return r;
}
