/* SPDX-License-Identifier: BSD-3-Clause */
/* MBR and GPT partition tables: see partition.h.  Every number read from
 * the disk is checked against the disk size (in 64-bit arithmetic that
 * cannot overflow) before it is used as an offset or a length. */
#include "partition.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/byteorder.h"

#define MBR_SECTOR 512u
#define MBR_TABLE 446u
#define GPT_MAX_ARRAY (1u << 20) /* bytes of GPT entries we accept */
#define GPT_HEADER_MIN 92u
#define MAX_EBR_HOPS 1024u /* a chain longer than this is a loop */

struct ctx {
  pt_read_fn *read;
  void *opaque;
  uint64_t size;
  struct pt_table *t;
};

__attribute__((format(printf, 2, 3))) static void warn(struct ctx *c,
                                                       const char *fmt, ...) {
  if (c->t->nwarnings++ > 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->t->warning, sizeof c->t->warning, fmt, ap);
  va_end(ap);
}

/* Is [off, off + len) on the disk? */
static bool on_disk(const struct ctx *c, uint64_t off, uint64_t len) {
  return off <= c->size && len <= c->size - off;
}

/* Read a range of the disk: 0, 1 when it is not on the disk, or -errno. */
static int read_at(struct ctx *c, uint64_t off, void *buf, size_t len) {
  if (!on_disk(c, off, len))
    return 1;
  return c->read(c->opaque, off, buf, len);
}

static void add_part(struct ctx *c, unsigned number, uint64_t off, uint64_t len,
                     uint8_t mbr_type, const uint8_t *gpt_entry) {
  struct pt_table *t = c->t;
  if (len == 0)
    return;
  if (!on_disk(c, off, len)) {
    warn(c, "partition %u [%llu, +%llu) does not fit on the disk (%llu bytes)",
         number, (unsigned long long)off, (unsigned long long)len,
         (unsigned long long)c->size);
    return;
  }
  if (number > PT_MAX_PARTS || t->n >= PT_MAX_PARTS) {
    warn(c, "partition %u: more partitions than the %u supported", number,
         PT_MAX_PARTS);
    return;
  }
  struct pt_part *p = &t->parts[t->n++];
  memset(p, 0, sizeof *p);
  p->number = number;
  p->offset = off;
  p->length = len;
  p->mbr_type = mbr_type;
  if (gpt_entry) {
    memcpy(p->type, gpt_entry, 16);
    memcpy(p->guid, gpt_entry + 16, 16);
  }
}

/* ---- MBR ---- */

struct mbr_entry {
  uint8_t boot, type;
  uint32_t start, count; /* in 512-byte sectors */
};

static struct mbr_entry mbr_entry(const uint8_t *sector, unsigned slot) {
  const uint8_t *e = sector + MBR_TABLE + 16 * slot;
  return (struct mbr_entry){e[0], e[4], get_le32(e + 8), get_le32(e + 12)};
}

static bool mbr_signature(const uint8_t *sector) {
  return sector[510] == 0x55 && sector[511] == 0xAA;
}

/* A boot sector with 0x55AA that is not a partition table (a FAT file
 * system, say) has other bytes where the boot flags would be. */
static bool mbr_valid(const uint8_t *sector) {
  if (!mbr_signature(sector))
    return false;
  for (unsigned i = 0; i < 4; i++) {
    uint8_t b = mbr_entry(sector, i).boot;
    if (b != 0 && b != 0x80)
      return false;
  }
  return true;
}

static bool mbr_extended(uint8_t type) {
  return type == 0x05 || type == 0x0F || type == 0x85;
}

/* The logical partitions: a chain of extended boot records, each holding
 * one logical partition (relative to itself) and a link to the next
 * (relative to the extended partition). */
