/* SPDX-License-Identifier: BSD-3-Clause */
/* virtio-blk: feature bits, config space and request parsing (pure). */
#include "virtio-blk.h"

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>
#include <string.h>

#include "core/byteorder.h"

#define BIT(n) (1ull << (n))

static uint32_t pow2_at_least(uint32_t v, uint32_t lo, uint32_t hi) {
  uint32_t p = lo;
  while (p < v && p < hi)
    p <<= 1;
  return p;
}

static uint64_t device_features(const struct vblk_dev *dev) {
  const struct bd_caps *c = &dev->bd->caps;
  uint64_t f = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_RING_F_INDIRECT_DESC) |
               BIT(VIRTIO_RING_F_EVENT_IDX) | BIT(VIRTIO_BLK_F_SIZE_MAX) |
               BIT(VIRTIO_BLK_F_SEG_MAX) | BIT(VIRTIO_BLK_F_BLK_SIZE) |
               BIT(VIRTIO_BLK_F_TOPOLOGY);
  if (dev->num_queues > 1)
    f |= BIT(VIRTIO_BLK_F_MQ);
  if (c->can_flush)
    f |= BIT(VIRTIO_BLK_F_FLUSH);
  if (dev->readonly)
    f |= BIT(VIRTIO_BLK_F_RO);
  else {
    /* The core writes zero buffers for sources that cannot zero. */
    f |= BIT(VIRTIO_BLK_F_WRITE_ZEROES);
    if (c->can_trim)
      f |= BIT(VIRTIO_BLK_F_DISCARD);
  }
  return f;
}

void vblk_dev_init(struct vblk_dev *dev, struct bd *bd, bool readonly,
                   uint16_t num_queues, uint16_t queue_size,
                   const char *serial) {
  memset(dev, 0, sizeof *dev);
  dev->bd = bd;
  dev->readonly = readonly || bd->caps.readonly;
  dev->num_queues = num_queues ? num_queues : 1;
  dev->blk_size = pow2_at_least(bd->caps.min_block, VBLK_SECTOR, 65536);
  /* The guest sees whole logical blocks only. */
  dev->capacity = bd->size / dev->blk_size * (dev->blk_size / VBLK_SECTOR);
  uint32_t max = bd->caps.max_block && bd->caps.max_block < BD_MAX_IO
                     ? bd->caps.max_block
                     : BD_MAX_IO;
  dev->max_io = max / dev->blk_size * dev->blk_size;
  if (!dev->max_io)
    dev->max_io = dev->blk_size;
  uint32_t segs = queue_size > 2 ? queue_size - 2u : 1u;
  dev->seg_max = (uint16_t)(segs < VQ_MAX_CHAIN - 2 ? segs : VQ_MAX_CHAIN - 2);
  strncpy(dev->serial, serial ? serial : "blockport", sizeof dev->serial);
  dev->features = device_features(dev);
}

static unsigned log2u(uint32_t v) {
  unsigned n = 0;
  while (v > 1) {
    v >>= 1;
    n++;
  }
  return n;
}

/* The largest segment.  We split and bounce whatever comes, so this only
 * has to keep guests sane: SeaBIOS divides size_max * seg_max by the block
 * size into 16 bits and loops forever on zero-length reads if that
 * overflows. */
static uint32_t size_max(const struct vblk_dev *dev) {
  uint64_t limit = 65535ull * dev->blk_size / dev->seg_max, p = 4096;
  while (p * 2 <= limit && p * 2 <= dev->max_io)
    p *= 2;
  return (uint32_t)(p < dev->max_io ? p : dev->max_io);
}

