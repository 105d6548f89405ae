/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the virtio-blk device model (frontend/virtio-blk.c and
 * frontend/vblk-queue.c): config space and feature bits from the source's
 * capabilities, and requests pushed through a simulated guest's ring into
 * a memory device: reads, writes (one piece, several pieces, across
 * regions, split to the source's largest request), flush, GET_ID, discard,
 * write-zeroes, and every malformed request answered with a status, never
 * a hang.  An asynchronous fake source checks out-of-order completion. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <stdlib.h>

#include "core/source.h"
#include "formats/registry.h"
#include "frontend/virtio-blk.h"
#include "guest-sim.h"

/* Sources open through the formats' table, as in the program. */
__attribute__((constructor)) static void install_formats(void) {
  bd_formats_install(formats_registry);
}

#define HDR 0x20000ull  /* request header */
#define DATA 0x30000ull /* data buffers */
#define STATUS 0x2ff00ull
#define QSIZE 16

static struct sim_guest g;
static struct sim_ring ring;
static struct bd *bd;
static struct vblk_dev dev;
static struct vblk_queue q;
static int notified;

static struct bd *async_open(void);
static void async_complete_all(void);

static uint32_t le32_at(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}

/* ---- config space ---- */

Test(vblk_config, memory_device) {
  struct bd *m = bd_open("memory:1M", NULL, false);
  cr_assert(m);
  struct vblk_dev d;
  vblk_dev_init(&d, m, false, 4, 128, "disk-1");
  uint8_t cfg[VBLK_CONFIG_SIZE];
  vblk_config(&d, cfg);
  uint64_t cap;
  memcpy(&cap, cfg, 8);
  cr_expect_eq(le64toh(cap), 2048);
  /* size_max * seg_max / blk_size fits 16 bits (SeaBIOS computes it). */
  cr_expect_eq(le32_at(cfg + 8), 256 * 1024);
  cr_expect_eq(le32_at(cfg + 12), 126); /* seg_max */
  cr_expect_eq(le32_at(cfg + 20), 512); /* blk_size */
  cr_expect_eq(cfg[24], 3);             /* physical block 4096 = 512 << 3 */
  cr_expect_eq(cfg[26], 8);             /* min_io_size in blocks */
  cr_expect_eq(cfg[32], 1);             /* writeback: the source flushes */
  cr_expect_eq(cfg[34], 4);             /* num_queues */
  cr_expect_eq(le32_at(cfg + 36), VBLK_MAX_DWZ_SECTORS);
  cr_expect_eq(le32_at(cfg + 40), VBLK_MAX_DWZ_SEG);
  cr_expect_eq(le32_at(cfg + 44), 1);
  cr_expect_eq(le32_at(cfg + 48), VBLK_MAX_DWZ_SECTORS);
  cr_expect_eq(le32_at(cfg + 52), VBLK_MAX_DWZ_SEG);
  cr_expect_eq(cfg[56], 1); /* write zeroes may unmap */
  uint64_t f = d.features;
  cr_expect(f & (1ull << VIRTIO_F_VERSION_1));
  cr_expect(f & (1ull << 28)); /* indirect */
  cr_expect(f & (1ull << 29)); /* event idx */
  cr_expect(f & (1ull << VIRTIO_BLK_F_FLUSH));
  cr_expect(f & (1ull << VIRTIO_BLK_F_DISCARD));
  cr_expect(f & (1ull << VIRTIO_BLK_F_WRITE_ZEROES));
  cr_expect(f & (1ull << VIRTIO_BLK_F_MQ));
  cr_expect(f & (1ull << VIRTIO_BLK_F_BLK_SIZE));
  cr_expect(f & (1ull << VIRTIO_BLK_F_TOPOLOGY));
  cr_expect(!(f & (1ull << VIRTIO_BLK_F_RO)));
  cr_expect_str_eq(d.serial, "disk-1");
  bd_close(m);
}

Test(vblk_config, readonly_device_offers_no_writes) {
  struct bd *m = bd_open("memory:1M", NULL, true);
  cr_assert(m);
  struct vblk_dev d;
  vblk_dev_init(&d, m, false, 1, 128, NULL);
  uint8_t cfg[VBLK_CONFIG_SIZE];
  vblk_config(&d, cfg);
  cr_expect(d.readonly);
  cr_expect(d.features & (1ull << VIRTIO_BLK_F_RO));
  cr_expect(!(d.features & (1ull << VIRTIO_BLK_F_DISCARD)));
  cr_expect(!(d.features & (1ull << VIRTIO_BLK_F_WRITE_ZEROES)));
  cr_expect(!(d.features & (1ull << VIRTIO_BLK_F_MQ)));
  cr_expect_eq(le32_at(cfg + 36), 0);
  cr_expect_eq(le32_at(cfg + 48), 0);
  cr_expect_eq(cfg[34], 1);
  cr_expect_str_eq(d.serial, "blockport");
  bd_close(m);
}

Test(vblk_config, block_sizes_from_the_source) {
  struct bd *m = bd_open("memory:1M", NULL, false);
  cr_assert(m);
  m->caps.min_block = 4096;
  m->caps.pref_block = 65536;
  m->caps.max_block = 65536 + 100;
  m->caps.can_trim = false;
  m->caps.can_flush = false;
  uint64_t real_size = m->size;
  m->size = 1000 * 1024 + 777; /* not a whole number of blocks */
  struct vblk_dev d;
  vblk_dev_init(&d, m, false, 1, 256, NULL);
  uint8_t cfg[VBLK_CONFIG_SIZE];
  vblk_config(&d, cfg);
  cr_expect_eq(le32_at(cfg + 20), 4096);
  cr_expect_eq(d.capacity, 250 * 8); /* whole 4 KiB blocks only */
  cr_expect_eq(cfg[24], 4);          /* 64 KiB physical */
  cr_expect_eq(cfg[26], 16);
  cr_expect_eq(d.max_io, 65536);
  cr_expect_eq(le32_at(cfg + 8), 65536); /* size_max: no more than max_io */
  cr_expect_eq(le32_at(cfg + 12), 254);
  cr_expect(!(d.features & (1ull << VIRTIO_BLK_F_DISCARD)));
  cr_expect(!(d.features & (1ull << VIRTIO_BLK_F_FLUSH)));
  cr_expect(d.features & (1ull << VIRTIO_BLK_F_WRITE_ZEROES));
  cr_expect_eq(cfg[56], 0);
  cr_expect_eq(cfg[32], 0);
  m->size = real_size;
  bd_close(m);
}

/* ---- requests through a ring ---- */

static void count_notify(void *opaque) {
  (void)opaque;
  notified++;
}

static void start_queue(struct bd *b, bool readonly) {
  bd = b;
  cr_assert(bd, "%s", bd_errmsg());
  vblk_dev_init(&dev, bd, readonly, 1, QSIZE, "test-serial-0123456789");
  cr_assert_eq(sim_vq_init(&ring, &q.vq, true, true), 0);
  cr_assert_eq(vblk_queue_init(&q, &dev, 0, count_notify, NULL), 0);
}

static void setup(void) {
  sim_guest_init(&g);
  sim_ring_init(&ring, &g, QSIZE);
  notified = 0;
  start_queue(bd_open("memory:1M", NULL, false), false);
}

static void teardown(void) {
  vblk_queue_fini(&q);
  vq_fini(&q.vq);
  bd_close(bd);
  sim_guest_fini(&g);
}

TestSuite(vblk, .init = setup, .fini = teardown);

static void put_header(uint64_t gpa, uint32_t type, uint64_t sector) {
  struct virtio_blk_outhdr h = {htole32(type), 0, htole64(sector)};
  sim_write(&g, gpa, &h, sizeof h);
}

/* A request of the usual shape: header, one data buffer, status. */
static uint16_t request(uint16_t head, uint32_t type, uint64_t sector,
                        uint64_t data, uint32_t len, bool device_writes) {
  uint16_t w = device_writes ? VRING_DESC_F_WRITE : 0;
  put_header(HDR + 16ull * head, type, sector);
  sim_write(&g, STATUS + head, "\xee", 1);
  uint16_t d = (uint16_t)(head + 1), s = (uint16_t)(head + 2);
  sim_desc(&ring, head, HDR + 16ull * head, 16, VRING_DESC_F_NEXT, len ? d : s);
  if (len)
    sim_desc(&ring, d, data, len, VRING_DESC_F_NEXT | w, s);
  sim_desc(&ring, s, STATUS + head, 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, head);
  return head;
}

static uint8_t status_of(uint16_t head) {
  uint8_t s;
  sim_read(&g, STATUS + head, &s, 1);
  return s;
}

/* Process the queue and return the used entry for HEAD. */
static struct vring_used_elem run(uint16_t head) {
  uint16_t before = sim_used_idx(&ring);
  cr_assert(vblk_queue_process(&q));
  cr_assert_eq(sim_used_idx(&ring), (uint16_t)(before + 1),
               "one used entry expected");
  struct vring_used_elem e = sim_used(&ring, before);
  cr_expect_eq(e.id, head);
  return e;
}

static void fill(uint64_t gpa, size_t len, uint8_t seed) {
  uint8_t *b = malloc(len);
  for (size_t i = 0; i < len; i++)
    b[i] = (uint8_t)(seed + i * 7);
  sim_write(&g, gpa, b, len);
  free(b);
}

static void expect_disk(uint64_t off, uint64_t gpa, size_t len) {
  uint8_t *want = malloc(len), *got = malloc(len);
  sim_read(&g, gpa, want, len);
  cr_assert_eq(bd_pread(bd, got, len, off), 0);
  cr_expect(memcmp(want, got, len) == 0, "disk differs from guest buffer");
  free(want);
  free(got);
}

Test(vblk, write_then_read_back) {
  fill(DATA, 4096, 1);
  struct vring_used_elem e =
      run(request(0, VIRTIO_BLK_T_OUT, 8, DATA, 4096, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  cr_expect_eq(e.len, 1);
  expect_disk(8 * 512, DATA, 4096);
  e = run(request(3, VIRTIO_BLK_T_IN, 8, DATA + 0x10000, 4096, true));
  cr_expect_eq(status_of(3), VIRTIO_BLK_S_OK);
  cr_expect_eq(e.len, 4097);
  expect_disk(8 * 512, DATA + 0x10000, 4096);
  cr_expect_gt(notified, 0);
}

/* Header and data in one buffer, data and status in another: virtio 1.x
 * lets the driver frame requests any way it likes. */
Test(vblk, any_layout_and_several_pieces) {
  fill(DATA, 3 * 512, 9);
  uint8_t hdr_and_data[16 + 512];
  struct virtio_blk_outhdr h = {htole32(VIRTIO_BLK_T_OUT), 0, htole64(2)};
  memcpy(hdr_and_data, &h, 16);
  sim_read(&g, DATA, hdr_and_data + 16, 512);
  sim_write(&g, HDR, hdr_and_data, sizeof hdr_and_data);
  /* The rest of the data crosses from region 0 into region 1. */
  uint64_t cross = SIM_REGION - 700;
  sim_write(&g, cross, sim_ptr(&g, DATA + 512, 1024), 700);
  sim_write(&g, SIM_REGION, (uint8_t *)sim_ptr(&g, DATA + 512, 1024) + 700,
            324);
  sim_desc(&ring, 0, HDR, sizeof hdr_and_data, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, cross, 1024, VRING_DESC_F_NEXT, 2);
  sim_desc(&ring, 2, STATUS, 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  run(0);
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  expect_disk(2 * 512, DATA, 3 * 512);

  /* Read it back into data+status sharing the last buffer. */
  put_header(HDR, VIRTIO_BLK_T_IN, 2);
  sim_desc(&ring, 0, HDR, 16, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, SIM_REGION - 100, 1000,
           VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 2);
  sim_desc(&ring, 2, DATA + 0x20000, 536 + 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  struct vring_used_elem e = run(0);
  cr_expect_eq(e.len, 1537);
  uint8_t got[1536], st;
  sim_read(&g, SIM_REGION - 100, got, 1000);
  sim_read(&g, DATA + 0x20000, got + 1000, 536);
  sim_read(&g, DATA + 0x20000 + 536, &st, 1);
  cr_expect_eq(st, VIRTIO_BLK_S_OK);
  cr_expect(memcmp(got, sim_ptr(&g, DATA, 1536), 1536) == 0);
}

Test(vblk, large_request_split_to_the_source_maximum) {
  dev.max_io = 1024;
  fill(DATA, 8192, 3);
  run(request(0, VIRTIO_BLK_T_OUT, 0, DATA, 8192, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  expect_disk(0, DATA, 8192);
  run(request(0, VIRTIO_BLK_T_IN, 0, DATA + 0x10000, 8192, true));
  expect_disk(0, DATA + 0x10000, 8192);
}

Test(vblk, indirect_request) {
  uint64_t table = 0x50000;
  fill(DATA, 512, 5);
  put_header(HDR, VIRTIO_BLK_T_OUT, 1);
  sim_desc_at(&g, table, 0, HDR, 16, VRING_DESC_F_NEXT, 1);
  sim_desc_at(&g, table, 1, DATA, 512, VRING_DESC_F_NEXT, 2);
  sim_desc_at(&g, table, 2, STATUS, 1, VRING_DESC_F_WRITE, 0);
  sim_desc(&ring, 7, table, 48, VRING_DESC_F_INDIRECT, 0);
  sim_offer(&ring, 7);
  run(7);
  uint8_t st;
  sim_read(&g, STATUS, &st, 1);
  cr_expect_eq(st, VIRTIO_BLK_S_OK);
  expect_disk(512, DATA, 512);
}

Test(vblk, flush_and_get_id) {
  run(request(0, VIRTIO_BLK_T_FLUSH, 0, 0, 0, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  struct vring_used_elem e =
      run(request(0, VIRTIO_BLK_T_GET_ID, 0, DATA, 20, true));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  cr_expect_eq(e.len, 21);
  cr_expect(memcmp(sim_ptr(&g, DATA, 20), "test-serial-01234567", 20) == 0);
  /* A short buffer gets what fits. */
  sim_write(&g, DATA, "xxxxxxxx", 8);
  e = run(request(0, VIRTIO_BLK_T_GET_ID, 0, DATA, 4, true));
  cr_expect_eq(e.len, 5);
  cr_expect(memcmp(sim_ptr(&g, DATA, 8), "testxxxx", 8) == 0);
}

static void range(uint64_t gpa, uint64_t sector, uint32_t count,
                  uint32_t flags) {
  struct virtio_blk_discard_write_zeroes r = {htole64(sector), htole32(count),
                                              htole32(flags)};
  sim_write(&g, gpa, &r, sizeof r);
}

Test(vblk, write_zeroes_and_discard) {
  fill(DATA, 8192, 7);
  run(request(0, VIRTIO_BLK_T_OUT, 0, DATA, 8192, false));
  range(DATA + 0x10000, 2, 2, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
  range(DATA + 0x10010, 10, 1, 0);
  run(request(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, DATA + 0x10000, 32, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  uint8_t buf[8192], zero[1024] = {0};
  cr_assert_eq(bd_pread(bd, buf, 8192, 0), 0);
  cr_expect(memcmp(buf + 1024, zero, 1024) == 0);
  cr_expect(memcmp(buf + 5120, zero, 512) == 0);
  cr_expect(memcmp(buf, sim_ptr(&g, DATA, 1024), 1024) == 0);
  range(DATA + 0x10000, 0, 16, 0);
  run(request(0, VIRTIO_BLK_T_DISCARD, 0, DATA + 0x10000, 16, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
  /* The unmap flag is for write-zeroes only. */
  range(DATA + 0x10000, 0, 16, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
  run(request(0, VIRTIO_BLK_T_DISCARD, 0, DATA + 0x10000, 16, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_UNSUPP);
  range(DATA + 0x10000, 0, 16, 0x80);
  run(request(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, DATA + 0x10000, 16, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_UNSUPP);
  range(DATA + 0x10000, 2040, 16, 0); /* past the end */
  run(request(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, DATA + 0x10000, 16, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  run(request(0, VIRTIO_BLK_T_DISCARD, 0, DATA + 0x10000, 12, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR); /* ragged */
}

Test(vblk, bad_requests_get_a_status) {
  struct {
    uint32_t type;
    uint64_t sector;
    uint32_t len;
    bool in;
    uint8_t want;
  } cases[] = {
      {VIRTIO_BLK_T_IN, 2048, 512, true, VIRTIO_BLK_S_IOERR},  /* past end */
      {VIRTIO_BLK_T_IN, 2047, 1024, true, VIRTIO_BLK_S_IOERR}, /* runs over */
      {VIRTIO_BLK_T_IN, UINT64_MAX, 512, true, VIRTIO_BLK_S_IOERR},
      {VIRTIO_BLK_T_OUT, UINT64_MAX / 256, 512, false, VIRTIO_BLK_S_IOERR},
      {VIRTIO_BLK_T_IN, 0, 100, true, VIRTIO_BLK_S_IOERR}, /* not sectors */
      {VIRTIO_BLK_T_IN, 2047, 512, true, VIRTIO_BLK_S_OK}, /* the last */
      {VIRTIO_BLK_T_SCSI_CMD, 0, 512, true, VIRTIO_BLK_S_UNSUPP},
      {VIRTIO_BLK_T_SECURE_ERASE, 0, 16, false, VIRTIO_BLK_S_UNSUPP},
      {12345, 0, 0, false, VIRTIO_BLK_S_UNSUPP},
  };
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run(request(0, cases[i].type, cases[i].sector, DATA, cases[i].len,
                cases[i].in));
    cr_expect_eq(status_of(0), cases[i].want, "case %u: status %u", i,
                 status_of(0));
  }
  cr_expect_eq(q.errors, 8);
}

Test(vblk, malformed_chains_still_complete) {
  /* Header too short. */
  sim_desc(&ring, 0, HDR, 8, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, STATUS, 1, VRING_DESC_F_WRITE, 0);
  sim_offer(&ring, 0);
  struct vring_used_elem e = run(0);
  cr_expect_eq(e.len, 1);
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  /* No writable byte for a status: used with length 0. */
  put_header(HDR, VIRTIO_BLK_T_IN, 0);
  sim_desc(&ring, 0, HDR, 16, 0, 0);
  sim_offer(&ring, 0);
  e = run(0);
  cr_expect_eq(e.len, 0);
  /* A loop. */
  sim_desc(&ring, 0, HDR, 16, VRING_DESC_F_NEXT, 1);
  sim_desc(&ring, 1, STATUS, 1, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 0);
  sim_offer(&ring, 0);
  run(0);
  /* A data buffer outside guest memory. */
  request(0, VIRTIO_BLK_T_IN, 0, 3 * SIM_REGION, 512, true);
  e = run(0);
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  /* A write on the device-writable side. */
  request(0, VIRTIO_BLK_T_OUT, 0, DATA, 512, true);
  run(0);
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  cr_expect(vblk_queue_process(&q));
}

Test(vblk, head_offered_twice_breaks_the_ring) {
  teardown();
  sim_guest_init(&g);
  sim_ring_init(&ring, &g, QSIZE);
  start_queue(async_open(), false);
  request(0, VIRTIO_BLK_T_IN, 0, DATA, 512, true);
  sim_offer(&ring, 0);
  cr_expect(!vblk_queue_process(&q));
  cr_expect(!vblk_queue_process(&q));
  async_complete_all();
  cr_expect_eq(sim_used_idx(&ring), 1);
}

Test(vblk, readonly_device_refuses_writes) {
  teardown();
  sim_guest_init(&g);
  sim_ring_init(&ring, &g, QSIZE);
  start_queue(bd_open("memory:1M", NULL, false), true);
  run(request(0, VIRTIO_BLK_T_OUT, 0, DATA, 512, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  range(DATA + 0x10000, 0, 1, 0);
  run(request(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, DATA + 0x10000, 16, false));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_IOERR);
  run(request(0, VIRTIO_BLK_T_IN, 0, DATA, 512, true));
  cr_expect_eq(status_of(0), VIRTIO_BLK_S_OK);
}

/* ---- an asynchronous source: completions when the test says ---- */

static struct bd_req *held[64];
static unsigned nheld;

static void async_submit(struct bd *b, struct bd_req *req) {
  (void)b;
  if (req->cmd == BD_READ)
    memset(req->buf, 0xab, req->length);
  held[nheld++] = req;
}

static const struct bd_ops async_ops = {.name = "async",
                                        .submit = async_submit};

static struct bd *async_open(void) {
  struct bd *b = bd_new(&async_ops, "async", NULL);
  b->size = 1 << 20;
  b->exec = BD_EXEC_ASYNC;
  b->caps.can_flush = false;
  nheld = 0;
  return b;
}

static void async_complete_all(void) {
  while (nheld)
    bd_complete(held[--nheld], 0);
}

Test(vblk, out_of_order_completion) {
  teardown();
  sim_guest_init(&g);
  sim_ring_init(&ring, &g, QSIZE);
  start_queue(async_open(), false);
  request(0, VIRTIO_BLK_T_IN, 0, DATA, 512, true);
  request(3, VIRTIO_BLK_T_IN, 1, DATA + 0x1000, 512, true);
  request(6, VIRTIO_BLK_T_IN, 2, DATA + 0x2000, 512, true);
  cr_assert(vblk_queue_process(&q));
  cr_assert_eq(nheld, 3);
  cr_expect_eq(sim_used_idx(&ring), 0);
  cr_expect_eq(q.inflight, 3);
  sim_set_used_event(&ring, 5); /* no interrupt wanted yet... */
  bd_complete(held[1], 0);
  bd_complete(held[2], -EIO);
  held[1] = held[0];
  nheld = 2;
  cr_expect_eq(sim_used_idx(&ring), 2);
  cr_expect_eq(sim_used(&ring, 0).id, 3);
  cr_expect_eq(sim_used(&ring, 1).id, 6);
  cr_expect_eq(status_of(3), VIRTIO_BLK_S_OK);
  cr_expect_eq(status_of(6), VIRTIO_BLK_S_IOERR);
  int before = notified;
  sim_set_used_event(&ring, 2); /* ...now: when used passes 2 */
  bd_complete(held[1], 0);
  nheld = 0;
  cr_expect_eq(sim_used(&ring, 2).id, 0);
  cr_expect_eq(notified, before + 1);
  cr_expect_eq(q.inflight, 0);
  cr_expect_eq(*(uint8_t *)sim_ptr(&g, DATA, 1), 0xab);
}