static int mbr_logicals(struct ctx *c, uint64_t ext_start, uint64_t ext_count) {
  uint8_t s[MBR_SECTOR];
  uint64_t ebr = ext_start, ebr_count = ext_count;
  unsigned number = 5;
  for (unsigned hop = 0;; hop++) {
    if (hop == MAX_EBR_HOPS) {
      warn(c, "the chain of logical partitions does not end (a loop?)");
      return 0;
    }
    int r = read_at(c, ebr * MBR_SECTOR, s, sizeof s);
    if (r != 0 || !mbr_signature(s)) {
      if (r <= 0 && hop > 0)
        warn(c, "extended boot record at sector %llu is %s",
             (unsigned long long)ebr, r < 0 ? "unreadable" : "not valid");
      return r < 0 ? r : 0;
    }
    for (unsigned i = 0; i < 4; i++) {
      struct mbr_entry e = mbr_entry(s, i);
      if (e.count == 0 || e.type == 0 || mbr_extended(e.type))
        continue;
      uint64_t start = ebr + e.start;
      /* Slots 3 and 4 are often garbage: take them only when they lie
       * inside this record's part of the extended partition (as Linux). */
      if (i >= 2 && ((uint64_t)e.start + e.count > ebr_count ||
                     start + e.count > ext_start + ext_count))
        continue;
      add_part(c, number++, start * MBR_SECTOR, (uint64_t)e.count * MBR_SECTOR,
               e.type, NULL);
    }
    unsigned i = 0;
    while (i < 4 &&
           !(mbr_extended(mbr_entry(s, i).type) && mbr_entry(s, i).count != 0))
      i++;
    if (i == 4)
      return 0;
    struct mbr_entry link = mbr_entry(s, i);
    ebr = ext_start + link.start;
    ebr_count = link.count;
    if (link.start == 0 || link.start >= ext_count) {
      warn(c,
           "extended boot record link to sector %llu leaves the extended "
           "partition",
           (unsigned long long)ebr);
      return 0;
    }
  }
}

static int mbr_parse(struct ctx *c, const uint8_t *s) {
  c->t->type = PT_MBR;
  c->t->sector_size = MBR_SECTOR;
  bool extended_done = false;
  for (unsigned i = 0; i < 4; i++) {
    struct mbr_entry e = mbr_entry(s, i);
    if (e.type == 0 || e.count == 0)
      continue;
    if (mbr_extended(e.type)) {
      /* Linux follows one extended partition; so do we. */
      if (extended_done)
        continue;
      extended_done = true;
      if (!on_disk(c, (uint64_t)e.start * MBR_SECTOR,
                   (uint64_t)e.count * MBR_SECTOR)) {
        warn(c, "extended partition %u does not fit on the disk", i + 1);
        continue;
      }
      int r = mbr_logicals(c, e.start, e.count);
      if (r < 0)
        return r;
      continue;
    }
    add_part(c, i + 1, (uint64_t)e.start * MBR_SECTOR,
             (uint64_t)e.count * MBR_SECTOR, e.type, NULL);
  }
  return 0;
}

/* ---- GPT ---- */

struct gpt_header {
  uint64_t first_usable, last_usable, entries_lba;
  uint32_t nentries, entry_size, entries_crc;
};

/* Check the header at LBA; 1 valid, 0 not, -errno. */
static int gpt_header(struct ctx *c, uint32_t ss, uint64_t lba,
                      struct gpt_header *h) {
  uint8_t s[4096];
  uint64_t last_lba = c->size / ss - 1;
  int r = read_at(c, lba * ss, s, ss);
  if (r != 0)
    return r < 0 ? r : 0;
  uint32_t hsize = get_le32(s + 12);
  if (memcmp(s, "EFI PART", 8) != 0 || hsize < GPT_HEADER_MIN || hsize > ss)
    return 0;
  uint32_t crc = get_le32(s + 16);
  memset(s + 16, 0, 4);
  if ((uint32_t)crc32(0, s, hsize) != crc || get_le64(s + 24) != lba)
    return 0;
  *h = (struct gpt_header){.first_usable = get_le64(s + 40),
                           .last_usable = get_le64(s + 48),
                           .entries_lba = get_le64(s + 72),
                           .nentries = get_le32(s + 80),
                           .entry_size = get_le32(s + 84),
                           .entries_crc = get_le32(s + 88)};
  if (h->first_usable > h->last_usable || h->last_usable > last_lba ||
      h->entry_size < 128 || h->entry_size > 4096 || h->entry_size % 8 != 0 ||
      (uint64_t)h->nentries * h->entry_size > GPT_MAX_ARRAY ||
      h->entries_lba > last_lba ||
      !on_disk(c, h->entries_lba * ss, (uint64_t)h->nentries * h->entry_size))
    return 0;
  return 1;
}

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

