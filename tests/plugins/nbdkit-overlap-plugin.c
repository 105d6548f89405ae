/* SPDX-License-Identifier: BSD-3-Clause */
/* A test plugin for blockport's nbdkit plugin host: a RAM disk that
 * records how many of its calls overlap (in all, and on one handle) and
 * how many handles are open at once, so a test can tell whether the host
 * honours the thread model it asked for, and whether a PARALLEL plugin
 * really gets parallel calls.  Built for API version 2, and for version 1
 * with -DOVERLAP_API_V1.
 *
 * Parameters: size=SIZE (default 16M), model=serialize_connections|
 * serialize_all_requests|serialize_requests|parallel (default parallel),
 * delay=MICROSECONDS each data call sleeps (default 1000), stats=FILE
 * (rewritten at each close: max_all=N max_handle=N max_open=N calls=N
 * flushes=N flag=N), fail=config|open (refuse the configuration, or
 * every open after the first: blockport's own probe), eio_at=OFFSET (a
 * read there fails with EIO through errno), enospc_at=OFFSET (a write
 * there fails with ENOSPC through nbdkit_set_error), exports=1 (lists
 * exports "one" and "two"; opening another name fails). */
#ifdef OVERLAP_API_V1
#define NBDKIT_API_VERSION 1
#else
#define NBDKIT_API_VERSION 2
#endif
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <nbdkit-plugin.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int overlap_debug_flag; /* -D overlap.flag=N */

static int64_t size = 16 << 20;
static unsigned char *disk;
static int model = NBDKIT_THREAD_MODEL_PARALLEL;
static unsigned delay_us = 1000;
static const char *stats_file;
static const char *fail_at;
static int64_t eio_at = -1, enospc_at = -1;
static bool list_two;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int active_all, max_all, max_handle, open_handles, max_open;
static long calls, flushes;

struct handle {
  int active;
};

static const char *model_names[] = {"serialize_connections",
                                    "serialize_all_requests",
                                    "serialize_requests", "parallel"};

static int parse_model(const char *v) {
  for (int i = 0; i < 4; i++)
    if (!strcmp(v, model_names[i]))
      return i;
  nbdkit_error("unknown model: %s", v);
  return -1;
}

static int overlap_config(const char *key, const char *value) {
  if (!strcmp(key, "size"))
    return (size = nbdkit_parse_size(value)) < 0 ? -1 : 0;
  if (!strcmp(key, "model"))
    return (model = parse_model(value)) < 0 ? -1 : 0;
  if (!strcmp(key, "delay"))
    return nbdkit_parse_unsigned("delay", value, &delay_us);
  if (!strcmp(key, "stats")) {
    stats_file = value;
    return 0;
  }
  if (!strcmp(key, "fail")) {
    fail_at = value;
    return 0;
  }
  if (!strcmp(key, "eio_at"))
    return nbdkit_parse_int64_t("eio_at", value, &eio_at);
  if (!strcmp(key, "enospc_at"))
    return nbdkit_parse_int64_t("enospc_at", value, &enospc_at);
  if (!strcmp(key, "exports")) {
    int b = nbdkit_parse_bool(value);
    list_two = b > 0;
    return b < 0 ? -1 : 0;
  }
  nbdkit_error("unknown parameter '%s'", key);
  return -1;
}

static int overlap_config_complete(void) {
  if (fail_at && !strcmp(fail_at, "config")) {
    nbdkit_error("refusing the configuration, as asked (fail=config)");
    return -1;
  }
  disk = calloc(1, (size_t)size);
  if (!disk) {
    nbdkit_error("calloc: %m");
    return -1;
  }
  return 0;
}

static int overlap_thread_model(void) {
  return model;
}

static void write_stats(void) {
  if (!stats_file)
    return;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", stats_file);
  FILE *f = fopen(tmp, "w");
  if (!f)
    return;
  pthread_mutex_lock(&lock);
  fprintf(f,
          "max_all=%d max_handle=%d max_open=%d calls=%ld flushes=%ld "
          "flag=%d\n",
          max_all, max_handle, max_open, calls, flushes, overlap_debug_flag);
  pthread_mutex_unlock(&lock);
  fclose(f);
  rename(tmp, stats_file);
}

static int overlap_list_exports(int readonly, int is_tls,
                                struct nbdkit_exports *exports) {
  (void)readonly;
  (void)is_tls;
  if (!list_two)
    return nbdkit_use_default_export(exports);
  if (nbdkit_add_export(exports, "one", "the first export") < 0 ||
      nbdkit_add_export(exports, "two", NULL) < 0)
    return -1;
  return 0;
}

static void *overlap_open(int readonly) {
  (void)readonly;
  const char *name = nbdkit_export_name();
  if (!name)
    return NULL;
  static int opens;
  pthread_mutex_lock(&lock);
  bool refuse = opens++ > 0 && fail_at && !strcmp(fail_at, "open");
  pthread_mutex_unlock(&lock);
  if (refuse) {
    nbdkit_error("refusing to open, as asked (fail=open)");
    return NULL;
  }
  if (list_two && strcmp(name, "one") && strcmp(name, "two") && *name) {
    nbdkit_error("no export called '%s'", name);
    return NULL;
  }
  struct handle *h = calloc(1, sizeof *h);
  if (!h)
    return NULL;
  pthread_mutex_lock(&lock);
  if (++open_handles > max_open)
    max_open = open_handles;
  pthread_mutex_unlock(&lock);
  nbdkit_debug("open export '%s', flag %d", name, overlap_debug_flag);
  return h;
}

