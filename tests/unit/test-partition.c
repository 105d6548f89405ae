/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the MBR/GPT parser (frontend/partition.c): tables as
 * sfdisk and Linux lay them out, damaged tables, loops, lies about sizes,
 * and garbage, which must never yield a partition outside the disk. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "frontend/partition.h"

#define MIB (1024u * 1024u)

static void w32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void w64(uint8_t *p, uint64_t v) {
  w32(p, (uint32_t)v);
  w32(p + 4, (uint32_t)(v >> 32));
}

static void mbr_set(uint8_t *sector, unsigned slot, uint8_t boot, uint8_t type,
                    uint32_t start, uint32_t count) {
  uint8_t *e = sector + 446 + 16 * slot;
  e[0] = boot;
  e[4] = type;
  w32(e + 8, start);
  w32(e + 12, count);
  sector[510] = 0x55;
  sector[511] = 0xAA;
}

static struct pt_table *parse(const uint8_t *disk, size_t len) {
  static struct pt_table t;
  cr_assert_eq(pt_parse_buffer(disk, len, &t), 0);
  return &t;
}

static void expect(const struct pt_part *p, unsigned number, uint64_t off,
                   uint64_t len) {
  cr_expect_eq(p->number, number);
  cr_expect_eq(p->offset, off, "partition %u offset %llu, want %llu", number,
               (unsigned long long)p->offset, (unsigned long long)off);
  cr_expect_eq(p->length, len, "partition %u length %llu, want %llu", number,
               (unsigned long long)p->length, (unsigned long long)len);
}

Test(partition, blank_disk_has_none) {
  uint8_t *d = calloc(1, MIB);
  struct pt_table *t = parse(d, MIB);
  cr_expect_eq(t->type, PT_NONE);
  cr_expect_eq(t->n, 0);
  free(d);
}

Test(partition, tiny_disks_have_none) {
  uint8_t d[600] = {0};
  mbr_set(d, 0, 0, 0x83, 0, 1);
  for (size_t len = 0; len < sizeof d; len += 37) {
    struct pt_table *t = parse(d, len);
    cr_expect(len >= 512 || t->type == PT_NONE);
    for (size_t i = 0; i < t->n; i++)
      cr_expect_leq(t->parts[i].offset + t->parts[i].length, len);
  }
}

Test(partition, mbr_primaries_numbered_by_slot) {
  uint8_t *d = calloc(1, 8 * MIB);
  mbr_set(d, 0, 0x80, 0x83, 2048, 4096);
  mbr_set(d, 2, 0, 0x07, 8192, 2048);
  struct pt_table *t = parse(d, 8 * MIB);
  cr_assert_eq(t->type, PT_MBR);
  cr_assert_eq(t->n, 2);
  expect(&t->parts[0], 1, MIB, 2 * MIB);
  expect(&t->parts[1], 3, 4 * MIB, MIB);
  cr_expect_eq(t->parts[0].mbr_type, 0x83);
  cr_expect_eq(t->nwarnings, 0);
  free(d);
}

Test(partition, mbr_bad_boot_flag_is_not_a_table) {
  uint8_t *d = calloc(1, MIB);
  mbr_set(d, 0, 0x80, 0x83, 1, 100);
  mbr_set(d, 1, 0x12, 0x83, 200, 100); /* a FAT boot sector, say */
  cr_expect_eq(parse(d, MIB)->type, PT_NONE);
  free(d);
}

Test(partition, mbr_partition_past_the_end_is_left_out) {
  uint8_t *d = calloc(1, MIB);
  mbr_set(d, 0, 0, 0x83, 1, 100);
  mbr_set(d, 1, 0, 0x83, 2000, 100); /* ends at 2100 sectors > 2048 */
  mbr_set(d, 2, 0, 0x83, 0xFFFFFFFF, 0xFFFFFFFF);
  struct pt_table *t = parse(d, MIB);
  cr_assert_eq(t->n, 1);
  expect(&t->parts[0], 1, 512, 100 * 512);
  cr_expect_eq(t->nwarnings, 2);
  cr_expect(strstr(t->warning, "does not fit") != NULL, "%s", t->warning);
  free(d);
}

