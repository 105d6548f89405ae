/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 snapshot table parsing (see qcow2.rst, "Snapshots"). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/byteorder.h"
#include "core/io.h"
#include "qcow2.h"
#include "snapshot.h"

void qcow2_free_snapshots(struct qcow2_snapshot *s, uint32_t nb) {
  if (!s)
    return;
  for (uint32_t i = 0; i < nb; i++) {
    free(s[i].id);
    free(s[i].name);
    free(s[i].extra);
  }
  free(s);
}

/* The table does not fit in LEN: -ENOSPC to read more, unless LEN already
 * reaches the limit. */
static int short_table(size_t len, uint32_t i) {
  if (len >= QCOW2_MAX_SNAPSHOTS_BYTES)
    return qcow2_err(-EINVAL,
                     "snapshot table is larger than %u bytes (entry %u)",
                     QCOW2_MAX_SNAPSHOTS_BYTES, i);
  return qcow2_err(-ENOSPC, "snapshot table is truncated (entry %u)", i);
}

/* Snapshot I's L1 table: not too large, aligned, inside the file. */
static int l1_ok(const struct qcow2_snapshot *s, uint32_t i, uint64_t csize,
                 uint64_t file_size) {
  if ((uint64_t)s->l1_size * 8 > QCOW2_MAX_L1_BYTES)
    return qcow2_err(-EINVAL,
                     "snapshot %u: L1 table of %u entries is too large", i,
                     s->l1_size);
  if (s->l1_size && (s->l1_offset % csize || s->l1_offset > file_size ||
                     (uint64_t)s->l1_size * 8 > file_size - s->l1_offset))
    return qcow2_err(
        -EINVAL,
        "snapshot %u: L1 table offset 0x%llx is unaligned or past the "
        "end of the file",
        i, (unsigned long long)s->l1_offset);
  return 0;
}

static int parse_one(const uint8_t *p, size_t avail, uint32_t i, uint64_t csize,
                     uint64_t file_size, struct qcow2_snapshot *s,
                     size_t *elen) {
  if (avail < 40)
    return -ENOSPC;
  s->l1_offset = get_be64(p);
  s->l1_size = get_be32(p + 8);
  uint32_t id_len = get_be16(p + 12), name_len = get_be16(p + 14);
  s->date_sec = get_be32(p + 16);
  s->date_nsec = get_be32(p + 20);
  s->vm_clock_nsec = get_be64(p + 24);
  s->vm_state_size = get_be32(p + 32);
  uint32_t extra = get_be32(p + 36);
  s->disk_size = s->icount = UINT64_MAX;
  if (extra > QCOW2_MAX_SNAPSHOT_EXTRA)
    return qcow2_err(-EFBIG, "snapshot %u: extra data of %u bytes is too large",
                     i, extra);
  uint64_t total = 40ull + extra + id_len + name_len;
  if (total > avail)
    return -ENOSPC;
  /* Entries are padded to 8 bytes; the last one's padding may be missing
   * at the end of the file, as QEMU writes it. */
  total = (total + 7) & ~7ull;
  if (total > avail)
    total = avail;
  if (id_len == 0)
    return qcow2_err(-EINVAL, "snapshot %u has an empty ID", i);
  const uint8_t *x = p + 40;
  if (extra >= 8)
    s->vm_state_size = get_be64(x);
  if (extra >= 16)
    s->disk_size = get_be64(x + 8);
  if (extra >= 24)
    s->icount = get_be64(x + 16);
  int r = csize ? l1_ok(s, i, csize, file_size) : 0;
  if (r < 0)
    return r;
  const uint8_t *id = x + extra, *name = id + id_len;
  if (memchr(id, 0, id_len) || memchr(name, 0, name_len))
    return qcow2_err(-EINVAL, "snapshot %u: ID or name contains NUL", i);
  s->id = strndup((const char *)id, id_len);
  s->name = strndup((const char *)name, name_len);
  s->extra = malloc(extra ? extra : 1);
  s->extra_len = extra;
  if (s->extra)
    memcpy(s->extra, x, extra);
  if (!s->id || !s->name || !s->extra)
    return qcow2_err(-ENOMEM, "out of memory");
  *elen = (size_t)total;
  return 0;
}

int qcow2_parse_snapshots(const uint8_t *buf, size_t len, uint32_t nb,
                          uint64_t csize, uint64_t file_size,
                          struct qcow2_snapshot **out, size_t *used) {
  *out = NULL;
  *used = 0;
  if (nb > QCOW2_MAX_SNAPSHOTS)
    return qcow2_err(-EINVAL, "too many snapshots (%u)", nb);
  if (csize & (csize - 1))
    return qcow2_err(-EINVAL, "invalid cluster size");
  if (len > QCOW2_MAX_SNAPSHOTS_BYTES)
    len = QCOW2_MAX_SNAPSHOTS_BYTES;
  struct qcow2_snapshot *s = calloc(nb ? nb : 1, sizeof *s);
  if (!s)
    return qcow2_err(-ENOMEM, "out of memory");
  size_t off = 0;
  for (uint32_t i = 0; i < nb; i++) {
    size_t elen = 0;
    int r = parse_one(buf + off, len - off, i, csize, file_size, &s[i], &elen);
    if (r == -ENOSPC)
      r = short_table(len, i);
    if (r < 0) {
      qcow2_free_snapshots(s, nb);
      return r;
    }
    off += elen;
  }
  *out = s;
  *used = off;
  return 0;
}

