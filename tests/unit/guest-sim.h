/* SPDX-License-Identifier: BSD-3-Clause */
/* A simulated guest for the virtqueue and virtio-blk tests: memory in a
 * memfd mapped as three regions, as a vhost-user front end shares it (each
 * region at a non-zero offset in the file, the first two adjacent in guest
 * physical addresses but not in this process, the third far above), and a
 * driver side that writes descriptors and avail entries and reads used
 * ones. */
#ifndef BLOCKPORT_TEST_GUEST_SIM_H
#define BLOCKPORT_TEST_GUEST_SIM_H

#include <criterion/criterion.h>
#include <endian.h>
#include <linux/virtio_ring.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "frontend/virtq.h"

#define SIM_REGION (1u << 20)
#define SIM_HIGH 0x40000000ull    /* guest address of the third region */
#define SIM_UVA 0x7f0000000000ull /* front-end addresses: GPA + this */

struct sim_guest {
  int fd;
  struct vq_mem mem;
  void *map[3];
};

/* Region i: guest [gpa[i], +1 MiB) = file [off[i], +1 MiB). */
static inline void sim_guest_init(struct sim_guest *g) {
  static const uint64_t gpa[3] = {0, SIM_REGION, SIM_HIGH};
  static const uint64_t off[3] = {3 * SIM_REGION, SIM_REGION, 5 * SIM_REGION};
  memset(g, 0, sizeof *g);
  g->fd = memfd_create("guest", MFD_CLOEXEC);
  cr_assert(g->fd >= 0);
  cr_assert_eq(ftruncate(g->fd, 6 * SIM_REGION), 0);
  for (int i = 0; i < 3; i++) {
    g->map[i] = mmap(NULL, SIM_REGION, PROT_READ | PROT_WRITE, MAP_SHARED,
                     g->fd, (off_t)off[i]);
    cr_assert(g->map[i] != MAP_FAILED);
    cr_assert_eq(
        vq_mem_add(&g->mem, gpa[i], SIM_REGION, gpa[i] + SIM_UVA, g->map[i]),
        0);
  }
}

static inline void sim_guest_fini(struct sim_guest *g) {
  for (int i = 0; i < 3; i++)
    munmap(g->map[i], SIM_REGION);
  close(g->fd);
}

static inline void *sim_ptr(struct sim_guest *g, uint64_t gpa, uint64_t len) {
  void *p = vq_mem_gpa(&g->mem, gpa, len);
  cr_assert(p, "guest address 0x%llx not mapped", (unsigned long long)gpa);
  return p;
}

/* Write or read guest memory across regions. */
static inline void sim_write(struct sim_guest *g, uint64_t gpa, const void *src,
                             size_t len) {
  const uint8_t *s = src;
  for (size_t i = 0; i < len; i++)
    *(uint8_t *)sim_ptr(g, gpa + i, 1) = s[i];
}
static inline void sim_read(struct sim_guest *g, uint64_t gpa, void *dst,
                            size_t len) {
  uint8_t *d = dst;
  for (size_t i = 0; i < len; i++)
    d[i] = *(uint8_t *)sim_ptr(g, gpa + i, 1);
}

/* A split ring in the first region. */
struct sim_ring {
  struct sim_guest *g;
  uint16_t num;
  uint64_t desc, avail, used;
  uint16_t avail_idx;
};

static inline void sim_ring_init(struct sim_ring *r, struct sim_guest *g,
                                 uint16_t num) {
  r->g = g;
  r->num = num;
  r->desc = 0x1000;
  r->avail = r->desc + 16ull * num;
  r->used = (r->avail + 6 + 2ull * num + 3) & ~3ull;
  r->avail_idx = 0;
  memset(sim_ptr(g, 0, 0x10000), 0, 0x10000);
}

static inline int sim_vq_init(struct sim_ring *r, struct virtq *vq,
                              bool event_idx, bool indirect) {
  size_t d, a, u;
  vq_ring_bytes(r->num, &d, &a, &u);
  return vq_init(vq, &r->g->mem, r->num, sim_ptr(r->g, r->desc, d),
                 sim_ptr(r->g, r->avail, a), sim_ptr(r->g, r->used, u), 0,
                 event_idx, indirect);
}

static inline void sim_desc_at(struct sim_guest *g, uint64_t table, uint16_t i,
                               uint64_t addr, uint32_t len, uint16_t flags,
                               uint16_t next) {
  struct vring_desc d = {htole64(addr), htole32(len), htole16(flags),
                         htole16(next)};
  sim_write(g, table + 16ull * i, &d, sizeof d);
}

static inline void sim_desc(struct sim_ring *r, uint16_t i, uint64_t addr,
                            uint32_t len, uint16_t flags, uint16_t next) {
  sim_desc_at(r->g, r->desc, i, addr, len, flags, next);
}

static inline void sim_offer(struct sim_ring *r, uint16_t head) {
  uint16_t *ring = sim_ptr(r->g, r->avail + 4, 2ull * r->num);
  ring[r->avail_idx % r->num] = htole16(head);
  r->avail_idx++;
  uint16_t *idx = sim_ptr(r->g, r->avail + 2, 2);
  __atomic_store_n(idx, htole16(r->avail_idx), __ATOMIC_RELEASE);
}

static inline uint16_t sim_used_idx(struct sim_ring *r) {
  return le16toh(*(uint16_t *)sim_ptr(r->g, r->used + 2, 2));
}

static inline struct vring_used_elem sim_used(struct sim_ring *r, uint16_t k) {
  struct vring_used_elem e;
  sim_read(r->g, r->used + 4 + 8ull * (k % r->num), &e, sizeof e);
  e.id = le32toh(e.id);
  e.len = le32toh(e.len);
  return e;
}

/* The guest's used_event (avail->ring[num]) and the device's avail_event
 * (used->ring[num]). */
static inline void sim_set_used_event(struct sim_ring *r, uint16_t v) {
  *(uint16_t *)sim_ptr(r->g, r->avail + 4 + 2ull * r->num, 2) = htole16(v);
}
static inline uint16_t sim_avail_event(struct sim_ring *r) {
  return le16toh(*(uint16_t *)sim_ptr(r->g, r->used + 4 + 8ull * r->num, 2));
}

#endif