/* Extended partition at sector 4096 of 8192 sectors with logicals of 1000
 * and 2000 sectors, the second EBR at +2048. */
static uint8_t *disk_with_logicals(void) {
  uint8_t *d = calloc(1, 8 * MIB);
  mbr_set(d, 0, 0, 0x83, 2048, 2048);
  mbr_set(d, 1, 0, 0x05, 4096, 8192);
  uint8_t *ebr1 = d + 4096 * 512, *ebr2 = d + (4096 + 2048) * 512;
  mbr_set(ebr1, 0, 0, 0x83, 63, 1000);
  mbr_set(ebr1, 1, 0, 0x05, 2048, 4096);
  mbr_set(ebr2, 0, 0, 0x82, 63, 2000);
  return d;
}

Test(partition, mbr_logical_partitions) {
  uint8_t *d = disk_with_logicals();
  struct pt_table *t = parse(d, 8 * MIB);
  cr_assert_eq(t->type, PT_MBR);
  cr_assert_eq(t->n, 3);
  expect(&t->parts[0], 1, MIB, MIB);
  expect(&t->parts[1], 5, (4096 + 63) * 512ull, 1000 * 512);
  expect(&t->parts[2], 6, (4096 + 2048 + 63) * 512ull, 2000 * 512);
  cr_expect_eq(t->parts[2].mbr_type, 0x82);
  free(d);
}

Test(partition, mbr_ebr_loop_ends) {
  uint8_t *d = disk_with_logicals();
  /* The second EBR links back to the first. */
  mbr_set(d + (4096 + 2048) * 512, 1, 0, 0x05, 1, 100);
  mbr_set(d + (4096 + 1) * 512, 1, 0, 0x05, 2048, 100);
  struct pt_table *t = parse(d, 8 * MIB);
  cr_expect_leq(t->n, PT_MAX_PARTS);
  cr_expect_gt(t->nwarnings, 0);
  free(d);
}

Test(partition, mbr_ebr_self_link_ends) {
  uint8_t *d = disk_with_logicals();
  mbr_set(d + 4096 * 512, 1, 0, 0x05, 0, 100); /* link to itself */
  struct pt_table *t = parse(d, 8 * MIB);
  cr_expect_eq(t->n, 2);
  cr_expect_gt(t->nwarnings, 0);
  free(d);
}

Test(partition, mbr_extended_past_the_end) {
  uint8_t *d = calloc(1, MIB);
  mbr_set(d, 0, 0, 0x0F, 1000, 100000);
  struct pt_table *t = parse(d, MIB);
  cr_expect_eq(t->n, 0);
  cr_expect_eq(t->nwarnings, 1);
  free(d);
}

/* ---- GPT ---- */

struct gpt_spec {
  uint32_t ss;
  uint64_t lba, entries_lba;
  uint32_t nentries, entry_size;
};

static void gpt_put_entry(uint8_t *disk, const struct gpt_spec *g,
                          unsigned index, uint64_t first, uint64_t last) {
  uint8_t *e = disk + g->entries_lba * g->ss + (size_t)index * g->entry_size;
  memset(e, 0, g->entry_size);
  memcpy(e, "\xaf\x3d\xc6\x0f\x83\x84\x72\x47\x8e\x79\x3d\x69\xd8\x47\x7d\xe4",
         16); /* Linux filesystem data */
  e[16] = (uint8_t)(index + 1);
  w64(e + 32, first);
  w64(e + 40, last);
}

/* Write the header (after the entries, whose CRC it carries). */
static void gpt_seal(uint8_t *disk, uint64_t disk_size,
                     const struct gpt_spec *g) {
  uint8_t *h = disk + g->lba * g->ss;
  uint64_t last = disk_size / g->ss - 1;
  memset(h, 0, g->ss);
  memcpy(h, "EFI PART", 8);
  w32(h + 8, 0x00010000);
  w32(h + 12, 92);
  w64(h + 24, g->lba);
  w64(h + 32, g->lba == 1 ? last : 1);
  w64(h + 40, 34);
  w64(h + 48, last - 33);
  w64(h + 72, g->entries_lba);
  w32(h + 80, g->nentries);
  w32(h + 84, g->entry_size);
  w32(h + 88, (uint32_t)crc32(0, disk + g->entries_lba * g->ss,
                              g->nentries * g->entry_size));
  w32(h + 16, (uint32_t)crc32(0, h, 92));
}

