/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 internal snapshots: parsing the snapshot table from a buffer, with
 * every length checked before it is used (pure, for the unit tests and
 * the fuzzers), and reading it from an image, for every reader of the
 * table (`blockport info`, the open for writing, `check`). */
#ifndef BLOCKPORT_QCOW2_SNAPSHOT_H
#define BLOCKPORT_QCOW2_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits, as QEMU's. */
#define QCOW2_MAX_SNAPSHOT_EXTRA 1024
#define QCOW2_MAX_SNAPSHOTS_BYTES (64u * 1024 * 1024)

struct qcow2_snapshot {
  uint64_t l1_offset;
  uint32_t l1_size;
  char *id; /* NUL-terminated copies */
  char *name;
  uint32_t date_sec, date_nsec;
  uint64_t vm_clock_nsec;
  uint64_t vm_state_size; /* the 64-bit extra field when present */
  uint64_t disk_size;     /* virtual size at snapshot time; UINT64_MAX if
                             not recorded */
  uint64_t icount;        /* UINT64_MAX if not recorded */
  /* The extra data as read (EXTRA_LEN bytes), kept so that rewriting the
   * table keeps what a newer writer put past the fields known here. */
  uint8_t *extra;
  uint32_t extra_len;
};

/* Parse NB entries from BUF (LEN bytes, the table starting at offset 0).
 * CLUSTER_SIZE and FILE_SIZE are used to check each snapshot's L1 table
 * (CLUSTER_SIZE 0: not checked, the check judges each one itself).
 * Returns 0 with *OUT (free with qcow2_free_snapshots) and *USED (bytes of
 * the table), -ENOSPC if BUF is too short for the table (read more, up to
 * QCOW2_MAX_SNAPSHOTS_BYTES, and retry), -EFBIG for an entry with more
 * extra data than QCOW2_MAX_SNAPSHOT_EXTRA (QEMU cannot read the table
 * either), or -EINVAL; with a reason in bd_errmsg(). */
int qcow2_parse_snapshots(const uint8_t *buf, size_t len, uint32_t nb,
                          uint64_t cluster_size, uint64_t file_size,
                          struct qcow2_snapshot **out, size_t *used);
void qcow2_free_snapshots(struct qcow2_snapshot *s, uint32_t nb);

/* Writing the table (snapshot-edit.c), pure for the unit tests.  Each
 * entry gets at least the 24 bytes of extra data QEMU writes (VM state
 * size, disk size, icount: DISK_SIZE must be known), the rest of its
 * extra data kept; entries are padded to 8 bytes but the last.  The size
 * of the table, then the table into BUF (that many bytes). */
size_t qcow2_snapshot_table_size(const struct qcow2_snapshot *s, uint32_t nb);
void qcow2_snapshot_table_write(const struct qcow2_snapshot *s, uint32_t nb,
                                uint8_t *buf);
/* With BY_ID, the snapshot whose ID is ID_OR_NAME, else the first whose
 * name is (how QEMU finds one to apply); without, only the first whose
 * name is (qemu-img snapshot -d).  -1 if none. */
int qcow2_snapshot_find(const struct qcow2_snapshot *s, uint32_t nb,
                        const char *id_or_name, bool by_id);
/* The ID QEMU gives a new snapshot: one more than the largest ID read as
 * a number (strtoul's reading), into BUF. */
void qcow2_snapshot_next_id(const struct qcow2_snapshot *s, uint32_t nb,
                            char *buf, size_t len);

struct qcow2_header;
/* Read the snapshot table H names from FD, a file of FILE_SIZE bytes, in
 * growing pieces until it parses (up to QCOW2_MAX_SNAPSHOTS_BYTES; what
 * lies past the end of the file reads as zeroes), and parse it as
 * qcow2_parse_snapshots() does, checking each snapshot's L1 table against
 * the cluster size and the file when CHECK_L1.  Returns 0 with *OUT and
 * *USED, -ENOSPC when the table runs past the end of the file, the
 * parser's -EINVAL or -EFBIG, -ENOMEM, or the -errno of a read; with a
 * reason in bd_errmsg(). */
int qcow2_read_snapshots(int fd, uint64_t file_size,
                         const struct qcow2_header *h, bool check_l1,
                         struct qcow2_snapshot **out, size_t *used);

#endif
