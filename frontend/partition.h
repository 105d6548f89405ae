/* SPDX-License-Identifier: BSD-3-Clause */
/* MBR and GPT partition tables, parsed from bytes the caller supplies.
 *
 * Pure: the parser does no I/O of its own and keeps no state.  It asks the
 * caller for the sectors it needs through a read callback, and checks every
 * offset and length it takes from the disk against the disk size before it
 * asks for or uses them.  pt_parse_buffer() runs it over a byte buffer that
 * holds the whole disk (unit tests and the fuzzer).
 *
 * What it finds, and how partitions are numbered, follows Linux: MBR
 * primaries are 1-4 by slot, logical partitions in an extended partition
 * 5 and up in chain order (the extended container itself is not a
 * partition here); a protective MBR (type 0xEE) leads to the GPT, primary
 * header first, then the backup at the last sector, 512-byte sectors
 * first, then 4096; GPT partitions are numbered by their entry's index + 1.
 * A partition that does not fit on the disk is left out with a warning. */
#ifndef BLOCKPORT_PARTITION_H
#define BLOCKPORT_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#define PT_MAX_PARTS 256 /* partitions reported (GPT entry numbers too) */

enum pt_type { PT_NONE, PT_MBR, PT_GPT };

struct pt_part {
  unsigned number;  /* 1.. as Linux numbers it */
  uint64_t offset;  /* bytes from the start of the disk */
  uint64_t length;  /* bytes */
  uint8_t mbr_type; /* MBR partition type; 0 for GPT */
  uint8_t guid[16]; /* GPT unique partition GUID (on-disk byte order) */
  uint8_t type[16]; /* GPT partition type GUID (on-disk byte order) */
};

struct pt_table {
  enum pt_type type;
  uint32_t sector_size; /* 512 or 4096 */
  size_t n;
  struct pt_part parts[PT_MAX_PARTS];
  unsigned nwarnings; /* partitions or structures left out */
  char warning[160];  /* the first of them, for a log line */
};

/* Read LEN bytes at OFFSET of the disk into BUF.  The parser only asks for
 * ranges inside the disk size it was given.  Returns 0 or -errno. */
typedef int pt_read_fn(void *opaque, uint64_t offset, void *buf, size_t len);

/* Parse the partition table of a disk of DISK_SIZE bytes.  Returns 0 with
 * OUT->type PT_NONE when there is no partition table, 0 with the
 * partitions found, or the read callback's error.  A damaged table is not
 * an error: what cannot be trusted is left out and counted in
 * OUT->nwarnings. */
int pt_parse(pt_read_fn *read, void *opaque, uint64_t disk_size,
             struct pt_table *out);

/* The same over a buffer holding the whole disk. */
int pt_parse_buffer(const void *disk, size_t len, struct pt_table *out);

#endif