static void protective_mbr(uint8_t *disk, uint64_t size) {
  uint64_t n = size / 512 - 1;
  mbr_set(disk, 0, 0, 0xEE, 1, n > 0xFFFFFFFF ? 0xFFFFFFFF : (uint32_t)n);
}

#define GPT_DISK (16 * MIB)

static uint8_t *gpt_disk(void) {
  uint8_t *d = calloc(1, GPT_DISK);
  protective_mbr(d, GPT_DISK);
  struct gpt_spec g = {512, 1, 2, 128, 128};
  gpt_put_entry(d, &g, 0, 2048, 4095);
  gpt_put_entry(d, &g, 3, 8192, 16383);
  gpt_seal(d, GPT_DISK, &g);
  struct gpt_spec b = {512, GPT_DISK / 512 - 1, GPT_DISK / 512 - 33, 128, 128};
  memcpy(d + b.entries_lba * 512, d + 1024, 128 * 128);
  gpt_seal(d, GPT_DISK, &b);
  return d;
}

Test(partition, gpt_numbered_by_entry) {
  uint8_t *d = gpt_disk();
  struct pt_table *t = parse(d, GPT_DISK);
  cr_assert_eq(t->type, PT_GPT);
  cr_expect_eq(t->sector_size, 512);
  cr_assert_eq(t->n, 2);
  expect(&t->parts[0], 1, MIB, MIB);
  expect(&t->parts[1], 4, 4 * MIB, 4 * MIB);
  cr_expect_eq(t->parts[1].guid[0], 4);
  cr_expect_eq(t->parts[0].type[0], 0xaf);
  cr_expect_eq(t->nwarnings, 0);
  free(d);
}

Test(partition, gpt_backup_header_when_primary_is_damaged) {
  uint8_t *d = gpt_disk();
  d[512 + 60] ^= 1; /* header CRC no longer matches */
  struct pt_table *t = parse(d, GPT_DISK);
  cr_assert_eq(t->type, PT_GPT);
  cr_expect_eq(t->n, 2);
  free(d);
}

Test(partition, gpt_backup_when_primary_entries_are_damaged) {
  uint8_t *d = gpt_disk();
  d[1024 + 40] ^= 1; /* entry array CRC no longer matches */
  struct pt_table *t = parse(d, GPT_DISK);
  cr_assert_eq(t->type, PT_GPT);
  cr_assert_eq(t->n, 2);
  expect(&t->parts[0], 1, MIB, MIB);
  free(d);
}

Test(partition, gpt_both_damaged_gives_none) {
  uint8_t *d = gpt_disk();
  d[512 + 60] ^= 1;
  d[GPT_DISK - 512 + 60] ^= 1;
  struct pt_table *t = parse(d, GPT_DISK);
  cr_expect_eq(t->type, PT_NONE);
  cr_expect_eq(t->n, 0);
  cr_expect(strstr(t->warning, "without a valid GPT") != NULL);
  free(d);
}

Test(partition, gpt_without_protective_mbr_is_ignored) {
  uint8_t *d = gpt_disk();
  memset(d, 0, 512);
  cr_expect_eq(parse(d, GPT_DISK)->type, PT_NONE);
  free(d);
}

Test(partition, gpt_4k_sectors) {
  uint8_t *d = calloc(1, GPT_DISK);
  protective_mbr(d, GPT_DISK);
  struct gpt_spec g = {4096, 1, 2, 128, 128};
  gpt_put_entry(d, &g, 1, 256, 511);
  gpt_seal(d, GPT_DISK, &g);
  struct pt_table *t = parse(d, GPT_DISK);
  cr_assert_eq(t->type, PT_GPT);
  cr_expect_eq(t->sector_size, 4096);
  cr_assert_eq(t->n, 1);
  expect(&t->parts[0], 2, MIB, MIB);
  free(d);
}

