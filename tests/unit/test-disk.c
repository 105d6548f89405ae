/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for core/disk.c: requests of any offset and length over a
 * device that refuses anything but whole blocks of its minimum size and at
 * most its maximum size.  Its operations run on the worker pool, so the
 * pieces of a request and concurrent requests complete in any order. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/disk.h"
#include "core/pool.h"
#include "core/source.h"

struct strict {
  uint8_t *data;
  uint64_t size;
  uint32_t align, maxio;
  atomic_int violations;
  atomic_uint_fast64_t trimmed;
};

static int check(struct bd *bd, uint64_t off, uint64_t len, bool data) {
  struct strict *s = bd->priv;
  bool end = off + len == s->size; /* the last, partial block */
  if (off % s->align || (len % s->align && !end) || (data && len > s->maxio)) {
    atomic_fetch_add(&s->violations, 1);
    return -EINVAL;
  }
  return 0;
}

static int s_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct strict *s = bd->priv;
  int r = check(bd, off, len, true);
  if (r == 0)
    memcpy(buf, s->data + off, len);
  return r;
}

static int s_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                    uint32_t flags) {
  (void)flags;
  struct strict *s = bd->priv;
  int r = check(bd, off, len, true);
  if (r == 0)
    memcpy(s->data + off, buf, len);
  return r;
}

static int s_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  (void)flags;
  struct strict *s = bd->priv;
  int r = check(bd, off, len, false);
  if (r == 0)
    memset(s->data + off, 0, len);
  return r;
}

static int s_trim(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  (void)flags;
  struct strict *s = bd->priv;
  int r = check(bd, off, len, false);
  if (r == 0) {
    memset(s->data + off, 0, len); /* this device reads trimmed as zero */
    atomic_fetch_add(&s->trimmed, len);
  }
  return r;
}

static int s_extents(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags,
                     struct bd_extents *ext) {
  (void)flags;
  int r = check(bd, off, len, false);
  return r < 0 ? r : bd_extents_add(ext, len, 0, 1) < 0 ? -ENOMEM : 0;
}

static const struct bd_ops strict_ops = {.name = "strict",
                                         .pread = s_pread,
                                         .pwrite = s_pwrite,
                                         .zero = s_zero,
                                         .trim = s_trim,
                                         .extents = s_extents};

static struct strict dev;
static struct bd *bd;
static struct disk disk;

static void open_strict(uint64_t size, uint32_t align, uint32_t maxio) {
  cr_assert_eq(bd_pool_start(8), 0);
  dev = (struct strict){
      .data = calloc(1, size), .size = size, .align = align, .maxio = maxio};
  bd = bd_new(&strict_ops, "strict", "strict");
  bd->priv = &dev;
  bd->size = size;
  bd->caps.min_block = align;
  bd->caps.max_block = maxio;
  cr_assert_eq(disk_init(&disk, bd), 0);
}

static void close_strict(void) {
  disk_fini(&disk);
  bd->ops = &(const struct bd_ops){.name = "strict"};
  bd_close(bd);
  free(dev.data);
  bd_pool_stop();
}

static int run(enum bd_cmd cmd, uint32_t flags, uint64_t off, uint64_t len,
               void *buf) {
  struct disk_req r = {
      .cmd = cmd, .flags = flags, .offset = off, .length = len, .buf = buf};
  return disk_run(&disk, &r);
}

static uint64_t rnd(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* Random reads, writes, zeroes and trims of any alignment against a
 * shadow copy. */
static void random_ops(uint64_t size, uint32_t align, uint32_t maxio) {
  open_strict(size, align, maxio);
  uint8_t *shadow = calloc(1, size), *buf = malloc(size);
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 3000; i++) {
    uint64_t lens[] = {1, 7, 511, 512, 4095, 4096, 4097, 65536, 200000};
    uint64_t len = lens[rnd(&x) % 9];
    if (len > size)
      len = size;
    uint64_t off = rnd(&x) % (size - len + 1);
    switch (rnd(&x) % 4) {
    case 0:
      for (uint64_t j = 0; j < len; j++)
        buf[j] = (uint8_t)rnd(&x);
      cr_assert_eq(run(BD_WRITE, 0, off, len, buf), 0, "write %llu+%llu",
                   (unsigned long long)off, (unsigned long long)len);
      memcpy(shadow + off, buf, len);
      break;
    case 1:
      cr_assert_eq(run(BD_ZERO, BD_F_MAY_TRIM, off, len, NULL), 0);
      memset(shadow + off, 0, len);
      break;
    case 2:
      /* Trim is advisory; this device zeroes what it trims, whole blocks
       * only. */
      cr_assert_eq(run(BD_TRIM, 0, off, len, NULL), 0);
      for (uint64_t b = (off + align - 1) / align * align;
           b + align <= off + len || (b < off + len && off + len == size);
           b += align)
        memset(shadow + b, 0, (b + align <= size ? align : size - b));
      break;
    default:
      cr_assert_eq(run(BD_READ, 0, off, len, buf), 0);
      cr_assert(memcmp(buf, shadow + off, len) == 0, "read %llu+%llu",
                (unsigned long long)off, (unsigned long long)len);
    }
  }
  cr_expect_eq(atomic_load(&dev.violations), 0,
               "the device saw unaligned or oversized requests");
  cr_assert(memcmp(dev.data, shadow, size) == 0);
  free(shadow);
  free(buf);
  close_strict();
}

