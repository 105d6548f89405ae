/* SPDX-License-Identifier: BSD-3-Clause */
#include "map.h"

#include <errno.h>
#include <string.h>

#include "core/blockdev.h"

/* A device without layers (raw, an NBD export, memory, null): its block
 * status, every byte its own. */
static int generic_map(struct bd *bd, uint64_t off, uint64_t len,
                       struct map_entry *e) {
  struct bd_extents ext;
  bd_extents_init(&ext, off, 1);
  struct bd_req req = {.cmd = BD_BLOCK_STATUS,
                       .offset = off,
                       .length = len,
                       .flags = BD_F_REQ_ONE,
                       .extents = &ext};
  int r = bd_run(bd, &req);
  if (r == 0 && ext.n == 0)
    r = -EIO;
  if (r == 0) {
    e->length = ext.v[0].length < len ? ext.v[0].length : len;
    e->present = true;
    e->zero = ext.v[0].flags & BD_EXT_ZERO;
    e->data = !(ext.v[0].flags & BD_EXT_HOLE);
  }
  bd_extents_free(&ext);
  return r;
}

int map_first(struct bd *bd, unsigned depth, uint64_t off, uint64_t len,
              struct map_entry *e) {
  memset(e, 0, sizeof *e);
  e->start = off;
  e->depth = depth;
  e->file = bd->description;
  if (off >= bd->size) {
    /* Past the end of a backing file: nothing below provides data, and
     * the answer is the layer above's, as qemu-img map says. */
    e->length = len;
    e->zero = true;
    e->depth = depth ? depth - 1 : 0;
    return 0;
  }
  if (len > bd->size - off)
    len = bd->size - off;
  if (!strcmp(bd->format, "qcow2"))
    return qcow2_map(bd, depth, off, len, e);
  int r = generic_map(bd, off, len, e);
  if (r == 0 && (!strcmp(bd->format, "raw") || !strcmp(bd->format, "rbd"))) {
    /* Every byte of a raw file (or an RBD image, as qemu-img map shows
     * it) sits at its own offset. */
    e->has_offset = true;
    e->offset = off;
  }
  return r;
}
