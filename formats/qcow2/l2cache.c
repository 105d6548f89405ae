/* SPDX-License-Identifier: BSD-3-Clause */
/* The L2 cache: slices of L2 tables (4 KiB, or a whole table when clusters
 * are smaller) kept in memory, split into shards by key so that lookups
 * from many threads rarely meet on one lock.  Each shard is a hash table
 * with an LRU list; pinned slices are never evicted.  A miss inserts a
 * "loading" slice first, so two threads never load the same slice and a
 * reader waits for the one load in flight. */
#include <errno.h>
#include <stdlib.h>

#include "core/stats.h"
#include "qcow2-internal.h"

/* For serve --metrics (core/stats.h), over every qcow2 image. */
BD_STAT_DEFINE(st_hits, "qcow2_l2_cache_hits_total",
               "qcow2 L2 table lookups found in the cache.")
BD_STAT_DEFINE(st_misses, "qcow2_l2_cache_misses_total",
               "qcow2 L2 table lookups that read the table from the image.")
BD_STAT_DEFINE(st_evictions, "qcow2_l2_cache_evictions_total",
               "qcow2 L2 cache slices dropped to make room.")

#define NSHARDS 16

struct l2slice {
  uint64_t key;
  uint64_t *entries;
  unsigned refs;
  unsigned dirty; /* pending metadata updates that pin this slice */
  bool loading, failed;
  struct l2slice *hnext;               /* hash chain */
  struct l2slice *lru_prev, *lru_next; /* unpinned slices only */
};

struct shard {
  pthread_mutex_t lock;
  pthread_cond_t loaded;
  struct l2slice **buckets;
  size_t nbuckets, count, cap;
  struct l2slice lru; /* sentinel: lru.lru_next is the oldest */
};

struct l2cache {
  size_t slice_bytes;
  struct bd_stat_scope *stats; /* where hits and misses count, or NULL */
  struct shard shards[NSHARDS];
};

static unsigned shard_of(uint64_t key) {
  return (unsigned)((key >> 12) * 0x9e3779b97f4a7c15ull >> 60) % NSHARDS;
}

static size_t bucket_of(const struct shard *s, uint64_t key) {
  return (size_t)((key >> 9) * 0xff51afd7ed558ccdull >> 32) % s->nbuckets;
}

struct l2cache *l2cache_new(size_t slice_bytes, size_t total_bytes,
                            struct bd_stat_scope *stats) {
  struct l2cache *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->slice_bytes = slice_bytes;
  c->stats = stats;
  size_t per = total_bytes / slice_bytes / NSHARDS;
  if (per < 4)
    per = 4;
  for (int i = 0; i < NSHARDS; i++) {
    struct shard *s = &c->shards[i];
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->loaded, NULL);
    s->cap = per;
    s->nbuckets = per * 2 + 1;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    s->lru.lru_next = s->lru.lru_prev = &s->lru;
    if (!s->buckets) {
      l2cache_free(c);
      return NULL;
    }
  }
  return c;
}

static void free_slice(struct l2slice *sl) {
  free(sl->entries);
  free(sl);
}

void l2cache_free(struct l2cache *c) {
  if (!c)
    return;
  for (int i = 0; i < NSHARDS; i++) {
    struct shard *s = &c->shards[i];
    for (size_t b = 0; s->buckets && b < s->nbuckets; b++) {
      struct l2slice *sl = s->buckets[b];
      while (sl) {
        struct l2slice *next = sl->hnext;
        free_slice(sl);
        sl = next;
      }
    }
    free(s->buckets);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->loaded);
  }
  free(c);
}

static void lru_unlink(struct l2slice *sl) {
  if (sl->lru_next) {
    sl->lru_prev->lru_next = sl->lru_next;
    sl->lru_next->lru_prev = sl->lru_prev;
    sl->lru_next = sl->lru_prev = NULL;
  }
}

static void hash_unlink(struct shard *s, struct l2slice *sl) {
  for (struct l2slice **pp = &s->buckets[bucket_of(s, sl->key)]; *pp;
       pp = &(*pp)->hnext) {
    if (*pp == sl) {
      *pp = sl->hnext;
      s->count--;
      return;
    }
  }
}

/* Drop the oldest unpinned slices while the shard is over capacity. */
static void evict(struct l2cache *c, struct shard *s) {
  while (s->count > s->cap && s->lru.lru_next != &s->lru) {
    struct l2slice *old = s->lru.lru_next;
    lru_unlink(old);
    hash_unlink(s, old);
    free_slice(old);
    bd_stat_count(c->stats, &st_evictions, 1);
  }
}

