/* SPDX-License-Identifier: BSD-3-Clause */
/* The FUSE request loop and its buffer pool: see fuse-loop.h. */
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include "fuse-loop.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/blockdev.h"
#include "core/log.h"

#define KICK_SIGNAL SIGUSR1 /* interrupts a thread's read of /dev/fuse */
#define KICK_EVERY_MS 10

struct worker {
  struct fuse_loop *l;
  pthread_t thread;
  struct fuse_buf fbuf; /* the buffer the next request arrives in */
};

struct fuse_loop {
  struct fuse_session *se;
  unsigned nthreads;
  struct worker *workers;
  pthread_mutex_t lock; /* stop, ended, error */
  pthread_cond_t cond;
  bool stop;
  unsigned ended;
  int error;
  pthread_mutex_t pool_lock;
  void **cache;
  unsigned ncache, maxcache;
};

static _Thread_local struct worker *current;

/* ---- buffers ---- */

void *fl_buf_get(struct fuse_loop *l) {
  void *b = NULL;
  pthread_mutex_lock(&l->pool_lock);
  if (l->ncache > 0)
    b = l->cache[--l->ncache];
  pthread_mutex_unlock(&l->pool_lock);
  return b ? b : malloc(FL_BUF_SIZE);
}

/* Kept for reuse up to a bound: a fresh buffer is mapped and faulted in
 * page by page, which costs more than the copy into it. */
void fl_buf_put(struct fuse_loop *l, void *buf) {
  if (!buf)
    return;
  pthread_mutex_lock(&l->pool_lock);
  if (l->ncache < l->maxcache) {
    l->cache[l->ncache++] = buf;
    buf = NULL;
  }
  pthread_mutex_unlock(&l->pool_lock);
  free(buf);
}

void *fl_take_request_buf(const void *data) {
  struct worker *w = current;
  if (!w || !w->fbuf.mem)
    return NULL;
  const char *p = data, *mem = w->fbuf.mem;
  if (p < mem || p >= mem + FL_BUF_SIZE)
    return NULL;
  void *fresh = fl_buf_get(w->l);
  if (!fresh)
    return NULL;
  void *taken = w->fbuf.mem;
  w->fbuf.mem = fresh;
  return taken;
}

/* ---- threads ---- */

static void kicked(int sig) {
  (void)sig; /* only interrupts a blocking call */
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct fuse_loop *l = w->l;
  current = w;
  sigset_t kick;
  sigemptyset(&kick);
  sigaddset(&kick, KICK_SIGNAL);
  pthread_sigmask(SIG_UNBLOCK, &kick, NULL);
  int err = 0;
  while (!fuse_session_exited(l->se)) {
    /* libfuse reads into fbuf.mem as it is (it allocates only when it is
     * NULL), at most its buffer size, which FL_BUF_SIZE exceeds. */
    int r = fuse_session_receive_buf(l->se, &w->fbuf);
    if (r == -EINTR || r == -EAGAIN)
      continue;
    if (r <= 0) {
      err = r; /* 0: unmounted, or the session is ending */
      break;
    }
    fuse_session_process_buf(l->se, &w->fbuf);
  }
  pthread_mutex_lock(&l->lock);
  l->ended++;
  if (err < 0 && !l->error)
    l->error = err;
  pthread_cond_broadcast(&l->cond);
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

static unsigned start_workers(struct fuse_loop *l) {
  unsigned n = 0;
  for (; n < l->nthreads; n++) {
    struct worker *w = &l->workers[n];
    w->l = l;
    w->fbuf = (struct fuse_buf){.mem = fl_buf_get(l)};
    if (!w->fbuf.mem || pthread_create(&w->thread, NULL, worker_main, w)) {
      fl_buf_put(l, w->fbuf.mem);
      break;
    }
    pthread_setname_np(w->thread, "bp-fuse");
  }
  return n;
}

/* Wait until every started thread has returned, interrupting the ones
 * still blocked in read(2) every few milliseconds. */
static void end_workers(struct fuse_loop *l, unsigned n) {
  fuse_session_exit(l->se);
  pthread_mutex_lock(&l->lock);
  while (l->ended < n) {
    for (unsigned i = 0; i < n; i++)
      pthread_kill(l->workers[i].thread, KICK_SIGNAL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += KICK_EVERY_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&l->cond, &l->lock, &ts);
  }
  pthread_mutex_unlock(&l->lock);
  for (unsigned i = 0; i < n; i++) {
    pthread_join(l->workers[i].thread, NULL);
    fl_buf_put(l, l->workers[i].fbuf.mem);
  }
}

int fl_run(struct fuse_loop *l) {
  struct sigaction sa = {.sa_handler = kicked}; /* no SA_RESTART */
  sigemptyset(&sa.sa_mask);
  sigaction(KICK_SIGNAL, &sa, NULL);
  pthread_mutex_lock(&l->lock);
  bool stop = l->stop;
  pthread_mutex_unlock(&l->lock);
  if (stop)
    return 0;
  unsigned n = start_workers(l);
  if (n == 0) {
    bd_set_error("cannot start the FUSE threads");
    return -EAGAIN;
  }
  /* Until a stop, or until one thread ends (an unmount ends them all). */
  pthread_mutex_lock(&l->lock);
  while (!l->stop && l->ended == 0)
    pthread_cond_wait(&l->cond, &l->lock);
  pthread_mutex_unlock(&l->lock);
  end_workers(l, n);
  if (l->error)
    bd_set_error("reading /dev/fuse: %s", strerror(-l->error));
  return l->error;
}

void fl_stop(struct fuse_loop *l) {
  pthread_mutex_lock(&l->lock);
  l->stop = true;
  pthread_cond_broadcast(&l->cond);
  pthread_mutex_unlock(&l->lock);
}

struct fuse_loop *fl_new(struct fuse_session *se, unsigned threads,
                         unsigned cached_bufs) {
  struct fuse_loop *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  l->se = se;
  l->nthreads = threads ? threads : 1;
  l->maxcache = cached_bufs + l->nthreads;
  l->workers = calloc(l->nthreads, sizeof *l->workers);
  l->cache = calloc(l->maxcache, sizeof *l->cache);
  if (!l->workers || !l->cache) {
    free(l->workers);
    free(l->cache);
    free(l);
    return NULL;
  }
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->cond, NULL);
  pthread_mutex_init(&l->pool_lock, NULL);
  return l;
}

void fl_free(struct fuse_loop *l) {
  if (!l)
    return;
  for (unsigned i = 0; i < l->ncache; i++)
    free(l->cache[i]);
  free(l->cache);
  free(l->workers);
  pthread_mutex_destroy(&l->pool_lock);
  pthread_cond_destroy(&l->cond);
  pthread_mutex_destroy(&l->lock);
  free(l);
}
