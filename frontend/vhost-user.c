/* SPDX-License-Identifier: BSD-3-Clause */
/* vhost-user-blk back end; see vhost-user.h.
 *
 * The main thread owns the socket and all device state; it handles one
 * message at a time.  Each started ring has a thread that waits on the
 * ring's kick eventfd and feeds the virtio-blk queue; completions (on
 * whichever thread the block device finishes) signal the call eventfd.
 * Anything that changes what a ring thread uses (memory table, stop,
 * disconnect) first stops the thread and waits for its requests. */
#include "vhost-user.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"
#include "core/unix-socket.h"
#include "virtio-blk.h"

/* Front-end requests (vhost-user.rst, "Front-end message types"). */
enum {
  VHU_GET_FEATURES = 1,
  VHU_SET_FEATURES = 2,
  VHU_SET_OWNER = 3,
  VHU_RESET_OWNER = 4,
  VHU_SET_MEM_TABLE = 5,
  VHU_SET_LOG_BASE = 6,
  VHU_SET_LOG_FD = 7,
  VHU_SET_VRING_NUM = 8,
  VHU_SET_VRING_ADDR = 9,
  VHU_SET_VRING_BASE = 10,
  VHU_GET_VRING_BASE = 11,
  VHU_SET_VRING_KICK = 12,
  VHU_SET_VRING_CALL = 13,
  VHU_SET_VRING_ERR = 14,
  VHU_GET_PROTOCOL_FEATURES = 15,
  VHU_SET_PROTOCOL_FEATURES = 16,
  VHU_GET_QUEUE_NUM = 17,
  VHU_SET_VRING_ENABLE = 18,
  VHU_GET_CONFIG = 24,
  VHU_SET_CONFIG = 25,
  VHU_GET_INFLIGHT_FD = 31,
  VHU_SET_INFLIGHT_FD = 32,
};

#define VHU_VERSION 0x1u
#define VHU_FLAG_REPLY 0x4u
#define VHU_FLAG_NEED_REPLY 0x8u
#define VHU_F_PROTOCOL_FEATURES 30
#define VHU_PROTO_MQ 0
#define VHU_PROTO_REPLY_ACK 3
#define VHU_PROTO_CONFIG 9
#define VHU_PROTO_INFLIGHT_SHMFD 12
#define VHU_PROTOCOL_FEATURES                                                  \
  ((1ull << VHU_PROTO_MQ) | (1ull << VHU_PROTO_REPLY_ACK) |                    \
   (1ull << VHU_PROTO_CONFIG) | (1ull << VHU_PROTO_INFLIGHT_SHMFD))
#define VHU_MAX_FDS 8
#define VHU_MAX_MEM_REGIONS 8
#define VHU_VRING_NOFD 0x100u
#define VHU_VRING_INDEX 0xffu
#define VHU_CONFIG_MAX 256
#define VHU_HDR 12

struct vhu_region_desc {
  uint64_t gpa, size, uva, mmap_offset;
};
struct vhu_state_desc {
  uint32_t index, num;
};
struct vhu_addr_desc {
  uint32_t index, flags;
  uint64_t desc, used, avail, log;
};
struct vhu_config_desc {
  uint32_t offset, size, flags;
  uint8_t data[VHU_CONFIG_MAX];
};
struct vhu_inflight_desc {
  uint64_t mmap_size, mmap_offset;
  uint16_t num_queues, queue_size;
};

struct vhu_msg {
  uint32_t request, flags, size;
  union {
    uint64_t u64;
    struct vhu_state_desc state;
    struct vhu_addr_desc addr;
    struct {
      uint32_t nregions, padding;
      struct vhu_region_desc r[VHU_MAX_MEM_REGIONS];
    } mem;
    struct vhu_config_desc config;
    struct vhu_inflight_desc inflight;
    uint8_t raw[512];
  } p;
  int fds[VHU_MAX_FDS];
  unsigned nfds;
};

struct vhu_dev;

