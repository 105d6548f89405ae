/* SPDX-License-Identifier: BSD-3-Clause */
/* core/uring.c: requests through io_uring on a real file, from a poller
 * thread (its own ring) and from any other thread (the shared ring). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/source.h"
#include "core/uring.h"

struct waiter {
  struct bd_req req; /* first: done() finds the rest */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
  int err;
  pthread_t thread; /* where done() ran */
};

static void on_done(struct bd_req *req, int err) {
  struct waiter *w = (struct waiter *)req;
  pthread_mutex_lock(&w->lock);
  w->done = true;
  w->err = err;
  w->thread = pthread_self();
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

static void waiter_init(struct waiter *w) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cond, NULL);
  w->req.done = on_done;
}

/* Wait (at most 10 s) for a request of the shared ring. */
static int wait_done(struct waiter *w) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 10;
  pthread_mutex_lock(&w->lock);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT)
      break;
  bool done = w->done;
  pthread_mutex_unlock(&w->lock);
  cr_assert(done, "the request did not complete within 10 s");
  return w->err;
}

/* Turn this poller thread's loop (at most 10 s) until W completes. */
static int poll_done(struct waiter *w) {
  for (int i = 0; i < 1000 && !w->done; i++) {
    if (bd_poller_run())
      continue;
    struct pollfd p = {.fd = bd_poller_fd(), .events = POLLIN};
    cr_assert_geq(p.fd, 0, "a poller with a request has a descriptor");
    poll(&p, 1, 10);
  }
  cr_assert(w->done, "the request did not complete within 10 s");
  return w->err;
}

static int temp_file(size_t size) {
  char path[] = "/tmp/test-uring-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  cr_assert_eq(ftruncate(fd, (off_t)size), 0);
  return fd;
}

static void need_uring(void) {
  if (!uring_available())
    cr_skip_test("io_uring is not available here");
}

Test(uring, shared_ring_writes_and_reads_back) {
  need_uring();
  int fd = temp_file(1 << 20);
  static uint8_t out[65536], in[65536];
  for (size_t i = 0; i < sizeof out; i++)
    out[i] = (uint8_t)(i * 7 + 3);
  struct waiter w;
  waiter_init(&w);
  struct uring_seg s = {out, 4096, sizeof out};
  cr_assert_eq(uring_start(&w.req, URING_WRITE_DSYNC, fd, false, &s, 1), 0);
  cr_assert_eq(wait_done(&w), 0);
  cr_assert_eq(pread(fd, in, sizeof in, 4096), (ssize_t)sizeof in);
  cr_assert_arr_eq(in, out, sizeof in);
  waiter_init(&w);
  memset(in, 0, sizeof in);
  s = (struct uring_seg){in, 4096, sizeof in};
  cr_assert_eq(uring_start(&w.req, URING_READ, fd, false, &s, 1), 0);
  cr_assert_eq(wait_done(&w), 0);
  cr_assert_arr_eq(in, out, sizeof in);
  cr_assert_neq(w.thread, pthread_self(), "the reaper completes it");
  close(fd);
}

Test(uring, a_read_past_the_end_of_the_file_reads_zeroes) {
  need_uring();
  int fd = temp_file(0);
  uint8_t data[1000], buf[4096];
  memset(data, 0xab, sizeof data);
  cr_assert_eq(pwrite(fd, data, sizeof data, 0), (ssize_t)sizeof data);
  memset(buf, 0xff, sizeof buf);
  struct waiter w;
  waiter_init(&w);
  struct uring_seg s = {buf, 0, sizeof buf};
  cr_assert_eq(uring_start(&w.req, URING_READ, fd, false, &s, 1), 0);
  cr_assert_eq(wait_done(&w), 0);
  cr_assert_arr_eq(buf, data, sizeof data);
  for (size_t i = sizeof data; i < sizeof buf; i++)
    cr_assert_eq(buf[i], 0, "byte %zu past the end is %u", i, buf[i]);
  close(fd);
}

Test(uring, segments_of_one_request_complete_it_once) {
  need_uring();
  int fd = temp_file(1 << 20);
  static uint8_t a[4096], b[8192], c[512];
  memset(a, 1, sizeof a);
  memset(b, 2, sizeof b);
  memset(c, 3, sizeof c);
  struct uring_seg segs[] = {
      {a, 0, sizeof a}, {b, 65536, sizeof b}, {c, 500000, sizeof c}};
  struct waiter w;
  waiter_init(&w);
  cr_assert_eq(uring_start(&w.req, URING_WRITE, fd, false, segs, 3), 0);
  cr_assert_eq(wait_done(&w), 0);
  uint8_t x;
  cr_assert_eq(pread(fd, &x, 1, 65536 + 8191), 1);
  cr_assert_eq(x, 2);
  cr_assert_eq(pread(fd, &x, 1, 500000 + 511), 1);
  cr_assert_eq(x, 3);
  waiter_init(&w);
  cr_assert_eq(uring_start(&w.req, URING_FDATASYNC, fd, false, NULL, 0), 0);
  cr_assert_eq(wait_done(&w), 0);
  close(fd);
}

