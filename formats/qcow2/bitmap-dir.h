/* SPDX-License-Identifier: BSD-3-Clause */
/* The pure parts of changing a qcow2 image's persistent bitmaps (qemu-img
 * bitmap, convert --bitmaps): what QEMU accepts as a new bitmap, the
 * bitmap directory written back, the header extensions rebuilt around a
 * new bitmaps extension, and bits merged between granularities.  No I/O:
 * the unit tests drive them; bitmap-edit.c does the writing. */
#ifndef BLOCKPORT_QCOW2_BITMAP_DIR_H
#define BLOCKPORT_QCOW2_BITMAP_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One directory entry as it is written. */
struct qcow2_bitmap_entry {
  uint64_t table_offset;
  uint32_t table_size;
  uint32_t flags;
  unsigned granularity_bits;
  const char *name;
};

/* The granularity qemu-img bitmap --add gives without -g: the cluster size
 * within 4 KiB..64 KiB (QEMU's bdrv_get_default_bitmap_granularity()). */
uint64_t qcow2_bitmap_default_granularity(unsigned cluster_bits);

/* Why QEMU would refuse to store a new bitmap NAME of GRANULARITY (a power
 * of two) in an image of SIZE bytes and version VERSION holding NB bitmaps
 * in a directory of DIR_SIZE bytes, in its words (qcow2-bitmap.c), or NULL
 * if it may be stored. */
const char *qcow2_bitmap_refuse_new(const char *name, uint64_t granularity,
                                    uint64_t size, unsigned cluster_bits,
                                    uint32_t version, uint32_t nb,
                                    uint64_t dir_size);

/* Bytes of the directory entry of a bitmap whose name is NAME_LEN bytes. */
size_t qcow2_bitmap_entry_size(size_t name_len);
/* The directory of the NB entries E into OUT (zero-filled first), which
 * holds the sum of their sizes.  Returns the bytes written. */
size_t qcow2_bitmap_dir_write(const struct qcow2_bitmap_entry *e, uint32_t nb,
                              uint8_t *out);

/* The start of the file HDR (LEN bytes, the header's first cluster or the
 * whole file if shorter; its fixed fields already parsed: HEADER_LENGTH,
 * the backing name's BACKING_OFFSET and BACKING_SIZE) with its extensions
 * rewritten: every one kept as it is except the bitmaps extension, which
 * becomes EXT (24 bytes) or goes away (EXT NULL), then the end marker and
 * the backing file name, whose offset (header bytes 8-15) follows it, as
 * QEMU lays them out.  Written into OUT (LEN bytes, zero-filled first);
 * *USED: how much of it is header.  -EINVAL when the extensions cannot be
 * walked, -ENOSPC when they no longer fit in LEN bytes. */
int qcow2_rebuild_extensions(const uint8_t *hdr, size_t len,
                             uint32_t header_length, uint64_t backing_offset,
                             uint32_t backing_size, const uint8_t *ext,
                             uint8_t *out, size_t *used);

/* Every bit of SRC (granularity 2^SG bytes) set in DST (2^DG) over the
 * guest range it covers, both covering SIZE bytes: as QEMU merges bitmaps
 * of different granularities (a bit is dirty if any byte under it is). */
void qcow2_bitmap_merge_bits(uint8_t *dst, unsigned dg, const uint8_t *src,
                             unsigned sg, uint64_t size);

#endif