struct vhu_ring {
  struct vhu_dev *dev;
  unsigned index;
  uint16_t num, base;
  bool addr_set, enabled, started, broken;
  uint64_t desc_uva, avail_uva, used_uva;
  int kick_fd, call_fd, stop_fd;
  pthread_mutex_t call_lock; /* call_fd against completions */
  pthread_t thread;
  struct vblk_queue q;
  uint16_t *resubmit; /* heads recovered from the inflight region */
  unsigned nresubmit;
};

struct vhu_dev {
  const struct vhu_options *o;
  struct vblk_dev blk;
  int sock;
  uint64_t features, protocol;
  struct vq_mem mem;
  void *maps[VHU_MAX_MEM_REGIONS];
  size_t map_len[VHU_MAX_MEM_REGIONS];
  struct vhu_ring rings[VHU_MAX_QUEUES];
  void *inflight; /* the shared inflight region, or NULL */
  size_t inflight_len;
  uint16_t inflight_queues, inflight_qsize;
};

/* ---- socket I/O ---- */

static void close_fds(struct vhu_msg *m) {
  for (unsigned i = 0; i < m->nfds; i++)
    if (m->fds[i] >= 0)
      close(m->fds[i]);
  m->nfds = 0;
}

/* Take the message's only file descriptor (or -1). */
static int take_fd(struct vhu_msg *m) {
  if (m->nfds != 1)
    return -1;
  int fd = m->fds[0];
  m->fds[0] = -1;
  return fd;
}

static void collect_fds(struct msghdr *mh, struct vhu_msg *m) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int *fds = (int *)CMSG_DATA(c);
    for (size_t i = 0; i < n; i++) {
      if (m->nfds < VHU_MAX_FDS)
        m->fds[m->nfds++] = fds[i];
      else
        close(fds[i]);
    }
  }
}