Test(disk, byte_granular_over_4k_blocks) {
  random_ops(1 << 20, 4096, 65536);
}

Test(disk, byte_granular_over_512_blocks_and_small_maximum) {
  random_ops(1 << 20, 512, 4096);
}

Test(disk, disk_size_not_a_multiple_of_the_block) {
  random_ops((1 << 20) + 1000, 4096, 65536);
}

Test(disk, one_byte_blocks_go_straight_through) {
  random_ops(1 << 20, 1, 1 << 20);
}

/* Many writes at once, each to its own bytes, sharing blocks: a
 * read-modify-write that raced another would undo its neighbour. */
struct stripe {
  struct disk_req r;
  uint8_t data[100];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int pending, failed;

static void stripe_done(struct disk_req *r, int err) {
  (void)r;
  pthread_mutex_lock(&lock);
  if (err)
    failed++;
  if (--pending == 0)
    pthread_cond_signal(&cond);
  pthread_mutex_unlock(&lock);
}

Test(disk, concurrent_writes_sharing_blocks) {
  open_strict(1 << 20, 4096, 65536);
  enum { N = 400 };
  static struct stripe s[N];
  for (int round = 0; round < 20; round++) {
    pending = N;
    for (int i = 0; i < N; i++) {
      memset(s[i].data, (uint8_t)(i + round), sizeof s[i].data);
      s[i].r = (struct disk_req){.cmd = BD_WRITE,
                                 .offset = 3000 + (uint64_t)i * 100,
                                 .length = 100,
                                 .buf = s[i].data,
                                 .done = stripe_done};
    }
    /* Odd stripes first, then even, so neighbours overlap in time. */
    for (int i = 1; i < N; i += 2)
      disk_submit(&disk, &s[i].r);
    for (int i = 0; i < N; i += 2)
      disk_submit(&disk, &s[i].r);
    pthread_mutex_lock(&lock);
    while (pending > 0)
      pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    cr_assert_eq(failed, 0);
    for (int i = 0; i < N; i++)
      for (int j = 0; j < 100; j++)
        cr_assert_eq(dev.data[3000 + i * 100 + j], (uint8_t)(i + round),
                     "round %d stripe %d byte %d lost", round, i, j);
  }
  cr_expect_eq(atomic_load(&dev.violations), 0);
  close_strict();
}

Test(disk, block_status_widens_to_blocks) {
  open_strict(1 << 20, 4096, 65536);
  struct bd_extents ext;
  bd_extents_init(&ext, 5000, 16);
  struct disk_req r = {
      .cmd = BD_BLOCK_STATUS, .offset = 5000, .length = 3000, .extents = &ext};
  cr_assert_eq(disk_run(&disk, &r), 0);
  cr_expect_eq(ext.start, 4096);
  cr_expect_eq(ext.end, 8192);
  cr_expect_eq(atomic_load(&dev.violations), 0);
  bd_extents_free(&ext);
  close_strict();
}

Test(disk, trim_keeps_to_whole_blocks) {
  open_strict(1 << 20, 4096, 65536);
  memset(dev.data, 0xaa, 1 << 20);
  cr_assert_eq(run(BD_TRIM, 0, 100, 5000, NULL), 0); /* no whole block */
  cr_expect_eq(atomic_load(&dev.trimmed), 0);
  cr_assert_eq(run(BD_TRIM, 0, 100, 9000, NULL), 0); /* [4096, 8192) */
  cr_expect_eq(atomic_load(&dev.trimmed), 4096);
  cr_expect_eq(dev.data[4095], 0xaa);
  cr_expect_eq(dev.data[8192], 0xaa);
  close_strict();
}

Test(disk, refuses_huge_minimum_blocks) {
  struct bd *b = bd_new(&strict_ops, "strict", "strict");
  b->size = 1 << 20;
  b->caps.min_block = 1 << 20;
  struct disk d;
  cr_expect_eq(disk_init(&d, b), -EINVAL);
  b->ops = &(const struct bd_ops){.name = "strict"};
  bd_close(b);
}
