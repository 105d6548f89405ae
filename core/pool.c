/* SPDX-License-Identifier: BSD-3-Clause */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "blockdev.h"
#include "log.h"
#include "pipeline.h"
#include "source.h"

/* A FIFO of requests guarded by one mutex.  Workers that find it empty
 * sleep on the condition variable. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct bd_req *head, **tail;
  unsigned queued;
  unsigned sleeping;
  unsigned busy; /* workers running a request */
  unsigned nthreads;
  bool started, stopping;
  pthread_t *threads;
} pool = {
    .lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP,
    .cond = PTHREAD_COND_INITIALIZER,
    .tail = &pool.head,
};

static void *worker_main(void *arg) {
  char name[16];
  snprintf(name, sizeof name, "bp-worker-%u", (unsigned)(uintptr_t)arg);
  pthread_setname_np(pthread_self(), name);

  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (!pool.head && !pool.stopping) {
      pool.sleeping++;
      pthread_cond_wait(&pool.cond, &pool.lock);
      pool.sleeping--;
    }
    struct bd_req *req = pool.head;
    if (!req)
      break; /* stopping and drained */
    pool.head = req->next;
    pool.queued--;
    pool.busy++;
    if (!pool.head)
      pool.tail = &pool.head;
    pthread_mutex_unlock(&pool.lock);

    bd_complete(req, bd_execute(req->bd, req));

    pthread_mutex_lock(&pool.lock);
    pool.busy--;
  }
  pthread_mutex_unlock(&pool.lock);
  return NULL;
}

int bd_pool_start(unsigned n) {
  if (n == 0)
    n = BD_POOL_DEFAULT_WORKERS;
  if (n > BD_POOL_MAX_WORKERS)
    n = BD_POOL_MAX_WORKERS;
  pthread_mutex_lock(&pool.lock);
  if (pool.started) {
    pthread_mutex_unlock(&pool.lock);
    return 0;
  }
  pool.threads = calloc(n, sizeof *pool.threads);
  if (!pool.threads) {
    pthread_mutex_unlock(&pool.lock);
    return -ENOMEM;
  }
  pool.started = true;
  pool.stopping = false;
  for (unsigned i = 0; i < n; i++) {
    int r = pthread_create(&pool.threads[i], NULL, worker_main,
                           (void *)(uintptr_t)i);
    if (r != 0) {
      log_error("cannot start worker thread: %s", strerror(r));
      break;
    }
    pool.nthreads++;
  }
  int ret = pool.nthreads ? 0 : -EAGAIN;
  pthread_mutex_unlock(&pool.lock);
  return ret;
}

void bd_pool_stop(void) {
  pthread_mutex_lock(&pool.lock);
  if (!pool.started) {
    pthread_mutex_unlock(&pool.lock);
    return;
  }
  pool.stopping = true;
  pthread_cond_broadcast(&pool.cond);
  unsigned n = pool.nthreads;
  pthread_mutex_unlock(&pool.lock);
  for (unsigned i = 0; i < n; i++)
    pthread_join(pool.threads[i], NULL);
  pthread_mutex_lock(&pool.lock);
  free(pool.threads);
  pool.threads = NULL;
  pool.nthreads = 0;
  pool.started = false;
  pthread_mutex_unlock(&pool.lock);
}

unsigned bd_pool_size(void) {
  pthread_mutex_lock(&pool.lock);
  unsigned n = pool.nthreads;
  pthread_mutex_unlock(&pool.lock);
  return n;
}

struct bd_pool_load bd_pool_load(void) {
  pthread_mutex_lock(&pool.lock);
  struct bd_pool_load l = {pool.nthreads, pool.busy, pool.queued};
  pthread_mutex_unlock(&pool.lock);
  return l;
}

void bd_pool_queue(struct bd_req *req) {
  req->next = NULL;
  pthread_mutex_lock(&pool.lock);
  if (!pool.started) {
    /* Nobody started the pool: start the default one. */
    pthread_mutex_unlock(&pool.lock);
    if (bd_pool_start(0) < 0) {
      bd_complete(req, -EAGAIN);
      return;
    }
    pthread_mutex_lock(&pool.lock);
  }
  *pool.tail = req;
  pool.tail = &req->next;
  pool.queued++;
  /* Wake a sleeper only when the queue is longer than the workers that are
   * awake and between requests can take: on a fast device they keep up
   * without the cost of a wake-up per request.  A worker running a request
   * does not count: it may be blocked for as long as the device likes (a
   * slow disk, a remote source), and the queue must not wait behind it
   * while others sleep. */
  unsigned spare = pool.nthreads - pool.sleeping - pool.busy;
  bool wake = pool.sleeping > 0 && pool.queued > spare;
  pthread_mutex_unlock(&pool.lock);
  if (wake)
    pthread_cond_signal(&pool.cond);
}