static int read_full(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Receive one message.  Returns 0, or -1 when the front end is gone or
 * broke the framing. */
static int recv_msg(int sock, struct vhu_msg *m) {
  m->nfds = 0;
  union {
    char buf[CMSG_SPACE(VHU_MAX_FDS * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {m, VHU_HDR};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = ctl.buf,
                      .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n <= 0)
    return -1;
  collect_fds(&mh, m);
  if (mh.msg_flags & MSG_CTRUNC)
    log_warn("vhost: too many file descriptors in one message");
  if ((n < VHU_HDR && read_full(sock, (uint8_t *)m + n, VHU_HDR - (size_t)n)) ||
      m->size > sizeof m->p) {
    if (m->size > sizeof m->p)
      log_error("vhost: message %u of %u bytes is too large", m->request,
                m->size);
    close_fds(m);
    return -1;
  }
  if (read_full(sock, &m->p, m->size) < 0) {
    close_fds(m);
    return -1;
  }
  return 0;
}

static int send_reply(int sock, struct vhu_msg *m, uint32_t size, int fd) {
  m->flags = VHU_VERSION | VHU_FLAG_REPLY;
  m->size = size;
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  /* The payload follows the 12-byte header directly on the wire. */
  struct iovec iov[2] = {{m, VHU_HDR}, {&m->p, size}};
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
  if (fd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)(VHU_HDR + size) ? 0 : -1;
}

static int reply_u64(struct vhu_dev *d, struct vhu_msg *m, uint64_t v) {
  m->p.u64 = v;
  return send_reply(d->sock, m, sizeof m->p.u64, -1);
}

/* ---- rings ---- */

static void ring_notify(void *opaque) {
  struct vhu_ring *r = opaque;
  pthread_mutex_lock(&r->call_lock);
  if (r->call_fd >= 0 && eventfd_write(r->call_fd, 1) < 0)
    log_debug("vhost queue %u: call: %s", r->index, strerror(errno));
  pthread_mutex_unlock(&r->call_lock);
}

static void *ring_thread(void *arg) {
  struct vhu_ring *r = arg;
  if (r->nresubmit) {
    log_info("vhost queue %u: resubmitting %u request(s) in flight before "
             "the restart",
             r->index, r->nresubmit);
    vblk_queue_resubmit(&r->q, r->resubmit, r->nresubmit);
  }
  bool ok = vblk_queue_process(&r->q);
  struct pollfd fds[2] = {{r->stop_fd, POLLIN, 0}, {r->kick_fd, POLLIN, 0}};
  for (;;) {
    /* A broken ring waits for the stop that a device reset brings. */
    int n = poll(fds, ok ? 2 : 1, -1);
    if (n < 0 && errno != EINTR)
      break;
    if (fds[0].revents)
      break;
    if (ok && fds[1].revents) {
      eventfd_t v;
      if (eventfd_read(r->kick_fd, &v) < 0 && errno != EAGAIN)
        break;
      ok = vblk_queue_process(&r->q);
    }
  }
  return NULL;
}

static void ring_reset(struct vhu_ring *r) {
  pthread_mutex_lock(&r->call_lock);
  if (r->call_fd >= 0)
    close(r->call_fd);
  r->call_fd = -1;
  pthread_mutex_unlock(&r->call_lock);
  if (r->kick_fd >= 0)
    close(r->kick_fd);
  r->kick_fd = -1;
  r->num = 0;
  r->base = 0;
  r->addr_set = r->enabled = r->broken = false;
}

/* Stop the ring's thread and wait for its requests; base becomes where
 * the next start continues. */
static void ring_stop(struct vhu_ring *r) {
  if (!r->started)
    return;
  eventfd_write(r->stop_fd, 1);
  pthread_join(r->thread, NULL);
  close(r->stop_fd);
  r->stop_fd = -1;
  vblk_queue_drain(&r->q);
  r->base = r->q.vq.last_avail;
  log_debug("vhost queue %u: stopped at %u (%llu requests, %llu failed)",
            r->index, r->base, (unsigned long long)r->q.completed,
            (unsigned long long)r->q.errors);
  if (r->q.abandoned)
    log_info("vhost queue %u: %llu request(s) cancelled with the front end "
             "that left them; the next one submits them again",
             r->index, (unsigned long long)r->q.abandoned);
  vblk_queue_fini(&r->q);
  vq_fini(&r->q.vq);
  free(r->resubmit);
  r->resubmit = NULL;
  r->nresubmit = 0;
  r->started = false;
}

static void *ring_part(struct vhu_dev *d, struct vhu_ring *r, uint64_t uva,
                       size_t len, const char *what) {
  void *p = vq_mem_uva(&d->mem, uva, len);
  if (!p)
    log_error("vhost queue %u: %s ring at 0x%llx is not in guest memory",
              r->index, what, (unsigned long long)uva);
  return p;
}

/* This queue's part of the inflight region, if there is one that fits. */
static struct vq_inflight *ring_inflight(struct vhu_dev *d,
                                         struct vhu_ring *r) {
  if (!d->inflight || r->index >= d->inflight_queues)
    return NULL;
  if (d->inflight_qsize != r->num) {
    log_warn("vhost queue %u: inflight region for %u entries, ring has %u: "
             "not tracking",
             r->index, d->inflight_qsize, r->num);
    return NULL;
  }
  size_t per = vq_inflight_queue_bytes(d->inflight_qsize);
  return (struct vq_inflight *)((uint8_t *)d->inflight + per * r->index);
}

static int ring_start(struct vhu_dev *d, struct vhu_ring *r) {
  if (r->started || r->broken || !r->addr_set || !r->num || r->kick_fd < 0 ||
      !d->mem.n)
    return 0;
  size_t dl, al, ul;
  vq_ring_bytes(r->num, &dl, &al, &ul);
  void *desc = ring_part(d, r, r->desc_uva, dl, "descriptor");
  void *avail = ring_part(d, r, r->avail_uva, al, "available");
  void *used = ring_part(d, r, r->used_uva, ul, "used");
  if (!desc || !avail || !used)
    return -1;
  int e = vq_init(&r->q.vq, &d->mem, r->num, desc, avail, used, r->base,
                  d->features & (1ull << VIRTIO_RING_F_EVENT_IDX),
                  d->features & (1ull << VIRTIO_RING_F_INDIRECT_DESC));
  if (e < 0) {
    log_error("vhost queue %u: cannot set up the ring: %s", r->index,
              strerror(-e));
    return -1;
  }
  struct vq_inflight *inf = ring_inflight(d, r);
  if ((inf &&
       vq_inflight_attach(&r->q.vq, inf, &r->resubmit, &r->nresubmit) < 0) ||
      vblk_queue_init(&r->q, &d->blk, r->index, ring_notify, r) < 0) {
    log_error("vhost queue %u: out of memory", r->index);
    free(r->resubmit);
    r->resubmit = NULL;
    vq_fini(&r->q.vq);
    return -1;
  }
  r->stop_fd = eventfd(0, EFD_CLOEXEC);
  if (r->stop_fd < 0 || pthread_create(&r->thread, NULL, ring_thread, r)) {
    log_error("vhost queue %u: cannot start its thread", r->index);
    if (r->stop_fd >= 0)
      close(r->stop_fd);
    vblk_queue_fini(&r->q);
    vq_fini(&r->q.vq);
    free(r->resubmit);
    r->resubmit = NULL;
    return -1;
  }
  r->started = true;
  log_debug("vhost queue %u: started, %u entries from %u", r->index, r->num,
            r->q.vq.last_avail);
  return 0;
}

/* ---- memory ---- */

static void unmap_memory(struct vhu_dev *d) {
  for (unsigned i = 0; i < d->mem.n; i++)
    munmap(d->maps[i], d->map_len[i]);
  memset(&d->mem, 0, sizeof d->mem);
}

/* Whether [0, END) of the file FD is there: a mapping past the end of a
 * file faults (SIGBUS) when touched, so a front end must not get one by
 * declaring a region larger than its memory.  Other descriptors (devices)
 * have no size to check. */
static bool within_file(int fd, uint64_t end) {
  struct stat st;
  if (fstat(fd, &st) < 0)
    return false;
  return !S_ISREG(st.st_mode) || end <= (uint64_t)st.st_size;
}

static int map_region(struct vhu_dev *d, const struct vhu_region_desc *rd,
                      int fd) {
  unsigned i = d->mem.n;
  size_t len = rd->size + rd->mmap_offset;
  if (!rd->size || len < rd->size || !within_file(fd, len)) {
    log_error("vhost: memory region of %llu bytes at offset %llu refused",
              (unsigned long long)rd->size,
              (unsigned long long)rd->mmap_offset);
    return -1;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    log_error("vhost: cannot map guest memory (%llu bytes): %s",
              (unsigned long long)len, strerror(errno));
    return -1;
  }
  if (vq_mem_add(&d->mem, rd->gpa, rd->size, rd->uva,
                 (uint8_t *)p + rd->mmap_offset) < 0) {
    munmap(p, len);
    log_error("vhost: memory region at guest 0x%llx refused",
              (unsigned long long)rd->gpa);
    return -1;
  }
  d->maps[i] = p;
  d->map_len[i] = len;
  return 0;
}

static int set_mem_table(struct vhu_dev *d, struct vhu_msg *m) {
  uint32_t n = m->p.mem.nregions;
  if (n > VHU_MAX_MEM_REGIONS || m->size < 8 + n * sizeof m->p.mem.r[0] ||
      m->nfds != n) {
    log_error("vhost: memory table of %u regions with %u descriptors refused",
              n, m->nfds);
    return -1;
  }
  /* Rings point into the old table: stop them, swap, start them again. */
  bool was[VHU_MAX_QUEUES];
  for (unsigned q = 0; q < VHU_MAX_QUEUES; q++) {
    was[q] = d->rings[q].started;
    ring_stop(&d->rings[q]);
  }
  unmap_memory(d);
  int ret = 0;
  for (uint32_t i = 0; i < n && !ret; i++)
    ret = map_region(d, &m->p.mem.r[i], m->fds[i]);
  if (ret)
    unmap_memory(d);
  else
    for (unsigned q = 0; q < VHU_MAX_QUEUES; q++)
      if (was[q])
        ring_start(d, &d->rings[q]);
  log_debug("vhost: memory table of %u regions", n);
  return ret;
}

/* ---- inflight region ---- */

static void unmap_inflight(struct vhu_dev *d) {
  if (d->inflight)
    munmap(d->inflight, d->inflight_len);
  d->inflight = NULL;
  d->inflight_len = 0;
}

static bool inflight_shape_ok(const struct vhu_inflight_desc *in) {
  uint16_t qs = in->queue_size;
  return in->num_queues && in->num_queues <= VHU_MAX_QUEUES && qs &&
         !(qs & (qs - 1));
}

static int get_inflight_fd(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_inflight_desc *in = &m->p.inflight;
  if (m->size < sizeof *in || !inflight_shape_ok(in)) {
    log_error("vhost: inflight region for %u queues of %u refused",
              in->num_queues, in->queue_size);
    return send_reply(d->sock, m, 0, -1);
  }
  size_t len = vq_inflight_queue_bytes(in->queue_size) * in->num_queues;
  int fd = memfd_create("blockport-inflight", MFD_CLOEXEC);
  void *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)len) == 0)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    log_error("vhost: inflight region: %s", strerror(errno));
    if (fd >= 0)
      close(fd);
    return send_reply(d->sock, m, 0, -1);
  }
  unmap_inflight(d);
  d->inflight = p;
  d->inflight_len = len;
  d->inflight_queues = in->num_queues;
  d->inflight_qsize = in->queue_size;
  in->mmap_size = len;
  in->mmap_offset = 0;
  int r = send_reply(d->sock, m, sizeof *in, fd);
  close(fd);
  return r;
}

