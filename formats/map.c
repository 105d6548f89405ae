#include "map.h"

#include <errno.h>
#include <string.h>

#include "../core/blockdev.h"

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
  if (!strcmp(bd->format, "raw"))
    return raw_map(bd, off, len, e);
  if (!strcmp(bd->format, "qcow2"))
    return qcow2_map(bd, depth, off, len, e);
  bd_set_error("cannot map a %s device", bd->format);
  return -ENOTSUP;
}