static void overlap_close(void *handle) {
  pthread_mutex_lock(&lock);
  open_handles--;
  pthread_mutex_unlock(&lock);
  free(handle);
  write_stats();
}

static void overlap_cleanup(void) {
  write_stats();
}

static void overlap_unload(void) {
  free(disk);
}

static int64_t overlap_get_size(void *handle) {
  (void)handle;
  return size;
}

/* Every data call: count it as in flight for a while. */
static void enter(struct handle *h) {
  pthread_mutex_lock(&lock);
  calls++;
  if (++active_all > max_all)
    max_all = active_all;
  if (++h->active > max_handle)
    max_handle = h->active;
  pthread_mutex_unlock(&lock);
  struct timespec ts = {0, (long)delay_us * 1000};
  nanosleep(&ts, NULL);
}

static void leave(struct handle *h) {
  pthread_mutex_lock(&lock);
  active_all--;
  h->active--;
  pthread_mutex_unlock(&lock);
}

static int do_pread(void *handle, void *buf, uint32_t count, uint64_t off) {
  enter(handle);
  int r = 0;
  if (eio_at >= 0 && (int64_t)off <= eio_at &&
      eio_at < (int64_t)(off + count)) {
    nbdkit_error("read at %lld fails, as asked", (long long)eio_at);
    errno = EIO;
    r = -1;
  } else {
    memcpy(buf, disk + off, count);
  }
  leave(handle);
  return r;
}

static int do_pwrite(void *handle, const void *buf, uint32_t count,
                     uint64_t off) {
  enter(handle);
  int r = 0;
  if (enospc_at >= 0 && (int64_t)off <= enospc_at &&
      enospc_at < (int64_t)(off + count)) {
    nbdkit_error("write at %lld fails, as asked", (long long)enospc_at);
    nbdkit_set_error(ENOSPC);
    errno = EPERM; /* nbdkit_set_error wins over errno */
    r = -1;
  } else {
    memcpy(disk + off, buf, count);
  }
  leave(handle);
  return r;
}

static int do_flush(void *handle) {
  enter(handle);
  pthread_mutex_lock(&lock);
  flushes++;
  pthread_mutex_unlock(&lock);
  leave(handle);
  return 0;
}

static int do_zero(void *handle, uint32_t count, uint64_t off) {
  enter(handle);
  memset(disk + off, 0, count);
  leave(handle);
  return 0;
}

static int overlap_extents(void *handle, uint32_t count, uint64_t off,
                           uint32_t flags, struct nbdkit_extents *e) {
  (void)handle;
  (void)flags;
  /* 64 KiB blocks: all-zero ones are reported as holes. */
  uint64_t end = off + count, b = off & ~(uint64_t)0xffff;
  for (; b < end && b < (uint64_t)size; b += 0x10000) {
    uint64_t len = (uint64_t)size - b < 0x10000 ? (uint64_t)size - b : 0x10000;
    bool zero = true;
    for (uint64_t i = 0; i < len && zero; i++)
      zero = disk[b + i] == 0;
    if (nbdkit_add_extent(
            e, b, len, zero ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0) < 0)
      return -1;
  }
  return 0;
}

#ifdef OVERLAP_API_V1
static int overlap_zero(void *handle, uint32_t count, uint64_t off,
                        int may_trim) {
  (void)may_trim;
  return do_zero(handle, count, off);
}
#else
static int overlap_pread(void *handle, void *buf, uint32_t count, uint64_t off,
                         uint32_t flags) {
  (void)flags;
  return do_pread(handle, buf, count, off);
}
static int overlap_pwrite(void *handle, const void *buf, uint32_t count,
                          uint64_t off, uint32_t flags) {
  (void)flags; /* FUA is emulated by flush: see can_fua */
  return do_pwrite(handle, buf, count, off);
}
static int overlap_flush(void *handle, uint32_t flags) {
  (void)flags;
  return do_flush(handle);
}
static int overlap_zero(void *handle, uint32_t count, uint64_t off,
                        uint32_t flags) {
  (void)flags;
  return do_zero(handle, count, off);
}
static int overlap_can_fua(void *handle) {
  (void)handle;
  return NBDKIT_FUA_EMULATE;
}
#endif

static int overlap_can_multi_conn(void *handle) {
  (void)handle;
  return 1;
}

static struct nbdkit_plugin plugin = {
    .name = "overlap",
    .longname = "blockport's thread model test plugin",
    .config = overlap_config,
    .config_complete = overlap_config_complete,
    .thread_model = overlap_thread_model,
    .list_exports = overlap_list_exports,
    .open = overlap_open,
    .close = overlap_close,
    .cleanup = overlap_cleanup,
    .unload = overlap_unload,
    .get_size = overlap_get_size,
    .can_multi_conn = overlap_can_multi_conn,
    .extents = overlap_extents,
#ifdef OVERLAP_API_V1
    .pread = do_pread,
    .pwrite = do_pwrite,
    .flush = do_flush,
    .zero = overlap_zero,
#else
    .pread = overlap_pread,
    .pwrite = overlap_pwrite,
    .flush = overlap_flush,
    .zero = overlap_zero,
    .can_fua = overlap_can_fua,
#endif
    .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN(plugin)