static int set_inflight_fd(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_inflight_desc *in = &m->p.inflight;
  int fd = take_fd(m);
  if (m->size < sizeof *in || fd < 0 || !inflight_shape_ok(in) ||
      in->mmap_size <
          vq_inflight_queue_bytes(in->queue_size) * in->num_queues ||
      in->mmap_offset + in->mmap_size < in->mmap_size ||
      !within_file(fd, in->mmap_offset + in->mmap_size)) {
    log_error("vhost: inflight region refused");
    if (fd >= 0)
      close(fd);
    return -1;
  }
  void *p = mmap(NULL, in->mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 (off_t)in->mmap_offset);
  close(fd);
  if (p == MAP_FAILED) {
    log_error("vhost: cannot map the inflight region: %s", strerror(errno));
    return -1;
  }
  unmap_inflight(d);
  d->inflight = p;
  d->inflight_len = in->mmap_size;
  d->inflight_queues = in->num_queues;
  d->inflight_qsize = in->queue_size;
  return 0;
}

/* ---- messages ---- */

static struct vhu_ring *ring_of(struct vhu_dev *d, uint32_t index) {
  if (index >= d->o->queues) {
    log_error("vhost: queue %u does not exist (%u queues)", index,
              d->o->queues);
    return NULL;
  }
  return &d->rings[index];
}

