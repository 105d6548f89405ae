/* SPDX-License-Identifier: BSD-3-Clause */
/* memory: a sparse device held in RAM, lost when the process exits.
 *
 * The device is split into 64 KiB chunks allocated on first write, found
 * through a two-level table (a directory of 4096-chunk tables) so a huge
 * empty device costs almost nothing.  Reads and writes run in parallel under
 * a shared lock and allocate with compare-and-swap; only freeing chunks
 * (trim, zero) takes the lock exclusively, since a reader may hold a
 * pointer to the chunk being freed. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/source.h"
#include "formats.h"

#define CHUNK_SHIFT 16
#define CHUNK_SIZE (1u << CHUNK_SHIFT)
#define TABLE_SHIFT 12
#define TABLE_ENTRIES (1u << TABLE_SHIFT)
#define MEMORY_MAX_SIZE (1ull << 50)

typedef _Atomic(unsigned char *) chunk_ptr;

struct memdev {
  pthread_rwlock_t lock;
  size_t ndir;
  _Atomic(chunk_ptr *) *dir;
};

static chunk_ptr *table_get(struct memdev *m, uint64_t chunk, bool create) {
  size_t d = chunk >> TABLE_SHIFT;
  chunk_ptr *t = atomic_load(&m->dir[d]);
  if (t || !create)
    return t;
  chunk_ptr *nt = calloc(TABLE_ENTRIES, sizeof *nt);
  if (!nt)
    return NULL;
  chunk_ptr *expected = NULL;
  if (!atomic_compare_exchange_strong(&m->dir[d], &expected, nt)) {
    free(nt);
    return expected;
  }
  return nt;
}

static unsigned char *chunk_get(struct memdev *m, uint64_t chunk, bool create) {
  chunk_ptr *t = table_get(m, chunk, create);
  if (!t)
    return NULL;
  chunk_ptr *slot = &t[chunk & (TABLE_ENTRIES - 1)];
  unsigned char *c = atomic_load(slot);
  if (c || !create)
    return c;
  unsigned char *nc = calloc(1, CHUNK_SIZE);
  if (!nc)
    return NULL;
  unsigned char *expected = NULL;
  if (!atomic_compare_exchange_strong(slot, &expected, nc)) {
    free(nc);
    return expected;
  }
  return nc;
}

/* Walk [off, off+len) chunk by chunk. */
#define FOR_EACH_PIECE(off, len, chunk, coff, n)                               \
  for (uint64_t _o = (off), _end = (off) + (len), chunk, coff, n;              \
       _o < _end &&                                                            \
       ((chunk = _o >> CHUNK_SHIFT), (coff = _o & (CHUNK_SIZE - 1)),           \
        (n = CHUNK_SIZE - coff < _end - _o ? CHUNK_SIZE - coff : _end - _o),   \
        1);                                                                    \
       _o += n)

static int mem_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct memdev *m = bd->priv;
  unsigned char *p = buf;
  pthread_rwlock_rdlock(&m->lock);
  FOR_EACH_PIECE(off, len, chunk, coff, n) {
    unsigned char *c = chunk_get(m, chunk, false);
    if (c)
      memcpy(p, c + coff, n);
    else
      memset(p, 0, n);
    p += n;
  }
  pthread_rwlock_unlock(&m->lock);
  return 0;
}

static int mem_pwrite(struct bd *bd, const void *buf, uint64_t len,
                      uint64_t off, uint32_t flags) {
  (void)flags;
  struct memdev *m = bd->priv;
  const unsigned char *p = buf;
  int r = 0;
  pthread_rwlock_rdlock(&m->lock);
  FOR_EACH_PIECE(off, len, chunk, coff, n) {
    unsigned char *c = chunk_get(m, chunk, true);
    if (!c) {
      bd_set_error("memory: out of memory");
      r = -ENOMEM;
      break;
    }
    memcpy(c + coff, p, n);
    p += n;
  }
  pthread_rwlock_unlock(&m->lock);
  return r;
}