Test(partition, gpt_entry_outside_the_disk_is_left_out) {
  uint8_t *d = calloc(1, GPT_DISK);
  protective_mbr(d, GPT_DISK);
  struct gpt_spec g = {512, 1, 2, 128, 128};
  gpt_put_entry(d, &g, 0, 2048, 4095);
  gpt_put_entry(d, &g, 1, 4096, GPT_DISK / 512); /* one sector too far */
  gpt_put_entry(d, &g, 2, 5000, 4999);           /* ends before it starts */
  gpt_put_entry(d, &g, 3, UINT64_MAX - 1, UINT64_MAX);
  gpt_seal(d, GPT_DISK, &g);
  struct pt_table *t = parse(d, GPT_DISK);
  cr_assert_eq(t->n, 1);
  cr_expect_eq(t->nwarnings, 3);
  free(d);
}

/* A header with a good CRC whose numbers lie: each must be refused before
 * anything is sized or read from them. */
Test(partition, gpt_header_lies_are_refused) {
  const struct {
    unsigned field; /* byte offset in the header */
    uint64_t value;
    int width;
  } lies[] = {
      {80, 1u << 20, 4},            /* 128 MiB of entries */
      {84, 64, 4},                  /* entries too small */
      {84, 130, 4},                 /* not a multiple of 8 */
      {84, 1u << 16, 4},            /* entries too large */
      {72, GPT_DISK / 512, 8},      /* array past the end */
      {72, UINT64_MAX / 256, 8},    /* offset overflows */
      {48, GPT_DISK / 512, 8},      /* last usable past the end */
      {40, GPT_DISK / 512 - 10, 8}, /* first usable after last usable */
      {12, 4097, 4},                /* header larger than a sector */
      {24, 2, 8},                   /* not where it says it is */
  };
  for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
    uint8_t *d = gpt_disk();
    uint8_t *h = d + 512, *bh = d + GPT_DISK - 512;
    for (uint8_t *p = h; p; p = p == h ? bh : NULL) {
      if (lies[i].width == 4)
        w32(p + lies[i].field, (uint32_t)lies[i].value);
      else
        w64(p + lies[i].field, lies[i].value);
      w32(p + 16, 0);
      w32(p + 16, (uint32_t)crc32(0, p, 92));
    }
    struct pt_table *t = parse(d, GPT_DISK);
    cr_expect_eq(t->type, PT_NONE, "lie %zu", i);
    free(d);
  }
}

Test(partition, empty_disk) {
  struct pt_table t;
  cr_expect_eq(pt_parse_buffer("", 0, &t), 0);
  cr_expect_eq(t.type, PT_NONE);
}

static uint8_t *gpt_src;
static int read_sector0_only(void *opaque, uint64_t off, void *buf,
                             size_t len) {
  (void)opaque;
  if (off != 0)
    return -EIO;
  memcpy(buf, gpt_src, len);
  return 0;
}

Test(partition, read_error_after_the_mbr) {
  gpt_src = gpt_disk();
  struct pt_table t;
  cr_expect_eq(pt_parse(read_sector0_only, NULL, GPT_DISK, &t), -EIO);
  free(gpt_src);
}

/* Garbage: random sectors with a valid-looking MBR or GPT skeleton.  The
 * parser must return cleanly and report only partitions on the disk. */
Test(partition, garbage_never_escapes_the_disk) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  size_t len = 64 * 1024;
  uint8_t *d = malloc(len);
  for (int round = 0; round < 2000; round++) {
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      d[i] = (uint8_t)x;
    }
    /* Make half of them look like tables so the deep paths run. */
    for (unsigned s = 0; s < 4; s++)
      d[446 + 16 * s] = (round & 1) ? 0 : d[446 + 16 * s];
    d[510] = 0x55, d[511] = 0xAA;
    if (round % 4 == 1)
      d[446 + 4] = 0xEE, memcpy(d + 512, "EFI PART", 8);
    if (round % 4 == 3)
      d[446 + 4] = 0x05;
    size_t dl = len - (size_t)(x % 4096);
    struct pt_table *t = parse(d, dl);
    cr_assert_leq(t->n, PT_MAX_PARTS);
    for (size_t i = 0; i < t->n; i++) {
      cr_assert_gt(t->parts[i].length, 0);
      cr_assert_leq(t->parts[i].offset, dl);
      cr_assert_leq(t->parts[i].length, dl - t->parts[i].offset);
    }
  }
  free(d);
}