int qcow2_read_snapshots(int fd, uint64_t file_size,
                         const struct qcow2_header *h, bool check_l1,
                         struct qcow2_snapshot **out, size_t *used) {
  uint64_t off = h->snapshots_offset;
  uint64_t avail = off < file_size ? file_size - off : 0;
  uint64_t csize = check_l1 ? 1ull << h->cluster_bits : 0;
  size_t len = 64 * 1024;
  for (;;) {
    if (len > avail)
      len = (size_t)avail;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
      return qcow2_err(-ENOMEM, "out of memory");
    int r = io_pread_zero(fd, buf, len, off);
    if (r < 0)
      qcow2_err(r, "%s", strerror(-r));
    else
      r = qcow2_parse_snapshots(buf, len, h->nb_snapshots, csize,
                                check_l1 ? file_size : 0, out, used);
    free(buf);
    if (r == -ENOSPC && len < avail && len < QCOW2_MAX_SNAPSHOTS_BYTES) {
      len *= 4; /* the table is longer: read more */
      continue;
    }
    return r;
  }
}

/* QEMU's extra data: VM state size, disk size, icount. */
#define KNOWN_EXTRA 24u

static size_t entry_size(const struct qcow2_snapshot *s) {
  uint32_t extra = s->extra_len > KNOWN_EXTRA ? s->extra_len : KNOWN_EXTRA;
  return 40 + extra + strlen(s->id) + strlen(s->name);
}

size_t qcow2_snapshot_table_size(const struct qcow2_snapshot *s, uint32_t nb) {
  size_t off = 0;
  for (uint32_t i = 0; i < nb; i++)
    off = ((off + 7) & ~(size_t)7) + entry_size(&s[i]);
  return off;
}

static void write_entry(const struct qcow2_snapshot *s, uint8_t *p) {
  uint32_t extra = s->extra_len > KNOWN_EXTRA ? s->extra_len : KNOWN_EXTRA;
  size_t id_len = strlen(s->id), name_len = strlen(s->name);
  put_be64(p, s->l1_offset);
  put_be32(p + 8, s->l1_size);
  put_be16(p + 12, (uint16_t)id_len);
  put_be16(p + 14, (uint16_t)name_len);
  put_be32(p + 16, s->date_sec);
  put_be32(p + 20, s->date_nsec);
  put_be64(p + 24, s->vm_clock_nsec);
  put_be32(p + 32, (uint32_t)s->vm_state_size);
  put_be32(p + 36, extra);
  uint8_t *x = p + 40;
  memset(x, 0, extra);
  if (s->extra_len > KNOWN_EXTRA)
    memcpy(x + KNOWN_EXTRA, s->extra + KNOWN_EXTRA, s->extra_len - KNOWN_EXTRA);
  put_be64(x, s->vm_state_size);
  put_be64(x + 8, s->disk_size);
  put_be64(x + 16, s->icount);
  memcpy(x + extra, s->id, id_len);
  memcpy(x + extra + id_len, s->name, name_len);
}

void qcow2_snapshot_table_write(const struct qcow2_snapshot *s, uint32_t nb,
                                uint8_t *buf) {
  size_t off = 0;
  for (uint32_t i = 0; i < nb; i++) {
    size_t start = (off + 7) & ~(size_t)7;
    memset(buf + off, 0, start - off); /* the padding */
    write_entry(&s[i], buf + start);
    off = start + entry_size(&s[i]);
  }
}

int qcow2_snapshot_find(const struct qcow2_snapshot *s, uint32_t nb,
                        const char *id_or_name, bool by_id) {
  for (uint32_t i = 0; by_id && i < nb; i++)
    if (!strcmp(s[i].id, id_or_name))
      return (int)i;
  for (uint32_t i = 0; i < nb; i++)
    if (!strcmp(s[i].name, id_or_name))
      return (int)i;
  return -1;
}

void qcow2_snapshot_next_id(const struct qcow2_snapshot *s, uint32_t nb,
                            char *buf, size_t len) {
  unsigned long max = 0;
  for (uint32_t i = 0; i < nb; i++) {
    unsigned long id = strtoul(s[i].id, NULL, 10);
    if (id > max)
      max = id;
  }
  snprintf(buf, len, "%lu", max + 1);
}
