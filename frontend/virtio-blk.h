/* SPDX-License-Identifier: BSD-3-Clause */
/* The virtio-blk device model, independent of any transport.
 *
 * Two halves:
 * - pure functions (virtio-blk.c): the feature bits and config space a
 *   block device earns, and the parsing of one request chain into what to
 *   do (with every field checked against the device);
 * - a queue (vblk_queue_*, vblk-queue.c) that pops chains from a virtq,
 *   submits them to the block device through bd_submit(), and completes
 *   them out of order from whichever thread finishes them, pushing used
 *   entries under a per-queue lock and notifying the guest through a
 *   callback the transport supplies (an eventfd for vhost-user, an
 *   interrupt for an emulator that embeds the device).
 *
 * Nothing here knows about sockets: any emulator that can hand over guest
 * memory (struct vq_mem), ring addresses and a kick can embed it. */
#ifndef BLOCKPORT_VIRTIO_BLK_H
#define BLOCKPORT_VIRTIO_BLK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/blockdev.h"
#include "core/reqstats.h"
#include "virtq.h"

#define VBLK_CONFIG_SIZE 64 /* the fields up to write_zeroes_may_unmap */
#define VBLK_SECTOR 512u
#define VBLK_MAX_DWZ_SEG 16u /* discard / write-zeroes ranges per request */
#define VBLK_MAX_DWZ_SECTORS (1u << 21) /* per range: 1 GiB */

/* What a device offers, fixed when it is created. */
struct vblk_dev {
  struct bd *bd;
  /* The current front end's connection (NULL: the default one): cancelled
   * when that front end goes away with requests in flight. */
  struct bd_conn *conn;
  uint64_t capacity; /* in 512-byte sectors */
  uint32_t blk_size; /* logical block size, a power of two >= 512 */
  uint32_t max_io;   /* bytes per bd request (requests above are split) */
  uint16_t num_queues;
  uint16_t seg_max;
  bool readonly;
  char serial[20];   /* GET_ID, NUL-padded */
  uint64_t features; /* offered feature bits */
  uint64_t acked;    /* negotiated ones (set by the transport) */
  /* --metrics: where requests are counted (core/reqstats.h), or NULL */
  struct metrics_reqs *reqs;
};

/* Fill DEV from the block device.  SERIAL may be NULL. */
void vblk_dev_init(struct vblk_dev *dev, struct bd *bd, bool readonly,
                   uint16_t num_queues, uint16_t queue_size,
                   const char *serial);
/* The config space (little-endian, VBLK_CONFIG_SIZE bytes). */
void vblk_config(const struct vblk_dev *dev, uint8_t cfg[VBLK_CONFIG_SIZE]);

/* One request, parsed.  KIND says what to do; a request that needs no I/O
 * (malformed, unsupported, GET_ID) is VBLK_DONE with its status. */
enum vblk_kind {
  VBLK_DONE,
  VBLK_READ,
  VBLK_WRITE,
  VBLK_FLUSH,
  VBLK_GET_ID,
  VBLK_DISCARD,
  VBLK_ZEROES,
};

struct vblk_range {
  uint64_t offset, length; /* bytes */
  bool unmap;
};

struct vblk_parsed {
  enum vblk_kind kind;
  uint32_t type;           /* the request's type field, for logging */
  uint8_t status;          /* VIRTIO_BLK_S_* when kind == VBLK_DONE */
  uint8_t *status_ptr;     /* NULL: no room for a status byte */
  uint32_t used_len;       /* bytes written to device-writable buffers */
  uint64_t offset, length; /* READ/WRITE, bytes */
  /* READ/WRITE/GET_ID data, as pieces of guest memory (in IOV). */
  unsigned niov;
  struct vblk_range ranges[VBLK_MAX_DWZ_SEG]; /* DISCARD / ZEROES */
  unsigned nranges;
  const char *why; /* why a request failed, for the log */
};

/* Parse chain C of a device DEV.  Data pieces go to IOV (VQ_MAX_IOV
 * entries).  Never fails: problems become VBLK_DONE with IOERR or
 * UNSUPP. */
void vblk_parse(const struct vblk_dev *dev, const struct vq_chain *c,
                struct iovec *iov, struct vblk_parsed *p);

struct vblk_req;

/* A queue of the device, driven by one thread (the kick handler) and
 * completed from any thread. */
struct vblk_queue {
  struct virtq vq;
  struct vblk_dev *dev;
  unsigned index;
  pthread_mutex_t lock; /* vq pop/push, slots, counters */
  pthread_cond_t idle;  /* signalled when inflight drops to 0 */
  unsigned inflight;
  bool batching;         /* the queue thread will notify at batch end */
  unsigned pending;      /* pushes not yet notified */
  struct vblk_req *reqs; /* one per descriptor head */
  struct vq_chain *chain;
  struct iovec *scratch;
  void (*notify)(void *opaque); /* interrupt the guest */
  void *opaque;
  uint64_t completed, errors, abandoned; /* statistics */
};

/* Set up a queue whose virtq Q->vq was initialised by the caller. */
int vblk_queue_init(struct vblk_queue *q, struct vblk_dev *dev, unsigned index,
                    void (*notify)(void *), void *opaque);
/* Wait for requests in flight, then free.  The virtq is left to the
 * caller. */
void vblk_queue_fini(struct vblk_queue *q);
/* Pop and submit everything available (call on each kick).  Returns false
 * once the ring is broken. */
bool vblk_queue_process(struct vblk_queue *q);
/* Submit chains already popped before a restart (inflight recovery). */
void vblk_queue_resubmit(struct vblk_queue *q, const uint16_t *heads,
                         unsigned n);
/* Block until no request is in flight. */
void vblk_queue_drain(struct vblk_queue *q);

#endif
