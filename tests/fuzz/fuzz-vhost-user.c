/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the vhost-user messages a front end sends
 * (frontend/vhost-user.c), through the real socket.
 *
 * The input is a stream of messages as they go on the wire: a 12-byte
 * header (request, flags, size; little-endian) and SIZE bytes of payload,
 * the last one cut short where the input ends.  Each is sent with the
 * descriptors its request carries, as QEMU would: guest memory (64 KiB
 * memfds, one per region the table declares), an eventfd for a ring's
 * kick, call or err unless the payload says "no fd", a memfd for
 * SET_INFLIGHT_FD.  Then the front end hangs up.  The back end must
 * survive whatever it was sent, answer only with well-framed replies (the
 * reply flag, a payload it sends in full), return from vhu_serve() once
 * the front end has gone, and leave no descriptor open. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"
#include "formats/formats.h"
#include "frontend/vhost-user.h"
#include "fuzz-check.h"

enum { HDR = 12, MAX_PAYLOAD = 512, MAX_FDS = 8, MEM_SIZE = 64 * 1024 };
enum {
  SET_MEM_TABLE = 5,
  SET_VRING_KICK = 12,
  SET_VRING_ERR = 14,
  SET_INFLIGHT_FD = 32
};
#define VRING_NOFD 0x100u
#define FLAG_REPLY 0x4u

static struct bd *dev;
static char sock_path[sizeof((struct sockaddr_un *)0)->sun_path];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_threshold = LOG_LEVEL_ERROR;
  static char dir[] = "/tmp/blockport-fuzz-vhost-XXXXXX";
  CHECK(mkdtemp(dir));
  snprintf(sock_path, sizeof sock_path, "%s/s", dir);
  struct bd_open_opts o = {0};
  dev = null_open("null:1M", &o);
  CHECK(dev);
  return 0;
}

static uint32_t le32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

static int memfd(void) {
  int fd = memfd_create("fuzz-guest", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, MEM_SIZE) == 0);
  return fd;
}

/* The descriptors message REQ with payload P (LEN bytes) carries. */
static unsigned fds_for(uint32_t req, const uint8_t *p, size_t len, int *fds) {
  unsigned n = 0;
  if (req == SET_MEM_TABLE && len >= 4) {
    uint32_t regions = le32(p);
    for (; n < regions && n < MAX_FDS; n++)
      fds[n] = memfd();
  } else if (req >= SET_VRING_KICK && req <= SET_VRING_ERR) {
    if (len < 4 || !(le32(p) & VRING_NOFD)) {
      fds[n] = eventfd(0, EFD_CLOEXEC);
      CHECK(fds[n] >= 0);
      n++;
    }
  } else if (req == SET_INFLIGHT_FD) {
    fds[n++] = memfd();
  }
  return n;
}

static void send_msg(int sock, const uint8_t *m, size_t len, const int *fds,
                     unsigned nfds) {
  union {
    char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {(void *)m, len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  /* The back end may have hung up already: that is its right.  (libFuzzer's
   * timer interrupts system calls: EINTR is tried again, here and below.) */
  while (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0 && errno == EINTR)
    ;
}

/* Every reply: the reply flag, at most MAX_PAYLOAD bytes, sent whole;
 * descriptors it carries are closed.  Returns how many. */
static unsigned check_replies(int sock) {
  static uint8_t buf[1024 * 1024];
  size_t have = 0;
  for (;;) {
    union {
      char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {buf + have, sizeof buf - have};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
        close(((int *)CMSG_DATA(c))[i]);
    have += (size_t)n;
    CHECK(have < sizeof buf);
  }
  unsigned replies = 0;
  for (size_t at = 0; at < have; replies++) {
    CHECK(have - at >= HDR);
    CHECK(le32(buf + at + 4) & FLAG_REPLY);
    uint32_t size = le32(buf + at + 8);
    CHECK(size <= MAX_PAYLOAD && have - at - HDR >= size);
    at += HDR + size;
  }
  return replies;
}

struct server {
  int stop[2], ready[2];
  int ret;
};

static void ready(void *opaque) {
  struct server *s = opaque;
  CHECK(write(s->ready[1], "r", 1) == 1);
}

static void *serve(void *arg) {
  struct server *s = arg;
  struct vhu_options o = {.socket_path = sock_path, .queues = 2, .once = true};
  int lsock = vhu_listen(sock_path);
  CHECK(lsock >= 0);
  s->ret = vhu_serve(dev, &o, lsock, s->stop[0], ready, s);
  return NULL;
}

static int connect_to(const char *path) {
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  CHECK(c >= 0);
  int r;
  while ((r = connect(c, (struct sockaddr *)&sa, sizeof sa)) < 0 &&
         errno == EINTR)
    ;
  CHECK(r == 0);
  return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int before = open_fds();
  struct server s = {.ret = -1};
  CHECK(pipe(s.stop) == 0 && pipe(s.ready) == 0);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, serve, &s) == 0);
  char r;
  ssize_t got;
  while ((got = read(s.ready[0], &r, 1)) < 0 && errno == EINTR)
    ;
  CHECK(got == 1);
  int c = connect_to(sock_path);
  unsigned sent = 0;
  for (size_t at = 0; at + HDR <= size; sent++) {
    const uint8_t *m = data + at;
    size_t len = (size_t)HDR + le32(m + 8);
    if (len > size - at)
      len = size - at;
    int fds[MAX_FDS];
    unsigned nfds = fds_for(le32(m), m + HDR, len - HDR, fds);
    send_msg(c, m, len, fds, nfds);
    for (unsigned i = 0; i < nfds; i++)
      close(fds[i]);
    at += len;
  }
  shutdown(c, SHUT_WR);
  CHECK(check_replies(c) <= sent);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(s.ret == 0);
  close(c);
  for (int i = 0; i < 2; i++) {
    close(s.stop[i]);
    close(s.ready[i]);
  }
  CHECK(open_fds() == before);
  return 0;
}
