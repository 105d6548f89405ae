/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker pool: a request queued while other workers are blocked in
 * long operations must start at once on an idle worker. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "core/blockdev.h"
#include "core/pool.h"
#include "core/source.h"

#define NREQ 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int running, finished;
static bool release;

static struct timespec deadline(int seconds) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += seconds;
  return t;
}

/* Blocks, like a read from a slow disk, until the test releases it. */
static int slow_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  (void)bd, (void)buf, (void)len, (void)off;
  struct timespec until = deadline(20);
  pthread_mutex_lock(&lock);
  running++;
  pthread_cond_broadcast(&cond);
  while (!release)
    if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT)
      break;
  pthread_mutex_unlock(&lock);
  return 0;
}

static void done(struct bd_req *req, int err) {
  (void)req, (void)err;
  pthread_mutex_lock(&lock);
  finished++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* Waits up to 5 s for *counter to reach want; returns what it reached. */
static int wait_for(int *counter, int want) {
  struct timespec until = deadline(5);
  pthread_mutex_lock(&lock);
  while (*counter < want)
    if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT)
      break;
  int got = *counter;
  pthread_mutex_unlock(&lock);
  return got;
}

static const struct bd_ops slow_ops = {.name = "slow", .pread = slow_pread};

/* Each request is queued once the one before it runs (blocked): the pool
 * used to count a blocked worker as able to take the queue, so the next
 * request waited for it while seven workers slept. */
Test(pool, queued_request_runs_while_others_block) {
  cr_assert_eq(bd_pool_start(NREQ), 0);
  struct bd *bd = bd_new(&slow_ops, "slow", NULL);
  cr_assert(bd);
  bd->size = 1 << 20;
  bd->caps.readonly = true;
  bd->exec = BD_EXEC_POOL;
  static struct bd_req req[NREQ];
  static char buf[NREQ][512];
  int started = 0, submitted = 0;
  for (int i = 0; i < NREQ; i++) {
    req[i] = (struct bd_req){.cmd = BD_READ,
                             .offset = (uint64_t)i * 512,
                             .length = 512,
                             .buf = buf[i],
                             .done = done};
    bd_submit(bd, &req[i]);
    submitted++;
    started = wait_for(&running, i + 1);
    if (started < i + 1)
      break;
  }
  pthread_mutex_lock(&lock);
  release = true;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  cr_expect_eq(wait_for(&finished, submitted), submitted,
               "requests not finished");
  bd_close(bd);
  bd_pool_stop();
  cr_assert_eq(started, NREQ,
               "only %d of %d requests ran at once on %d workers", started,
               NREQ, NREQ);
}