Test(uring, an_error_reaches_done) {
  need_uring();
  int fd = open("/dev/null", O_RDONLY);
  uint8_t buf[512];
  struct waiter w;
  waiter_init(&w);
  struct uring_seg s = {buf, 0, sizeof buf};
  /* Writing a descriptor opened read-only: EBADF from the kernel. */
  cr_assert_eq(uring_start(&w.req, URING_WRITE, fd, false, &s, 1), 0);
  cr_assert_eq(wait_done(&w), -EBADF);
  close(fd);
}

Test(uring, too_many_segments_are_refused_not_started) {
  need_uring();
  static struct uring_seg segs[URING_MAX_SEGS + 1];
  struct waiter w;
  waiter_init(&w);
  cr_assert_eq(
      uring_start(&w.req, URING_READ, 0, false, segs, URING_MAX_SEGS + 1),
      -EAGAIN);
  cr_assert_not(w.done);
}

Test(uring, a_poller_completes_its_requests_in_its_own_thread) {
  need_uring();
  int fd = temp_file(65536);
  uint8_t buf[4096];
  bd_poller_begin();
  cr_assert_eq(bd_poller_fd(), -1, "no ring before the first request");
  struct waiter w;
  waiter_init(&w);
  struct uring_seg s = {buf, 0, sizeof buf};
  cr_assert_eq(uring_start(&w.req, URING_READ, fd, false, &s, 1), 0);
  cr_assert_eq(poll_done(&w), 0);
  cr_assert(pthread_equal(w.thread, pthread_self()));
  bd_poller_end();
  cr_assert_eq(bd_poller_fd(), -1);
  close(fd);
}

Test(uring, a_plug_holds_submission_until_its_end) {
  need_uring();
  int fd = temp_file(65536);
  uint8_t buf[4096];
  bd_poller_begin();
  struct waiter w;
  waiter_init(&w);
  struct uring_seg s = {buf, 0, sizeof buf};
  bd_plug_begin();
  cr_assert_eq(uring_start(&w.req, URING_READ, fd, false, &s, 1), 0);
  /* Not submitted: nothing can complete however long the loop turns. */
  struct pollfd p = {.fd = bd_poller_fd(), .events = POLLIN};
  cr_assert_eq(poll(&p, 1, 50), 0);
  cr_assert_not(bd_poller_run());
  cr_assert_not(w.done);
  bd_plug_end();
  cr_assert_eq(poll_done(&w), 0);
  bd_poller_end();
  close(fd);
}

Test(uring, a_poller_ends_only_when_its_requests_have) {
  need_uring();
  int fd = temp_file(1 << 20);
  static uint8_t buf[8][65536];
  struct waiter w[8];
  bd_poller_begin();
  for (int i = 0; i < 8; i++) {
    waiter_init(&w[i]);
    struct uring_seg s = {buf[i], (uint64_t)i * 65536, sizeof buf[i]};
    cr_assert_eq(uring_start(&w[i].req, URING_READ, fd, false, &s, 1), 0);
  }
  bd_poller_end(); /* reaps them */
  for (int i = 0; i < 8; i++)
    cr_assert(w[i].done, "request %d not completed by bd_poller_end()", i);
  close(fd);
}

/* Issue 30: errors travel with the request.  Requests that fail at once,
 * each with its own errno, completed together in one poller batch: each
 * carries its own message, whatever the others (and the thread) say. */
Test(uring, failing_requests_each_carry_their_own_message) {
  need_uring();
  int rdonly = open("/dev/null", O_RDONLY);
  int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
  int pipes[2];
  cr_assert(rdonly >= 0 && dir >= 0 && pipe(pipes) == 0);
  /* EBADF (write to a read-only descriptor), EISDIR (read a directory),
   * EINVAL (sync a pipe), round and round. */
  const struct {
    enum uring_op op;
    int fd, err;
  } kinds[] = {{URING_WRITE, rdonly, EBADF},
               {URING_READ, dir, EISDIR},
               {URING_FDATASYNC, pipes[0], EINVAL}};
  enum { N = 24 };
  static struct waiter w[N];
  static uint8_t buf[N][512];
  bd_poller_begin();
  bd_plug_begin();
  for (int i = 0; i < N; i++) {
    waiter_init(&w[i]);
    struct uring_seg s = {buf[i], 4096, sizeof buf[i]};
    const int k = i % 3;
    cr_assert_eq(uring_start(&w[i].req, kinds[k].op, kinds[k].fd, false, &s,
                             kinds[k].op == URING_FDATASYNC ? 0 : 1),
                 0);
  }
  bd_plug_end();
  bd_set_error("a message of this thread, not of any request");
  for (int i = 0; i < N; i++)
    poll_done(&w[i]);
  bd_poller_end();
  for (int i = 0; i < N; i++) {
    const int e = kinds[i % 3].err;
    cr_assert_eq(w[i].err, -e, "request %d: %d, not -%d", i, w[i].err, e);
    cr_assert_str_eq(w[i].req.errmsg, strerror(e), "request %d", i);
  }
  close(rdonly);
  close(dir);
  close(pipes[0]);
  close(pipes[1]);
}
