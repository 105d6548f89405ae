/* SPDX-License-Identifier: BSD-3-Clause */
/* Split virtqueues over guest memory; see virtq.h. */
#include "virtq.h"

#include <endian.h>
#include <errno.h>
#include <linux/virtio_ring.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct vq_inflight_desc) == 16, "inflight desc layout");
_Static_assert(sizeof(struct vq_inflight) == 16, "inflight header layout");

int vq_mem_add(struct vq_mem *m, uint64_t gpa, uint64_t size, uint64_t uva,
               void *host) {
  if (!size || gpa + size < gpa || uva + size < uva || !host)
    return -EINVAL;
  if (m->n >= VQ_MAX_REGIONS)
    return -ENOSPC;
  m->r[m->n++] = (struct vq_region){gpa, size, uva, host};
  return 0;
}

/* The region holding ADDR (a GPA, or a UVA if BY_UVA). */
static const struct vq_region *find_region(const struct vq_mem *m,
                                           uint64_t addr, bool by_uva) {
  for (unsigned i = 0; i < m->n; i++) {
    const struct vq_region *r = &m->r[i];
    uint64_t base = by_uva ? r->uva : r->gpa;
    if (addr >= base && addr - base < r->size)
      return r;
  }
  return NULL;
}

static void *contiguous(const struct vq_mem *m, uint64_t addr, uint64_t len,
                        bool by_uva) {
  const struct vq_region *r = find_region(m, addr, by_uva);
  if (!r)
    return NULL;
  uint64_t off = addr - (by_uva ? r->uva : r->gpa);
  if (len > r->size - off)
    return NULL;
  return r->host + off;
}

void *vq_mem_gpa(const struct vq_mem *m, uint64_t gpa, uint64_t len) {
  return contiguous(m, gpa, len, false);
}

void *vq_mem_uva(const struct vq_mem *m, uint64_t uva, uint64_t len) {
  return contiguous(m, uva, len, true);
}

int vq_mem_map(const struct vq_mem *m, uint64_t gpa, uint64_t len,
               struct iovec *iov, unsigned max, unsigned *n) {
  if (gpa + len < gpa)
    return -EFAULT;
  while (len) {
    const struct vq_region *r = find_region(m, gpa, false);
    if (!r)
      return -EFAULT;
    if (*n >= max)
      return -E2BIG;
    uint64_t off = gpa - r->gpa;
    uint64_t piece = r->size - off < len ? r->size - off : len;
    iov[(*n)++] = (struct iovec){r->host + off, (size_t)piece};
    gpa += piece;
    len -= piece;
  }
  return 0;
}

const char *vq_strerror(enum vq_error e) {
  switch (e) {
  case VQ_OK: return "no error";
  case VQ_E_LONG: return "descriptor chain loops or exceeds the queue size";
  case VQ_E_NEXT: return "descriptor next index out of range";
  case VQ_E_ADDR: return "buffer outside guest memory";
  case VQ_E_INDIRECT: return "invalid indirect descriptor table";
  case VQ_E_ORDER: return "device-readable buffer after a writable one";
  case VQ_E_IOV: return "too many buffer pieces";
  case VQ_E_SIZE: return "buffers larger than 4 GiB";
  }
  return "unknown error";
}

size_t vq_inflight_queue_bytes(uint16_t queue_size) {
  size_t bytes = sizeof(struct vq_inflight) +
                 (size_t)queue_size * sizeof(struct vq_inflight_desc);
  return (bytes + 63) & ~(size_t)63;
}

void vq_ring_bytes(uint16_t num, size_t *desc, size_t *avail, size_t *used) {
  *desc = (size_t)num * sizeof(struct vring_desc);
  *avail = 4 + 2 * (size_t)num + 2;
  *used = 4 + 8 * (size_t)num + 2;
}

int vq_init(struct virtq *vq, const struct vq_mem *mem, uint16_t num,
            void *desc, void *avail, void *used, uint16_t last_avail,
            bool event_idx, bool indirect) {
  memset(vq, 0, sizeof *vq);
  if (!num || (num & (num - 1)) || num > VQ_MAX_SIZE)
    return -EINVAL;
  if (!desc || !avail || !used || (uintptr_t)desc % 16 ||
      (uintptr_t)avail % 2 || (uintptr_t)used % 4)
    return -EINVAL;
  vq->itable = malloc(VQ_MAX_CHAIN * sizeof(struct vring_desc));
  if (!vq->itable)
    return -ENOMEM;
  vq->num = num;
  vq->desc = desc;
  vq->avail = avail;
  vq->used = used;
  vq->mem = mem;
  vq->event_idx = event_idx;
  vq->indirect = indirect;
  vq->last_avail = last_avail;
  vq->used_idx = le16toh(__atomic_load_n(&vq->used->idx, __ATOMIC_ACQUIRE));
  return 0;
}

