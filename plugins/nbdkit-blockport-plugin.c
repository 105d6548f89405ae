/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit-blockport-plugin: blockport's formats (raw, and qcow2 read-write
 * with backing chains) served by nbdkit.
 *
 *   nbdkit ./nbdkit-blockport-plugin.so file=disk.qcow2 [format=qcow2]
 *          [readonly=true]
 *
 * One device is opened when the server gets ready and shared by every
 * connection (so a flush on one covers writes from all: multi-conn), and
 * requests run in parallel in nbdkit's threads: each call runs the
 * request to completion through bd_run(), the core serialising only what
 * the format asks.  The nbdkit_* functions come from nbdkit. */
#define NBDKIT_API_VERSION 2
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <nbdkit-plugin.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "formats/registry.h"

static char *file;
static const char *format;
static bool readonly;
static struct bd *bd;

static int bp_config(const char *key, const char *value) {
  if (!strcmp(key, "file")) {
    free(file);
    file = nbdkit_realpath(value);
    return file ? 0 : -1;
  }
  if (!strcmp(key, "format")) {
    if (strcmp(value, "raw") && strcmp(value, "qcow2")) {
      nbdkit_error("format must be raw or qcow2, not '%s'", value);
      return -1;
    }
    format = value;
    return 0;
  }
  if (!strcmp(key, "readonly")) {
    int r = nbdkit_parse_bool(value);
    if (r < 0)
      return -1;
    readonly = r;
    return 0;
  }
  nbdkit_error("unknown parameter '%s'", key);
  return -1;
}

static int bp_config_complete(void) {
  if (!file) {
    nbdkit_error("the file parameter is required");
    return -1;
  }
  return 0;
}

/* Open here, before nbdkit forks: errors reach the user, and opening
 * starts no thread. */
static int bp_get_ready(void) {
  bd_formats_install(formats_registry);
  bd = bd_open(file, format, readonly);
  if (!bd) {
    nbdkit_error("%s", bd_errmsg());
    return -1;
  }
  return 0;
}

static void bp_cleanup(void) {
  if (bd && bd_close(bd) < 0)
    nbdkit_error("%s: final flush failed", file);
  bd = NULL;
}

static void bp_unload(void) {
  free(file);
}

