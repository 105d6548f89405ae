/* SPDX-License-Identifier: BSD-3-Clause */
/* Process-wide event counters that layers below the front ends keep for
 * whoever reports them (serve --metrics).
 *
 * A source cannot hand its counters to the server directly (formats/ and
 * server/ never see each other), so it defines them here by name:
 *
 *   BD_STAT_DEFINE(l2_hits, "qcow2_l2_cache_hits_total", "L2 slices found.");
 *   ...
 *   bd_stat_add(&l2_hits, 1);
 *
 * and a reporter walks them with bd_stats_foreach().  Names follow the
 * Prometheus conventions (snake_case, base units, "_total" for counters);
 * the reporter adds its own prefix.  Counters only ever grow.
 *
 * Adding is one relaxed atomic add on a slot picked per thread, so threads
 * counting the same event rarely share a cache line; reading sums the
 * slots. */
#ifndef BLOCKPORT_STATS_H
#define BLOCKPORT_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define BD_STAT_SLOTS 8

struct bd_stat {
  const char *name;
  const char *help;
  struct {
    _Alignas(64) atomic_uint_least64_t v;
  } slot[BD_STAT_SLOTS];
  struct bd_stat *next; /* in the registry */
};

/* Define the counter VAR and register it when the program starts (a
 * constructor: it exists, at 0, before anything counts). */
#define BD_STAT_DEFINE(var, NAME, HELP)                                        \
  static struct bd_stat var = {.name = NAME, .help = HELP};                    \
  __attribute__((constructor)) static void var##_register(void) {              \
    bd_stat_register(&var);                                                    \
  }

/* Add S to the registry (once; a second call is a no-op). */
void bd_stat_register(struct bd_stat *s);

/* The calling thread's slot + 1, 0 until it first counts. */
extern _Thread_local unsigned bd_stat_thread_slot;
unsigned bd_stat_pick_slot(void);

static inline void bd_stat_add(struct bd_stat *s, uint64_t n) {
  unsigned i = bd_stat_thread_slot;
  if (!i)
    i = bd_stat_pick_slot();
  atomic_fetch_add_explicit(&s->slot[i - 1].v, n, memory_order_relaxed);
}

uint64_t bd_stat_value(const struct bd_stat *s);

/* Call FN for every registered counter, in the order they registered. */
typedef void bd_stat_fn(const struct bd_stat *s, void *ctx);
void bd_stats_foreach(bd_stat_fn *fn, void *ctx);

#endif