void vq_fini(struct virtq *vq) {
  free(vq->itable);
  vq->itable = NULL;
}

/* Append one buffer to the chain; false (with c->error) if the walk must
 * stop. */
static bool add_buffer(const struct virtq *vq, struct vq_chain *c,
                       uint64_t addr, uint32_t len, bool writable) {
  if (!writable && c->n_in) {
    c->error = VQ_E_ORDER;
    return false;
  }
  uint64_t *total = writable ? &c->in_bytes : &c->out_bytes;
  if (*total + len > UINT32_MAX) {
    c->error = VQ_E_SIZE;
    return false;
  }
  unsigned n = c->n_out + c->n_in, before = n;
  int r = vq_mem_map(vq->mem, addr, len, c->iov, VQ_MAX_IOV, &n);
  if (r == -EFAULT) {
    /* Skip the buffer but keep walking: the status byte may still be
     * reachable, and the guest then learns of the error. */
    c->error = VQ_E_ADDR;
    return true;
  }
  if (r < 0) {
    c->error = VQ_E_IOV;
    return false;
  }
  *total += len;
  if (writable)
    c->n_in += n - before;
  else
    c->n_out += n - before;
  return true;
}

/* Copy an indirect table out of guest memory (it may span regions, and a
 * copy cannot change under us).  Returns its entry count, 0 if invalid. */
static unsigned load_indirect(const struct virtq *vq, uint64_t addr,
                              uint32_t len) {
  if (!len || len % sizeof(struct vring_desc) ||
      len / sizeof(struct vring_desc) > VQ_MAX_CHAIN)
    return 0;
  struct iovec pieces[8];
  unsigned n = 0;
  if (vq_mem_map(vq->mem, addr, len, pieces, 8, &n) < 0)
    return 0;
  uint8_t *dst = (uint8_t *)vq->itable;
  for (unsigned i = 0; i < n; i++) {
    memcpy(dst, pieces[i].iov_base, pieces[i].iov_len);
    dst += pieces[i].iov_len;
  }
  return len / sizeof(struct vring_desc);
}

void vq_walk(const struct virtq *vq, uint16_t head, struct vq_chain *c) {
  c->head = head;
  c->error = VQ_OK;
  c->n_out = c->n_in = 0;
  c->out_bytes = c->in_bytes = 0;
  const struct vring_desc *table = vq->desc;
  unsigned table_len = vq->num, i = head;
  /* Each descriptor is visited at most once in a chain that does not
   * loop, so a budget of the table size catches every loop. */
  unsigned budget = vq->num < VQ_MAX_CHAIN ? vq->num : VQ_MAX_CHAIN;
  bool in_indirect = false;
  for (;;) {
    if (!budget--) {
      c->error = VQ_E_LONG;
      return;
    }
    struct vring_desc d;
    memcpy(&d, &table[i], sizeof d);
    uint16_t flags = le16toh(d.flags);
    uint64_t addr = le64toh(d.addr);
    uint32_t len = le32toh(d.len);
    if (flags & VRING_DESC_F_INDIRECT) {
      /* Allowed once, as the last descriptor of a direct chain. */
      unsigned entries;
      if (!vq->indirect || in_indirect || (flags & VRING_DESC_F_NEXT) ||
          !(entries = load_indirect(vq, addr, len))) {
        c->error = VQ_E_INDIRECT;
        return;
      }
      table = vq->itable;
      table_len = entries;
      budget = entries;
      in_indirect = true;
      i = 0;
      continue;
    }
    if (!add_buffer(vq, c, addr, len, flags & VRING_DESC_F_WRITE))
      return;
    if (!(flags & VRING_DESC_F_NEXT))
      return;
    i = le16toh(d.next);
    if (i >= table_len) {
      c->error = VQ_E_NEXT;
      return;
    }
  }
}

static uint16_t avail_idx(const struct virtq *vq) {
  return le16toh(__atomic_load_n(&vq->avail->idx, __ATOMIC_ACQUIRE));
}

static void inflight_mark(struct virtq *vq, uint16_t head) {
  struct vq_inflight_desc *d = &vq->inflight->desc[head];
  d->counter = vq->inflight_counter++;
  __atomic_store_n(&d->inflight, 1, __ATOMIC_RELEASE);
}

int vq_pop(struct virtq *vq, struct vq_chain *c) {
  if (vq->broken)
    return -EIO;
  uint16_t avail = avail_idx(vq);
  uint16_t pending = (uint16_t)(avail - vq->last_avail);
  if (!pending)
    return 0;
  if (pending > vq->num) {
    vq->broken = true;
    return -EIO;
  }
  uint16_t head = le16toh(vq->avail->ring[vq->last_avail % vq->num]);
  if (head >= vq->num) {
    vq->broken = true;
    return -EIO;
  }
  vq->last_avail++;
  if (vq->inflight)
    inflight_mark(vq, head);
  vq_walk(vq, head, c);
  return 1;
}