static int get_config(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_config_desc *c = &m->p.config;
  if (m->size < VHU_HDR || c->size > VHU_CONFIG_MAX ||
      c->offset > VHU_CONFIG_MAX - c->size) {
    log_error("vhost: config space read of %u bytes at %u refused", c->size,
              c->offset);
    return send_reply(d->sock, m, 0, -1);
  }
  uint8_t space[VHU_CONFIG_MAX] = {0};
  vblk_config(&d->blk, space);
  memcpy(c->data, space + c->offset, c->size);
  return send_reply(d->sock, m, VHU_HDR + c->size, -1);
}

static int set_vring_fd(struct vhu_dev *d, struct vhu_msg *m) {
  uint64_t v = m->p.u64;
  struct vhu_ring *r = ring_of(d, v & VHU_VRING_INDEX);
  int fd = take_fd(m);
  if (!r || (!(v & VHU_VRING_NOFD) && fd < 0)) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  if (m->request == VHU_SET_VRING_ERR) {
    if (fd >= 0)
      close(fd); /* we never report ring errors this way */
    return 0;
  }
  if (m->request == VHU_SET_VRING_CALL) {
    pthread_mutex_lock(&r->call_lock);
    if (r->call_fd >= 0)
      close(r->call_fd);
    r->call_fd = fd;
    /* Completions of resubmitted requests may have found no call fd: a
     * spurious interrupt is harmless, a lost one stalls the guest. */
    if (r->started && fd >= 0)
      eventfd_write(fd, 1);
    pthread_mutex_unlock(&r->call_lock);
    return 0;
  }
  if (fd < 0) {
    log_error("vhost queue %u: polling without a kick eventfd is not "
              "supported",
              r->index);
    return -1;
  }
  ring_stop(r);
  if (r->kick_fd >= 0)
    close(r->kick_fd);
  r->kick_fd = fd;
  return ring_start(d, r);
}

