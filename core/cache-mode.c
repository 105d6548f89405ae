/* SPDX-License-Identifier: BSD-3-Clause */
/* The names of the cache modes (enum bd_cache) and of the I/O modes (enum
 * bd_aio): pure, so that the config parser's fuzz target links it without
 * the rest of the core. */
#include <errno.h>
#include <string.h>

#include "blockdev.h"

static const char *const cache_names[] = {
    [BD_CACHE_WRITEBACK] = "writeback",
    [BD_CACHE_NONE] = "none",
    [BD_CACHE_WRITETHROUGH] = "writethrough",
    [BD_CACHE_DIRECTSYNC] = "directsync",
    [BD_CACHE_UNSAFE] = "unsafe",
};

int bd_cache_parse(const char *name, enum bd_cache *out) {
  for (size_t i = 0; i < sizeof cache_names / sizeof *cache_names; i++)
    if (strcmp(name, cache_names[i]) == 0) {
      *out = (enum bd_cache)i;
      return 0;
    }
  return -EINVAL;
}

const char *bd_cache_name(enum bd_cache mode) {
  return (unsigned)mode < sizeof cache_names / sizeof *cache_names
             ? cache_names[mode]
             : "?";
}

bool bd_cache_direct(enum bd_cache mode) {
  return mode == BD_CACHE_NONE || mode == BD_CACHE_DIRECTSYNC;
}

static const char *const aio_names[] = {
    [BD_AIO_DEFAULT] = "default",
    [BD_AIO_IO_URING] = "io_uring",
    [BD_AIO_THREADS] = "threads",
};

int bd_aio_parse(const char *name, enum bd_aio *out) {
  for (size_t i = BD_AIO_IO_URING; i < sizeof aio_names / sizeof *aio_names;
       i++)
    if (strcmp(name, aio_names[i]) == 0) {
      *out = (enum bd_aio)i;
      return 0;
    }
  return -EINVAL;
}

const char *bd_aio_name(enum bd_aio mode) {
  return (unsigned)mode < sizeof aio_names / sizeof *aio_names ? aio_names[mode]
                                                               : "?";
}