static void gpt_entries(struct ctx *c, uint32_t ss, const struct gpt_header *h,
                        const uint8_t *a) {
  uint64_t last_lba = c->size / ss - 1;
  for (uint32_t i = 0; i < h->nentries; i++) {
    const uint8_t *e = a + (size_t)i * h->entry_size;
    if (all_zero(e, 16))
      continue; /* unused entry */
    uint64_t first = get_le64(e + 32), last = get_le64(e + 40);
    if (first > last || last > last_lba) {
      warn(c, "GPT entry %u has sectors [%llu, %llu] outside the disk", i + 1,
           (unsigned long long)first, (unsigned long long)last);
      continue;
    }
    add_part(c, i + 1, first * ss, (last - first + 1) * ss, 0, e);
  }
}

/* The GPT at header LBA with sectors of SS bytes: 1 found, 0 not, -errno. */
static int gpt_at(struct ctx *c, uint32_t ss, uint64_t lba) {
  struct gpt_header h;
  int r = gpt_header(c, ss, lba, &h);
  if (r <= 0)
    return r;
  size_t len = (size_t)h.nentries * h.entry_size;
  uint8_t *a = malloc(len ? len : 1);
  if (!a)
    return -ENOMEM;
  r = read_at(c, h.entries_lba * ss, a, len);
  bool good = r == 0 && (uint32_t)crc32(0, a, (uInt)len) == h.entries_crc;
  if (good) {
    c->t->type = PT_GPT;
    c->t->sector_size = ss;
    gpt_entries(c, ss, &h, a);
  }
  free(a);
  return r < 0 ? r : good;
}

/* Try the primary header, then the backup at the last sector (each with
 * its own entry array), as Linux does. */
static int gpt_parse(struct ctx *c, uint32_t ss) {
  if (c->size / ss < 3)
    return 0;
  int r = gpt_at(c, ss, 1);
  return r != 0 ? r : gpt_at(c, ss, c->size / ss - 1);
}

/* ---- entry points ---- */

int pt_parse(pt_read_fn *read, void *opaque, uint64_t disk_size,
             struct pt_table *out) {
  memset(out, 0, sizeof *out);
  struct ctx c = {read, opaque, disk_size, out};
  uint8_t s[MBR_SECTOR];
  int r = read_at(&c, 0, s, sizeof s);
  if (r != 0)
    return r < 0 ? r : 0;
  if (!mbr_valid(s))
    return 0;
  bool protective = false;
  for (unsigned i = 0; i < 4; i++)
    protective |= mbr_entry(s, i).type == 0xEE;
  if (!protective)
    return mbr_parse(&c, s);
  r = gpt_parse(&c, 512);
  if (r == 0)
    r = gpt_parse(&c, 4096);
  if (r == 0)
    warn(&c, "protective MBR without a valid GPT");
  return r < 0 ? r : 0;
}

struct membuf {
  const uint8_t *p;
  size_t len;
};

static int read_membuf(void *opaque, uint64_t off, void *buf, size_t len) {
  const struct membuf *m = opaque;
  if (off > m->len || len > m->len - off)
    return -EIO;
  memcpy(buf, m->p + off, len);
  return 0;
}

int pt_parse_buffer(const void *disk, size_t len, struct pt_table *out) {
  struct membuf m = {disk, len};
  return pt_parse(read_membuf, &m, len, out);
}