static int mem_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  (void)flags;
  struct memdev *m = bd->priv;
  pthread_rwlock_wrlock(&m->lock);
  FOR_EACH_PIECE(off, len, chunk, coff, n) {
    chunk_ptr *t = table_get(m, chunk, false);
    if (!t)
      continue;
    chunk_ptr *slot = &t[chunk & (TABLE_ENTRIES - 1)];
    unsigned char *c = atomic_load(slot);
    if (!c)
      continue;
    if (n == CHUNK_SIZE) {
      atomic_store(slot, NULL);
      free(c);
    } else {
      memset(c + coff, 0, n);
    }
  }
  pthread_rwlock_unlock(&m->lock);
  return 0;
}

static int mem_flush(struct bd *bd) {
  (void)bd;
  return 0;
}

static int mem_extents(struct bd *bd, uint64_t len, uint64_t off,
                       uint32_t flags, struct bd_extents *ext) {
  struct memdev *m = bd->priv;
  int r = 0;
  pthread_rwlock_rdlock(&m->lock);
  FOR_EACH_PIECE(off, len, chunk, coff, n) {
    (void)coff;
    bool data = chunk_get(m, chunk, false) != NULL;
    /* Depth 1 either way: this device provides every byte itself. */
    r = bd_extents_add(ext, n, data ? 0 : BD_EXT_HOLE | BD_EXT_ZERO, 1);
    if (r != 0 || ((flags & BD_F_REQ_ONE) && ext->n > 1))
      break;
  }
  pthread_rwlock_unlock(&m->lock);
  return r < 0 ? r : 0;
}

static void mem_close(struct bd *bd) {
  struct memdev *m = bd->priv;
  for (size_t d = 0; d < m->ndir; d++) {
    chunk_ptr *t = atomic_load(&m->dir[d]);
    if (!t)
      continue;
    for (size_t i = 0; i < TABLE_ENTRIES; i++)
      free(atomic_load(&t[i]));
    free(t);
  }
  free(m->dir);
  pthread_rwlock_destroy(&m->lock);
  free(m);
}

static const struct bd_ops memory_ops = {
    .name = "memory",
    .pread = mem_pread,
    .pwrite = mem_pwrite,
    .flush = mem_flush,
    .trim = mem_zero,
    .zero = mem_zero,
    .extents = mem_extents,
    .close = mem_close,
};

bool memory_is_spec(const char *spec) {
  return strncmp(spec, "memory:", 7) == 0;
}

struct bd *memory_open(const char *spec, const struct bd_open_opts *o) {
  (void)o;
  const char *size = spec + 7;
  uint64_t sz = 0;
  char why[96];
  int r = bd_parse_size(size, &sz);
  if (r < 0 || sz > MEMORY_MAX_SIZE) {
    bd_set_error("memory: invalid size '%s': %s", size,
                 r < 0 ? bd_size_problem(size, why, sizeof why) : "at most 1P");
    return NULL;
  }
  struct memdev *m = calloc(1, sizeof *m);
  uint64_t nchunks = (sz + CHUNK_SIZE - 1) >> CHUNK_SHIFT;
  if (m) {
    m->ndir = (nchunks + TABLE_ENTRIES - 1) >> TABLE_SHIFT;
    m->dir = calloc(m->ndir ? m->ndir : 1, sizeof *m->dir);
  }
  struct bd *bd =
      m && m->dir ? bd_new(&memory_ops, "memory", "memory device") : NULL;
  if (!bd) {
    if (m)
      free(m->dir);
    free(m);
    bd_set_error("memory: out of memory");
    return NULL;
  }
  pthread_rwlock_init(&m->lock, NULL);
  bd->priv = m;
  bd->size = sz;
  bd->exec = BD_EXEC_INLINE;
  return bd;
}
