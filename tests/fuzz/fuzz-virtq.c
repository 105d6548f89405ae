/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: descriptor-chain parsing and virtio-blk requests
 * (frontend/virtq.c, frontend/virtio-blk.c).
 *
 * The input is a tiny guest: four bytes of parameters (queue size, ring
 * features, starting avail index, disk size), then the contents of 32 KiB
 * of guest memory in two 16 KiB regions that are adjacent in guest
 * addresses but not in this process.  The rings sit at fixed addresses in
 * the first region; everything in them comes from the input.  Every chain
 * popped must only point into the regions, every parsed request must stay
 * inside the disk, and inflight recovery over a region taken from the
 * input must return distinct heads inside the ring. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/virtio-blk.h"
#include "frontend/virtq.h"
#include "fuzz-check.h"

#define REGION 0x4000u
#define DESC_GPA 0x0u
#define AVAIL_GPA 0x400u
#define USED_GPA 0x600u /* room for 64 entries of each ring */

static uint8_t *mem_a, *mem_b;

static bool inside(const void *p, size_t len) {
  const uint8_t *b = p;
  return (b >= mem_a && b + len <= mem_a + REGION) ||
         (b >= mem_b && b + len <= mem_b + REGION);
}

static void check_chain(const struct vq_chain *c) {
  CHECK(c->n_out + c->n_in <= VQ_MAX_IOV);
  uint64_t out = 0, in = 0;
  for (unsigned i = 0; i < c->n_out + c->n_in; i++) {
    CHECK(c->iov[i].iov_len > 0);
    CHECK(inside(c->iov[i].iov_base, c->iov[i].iov_len));
    *(i < c->n_out ? &out : &in) += c->iov[i].iov_len;
  }
  if (!c->error) {
    CHECK(out == c->out_bytes);
    CHECK(in == c->in_bytes);
  }
}

static void check_request(const struct vblk_dev *dev,
                          const struct vq_chain *c) {
  static struct iovec iov[VQ_MAX_IOV];
  struct vblk_parsed p;
  vblk_parse(dev, c, iov, &p);
  if (p.status_ptr)
    CHECK(inside(p.status_ptr, 1));
  uint64_t disk = dev->capacity * VBLK_SECTOR, data = 0;
  switch (p.kind) {
  case VBLK_READ:
  case VBLK_WRITE:
    CHECK(p.offset <= disk && p.length <= disk - p.offset);
    CHECK(p.length % dev->blk_size == 0);
    /* fall through */
  case VBLK_GET_ID:
    for (unsigned i = 0; i < p.niov; i++) {
      CHECK(inside(iov[i].iov_base, iov[i].iov_len));
      data += iov[i].iov_len;
    }
    CHECK(data == p.length);
    break;
  case VBLK_DISCARD:
  case VBLK_ZEROES:
    CHECK(p.nranges >= 1 && p.nranges <= VBLK_MAX_DWZ_SEG);
    for (unsigned i = 0; i < p.nranges; i++)
      CHECK(p.ranges[i].offset <= disk &&
            p.ranges[i].length <= disk - p.ranges[i].offset);
    break;
  case VBLK_DONE: CHECK(p.status != 0 || p.why == NULL); break;
  case VBLK_FLUSH: break;
  }
}

static void check_inflight(struct virtq *vq, const uint8_t *data, size_t size) {
  size_t bytes = vq_inflight_queue_bytes(vq->num);
  struct vq_inflight *r = calloc(1, bytes);
  CHECK(r);
  memcpy(r, data, size < bytes ? size : bytes);
  uint16_t *heads;
  unsigned n;
  CHECK(vq_inflight_attach(vq, r, &heads, &n) == 0);
  CHECK(n <= vq->num);
  static uint8_t seen[64];
  memset(seen, 0, sizeof seen);
  for (unsigned i = 0; i < n; i++) {
    CHECK(heads[i] < vq->num && !seen[heads[i]]);
    seen[heads[i]] = 1;
  }
  free(heads);
  vq->inflight = NULL;
  free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  uint16_t num = (uint16_t)(1u << (data[0] % 7)); /* 1..64 */
  bool event_idx = data[1] & 1, indirect = data[1] & 2;
  uint16_t last_avail = data[2];
  uint64_t disk_size = (uint64_t)data[3] << 12;
  bool can_trim = data[0] & 0x80, readonly = data[1] & 4;
  uint32_t min_block = 1u << (data[1] >> 4);
  data += 4;
  size -= 4;

  mem_a = calloc(1, REGION);
  mem_b = calloc(1, REGION);
  CHECK(mem_a && mem_b);
  size_t na = size < REGION ? size : REGION;
  memcpy(mem_a, data, na);
  if (size > REGION)
    memcpy(mem_b, data + REGION,
           size - REGION < REGION ? size - REGION : REGION);

  struct vq_mem mem = {0};
  CHECK(vq_mem_add(&mem, 0, REGION, 0x10000000, mem_a) == 0);
  CHECK(vq_mem_add(&mem, REGION, REGION, 0x20000000, mem_b) == 0);
  struct virtq vq;
  CHECK(vq_init(&vq, &mem, num, mem_a + DESC_GPA, mem_a + AVAIL_GPA,
                mem_a + USED_GPA, last_avail, event_idx, indirect) == 0);

  struct bd bd = {0};
  bd.size = disk_size;
  bd.caps = (struct bd_caps){.can_trim = can_trim,
                             .can_flush = true,
                             .min_block = min_block,
                             .pref_block = 4096,
                             .max_block = 1u << 20};
  struct vblk_dev dev;
  vblk_dev_init(&dev, &bd, readonly, 1, num, "fuzz");

  static struct vq_chain chain;
  for (unsigned i = 0; i < 2u * num; i++) {
    int r = vq_pop(&vq, &chain);
    if (r <= 0) {
      if (r == 0)
        vq_enable_kicks(&vq);
      break;
    }
    CHECK(chain.head < num);
    check_chain(&chain);
    check_request(&dev, &chain);
    vq_push(&vq, chain.head, (uint32_t)chain.in_bytes);
    vq_should_notify(&vq);
  }
  /* Inflight state from the tail of the second region. */
  check_inflight(&vq, mem_b + REGION / 2, REGION / 2);
  vq_fini(&vq);
  free(mem_a);
  free(mem_b);
  return 0;
}
