/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for split virtqueues (frontend/virtq.c) over simulated guest
 * memory: normal, indirect, cross-region, looped, out-of-bounds,
 * zero-length and over-long chains; broken rings; event-idx notification
 * decisions; inflight tracking across a simulated restart. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "guest-sim.h"

#define BUF 0x20000ull /* data buffers from here on in region 0 */

static struct sim_guest g;
static struct sim_ring ring;
static struct virtq vq;
static struct vq_chain *c;

static void setup(void) {
  sim_guest_init(&g);
  sim_ring_init(&ring, &g, 8);
  cr_assert_eq(sim_vq_init(&ring, &vq, true, true), 0);
  c = malloc(sizeof *c);
  cr_assert(c);
}

static void teardown(void) {
  free(c);
  vq_fini(&vq);
  sim_guest_fini(&g);
}

TestSuite(virtq, .init = setup, .fini = teardown);

static enum vq_error pop_error(void) {
  cr_assert_eq(vq_pop(&vq, c), 1);
  return c->error;
}

Test(virtq, empty_ring_pops_nothing) {
  cr_expect_eq(vq_pop(&vq, c), 0);
}

Test(virtq, normal_chain) {
  sim_desc(&ring, 3, BUF, 16, VRING_DESC_F_NEXT, 5);
  sim_desc(&ring, 5, BUF + 0x1000, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
           1);
  sim_desc(&ring, 1, BUF + 0x3000, 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 3);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->head, 3);
  cr_expect_eq(c->n_out, 1);
  cr_expect_eq(c->n_in, 2);
  cr_expect_eq(c->out_bytes, 16);
  cr_expect_eq(c->in_bytes, 4097);
  cr_expect_eq(c->iov[0].iov_base, sim_ptr(&g, BUF, 16));
  cr_expect_eq(c->iov[1].iov_base, sim_ptr(&g, BUF + 0x1000, 4096));
  cr_expect_eq(c->iov[2].iov_base, sim_ptr(&g, BUF + 0x3000, 1));
  cr_expect_eq(vq_pop(&vq, c), 0);
}

Test(virtq, buffer_spanning_two_regions_is_split) {
  uint64_t addr = SIM_REGION - 100;
  sim_desc(&ring, 0, addr, 300, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_assert_eq(c->n_in, 2);
  cr_expect_eq(c->iov[0].iov_base, sim_ptr(&g, addr, 100));
  cr_expect_eq(c->iov[0].iov_len, 100);
  cr_expect_eq(c->iov[1].iov_base, sim_ptr(&g, SIM_REGION, 200));
  cr_expect_eq(c->iov[1].iov_len, 200);
  /* The regions are not adjacent in this process. */
  cr_expect_neq((uint8_t *)c->iov[0].iov_base + 100, c->iov[1].iov_base);
}

Test(virtq, buffer_in_high_region) {
  sim_desc(&ring, 0, SIM_HIGH + 4096, 512, 0, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->iov[0].iov_base, sim_ptr(&g, SIM_HIGH + 4096, 512));
}

Test(virtq, out_of_bounds_buffers) {
  const uint64_t bad[][2] = {
      {2 * SIM_REGION, 1},            /* in the hole */
      {2 * SIM_REGION - 10, 20},      /* runs into the hole */
      {SIM_HIGH + SIM_REGION - 1, 2}, /* past the last region */
      {UINT64_MAX - 5, 100},          /* wraps */
      {SIM_HIGH - 1, 2},              /* starts in the hole */
  };
  for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sim_desc(&ring, 0, bad[i][0], (uint32_t)bad[i][1], 0, 0);
    sim_offer(&ring, 0);
    cr_expect_eq(pop_error(), VQ_E_ADDR, "case %u", i);
  }
}

Test(virtq, zero_length_descriptor_is_skipped) {
  sim_desc(&ring, 0, BUF, 16, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, 0xdead00000000ull, 0, VRING_DESC_F_NEXT, 2);
  sim_desc(&ring, 2, BUF + 100, 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->n_out, 1);
  cr_expect_eq(c->n_in, 1);
}

Test(virtq, looped_chain) {
  sim_desc(&ring, 0, BUF, 16, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, BUF, 16, VRING_DESC_F_NEXT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_LONG);
  sim_desc(&ring, 2, BUF, 16, VRING_DESC_F_NEXT, 2); /* onto itself */
  sim_offer(&ring, 2);
  cr_expect_eq(pop_error(), VQ_E_LONG);
}