static void *bp_open(int ro) {
  (void)ro; /* nbdkit itself refuses writes under -r */
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t bp_get_size(void *h) {
  (void)h;
  return (int64_t)bd->size;
}

#define CAN(fn, expr)                                                          \
  static int fn(void *h) {                                                     \
    (void)h;                                                                   \
    return (expr);                                                             \
  }
CAN(bp_can_write, !bd->caps.readonly)
CAN(bp_can_flush, bd->caps.can_flush)
CAN(bp_can_trim, bd->caps.can_trim)
CAN(bp_can_zero, 1) /* the core writes zeroes where the format cannot */
CAN(bp_can_fast_zero, bd->caps.can_fast_zero)
CAN(bp_can_extents, 1)
CAN(bp_can_multi_conn, bd->caps.multi_conn)
/* The core emulates FUA with a flush where the format has none. */
CAN(bp_can_fua, bd->caps.can_fua ? NBDKIT_FUA_NATIVE : NBDKIT_FUA_NONE)
CAN(bp_can_cache, bd->caps.can_cache ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE)

static int bp_block_size(void *h, uint32_t *min, uint32_t *pref,
                         uint32_t *max) {
  (void)h;
  *min = bd->caps.min_block;
  *pref = bd->caps.pref_block;
  *max = bd->caps.max_block;
  return 0;
}

/* Run one request; on failure pass the message and errno to nbdkit. */
static int run(enum bd_cmd cmd, void *buf, uint32_t count, uint64_t off,
               uint32_t flags, struct bd_extents *ext) {
  struct bd_req req = {.cmd = cmd,
                       .flags = flags,
                       .offset = off,
                       .length = count,
                       .buf = buf,
                       .extents = ext};
  int r = bd_run(bd, &req);
  if (r < 0) {
    nbdkit_error("%s", bd_errmsg());
    nbdkit_set_error(-r);
    return -1;
  }
  return 0;
}

static uint32_t bd_flags(uint32_t f) {
  return ((f & NBDKIT_FLAG_FUA) ? BD_F_FUA : 0) |
         ((f & NBDKIT_FLAG_MAY_TRIM) ? BD_F_MAY_TRIM : 0) |
         ((f & NBDKIT_FLAG_FAST_ZERO) ? BD_F_FAST_ZERO : 0) |
         ((f & NBDKIT_FLAG_REQ_ONE) ? BD_F_REQ_ONE : 0);
}

static int bp_pread(void *h, void *buf, uint32_t count, uint64_t off,
                    uint32_t flags) {
  (void)h;
  (void)flags;
  return run(BD_READ, buf, count, off, 0, NULL);
}

static int bp_pwrite(void *h, const void *buf, uint32_t count, uint64_t off,
                     uint32_t flags) {
  (void)h;
  return run(BD_WRITE, (void *)buf, count, off, bd_flags(flags), NULL);
}

static int bp_flush(void *h, uint32_t flags) {
  (void)h;
  (void)flags;
  return run(BD_FLUSH, NULL, 0, 0, 0, NULL);
}

static int bp_trim(void *h, uint32_t count, uint64_t off, uint32_t flags) {
  (void)h;
  return run(BD_TRIM, NULL, count, off, bd_flags(flags), NULL);
}

static int bp_zero(void *h, uint32_t count, uint64_t off, uint32_t flags) {
  (void)h;
  return run(BD_ZERO, NULL, count, off, bd_flags(flags), NULL);
}

static int bp_cache(void *h, uint32_t count, uint64_t off, uint32_t flags) {
  (void)h;
  (void)flags;
  return run(BD_CACHE, NULL, count, off, 0, NULL);
}

static int nbdkit_type(uint32_t flags) {
  return ((flags & BD_EXT_HOLE) ? NBDKIT_EXTENT_HOLE : 0) |
         ((flags & BD_EXT_ZERO) ? NBDKIT_EXTENT_ZERO : 0);
}

static int bp_extents(void *h, uint32_t count, uint64_t off, uint32_t flags,
                      struct nbdkit_extents *extents) {
  (void)h;
  struct bd_extents ext;
  bd_extents_init(&ext, off, (flags & NBDKIT_FLAG_REQ_ONE) ? 1 : 0);
  int r = run(BD_BLOCK_STATUS, NULL, count, off, bd_flags(flags), &ext);
  uint64_t pos = off;
  for (size_t i = 0; r == 0 && i < ext.n; i++) {
    r = nbdkit_add_extent(extents, pos, ext.v[i].length,
                          (uint32_t)nbdkit_type(ext.v[i].flags));
    pos += ext.v[i].length;
  }
  bd_extents_free(&ext);
  return r;
}

static struct nbdkit_plugin plugin = {
    .name = "blockport",
    .longname = "blockport formats (raw, qcow2)",
    .version = "0.1.0",
    .description = "Serves raw and qcow2 images (read-write, backing "
                   "chains) through blockport's block-device core.",
    .config = bp_config,
    .config_complete = bp_config_complete,
    .config_help = "file=<FILENAME>     (required) the image\n"
                   "format=raw|qcow2    the format (default: probed)\n"
                   "readonly=true       open the image read-only",
    .magic_config_key = "file",
    .get_ready = bp_get_ready,
    .cleanup = bp_cleanup,
    .unload = bp_unload,
    .open = bp_open,
    .get_size = bp_get_size,
    .block_size = bp_block_size,
    .can_write = bp_can_write,
    .can_flush = bp_can_flush,
    .can_trim = bp_can_trim,
    .can_zero = bp_can_zero,
    .can_fast_zero = bp_can_fast_zero,
    .can_extents = bp_can_extents,
    .can_fua = bp_can_fua,
    .can_multi_conn = bp_can_multi_conn,
    .can_cache = bp_can_cache,
    .pread = bp_pread,
    .pwrite = bp_pwrite,
    .flush = bp_flush,
    .trim = bp_trim,
    .zero = bp_zero,
    .cache = bp_cache,
    .extents = bp_extents,
    .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN(plugin)
