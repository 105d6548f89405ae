/* SPDX-License-Identifier: BSD-3-Clause */
/* The replay log of an NBD source: the writes, trims and zeroes a server
 * acknowledged and no flush has covered yet, in the order of their
 * acknowledgements, so that they can be sent again to a server that
 * restarted and lost its cache.  Bounded: past LIMIT bytes the oldest
 * entries are dropped, and the bytes dropped are counted until a flush
 * covers them.  Thread-safe; the entries themselves are read without the
 * lock only by a replay that runs while nothing can be acknowledged or
 * flushed (formats/nbd.c quiesces the device). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/blockdev.h"

struct replay_entry {
  struct replay_entry *next;
  uint64_t seq; /* 1, 2, ... in acknowledgement order */
  uint64_t off, len;
  uint32_t flags; /* BD_F_* as sent */
  enum bd_cmd cmd;
  unsigned char data[]; /* BD_WRITE: the LEN bytes written */
};

struct replay_log {
  pthread_mutex_t lock;
  struct replay_entry *head, *tail;
  uint64_t limit;   /* bytes the entries may take */
  uint64_t bytes;   /* bytes they take now */
  uint64_t peak;    /* the most they took */
  uint64_t seq;     /* the last acknowledgement's number */
  uint64_t flushed; /* the acknowledgements a completed flush covered */
  /* Not kept for the bound: the newest such acknowledgement (0: none
   * since the last covering flush) and the bytes of those not durable. */
  uint64_t dropped_seq;
  uint64_t past;
};

void replay_init(struct replay_log *l, uint64_t limit);
void replay_destroy(struct replay_log *l);
/* Record an acknowledged write (DATA: its LEN bytes), trim or zero. */
void replay_add(struct replay_log *l, enum bd_cmd cmd, uint32_t flags,
                uint64_t off, uint64_t len, const void *data);
/* The mark a flush takes when it is submitted: what it will cover. */
uint64_t replay_mark(struct replay_log *l);
/* A flush submitted at MARK completed: forget what it covered. */
void replay_flushed(struct replay_log *l, uint64_t mark);
/* Whether every acknowledgement is covered by a flush. */
bool replay_clean(struct replay_log *l);
/* Bytes acknowledged, not durable and not kept (past the bound): a
 * server restart now loses them. */
uint64_t replay_past(struct replay_log *l);
/* The entries kept and their bytes, for the replay's log line. */
void replay_stats(struct replay_log *l, uint64_t *n, uint64_t *bytes);