Test(virtq, next_out_of_range) {
  sim_desc(&ring, 0, BUF, 16, VRING_DESC_F_NEXT, 8);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_NEXT);
}

Test(virtq, readable_after_writable) {
  sim_desc(&ring, 0, BUF, 16, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, BUF, 16, 0, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_ORDER);
}

Test(virtq, indirect_chain) {
  uint64_t table = BUF + 0x8000;
  sim_desc_at(&g, table, 0, BUF, 16, VRING_DESC_F_NEXT, 2);
  sim_desc_at(&g, table, 2, SIM_REGION - 8, 16,
              VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
  sim_desc_at(&g, table, 1, BUF + 0x100, 1, VRING_DESC_F_WRITE, 0);
  sim_desc(&ring, 4, table, 3 * 16, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 4);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->head, 4);
  cr_expect_eq(c->n_out, 1);
  cr_expect_eq(c->n_in, 3); /* the middle buffer crosses regions */
  cr_expect_eq(c->in_bytes, 17);
}

Test(virtq, indirect_table_spanning_regions) {
  uint64_t table = SIM_REGION - 16; /* entry 0 in region 0, 1 in region 1 */
  sim_desc_at(&g, table, 0, BUF, 16, VRING_DESC_F_NEXT, 1);
  sim_desc_at(&g, table, 1, BUF + 0x100, 1, VRING_DESC_F_WRITE, 0);
  sim_desc(&ring, 0, table, 32, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->n_out + c->n_in, 2);
}