static int set_vring(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_ring *r = ring_of(d, m->p.state.index);
  if (!r)
    return -1;
  uint32_t v = m->p.state.num;
  switch (m->request) {
  case VHU_SET_VRING_NUM:
    if (r->started || !v || v > VQ_MAX_SIZE || (v & (v - 1))) {
      log_error("vhost queue %u: size %u refused", r->index, v);
      return -1;
    }
    r->num = (uint16_t)v;
    return 0;
  case VHU_SET_VRING_BASE:
    if (r->started || v > UINT16_MAX)
      return -1;
    r->base = (uint16_t)v;
    return 0;
  case VHU_SET_VRING_ENABLE:
    /* Requests are processed once the ring starts, enabled or not, as
     * libvhost-user does: QEMU 7.2 does not always enable block rings. */
    r->enabled = v != 0;
    return 0;
  }
  return -1;
}

static int set_vring_addr(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_ring *r = ring_of(d, m->p.addr.index);
  if (!r)
    return -1;
  if (r->started) /* a change of logging flags only: no logging here */
    return 0;
  r->desc_uva = m->p.addr.desc;
  r->avail_uva = m->p.addr.avail;
  r->used_uva = m->p.addr.used;
  r->addr_set = true;
  return 0;
}

static int get_vring_base(struct vhu_dev *d, struct vhu_msg *m) {
  struct vhu_ring *r = ring_of(d, m->p.state.index);
  if (!r)
    return -1;
  ring_stop(r);
  m->p.state.num = r->base;
  ring_reset(r);
  return send_reply(d->sock, m, sizeof m->p.state, -1);
}

/* Messages that bring their own reply return its send status; the rest
 * return 0 or -1 for REPLY_ACK. */
