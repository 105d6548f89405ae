/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker pool that runs blocking sources' operations in parallel.
 *
 * One pool serves the whole process: front ends submit requests through
 * bd_submit(), which queues requests of BD_EXEC_POOL sources here.  Workers
 * are named "bp-worker-N" so they can be told apart in top and gdb. */
#ifndef BLOCKPORT_POOL_H
#define BLOCKPORT_POOL_H

struct bd_req;

/* Start the pool with N workers (0: the default).  Calling it again is a no
 * op; bd_submit() starts the default pool if nobody did.  Returns 0 or
 * -errno. */
int bd_pool_start(unsigned nworkers);
/* Finish every queued request, then stop and join the workers. */
void bd_pool_stop(void);
/* Queue one request; a worker runs it and calls its done(). */
void bd_pool_queue(struct bd_req *req);
unsigned bd_pool_size(void);

/* A snapshot of the pool, for metrics: workers started, those running a
 * request, and requests queued for a worker. */
struct bd_pool_load {
  unsigned workers, busy, queued;
};
struct bd_pool_load bd_pool_load(void);

#define BD_POOL_DEFAULT_WORKERS 16
#define BD_POOL_MAX_WORKERS 1024

#endif
