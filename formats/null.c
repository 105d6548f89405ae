/* SPDX-License-Identifier: BSD-3-Clause */
/* null: a device of a given size that reads zeroes and discards writes.
 * It measures the cost of the front end and protocol alone. */
#include <errno.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/source.h"
#include "formats.h"

static int null_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  (void)bd;
  (void)off;
  memset(buf, 0, len);
  return 0;
}

static int null_pwrite(struct bd *bd, const void *buf, uint64_t len,
                       uint64_t off, uint32_t flags) {
  (void)bd, (void)buf, (void)len, (void)off, (void)flags;
  return 0;
}

static int null_flush(struct bd *bd) {
  (void)bd;
  return 0;
}

static int null_zero(struct bd *bd, uint64_t len, uint64_t off,
                     uint32_t flags) {
  (void)bd, (void)len, (void)off, (void)flags;
  return 0;
}

static int null_extents(struct bd *bd, uint64_t len, uint64_t off,
                        uint32_t flags, struct bd_extents *ext) {
  (void)bd, (void)off, (void)flags;
  int r = bd_extents_add(ext, len, BD_EXT_HOLE | BD_EXT_ZERO, 1);
  return r < 0 ? r : 0;
}

static const struct bd_ops null_ops = {
    .name = "null",
    .pread = null_pread,
    .pwrite = null_pwrite,
    .flush = null_flush,
    .trim = null_zero,
    .zero = null_zero,
    .extents = null_extents,
};

bool null_is_spec(const char *spec) {
  return strncmp(spec, "null:", 5) == 0;
}

struct bd *null_open(const char *spec, const struct bd_open_opts *o) {
  (void)o;
  const char *size = spec + 5;
  uint64_t sz;
  if (bd_parse_size(size, &sz) < 0) {
    char why[96];
    bd_set_error("null: invalid size '%s': %s", size,
                 bd_size_problem(size, why, sizeof why));
    return NULL;
  }
  struct bd *bd = bd_new(&null_ops, "null", "null device");
  if (!bd) {
    bd_set_error("null: out of memory");
    return NULL;
  }
  bd->size = sz;
  bd->exec = BD_EXEC_INLINE;
  return bd;
}
