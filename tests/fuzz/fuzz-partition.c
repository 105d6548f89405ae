/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: MBR and GPT partition tables (frontend/partition.c).
 *
 * The input is a whole disk.  The parser reads it through a callback that
 * checks every request lies on the disk; what comes back must be a sane
 * table: at most PT_MAX_PARTS partitions, each non-empty, on the disk,
 * numbered 1.. without repeats, with the sector size of its kind.  The
 * same input is also parsed as a prefix of a larger disk (the parser may
 * then ask past the input: the callback answers with zeroes), so size
 * checks against the disk and not the buffer are exercised. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/partition.h"
#include "fuzz-check.h"

struct disk {
  const uint8_t *data;
  size_t len;    /* bytes of input */
  uint64_t size; /* the disk size the parser is told */
};

static int read_disk(void *opaque, uint64_t off, void *buf, size_t len) {
  const struct disk *d = opaque;
  CHECK(off <= d->size && len <= d->size - off);
  memset(buf, 0, len);
  if (off < d->len) {
    size_t n = d->len - off < len ? d->len - (size_t)off : len;
    memcpy(buf, d->data + off, n);
  }
  return 0;
}

static void check_table(const struct pt_table *t, uint64_t size) {
  CHECK(t->n <= PT_MAX_PARTS);
  CHECK(t->type == PT_NONE || t->type == PT_MBR || t->type == PT_GPT);
  if (t->type == PT_NONE)
    CHECK(t->n == 0);
  if (t->type == PT_MBR)
    CHECK(t->sector_size == 512);
  if (t->type == PT_GPT)
    CHECK(t->sector_size == 512 || t->sector_size == 4096);
  CHECK(memchr(t->warning, 0, sizeof t->warning) != NULL);
  static unsigned char seen[PT_MAX_PARTS + 1];
  memset(seen, 0, sizeof seen);
  for (size_t i = 0; i < t->n; i++) {
    const struct pt_part *p = &t->parts[i];
    CHECK(p->number >= 1 && p->number <= PT_MAX_PARTS);
    CHECK(!seen[p->number]);
    seen[p->number] = 1;
    CHECK(p->length > 0);
    CHECK(p->offset <= size && p->length <= size - p->offset);
    CHECK(p->offset % t->sector_size == 0 && p->length % t->sector_size == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static struct pt_table t;
  if (size > (4u << 20))
    return 0;
  struct disk d = {data, size, size};
  CHECK(pt_parse(read_disk, &d, d.size, &t) == 0);
  check_table(&t, d.size);

  /* The input as the start of a disk of 2 TiB + a few sectors. */
  d.size = (2ull << 40) + 4096 * 3;
  CHECK(pt_parse(read_disk, &d, d.size, &t) == 0);
  check_table(&t, d.size);
  return 0;
}
