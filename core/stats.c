/* SPDX-License-Identifier: BSD-3-Clause */
/* The counter registry of stats.h. */
#include "stats.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct bd_stat *head, **tail = &head;
static atomic_uint next_slot;
static unsigned ndefined;

_Thread_local unsigned bd_stat_thread_slot;

unsigned bd_stat_pick_slot(void) {
  unsigned n = atomic_fetch_add_explicit(&next_slot, 1, memory_order_relaxed);
  bd_stat_thread_slot = n % BD_STAT_SLOTS + 1;
  return bd_stat_thread_slot;
}

void bd_stat_register(struct bd_stat *s) {
  pthread_mutex_lock(&lock);
  bool known = false;
  for (struct bd_stat *p = head; p && !known; p = p->next)
    known = p == s;
  if (!known) {
    s->index = ndefined++;
    s->next = NULL;
    *tail = s;
    tail = &s->next;
  }
  pthread_mutex_unlock(&lock);
}

struct bd_stat_scope *bd_stat_scope_new(void) {
  struct bd_stat_scope *sc =
      aligned_alloc(_Alignof(struct bd_stat_scope), sizeof *sc);
  if (sc)
    memset(sc, 0, sizeof *sc);
  return sc;
}

void bd_stat_scope_free(struct bd_stat_scope *sc) {
  free(sc);
}

uint64_t bd_stat_scope_value(const struct bd_stat_scope *sc,
                             const struct bd_stat *s) {
  uint64_t sum = 0;
  if (!sc || s->index >= BD_STAT_MAX)
    return 0;
  for (unsigned i = 0; i < BD_STAT_SLOTS; i++)
    sum +=
        atomic_load_explicit((atomic_uint_least64_t *)&sc->slot[i].v[s->index],
                             memory_order_relaxed);
  return sum;
}

void bd_stats_foreach(bd_stat_fn *fn, void *ctx) {
  pthread_mutex_lock(&lock);
  for (const struct bd_stat *p = head; p; p = p->next)
    fn(p, ctx);
  pthread_mutex_unlock(&lock);
}