Test(virtq, bad_indirect_tables) {
  uint64_t table = BUF + 0x8000;
  sim_desc_at(&g, table, 0, BUF, 16, 0, 0);
  /* Empty, ragged, out of memory, too long, with NEXT. */
  sim_desc(&ring, 0, table, 0, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
  sim_desc(&ring, 0, table, 24, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
  sim_desc(&ring, 0, 2 * SIM_REGION, 16, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
  sim_desc(&ring, 0, table, 16 * (VQ_MAX_CHAIN + 1), VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
  sim_desc(&ring, 0, table, 16, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
}

Test(virtq, nested_indirect_refused) {
  uint64_t table = BUF + 0x8000;
  sim_desc_at(&g, table, 0, table, 16, VRING_DESC_F_INDIRECT, 0);
  sim_desc(&ring, 0, table, 16, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
}

Test(virtq, indirect_without_the_feature_refused) {
  vq_fini(&vq);
  cr_assert_eq(sim_vq_init(&ring, &vq, true, false), 0);
  uint64_t table = BUF + 0x8000;
  sim_desc_at(&g, table, 0, BUF, 16, 0, 0);
  sim_desc(&ring, 0, table, 16, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_INDIRECT);
}

Test(virtq, looped_and_over_long_indirect_tables) {
  uint64_t table = BUF + 0x8000;
  sim_desc_at(&g, table, 0, BUF, 16, VRING_DESC_F_NEXT, 1);
  sim_desc_at(&g, table, 1, BUF, 16, VRING_DESC_F_NEXT, 0);
  sim_desc(&ring, 0, table, 32, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_LONG);
  /* A full-size table chained end to end is fine... */
  for (uint16_t i = 0; i < VQ_MAX_CHAIN; i++)
    sim_desc_at(&g, table, i, BUF, 1,
                i + 1u < VQ_MAX_CHAIN ? VRING_DESC_F_NEXT : 0, i + 1);
  sim_desc(&ring, 0, table, 16 * VQ_MAX_CHAIN, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->n_out, VQ_MAX_CHAIN);
  /* ...but a next past its end is not. */
  sim_desc_at(&g, table, VQ_MAX_CHAIN - 1, BUF, 1, VRING_DESC_F_NEXT,
              VQ_MAX_CHAIN);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_E_NEXT);
}

Test(virtq, pieces_of_a_full_table_of_crossing_buffers) {
  /* Every descriptor crosses the region boundary: two pieces each. */
  uint64_t table = BUF + 0x8000;
  for (uint16_t i = 0; i < VQ_MAX_CHAIN; i++)
    sim_desc_at(&g, table, i, SIM_REGION - 1, 2,
                i + 1u < VQ_MAX_CHAIN ? VRING_DESC_F_NEXT : 0, i + 1);
  sim_desc(&ring, 0, table, 16 * VQ_MAX_CHAIN, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 0);
  cr_expect_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->n_out, 2 * VQ_MAX_CHAIN);
}

Test(virtq, chain_of_zero_length_buffers) {
  sim_desc(&ring, 0, BUF, 0, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, BUF, 0, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect_eq(c->n_out + c->n_in, 0);
  cr_expect_eq(c->out_bytes + c->in_bytes, 0);
}

Test(virtq, avail_index_jump_breaks_ring) {
  sim_desc(&ring, 0, BUF, 16, 0, 0);
  ring.avail_idx = 20; /* more than the 8 entries the ring has */
  sim_offer(&ring, 0);
  cr_expect_eq(vq_pop(&vq, c), -EIO);
  cr_expect(vq.broken);
  cr_expect_eq(vq_pop(&vq, c), -EIO);
}

Test(virtq, head_out_of_range_breaks_ring) {
  sim_offer(&ring, 8);
  cr_expect_eq(vq_pop(&vq, c), -EIO);
  cr_expect(vq.broken);
}

Test(virtq, push_publishes_used_entries) {
  sim_desc(&ring, 2, BUF, 16, 0, 0);
  sim_offer(&ring, 2);
  cr_assert_eq(pop_error(), VQ_OK);
  vq_push(&vq, 2, 77);
  cr_expect_eq(sim_used_idx(&ring), 1);
  struct vring_used_elem e = sim_used(&ring, 0);
  cr_expect_eq(e.id, 2);
  cr_expect_eq(e.len, 77);
}

Test(virtq, event_idx_notification_decisions) {
  for (int i = 0; i < 4; i++) {
    sim_desc(&ring, (uint16_t)i, BUF, 16, 0, 0);
    sim_offer(&ring, (uint16_t)i);
  }
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pop_error(), VQ_OK);
  sim_set_used_event(&ring, 0);
  vq_push(&vq, 0, 1); /* used 0 -> 1: first notification always */
  cr_expect(vq_should_notify(&vq));
  sim_set_used_event(&ring, 2); /* interrupt me when used passes 2 */
  vq_push(&vq, 1, 1);           /* 1 -> 2 */
  cr_expect(!vq_should_notify(&vq));
  vq_push(&vq, 2, 1); /* 2 -> 3: crosses */
  cr_expect(vq_should_notify(&vq));
  vq_push(&vq, 3, 1); /* 3 -> 4: event 2 already passed */
  cr_expect(!vq_should_notify(&vq));
}

Test(virtq, event_idx_batch_crossing_the_event) {
  for (int i = 0; i < 4; i++) {
    sim_desc(&ring, (uint16_t)i, BUF, 16, 0, 0);
    sim_offer(&ring, (uint16_t)i);
    cr_assert_eq(pop_error(), VQ_OK);
  }
  vq_push(&vq, 0, 1);
  cr_expect(vq_should_notify(&vq));
  sim_set_used_event(&ring, 2);
  vq_push(&vq, 1, 1);
  vq_push(&vq, 2, 1);
  vq_push(&vq, 3, 1); /* 1 -> 4 in one batch covers event 2 */
  cr_expect(vq_should_notify(&vq));
}

Test(virtq, no_interrupt_flag_without_event_idx) {
  vq_fini(&vq);
  cr_assert_eq(sim_vq_init(&ring, &vq, false, true), 0);
  sim_desc(&ring, 0, BUF, 16, 0, 0);
  sim_offer(&ring, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  vq_push(&vq, 0, 1);
  cr_expect(vq_should_notify(&vq));
  *(uint16_t *)sim_ptr(&g, ring.avail, 2) = htole16(VRING_AVAIL_F_NO_INTERRUPT);
  cr_assert_eq(pop_error(), VQ_OK);
  vq_push(&vq, 0, 1);
  cr_expect(!vq_should_notify(&vq));
}

Test(virtq, enable_kicks_publishes_avail_event) {
  sim_desc(&ring, 0, BUF, 16, 0, 0);
  sim_offer(&ring, 0);
  sim_offer(&ring, 0);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect(vq_enable_kicks(&vq)); /* one more is waiting */
  cr_expect_eq(sim_avail_event(&ring), 1);
  cr_assert_eq(pop_error(), VQ_OK);
  cr_expect(!vq_enable_kicks(&vq));
  cr_expect_eq(sim_avail_event(&ring), 2);
}

Test(virtq, ring_addresses_must_be_aligned) {
  struct virtq other;
  uint8_t *base = sim_ptr(&g, 0x1000, 0x4000);
  cr_expect_eq(vq_init(&other, &g.mem, 8, base + 8, base + 0x1000,
                       base + 0x2000, 0, true, true),
               -EINVAL);
  cr_expect_eq(vq_init(&other, &g.mem, 8, base, base + 0x1001, base + 0x2000, 0,
                       true, true),
               -EINVAL);
  cr_expect_eq(vq_init(&other, &g.mem, 6, base, base + 0x1000, base + 0x2000, 0,
                       true, true),
               -EINVAL);
}

Test(virtq, uva_translation) {
  cr_expect_eq(vq_mem_uva(&g.mem, SIM_UVA + 0x1000, 16),
               sim_ptr(&g, 0x1000, 1));
  cr_expect_null(vq_mem_uva(&g.mem, SIM_UVA + SIM_REGION - 8, 16));
  cr_expect_null(vq_mem_uva(&g.mem, 0x1000, 16));
}

/* Inflight tracking: pop three, complete one, "restart" and recover. */
Test(virtq, inflight_recovery_in_pop_order) {
  size_t bytes = vq_inflight_queue_bytes(8);
  cr_expect_eq(bytes % 64, 0);
  struct vq_inflight *inf = calloc(1, bytes);
  uint16_t *heads;
  unsigned n;
  cr_assert_eq(vq_inflight_attach(&vq, inf, &heads, &n), 0);
  cr_expect_eq(n, 0);
  cr_expect_eq(inf->version, 1);
  cr_expect_eq(inf->desc_num, 8);
  free(heads);
  uint16_t order[3] = {5, 1, 6};
  for (int i = 0; i < 3; i++) {
    sim_desc(&ring, order[i], BUF, 16, 0, 0);
    sim_offer(&ring, order[i]);
    cr_assert_eq(pop_error(), VQ_OK);
  }
  vq_push(&vq, 1, 1);
  cr_expect_eq(inf->used_idx, 1);
  cr_expect_eq(inf->desc[1].inflight, 0);
  cr_expect_eq(inf->desc[5].inflight, 1);

  /* The restarted back end: the front end says last_avail = used idx. */
  struct virtq again;
  size_t d, a, u;
  vq_ring_bytes(8, &d, &a, &u);
  cr_assert_eq(
      vq_init(&again, &g.mem, 8, vq.desc, vq.avail, vq.used, 1, true, true), 0);
  cr_assert_eq(vq_inflight_attach(&again, inf, &heads, &n), 0);
  cr_assert_eq(n, 2);
  cr_expect_eq(heads[0], 5);
  cr_expect_eq(heads[1], 6);
  cr_expect_eq(again.last_avail, 3);
  cr_expect_eq(vq_pop(&again, c), 0);
  free(heads);
  vq_fini(&again);
  free(inf);
}

Test(virtq, inflight_last_batch_fixed_after_crash) {
  struct vq_inflight *inf = calloc(1, vq_inflight_queue_bytes(8));
  uint16_t *heads;
  unsigned n;
  cr_assert_eq(vq_inflight_attach(&vq, inf, &heads, &n), 0);
  free(heads);
  for (uint16_t h = 0; h < 2; h++) {
    sim_desc(&ring, h, BUF, 16, 0, 0);
    sim_offer(&ring, h);
    cr_assert_eq(pop_error(), VQ_OK);
  }
  vq_push(&vq, 0, 1);
  /* A crash after the used index moved but before the flags were
   * cleared: the region still says 0 is in flight at used_idx 0. */
  inf->desc[0].inflight = 1;
  inf->used_idx = 0;
  struct virtq again;
  cr_assert_eq(
      vq_init(&again, &g.mem, 8, vq.desc, vq.avail, vq.used, 1, true, true), 0);
  cr_assert_eq(vq_inflight_attach(&again, inf, &heads, &n), 0);
  cr_assert_eq(n, 1);
  cr_expect_eq(heads[0], 1);
  cr_expect_eq(inf->used_idx, 1);
  free(heads);
  vq_fini(&again);
  free(inf);
}

Test(virtq, inflight_region_of_another_size_is_reset) {
  struct vq_inflight *inf = calloc(1, vq_inflight_queue_bytes(16));
  inf->version = 1;
  inf->desc_num = 16;
  inf->desc[3].inflight = 1;
  uint16_t *heads;
  unsigned n;
  cr_assert_eq(vq_inflight_attach(&vq, inf, &heads, &n), 0);
  cr_expect_eq(n, 0);
  cr_expect_eq(inf->desc_num, 8);
  cr_expect_eq(inf->desc[3].inflight, 0);
  free(heads);
  free(inf);
}
