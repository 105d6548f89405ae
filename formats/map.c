/* SPDX-License-Identifier: BSD-3-Clause */
#include "map.h"

#include <errno.h>
#include <stdio.h>
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

/* An NBD URI as qemu names the default export: without its "/"
 * ("nbd+unix://?socket=...", "nbd://host:port"). */
static const char *nbd_file_name(struct bd *bd) {
  static _Thread_local char name[1024];
  const char *d = bd->description, *q = strstr(d, ":///?");
  const char *auth = strstr(d, "://");
  size_t n = strlen(d);
  if (n >= sizeof name || !auth)
    return d;
  if (q) /* nbd+unix:///?socket=... */
    snprintf(name, sizeof name, "%.*s://%s", (int)(q - d), d, q + 4);
  else if (strchr(auth + 3, '/') == d + n - 1) /* nbd://host:port/ */
    snprintf(name, sizeof name, "%.*s", (int)(n - 1), d);
  else
    return d;
  return name;
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
  if (r == 0 && (!strcmp(bd->format, "raw") || !strcmp(bd->format, "rbd") ||
                 !strcmp(bd->format, "nbd"))) {
    /* Every byte of a raw file (or an RBD image or NBD export, as
     * qemu-img map shows them) sits at its own offset. */
    e->has_offset = true;
    e->offset = off;
  }
  if (!strcmp(bd->format, "nbd"))
    e->file = nbd_file_name(bd);
  return r;
}

/* Does B carry on A's answer?  Compressed clusters (data without an
 * offset) are answered one at a time. */
static bool continues(const struct map_entry *a, const struct map_entry *b) {
  return a->depth == b->depth && a->present == b->present &&
         a->zero == b->zero && a->data == b->data &&
         a->has_offset == b->has_offset && a->file == b->file &&
         (!a->data || a->has_offset) &&
         (!a->has_offset || a->offset + a->length == b->offset);
}

int map_status_run(struct bd *bd, uint64_t off, unsigned stop_bits,
                   struct map_entry *e) {
  uint64_t end = bd->size;
  if (stop_bits && stop_bits < 63) {
    uint64_t stop = ((off >> stop_bits) + 1) << stop_bits;
    end = stop < end ? stop : end;
  }
  int r = map_first(bd, 0, off, end - off, e);
  while (r == 0 && e->length && off + e->length < end) {
    struct map_entry next;
    uint64_t at = off + e->length;
    /* A look-ahead that fails ends the run; asked for itself next, the
     * same range reports its error then. */
    if (map_first(bd, 0, at, end - at, &next) < 0 || !next.length ||
        !continues(e, &next))
      break;
    e->length += next.length;
  }
  return r;
}