static int handle(struct vhu_dev *d, struct vhu_msg *m, bool *replied) {
  *replied = true;
  switch (m->request) {
  case VHU_GET_FEATURES:
    return reply_u64(d, m, d->blk.features | (1ull << VHU_F_PROTOCOL_FEATURES));
  case VHU_GET_PROTOCOL_FEATURES: return reply_u64(d, m, VHU_PROTOCOL_FEATURES);
  case VHU_GET_QUEUE_NUM: return reply_u64(d, m, d->o->queues);
  case VHU_GET_VRING_BASE: return get_vring_base(d, m);
  case VHU_GET_CONFIG: return get_config(d, m);
  case VHU_GET_INFLIGHT_FD: return get_inflight_fd(d, m);
  }
  *replied = false;
  switch (m->request) {
  case VHU_SET_FEATURES:
    d->features =
        m->p.u64 & (d->blk.features | 1ull << VHU_F_PROTOCOL_FEATURES);
    d->blk.acked = d->features;
    return 0;
  case VHU_SET_PROTOCOL_FEATURES:
    d->protocol = m->p.u64 & VHU_PROTOCOL_FEATURES;
    return 0;
  case VHU_SET_OWNER: return 0;
  case VHU_RESET_OWNER:
    for (unsigned q = 0; q < VHU_MAX_QUEUES; q++)
      ring_stop(&d->rings[q]);
    return 0;
  case VHU_SET_MEM_TABLE: return set_mem_table(d, m);
  case VHU_SET_VRING_NUM:
  case VHU_SET_VRING_BASE:
  case VHU_SET_VRING_ENABLE: return set_vring(d, m);
  case VHU_SET_VRING_ADDR: return set_vring_addr(d, m);
  case VHU_SET_VRING_KICK:
  case VHU_SET_VRING_CALL:
  case VHU_SET_VRING_ERR: return set_vring_fd(d, m);
  case VHU_SET_CONFIG: return 0; /* nothing writable: no CONFIG_WCE */
  case VHU_SET_INFLIGHT_FD: return set_inflight_fd(d, m);
  }
  log_warn("vhost: request %u not supported", m->request);
  return -1;
}

static bool size_ok(const struct vhu_msg *m) {
  switch (m->request) {
  case VHU_SET_FEATURES:
  case VHU_SET_PROTOCOL_FEATURES:
  case VHU_SET_VRING_KICK:
  case VHU_SET_VRING_CALL:
  case VHU_SET_VRING_ERR: return m->size >= sizeof m->p.u64;
  case VHU_SET_VRING_NUM:
  case VHU_SET_VRING_BASE:
  case VHU_GET_VRING_BASE:
  case VHU_SET_VRING_ENABLE: return m->size >= sizeof m->p.state;
  case VHU_SET_VRING_ADDR: return m->size >= sizeof m->p.addr;
  case VHU_SET_MEM_TABLE: return m->size >= 8;
  }
  return true;
}

/* Serve one front end until it goes away (returns 0) or STOP_FD fires
 * (returns 1). */
static int serve_conn(struct vhu_dev *d, int stop_fd) {
  struct vhu_msg *m = malloc(sizeof *m);
  if (!m)
    return -1;
  int ret = 0;
  for (;;) {
    struct pollfd fds[2] = {{d->sock, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR)
      break;
    if (fds[1].revents) {
      ret = 1;
      break;
    }
    if (!fds[0].revents)
      continue;
    memset(m, 0, offsetof(struct vhu_msg, p));
    if (recv_msg(d->sock, m) < 0)
      break;
    log_debug("vhost: request %u, %u bytes, %u fds", m->request, m->size,
              m->nfds);
    bool replied = false;
    int r = size_ok(m) ? handle(d, m, &replied) : -1;
    close_fds(m);
    if (replied && r < 0)
      break; /* the reply could not be sent */
    if (!replied && (m->flags & VHU_FLAG_NEED_REPLY) &&
        (d->protocol & (1ull << VHU_PROTO_REPLY_ACK)) &&
        reply_u64(d, m, r < 0) < 0)
      break;
  }
  free(m);
  return ret;
}

static void dev_reset(struct vhu_dev *d) {
  for (unsigned q = 0; q < VHU_MAX_QUEUES; q++) {
    ring_stop(&d->rings[q]);
    ring_reset(&d->rings[q]);
  }
  unmap_memory(d);
  unmap_inflight(d);
  d->features = d->protocol = 0;
  d->blk.acked = 0;
}

/* One front end, on a connection of its own to the device: when it goes
 * away, what it left in flight is cancelled rather than waited for (a
 * request to a lost NBD server could take its whole time-out).  With an
 * inflight region, the next front end submits those requests again. */
static int front_end_session(struct vhu_dev *d, int stop_fd) {
  struct bd *bd = d->blk.bd;
  d->blk.conn = bd_conn_open(bd, "", d->blk.readonly);
  if (!d->blk.conn) {
    log_error("vhost: the device refused a connection: %s", bd_errmsg());
    return 0;
  }
  int r = serve_conn(d, stop_fd);
  if (r == 0)
    bd_conn_cancel(bd, d->blk.conn);
  dev_reset(d); /* waits for the requests */
  bd_conn_close(bd, d->blk.conn);
  d->blk.conn = NULL;
  return r;
}

/* A socket file nobody listens on any more (a previous run's): it may be
 * replaced.  One that answers belongs to a running back end. */
static bool stale_socket(const char *path, const struct sockaddr_un *sa) {
  struct stat st;
  if (lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
    return false;
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0)
    return false;
  bool stale = connect(c, (const struct sockaddr *)sa, sizeof *sa) < 0 &&
               errno == ECONNREFUSED;
  close(c);
  return stale;
}

int vhu_listen(const char *path) {
  struct sockaddr_un sa;
  if (!unix_socket_addr(path, &sa)) {
    bd_set_error("--socket %s: socket path too long (at most %zu bytes)", path,
                 sizeof sa.sun_path - 1);
    return -ENAMETOOLONG;
  }
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s >= 0 && stale_socket(path, &sa))
    unlink(path);
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      listen(s, 1) < 0) {
    int e = errno;
    bd_set_error("--socket %s: %s", path,
                 e == ENOENT ? "no such directory" : strerror(e));
    if (s >= 0)
      close(s);
    return -e;
  }
  return s;
}

