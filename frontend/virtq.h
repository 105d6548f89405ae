/* SPDX-License-Identifier: BSD-3-Clause */
/* Split virtqueues over guest memory: the transport-independent half of a
 * virtio device.
 *
 * Everything here is pure: guest memory is a table of regions already
 * mapped into this process (struct vq_mem), rings are host pointers into
 * those regions, and nothing blocks or talks to a socket.  A transport
 * (vhost-user, or an emulator embedding the device) fills in the regions,
 * translates the ring addresses and calls vq_pop()/vq_push().
 *
 * Every guest-supplied value is checked: descriptor addresses and lengths
 * against the regions (a buffer spanning two regions becomes two iovecs),
 * chains for loops and length, indirect tables for size and nesting, and
 * the avail index for jumps past the ring.  A malformed chain is reported
 * in vq_chain.error, never by crashing; a ring that cannot be trusted at
 * all (an avail index or head out of range) is marked broken.
 *
 * Locking: none here.  vq_pop() and vq_push() touch disjoint fields (pop:
 * last_avail, avail ring; push: used ring), but callers normally serialise
 * both under one per-queue lock. */
#ifndef BLOCKPORT_VIRTQ_H
#define BLOCKPORT_VIRTQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define VQ_MAX_REGIONS 32
#define VQ_MAX_SIZE 32768u /* the largest split queue the spec allows */
#define VQ_MAX_CHAIN 1024u /* descriptors in one chain, indirect included */
#define VQ_MAX_IOV 2048u   /* pieces of one chain after region splitting */

/* One guest memory region, mapped at HOST in this process.  GPA is the
 * guest-physical address (descriptor addresses), UVA the front end's
 * virtual address (vhost-user ring addresses). */
struct vq_region {
  uint64_t gpa, size, uva;
  uint8_t *host;
};

struct vq_mem {
  unsigned n;
  struct vq_region r[VQ_MAX_REGIONS];
};

/* Add a region; -EINVAL if empty or wrapping, -ENOSPC when full. */
int vq_mem_add(struct vq_mem *m, uint64_t gpa, uint64_t size, uint64_t uva,
               void *host);
/* A host pointer to LEN contiguous bytes at a guest-physical or front-end
 * virtual address, or NULL if they are not all inside one region. */
void *vq_mem_gpa(const struct vq_mem *m, uint64_t gpa, uint64_t len);
void *vq_mem_uva(const struct vq_mem *m, uint64_t uva, uint64_t len);
/* Append the host pieces of [GPA, GPA+LEN) to IOV (at most MAX entries in
 * all, *N in use).  Returns 0, -EFAULT if a byte is outside guest memory,
 * -E2BIG if the pieces do not fit. */
int vq_mem_map(const struct vq_mem *m, uint64_t gpa, uint64_t len,
               struct iovec *iov, unsigned max, unsigned *n);

/* Why a chain was refused. */
enum vq_error {
  VQ_OK,
  VQ_E_LONG,     /* more descriptors than the queue size: a loop */
  VQ_E_NEXT,     /* a next index outside the table */
  VQ_E_ADDR,     /* a buffer outside guest memory */
  VQ_E_INDIRECT, /* an indirect table that is empty, ragged, nested... */
  VQ_E_ORDER,    /* a device-readable buffer after a writable one */
  VQ_E_IOV,      /* too many pieces (VQ_MAX_IOV) */
  VQ_E_SIZE,     /* more than 4 GiB in one direction */
};
const char *vq_strerror(enum vq_error e);

/* One popped chain: device-readable pieces first (iov[0..n_out)), then
 * device-writable ones (iov[n_out..n_out+n_in)). */
struct vq_chain {
  uint16_t head;
  enum vq_error error; /* VQ_OK, or why the walk stopped */
  unsigned n_out, n_in;
  uint64_t out_bytes, in_bytes;
  struct iovec iov[VQ_MAX_IOV];
};

/* The inflight-tracking region of one queue (vhost-user's
 * VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD layout for split rings): it
 * survives a back-end restart, so requests in flight can be resubmitted. */
struct vq_inflight_desc {
  uint8_t inflight;
  uint8_t padding[5];
  uint16_t next;
  uint64_t counter;
};
struct vq_inflight {
  uint64_t features;
  uint16_t version;
  uint16_t desc_num;
  uint16_t last_batch_head;
  uint16_t used_idx;
  struct vq_inflight_desc desc[];
};
/* Bytes of one queue's region (64-byte aligned, as libvhost-user sizes it
 * so a front end can share a region between back ends). */
size_t vq_inflight_queue_bytes(uint16_t queue_size);

struct vring_desc;
struct vring_avail;
struct vring_used;

struct virtq {
  uint16_t num;
  bool event_idx; /* VIRTIO_RING_F_EVENT_IDX negotiated */
  bool indirect;  /* VIRTIO_RING_F_INDIRECT_DESC negotiated */
  bool broken;    /* the guest broke the ring: stop processing it */
  struct vring_desc *desc;
  struct vring_avail *avail;
  struct vring_used *used;
  const struct vq_mem *mem;
  uint16_t last_avail;     /* next avail entry to pop */
  uint16_t used_idx;       /* our copy of used->idx */
  uint16_t signalled_used; /* used_idx at the last notification */
  bool signalled_used_valid;
  struct vq_inflight *inflight; /* NULL without inflight tracking */
  uint64_t inflight_counter;
  struct vring_desc *itable; /* VQ_MAX_CHAIN entries: indirect copy */
};

/* Bytes of each ring part for a queue of NUM entries (event fields
 * included). */
void vq_ring_bytes(uint16_t num, size_t *desc, size_t *avail, size_t *used);

/* Set up a queue over mapped rings.  LAST_AVAIL is where to start popping
 * (vhost-user's SET_VRING_BASE); used_idx is read from the ring.  Returns
 * 0 or -EINVAL (size not a power of two up to VQ_MAX_SIZE, misaligned
 * ring), -ENOMEM. */
int vq_init(struct virtq *vq, const struct vq_mem *mem, uint16_t num,
            void *desc, void *avail, void *used, uint16_t last_avail,
            bool event_idx, bool indirect);
void vq_fini(struct virtq *vq);

/* Pop the next available chain into C.  Returns 1 with a chain (check
 * C->error: a malformed chain still has to be pushed back), 0 when the
 * ring is empty, -EIO when the ring is broken. */
int vq_pop(struct virtq *vq, struct vq_chain *c);
/* Walk the chain starting at HEAD (also used to resubmit inflight heads). */
void vq_walk(const struct virtq *vq, uint16_t head, struct vq_chain *c);
/* Return HEAD to the guest, LEN bytes written into its buffers. */
void vq_push(struct virtq *vq, uint16_t head, uint32_t len);
/* After pushes: should the guest be interrupted?  (EVENT_IDX aware; call
 * once per batch.) */
bool vq_should_notify(struct virtq *vq);
/* Before sleeping: ask the guest to kick for anything past what was
 * popped.  Returns true if more entries arrived meanwhile. */
bool vq_enable_kicks(struct virtq *vq);

/* Attach an inflight region (vq_inflight_queue_bytes(num) bytes) and
 * recover from it: an uninitialised region is initialised; otherwise the
 * heads still in flight are returned in *HEADS (malloc'd, in the order they
 * were popped, *N of them) and last_avail is moved past them.  Returns 0,
 * -ENOMEM. */
int vq_inflight_attach(struct virtq *vq, struct vq_inflight *region,
                       uint16_t **heads, unsigned *n);

#endif