static struct l2slice *find(struct shard *s, uint64_t key) {
  for (struct l2slice *sl = s->buckets[bucket_of(s, key)]; sl; sl = sl->hnext)
    if (sl->key == key)
      return sl;
  return NULL;
}

static struct l2slice *insert_loading(struct l2cache *c, struct shard *s,
                                      uint64_t key, size_t n) {
  struct l2slice *sl = calloc(1, sizeof *sl);
  if (sl)
    sl->entries = malloc(n * sizeof *sl->entries);
  if (!sl || !sl->entries) {
    free(sl);
    return NULL;
  }
  sl->key = key;
  sl->refs = 1;
  sl->loading = true;
  size_t b = bucket_of(s, key);
  sl->hnext = s->buckets[b];
  s->buckets[b] = sl;
  s->count++;
  evict(c, s);
  return sl;
}

const uint64_t *l2cache_get(struct l2cache *c, uint64_t key, l2_load_fn *load,
                            void *ctx, struct l2slice **pin, int *err) {
  struct shard *s = &c->shards[shard_of(key)];
  size_t n = c->slice_bytes / sizeof(uint64_t);
  pthread_mutex_lock(&s->lock);
  struct l2slice *sl = find(s, key);
  bd_stat_count(c->stats, sl ? &st_hits : &st_misses, 1);
  if (sl) {
    if (sl->refs++ == 0)
      lru_unlink(sl);
    while (sl->loading)
      pthread_cond_wait(&s->loaded, &s->lock);
  } else {
    sl = insert_loading(c, s, key, n);
    if (!sl) {
      pthread_mutex_unlock(&s->lock);
      *err = -ENOMEM;
      return NULL;
    }
    pthread_mutex_unlock(&s->lock);
    int r = load(ctx, key, sl->entries, n);
    pthread_mutex_lock(&s->lock);
    sl->loading = false;
    sl->failed = r < 0;
    pthread_cond_broadcast(&s->loaded);
  }
  if (sl->failed) {
    /* Unhash a failed load so the next reader retries it. */
    if (--sl->refs == 0) {
      hash_unlink(s, sl);
      free_slice(sl);
    }
    pthread_mutex_unlock(&s->lock);
    *err = -EIO;
    return NULL;
  }
  pthread_mutex_unlock(&s->lock);
  *pin = sl;
  return sl->entries;
}

void l2cache_put(struct l2cache *c, struct l2slice *sl) {
  struct shard *s = &c->shards[shard_of(sl->key)];
  pthread_mutex_lock(&s->lock);
  if (--sl->refs == 0) {
    /* Most recently used goes to the tail. */
    sl->lru_prev = s->lru.lru_prev;
    sl->lru_next = &s->lru;
    s->lru.lru_prev->lru_next = sl;
    s->lru.lru_prev = sl;
    evict(c, s);
  }
  pthread_mutex_unlock(&s->lock);
}

void l2cache_set(struct l2cache *c, uint64_t key, size_t i, uint64_t value) {
  struct shard *s = &c->shards[shard_of(key)];
  pthread_mutex_lock(&s->lock);
  struct l2slice *sl = find(s, key);
  if (sl) {
    while (sl->loading)
      pthread_cond_wait(&s->loaded, &s->lock);
    if (!sl->failed)
      __atomic_store_n(&sl->entries[i], value, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&s->lock);
}

const uint64_t *l2cache_peek(struct l2cache *c, uint64_t key,
                             struct l2slice **pin) {
  struct shard *s = &c->shards[shard_of(key)];
  pthread_mutex_lock(&s->lock);
  struct l2slice *sl = find(s, key);
  if (!sl || sl->loading || sl->failed) {
    pthread_mutex_unlock(&s->lock);
    return NULL;
  }
  if (sl->refs++ == 0)
    lru_unlink(sl);
  pthread_mutex_unlock(&s->lock);
  bd_stat_count(c->stats, &st_hits, 1); /* a miss here is counted by the
                                         * l2cache_get() that follows */
  *pin = sl;
  return sl->entries;
}

const uint64_t *qcow2_slice_entries(const struct l2slice *pin) {
  return pin->entries;
}

bool l2cache_mark_dirty(struct l2cache *c, struct l2slice *sl, int delta) {
  struct shard *s = &c->shards[shard_of(sl->key)];
  pthread_mutex_lock(&s->lock);
  bool first = delta > 0 && sl->dirty == 0;
  sl->dirty = (unsigned)((int)sl->dirty + delta);
  pthread_mutex_unlock(&s->lock);
  return first;
}
