/* SPDX-License-Identifier: BSD-3-Clause */
/* guest-blk: a deterministic write/zero/discard/flush/verify workload for a
 * block device, run inside the test guest, and on the host against a
 * regular file to produce the content the device must end up with.
 *
 *   guest-blk DEVICE-OR-FILE SEED [JOBS [OPS [lossy]]]
 *
 * The disk is cut into JOBS regions, one process each (so the device sees
 * that many requests at once).  Each process does OPS random operations in
 * its region: writes of 512 B to 256 KiB with O_DIRECT at sector-aligned
 * offsets (a pattern naming the sector and the operation), zeroing
 * (BLKZEROOUT) and discards of whole 1 MiB units (BLKDISCARD, which
 * blockport turns into unallocated clusters that read as zeroes), with a
 * flush every 16 operations; then it reads its whole region back with
 * O_DIRECT and checks every sector against its own model.  On a regular
 * file the same operations become pwrite, fallocate(ZERO_RANGE/PUNCH_HOLE)
 * and fdatasync, so both runs end with the same bytes.
 *
 * Job 0 prints "GUEST-BLK progress N" every 50 operations, so that a test
 * can act at a point of the run.
 *
 * lossy: an operation or flush that fails is reported ("GUEST-BLK ERROR
 * ...") and the run goes on.  The sectors it may have left old (the
 * operation's; for a flush, those written since the last good flush) are
 * marked uncertain, and the read-back accepts any content there: what
 * differs elsewhere was lost silently, a failure.  Meant for one job, since
 * a failed flush is reported to the one process that asked.
 *
 * Prints "GUEST-BLK OK" or "GUEST-BLK FAIL ..." and exits 0 or 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SECTOR 512u
#define MAX_IO (256u * 1024)
#define UNIT (1u << 20) /* discard granularity */

static uint64_t rng_state;
static bool lossy;

static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

/* The 512 bytes of SECTOR after operation GEN (0: zeroes). */
static void fill_sector(uint8_t *p, uint64_t sector, uint32_t gen) {
  uint64_t *w = (uint64_t *)p;
  for (unsigned i = 0; i < SECTOR / 8; i++)
    w[i] = gen ? (sector << 20) ^ ((uint64_t)gen << 8) ^ i : 0;
}

struct disk {
  int fd;
  bool is_file;
  uint64_t size;
};

static int do_write(struct disk *d, uint8_t *buf, uint64_t off, uint64_t len,
                    uint32_t gen) {
  for (uint64_t s = 0; s < len / SECTOR; s++)
    fill_sector(buf + s * SECTOR, off / SECTOR + s, gen);
  ssize_t n = pwrite(d->fd, buf, len, (off_t)off);
  return n == (ssize_t)len ? 0 : -1;
}

static int do_zero(struct disk *d, uint64_t off, uint64_t len, bool discard) {
  if (d->is_file) {
    int mode = discard ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                       : FALLOC_FL_ZERO_RANGE;
    return fallocate(d->fd, mode, (off_t)off, (off_t)len);
  }
  uint64_t range[2] = {off, len};
  return ioctl(d->fd, discard ? BLKDISCARD : BLKZEROOUT, range);
}

/* Generations have the job in bits 20+; this bit marks a sector uncertain. */
#define UNCERTAIN 0x80000000u

static int verify(struct disk *d, uint8_t *buf, uint64_t start, uint64_t end,
                  const uint32_t *gen) {
  uint64_t differ = 0;
  uint8_t want[SECTOR];
  for (uint64_t off = start; off < end; off += MAX_IO) {
    uint64_t len = end - off < MAX_IO ? end - off : MAX_IO;
    if (pread(d->fd, buf, len, (off_t)off) != (ssize_t)len) {
      printf("GUEST-BLK FAIL read at %llu: %s\n", (unsigned long long)off,
             strerror(errno));
      return -1;
    }
    for (uint64_t s = 0; s < len / SECTOR; s++) {
      uint64_t sector = off / SECTOR + s;
      uint32_t g = gen[sector - start / SECTOR];
      fill_sector(want, sector, g & ~UNCERTAIN);
      bool same = memcmp(buf + s * SECTOR, want, SECTOR) == 0;
      if (!same && (g & UNCERTAIN)) {
        differ++;
        continue;
      }
      if (!same) {
        printf("GUEST-BLK FAIL sector %llu (generation %u) differs\n",
               (unsigned long long)sector, gen[sector - start / SECTOR]);
        return -1;
      }
    }
  }
  if (differ)
    printf("GUEST-BLK %llu sectors differ, each after a reported error\n",
           (unsigned long long)differ);
  return 0;
}

/* lossy: the sectors [FROM, TO) of the region may hold old content. */
static void uncertain(uint32_t *gen, uint64_t from, uint64_t to) {
  for (uint64_t s = from; s < to; s++)
    gen[s] |= UNCERTAIN;
}

