/* SPDX-License-Identifier: BSD-3-Clause */
/* Event counters that layers below the front ends keep for whoever
 * reports them (--metrics of serve, mount and vhost).
 *
 * A source cannot hand its counters to the server directly (formats/ and
 * server/ never see each other), so it defines them here by name:
 *
 *   BD_STAT_DEFINE(l2_hits, "qcow2_l2_cache_hits_total", "L2 slices found.");
 *
 * and counts them in the scope it was opened for (struct bd_open_opts
 * stats: one export, mount or vhost device, backing files included):
 *
 *   bd_stat_count(q->stats, &l2_hits, 1);
 *
 * A reporter walks the definitions with bd_stats_foreach() and reads each
 * scope it made with bd_stat_scope_value(), labelling the series with the
 * scope's name.  A source opened without a scope counts nothing, so a
 * command without --metrics pays nothing.  Names follow the Prometheus
 * conventions (snake_case, base units, "_total" for counters); the
 * reporter adds its own prefix.  Counters only ever grow.
 *
 * Adding is one relaxed atomic add on a slot picked per thread, so threads
 * counting the same event rarely share a cache line; reading sums the
 * slots. */
#ifndef BLOCKPORT_STATS_H
#define BLOCKPORT_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define BD_STAT_SLOTS 8
/* At most this many definitions in a program (more are not counted). */
#define BD_STAT_MAX 32

struct bd_stat {
  const char *name;
  const char *help;
  unsigned index;       /* in every scope, from registration */
  struct bd_stat *next; /* in the registry */
};

/* The counters of one scope: one per definition, in every slot. */
struct bd_stat_scope {
  struct {
    _Alignas(64) atomic_uint_least64_t v[BD_STAT_MAX];
  } slot[BD_STAT_SLOTS];
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

/* A scope with every counter at 0 (NULL when out of memory); free it with
 * bd_stat_scope_free() once nothing opened for it counts any more. */
struct bd_stat_scope *bd_stat_scope_new(void);
void bd_stat_scope_free(struct bd_stat_scope *sc);

/* The calling thread's slot + 1, 0 until it first counts. */
extern _Thread_local unsigned bd_stat_thread_slot;
unsigned bd_stat_pick_slot(void);

/* Count N events of S in SC; SC NULL: nobody asked, nothing is counted. */
static inline void bd_stat_count(struct bd_stat_scope *sc,
                                 const struct bd_stat *s, uint64_t n) {
  if (!sc || s->index >= BD_STAT_MAX)
    return;
  unsigned i = bd_stat_thread_slot;
  if (!i)
    i = bd_stat_pick_slot();
  atomic_fetch_add_explicit(&sc->slot[i - 1].v[s->index], n,
                            memory_order_relaxed);
}

uint64_t bd_stat_scope_value(const struct bd_stat_scope *sc,
                             const struct bd_stat *s);

/* Call FN for every registered counter, in the order they registered. */
typedef void bd_stat_fn(const struct bd_stat *s, void *ctx);
void bd_stats_foreach(bd_stat_fn *fn, void *ctx);

#endif