/* Offsets in struct virtio_blk_config (virtio 1.2, 5.2.4). */
void vblk_config(const struct vblk_dev *dev, uint8_t cfg[VBLK_CONFIG_SIZE]) {
  const struct bd_caps *c = &dev->bd->caps;
  memset(cfg, 0, VBLK_CONFIG_SIZE);
  put_le64(cfg + 0, dev->capacity);
  put_le32(cfg + 8, size_max(dev));
  put_le32(cfg + 12, dev->seg_max);
  put_le32(cfg + 20, dev->blk_size);
  uint32_t phys = pow2_at_least(c->pref_block, dev->blk_size, 65536);
  cfg[24] = (uint8_t)log2u(phys / dev->blk_size);
  put_le16(cfg + 26, (uint16_t)(phys / dev->blk_size));
  cfg[32] = c->can_flush;
  put_le16(cfg + 34, dev->num_queues);
  if (dev->features & BIT(VIRTIO_BLK_F_DISCARD)) {
    put_le32(cfg + 36, VBLK_MAX_DWZ_SECTORS);
    put_le32(cfg + 40, VBLK_MAX_DWZ_SEG);
    put_le32(cfg + 44, dev->blk_size / VBLK_SECTOR);
  }
  if (dev->features & BIT(VIRTIO_BLK_F_WRITE_ZEROES)) {
    put_le32(cfg + 48, VBLK_MAX_DWZ_SECTORS);
    put_le32(cfg + 52, VBLK_MAX_DWZ_SEG);
    cfg[56] = c->can_trim;
  }
}

/* Copy LEN bytes starting SKIP bytes into IOV[0..N) to DST. */
static void gather(const struct iovec *iov, unsigned n, uint64_t skip,
                   uint8_t *dst, size_t len) {
  for (unsigned i = 0; i < n && len; i++) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t take = iov[i].iov_len - skip;
    if (take > len)
      take = len;
    memcpy(dst, (uint8_t *)iov[i].iov_base + skip, take);
    dst += take;
    len -= take;
    skip = 0;
  }
}

/* The pieces of bytes [SKIP, SKIP+LEN) of IOV[0..N), into OUT. */
static unsigned slice(const struct iovec *iov, unsigned n, uint64_t skip,
                      uint64_t len, struct iovec *out) {
  unsigned k = 0;
  for (unsigned i = 0; i < n && len; i++) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t take = iov[i].iov_len - skip;
    if (take > len)
      take = (size_t)len;
    out[k++] = (struct iovec){(uint8_t *)iov[i].iov_base + skip, take};
    len -= take;
    skip = 0;
  }
  return k;
}

/* The request is answered with STATUS, unstarted.  Returns false: the
 * parsers' "not accepted". */
static bool fail(struct vblk_parsed *p, uint8_t status, const char *why) {
  p->kind = VBLK_DONE;
  p->status = status;
  p->why = why;
  return false;
}

/* A byte range of the disk: inside it and aligned to its blocks. */
static const char *check_range(const struct vblk_dev *dev, uint64_t sector,
                               uint64_t bytes) {
  if (sector > dev->capacity)
    return "range beyond the end of the disk";
  if (bytes % dev->blk_size || sector % (dev->blk_size / VBLK_SECTOR))
    return "range not aligned to the block size";
  if (bytes / VBLK_SECTOR > dev->capacity - sector)
    return "range beyond the end of the disk";
  return NULL;
}

static bool parse_rw(const struct vblk_dev *dev, const struct vq_chain *c,
                     uint64_t sector, bool write, struct iovec *iov,
                     struct vblk_parsed *p) {
  const struct iovec *in = c->iov + c->n_out;
  if (write && dev->readonly)
    return fail(p, VIRTIO_BLK_S_IOERR, "write to a read-only disk");
  if (write ? c->in_bytes > 1 : c->out_bytes > 16)
    return fail(p, VIRTIO_BLK_S_IOERR, "data buffers in the wrong direction");
  p->length = write ? c->out_bytes - 16 : c->in_bytes - 1;
  const char *why = check_range(dev, sector, p->length);
  if (why)
    return fail(p, VIRTIO_BLK_S_IOERR, why);
  p->offset = sector * VBLK_SECTOR;
  p->kind = write ? VBLK_WRITE : VBLK_READ;
  p->niov = write ? slice(c->iov, c->n_out, 16, p->length, iov)
                  : slice(in, c->n_in, 0, p->length, iov);
  return true;
}