/* One process: OPS operations in [start, end), then a full check. */
static int run_job(struct disk *d, uint64_t seed, unsigned job, uint64_t start,
                   uint64_t end, unsigned ops) {
  rng_state = seed * 1000003u + job + 1;
  uint64_t sectors = (end - start) / SECTOR;
  uint32_t *gen = calloc(sectors, sizeof *gen);
  /* lossy: the sectors written since the last good flush */
  bool *dirty = calloc(sectors, sizeof *dirty);
  uint8_t *buf = aligned_alloc(4096, MAX_IO);
  if (!gen || !dirty || !buf)
    return -1;
  for (unsigned op = 1; op <= ops; op++) {
    uint64_t kind = rnd() % 10, r;
    uint64_t len = (rnd() % (MAX_IO / SECTOR) + 1) * SECTOR;
    if (len > end - start)
      len = end - start;
    uint64_t off = start + rnd() % ((end - start - len) / SECTOR + 1) * SECTOR;
    uint32_t g = (uint32_t)(job + 1) << 20 | op;
    if (kind < 7) {
      r = (uint64_t)do_write(d, buf, off, len, g);
    } else {
      /* Zeroes and discards cover whole units inside the region. */
      uint64_t a = (off + UNIT - 1) / UNIT * UNIT,
               b = (off + len) / UNIT * UNIT;
      if (b <= a && a + UNIT <= end)
        b = a + UNIT;
      if (b <= a)
        continue;
      off = a, len = b - a, g = 0;
      r = (uint64_t)do_zero(d, off, len, kind == 9);
    }
    if (r != 0) {
      printf("GUEST-BLK %s job %u op %u at %llu+%llu: %s\n",
             lossy ? "ERROR" : "FAIL", job, op, (unsigned long long)off,
             (unsigned long long)len, strerror(errno));
      if (!lossy)
        return -1;
    }
    for (uint64_t s = 0; s < len / SECTOR; s++) {
      gen[(off - start) / SECTOR + s] = g | (r ? UNCERTAIN : 0);
      dirty[(off - start) / SECTOR + s] = true;
    }
    if (job == 0 && op % 50 == 0) {
      printf("GUEST-BLK progress %u\n", op);
      fflush(stdout);
    }
    if (op % 16 == 0 && fdatasync(d->fd) != 0) {
      printf("GUEST-BLK %s flush after op %u: %s\n", lossy ? "ERROR" : "FAIL",
             op, strerror(errno));
      if (!lossy)
        return -1;
      for (uint64_t s = 0; s < sectors; s++)
        if (dirty[s])
          uncertain(gen, s, s + 1);
    }
    if (op % 16 == 0)
      memset(dirty, 0, sectors * sizeof *dirty);
  }
  if (fdatasync(d->fd) != 0) {
    printf("GUEST-BLK %s the last flush: %s\n", lossy ? "ERROR" : "FAIL",
           strerror(errno));
    if (!lossy)
      return -1;
    for (uint64_t s = 0; s < sectors; s++)
      if (dirty[s])
        uncertain(gen, s, s + 1);
  }
  return verify(d, buf, start, end, gen);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: guest-blk DEVICE-OR-FILE SEED [JOBS [OPS]]\n");
    return 2;
  }
  struct disk d = {0};
  struct stat st;
  uint64_t seed = strtoull(argv[2], NULL, 0);
  unsigned jobs = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
  unsigned ops = argc > 4 ? (unsigned)atoi(argv[4]) : 200;
  lossy = argc > 5 && strcmp(argv[5], "lossy") == 0;
  if (stat(argv[1], &st) != 0) {
    printf("GUEST-BLK FAIL %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  d.is_file = S_ISREG(st.st_mode);
  d.fd = open(argv[1], O_RDWR | (d.is_file ? 0 : O_DIRECT));
  if (d.fd < 0 || (d.is_file ? (d.size = (uint64_t)st.st_size, 0)
                             : ioctl(d.fd, BLKGETSIZE64, &d.size)) != 0) {
    printf("GUEST-BLK FAIL %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  if (jobs == 0 || d.size / jobs < UNIT) {
    printf("GUEST-BLK FAIL disk too small for %u jobs\n", jobs);
    return 1;
  }
  uint64_t region = d.size / jobs / UNIT * UNIT;
  for (unsigned j = 0; j < jobs; j++) {
    if (fork() == 0)
      _exit(run_job(&d, seed, j, j * region, (j + 1) * region, ops) ? 1 : 0);
  }
  int failed = 0, status;
  while (wait(&status) > 0)
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  printf("GUEST-BLK %s\n", failed ? "FAIL" : "OK");
  return failed;
}