void vq_push(struct virtq *vq, uint16_t head, uint32_t len) {
  struct vq_inflight *inf = vq->inflight;
  if (inf) {
    inf->desc[head].next = inf->last_batch_head;
    inf->last_batch_head = head;
  }
  struct vring_used_elem *e = &vq->used->ring[vq->used_idx % vq->num];
  e->id = htole32(head);
  e->len = htole32(len);
  vq->used_idx++;
  /* The element must be visible before the index that publishes it. */
  __atomic_store_n(&vq->used->idx, htole16(vq->used_idx), __ATOMIC_RELEASE);
  if (inf) {
    __atomic_store_n(&inf->desc[head].inflight, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&inf->used_idx, vq->used_idx, __ATOMIC_RELEASE);
  }
}

bool vq_should_notify(struct virtq *vq) {
  /* The used index must be visible before we read the guest's wishes. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (!vq->event_idx)
    return !(le16toh(__atomic_load_n(&vq->avail->flags, __ATOMIC_RELAXED)) &
             VRING_AVAIL_F_NO_INTERRUPT);
  uint16_t old = vq->signalled_used, new_idx = vq->used_idx;
  bool valid = vq->signalled_used_valid;
  vq->signalled_used = new_idx;
  vq->signalled_used_valid = true;
  uint16_t event =
      le16toh(__atomic_load_n(&vq->avail->ring[vq->num], __ATOMIC_RELAXED));
  return !valid || vring_need_event(event, new_idx, old);
}

bool vq_enable_kicks(struct virtq *vq) {
  if (vq->broken)
    return false;
  if (vq->event_idx) {
    uint16_t *avail_event = (uint16_t *)&vq->used->ring[vq->num];
    __atomic_store_n(avail_event, htole16(vq->last_avail), __ATOMIC_RELAXED);
  } else {
    uint16_t flags = le16toh(vq->used->flags) & ~VRING_USED_F_NO_NOTIFY;
    __atomic_store_n(&vq->used->flags, htole16(flags), __ATOMIC_RELAXED);
  }
  /* Publish the wish before looking again, or a kick could be missed. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return avail_idx(vq) != vq->last_avail;
}

struct inflight_entry {
  uint64_t counter;
  uint16_t head;
};

static int by_counter(const void *a, const void *b) {
  const struct inflight_entry *x = a, *y = b;
  return x->counter < y->counter ? -1 : x->counter > y->counter;
}

static void inflight_reset(struct virtq *vq, struct vq_inflight *r) {
  memset(r->desc, 0, (size_t)vq->num * sizeof r->desc[0]);
  r->features = 0;
  r->desc_num = vq->num;
  r->last_batch_head = 0;
  r->used_idx = vq->used_idx;
  r->version = 1;
  vq->inflight_counter = 1;
}

/* A crash between publishing a batch and clearing its inflight flags
 * leaves them set: clear the batch the used index says was published. */
static void inflight_fix_last_batch(struct virtq *vq, struct vq_inflight *r) {
  uint16_t batch = (uint16_t)(vq->used_idx - r->used_idx);
  uint16_t h = r->last_batch_head;
  for (uint16_t k = 0; k < batch && k < vq->num && h < vq->num; k++) {
    r->desc[h].inflight = 0;
    h = r->desc[h].next;
  }
  r->used_idx = vq->used_idx;
}

int vq_inflight_attach(struct virtq *vq, struct vq_inflight *r,
                       uint16_t **heads, unsigned *n) {
  *heads = NULL;
  *n = 0;
  vq->inflight = r;
  if (r->version != 1 || r->desc_num != vq->num) {
    inflight_reset(vq, r);
    return 0;
  }
  if (r->used_idx != vq->used_idx)
    inflight_fix_last_batch(vq, r);
  struct inflight_entry *v = malloc(vq->num * sizeof *v);
  if (!v)
    return -ENOMEM;
  unsigned count = 0;
  uint64_t max = 0;
  for (uint16_t h = 0; h < vq->num; h++) {
    if (r->desc[h].inflight != 1) {
      r->desc[h].inflight = 0;
      continue;
    }
    v[count++] = (struct inflight_entry){r->desc[h].counter, h};
    if (r->desc[h].counter > max)
      max = r->desc[h].counter;
  }
  qsort(v, count, sizeof *v, by_counter);
  uint16_t *out = malloc((count ? count : 1) * sizeof *out);
  if (!out) {
    free(v);
    return -ENOMEM;
  }
  for (unsigned k = 0; k < count; k++)
    out[k] = v[k].head;
  free(v);
  vq->inflight_counter = max + 1;
  /* Every popped entry is either used or still in flight. */
  vq->last_avail = (uint16_t)(vq->used_idx + count);
  *heads = out;
  *n = count;
  return 0;
}