static bool parse_ranges(const struct vblk_dev *dev, const struct vq_chain *c,
                         bool discard, struct vblk_parsed *p) {
  uint64_t feature = discard ? VIRTIO_BLK_F_DISCARD : VIRTIO_BLK_F_WRITE_ZEROES;
  if (!(dev->features & BIT(feature)))
    return fail(p, VIRTIO_BLK_S_UNSUPP, "discard/write-zeroes not offered");
  uint64_t payload = c->out_bytes - 16;
  if (!payload || payload % 16)
    return fail(p, VIRTIO_BLK_S_IOERR, "ragged discard/write-zeroes ranges");
  if (payload / 16 > VBLK_MAX_DWZ_SEG)
    return fail(p, VIRTIO_BLK_S_UNSUPP, "too many discard/write-zeroes ranges");
  p->nranges = (unsigned)(payload / 16);
  for (unsigned i = 0; i < p->nranges; i++) {
    uint8_t raw[16];
    gather(c->iov, c->n_out, 16 + 16 * (uint64_t)i, raw, 16);
    uint64_t sector = get_le64(raw);
    uint32_t count = get_le32(raw + 8), flags = get_le32(raw + 12);
    if (flags & ~(uint32_t)VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP ||
        (discard && flags))
      return fail(p, VIRTIO_BLK_S_UNSUPP, "unknown range flags");
    if (count > VBLK_MAX_DWZ_SECTORS)
      return fail(p, VIRTIO_BLK_S_IOERR, "range larger than advertised");
    const char *why = check_range(dev, sector, (uint64_t)count * VBLK_SECTOR);
    if (why)
      return fail(p, VIRTIO_BLK_S_IOERR, why);
    p->ranges[i] = (struct vblk_range){
        sector * VBLK_SECTOR, (uint64_t)count * VBLK_SECTOR, flags != 0};
  }
  p->kind = discard ? VBLK_DISCARD : VBLK_ZEROES;
  return true;
}

static void locate_status(const struct vq_chain *c, struct vblk_parsed *p) {
  if (!c->n_in)
    return;
  const struct iovec *last = &c->iov[c->n_out + c->n_in - 1];
  p->status_ptr = (uint8_t *)last->iov_base + last->iov_len - 1;
  p->used_len = 1;
}

/* The request after its status byte is found; false when it is answered
 * at once (P->kind VBLK_DONE). */
static bool parse_request(const struct vblk_dev *dev, const struct vq_chain *c,
                          struct iovec *iov, struct vblk_parsed *p) {
  if (c->error)
    return fail(p, VIRTIO_BLK_S_IOERR, vq_strerror(c->error));
  if (!p->status_ptr)
    return fail(p, VIRTIO_BLK_S_IOERR, "no room for a status byte");
  if (c->out_bytes < 16)
    return fail(p, VIRTIO_BLK_S_IOERR, "request header too short");
  uint8_t hdr[16];
  gather(c->iov, c->n_out, 0, hdr, 16);
  uint32_t type = get_le32(hdr);
  uint64_t sector = get_le64(hdr + 8);
  p->type = type;
  switch (type) {
  case VIRTIO_BLK_T_IN:
    p->used_len = (uint32_t)c->in_bytes;
    return parse_rw(dev, c, sector, false, iov, p);
  case VIRTIO_BLK_T_OUT: return parse_rw(dev, c, sector, true, iov, p);
  case VIRTIO_BLK_T_FLUSH:
    if (!(dev->features & BIT(VIRTIO_BLK_F_FLUSH)))
      return fail(p, VIRTIO_BLK_S_UNSUPP, "flush not offered");
    p->kind = VBLK_FLUSH;
    return true;
  case VIRTIO_BLK_T_GET_ID: {
    uint64_t n = c->in_bytes - 1;
    if (n > VIRTIO_BLK_ID_BYTES)
      n = VIRTIO_BLK_ID_BYTES;
    p->kind = VBLK_GET_ID;
    p->length = n;
    p->niov = slice(c->iov + c->n_out, c->n_in, 0, n, iov);
    p->used_len = (uint32_t)n + 1;
    return true;
  }
  case VIRTIO_BLK_T_DISCARD:
  case VIRTIO_BLK_T_WRITE_ZEROES:
    if (dev->readonly)
      return fail(p, VIRTIO_BLK_S_IOERR, "write to a read-only disk");
    return parse_ranges(dev, c, type == VIRTIO_BLK_T_DISCARD, p);
  default: return fail(p, VIRTIO_BLK_S_UNSUPP, "unsupported request type");
  }
}

void vblk_parse(const struct vblk_dev *dev, const struct vq_chain *c,
                struct iovec *iov, struct vblk_parsed *p) {
  memset(p, 0, sizeof *p);
  locate_status(c, p);
  /* The verdict is in P too: VBLK_DONE, a status and why when refused. */
  (void)parse_request(dev, c, iov, p);
}