void vhu_unlisten(int lsock, const char *path) {
  close(lsock);
  unlink(path);
}

static int accept_one(int lsock, int stop_fd) {
  for (;;) {
    struct pollfd fds[2] = {{lsock, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR)
      return -1;
    if (fds[1].revents)
      return -1;
    if (!fds[0].revents)
      continue;
    int s = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
    if (s >= 0)
      return s;
    if (errno != EINTR && errno != ECONNABORTED)
      return -1;
  }
}

int vhu_serve(struct bd *bd, const struct vhu_options *o, int lsock,
              int stop_fd, void (*ready)(void *), void *opaque) {
  struct vhu_dev *d = NULL;
  int err = 0;
  if (!o->queues || o->queues > VHU_MAX_QUEUES) {
    bd_set_error("vhost: between 1 and %u queues", VHU_MAX_QUEUES);
    err = -EINVAL;
  } else if (!(d = calloc(1, sizeof *d))) {
    bd_set_error("vhost: %s", strerror(ENOMEM));
    err = -ENOMEM;
  }
  if (err) {
    vhu_unlisten(lsock, o->socket_path);
    return err;
  }
  d->o = o;
  vblk_dev_init(&d->blk, bd, o->readonly, (uint16_t)o->queues, 128, o->serial);
  d->blk.reqs = o->reqs;
  for (unsigned q = 0; q < VHU_MAX_QUEUES; q++) {
    struct vhu_ring *r = &d->rings[q];
    r->dev = d;
    r->index = q;
    r->kick_fd = r->call_fd = r->stop_fd = -1;
    pthread_mutex_init(&r->call_lock, NULL);
  }
  log_info("vhost: serving %s (%llu bytes%s) on %s, %u queue(s)",
           bd->description, (unsigned long long)bd->size,
           d->blk.readonly ? ", read-only" : "", o->socket_path, o->queues);
  if (ready)
    ready(opaque);
  for (;;) {
    d->sock = accept_one(lsock, stop_fd);
    if (d->sock < 0)
      break;
    log_info("vhost: front end connected");
    int r = front_end_session(d, stop_fd);
    close(d->sock);
    log_info("vhost: front end %s", r == 1 ? "closed on request" : "gone");
    if (r != 0 || o->once)
      break;
  }
  vhu_unlisten(lsock, o->socket_path);
  for (unsigned q = 0; q < VHU_MAX_QUEUES; q++)
    pthread_mutex_destroy(&d->rings[q].call_lock);
  free(d);
  return 0;
}
