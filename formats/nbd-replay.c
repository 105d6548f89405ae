/* SPDX-License-Identifier: BSD-3-Clause */
#include "nbd-replay.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

static uint64_t cost(const struct replay_entry *e) {
  return sizeof *e + (e->cmd == BD_WRITE ? e->len : 0);
}

void replay_init(struct replay_log *l, uint64_t limit) {
  *l = (struct replay_log){.limit = limit};
  pthread_mutex_init(&l->lock, NULL);
}

void replay_destroy(struct replay_log *l) {
  struct replay_entry *e = l->head;
  while (e) {
    struct replay_entry *next = e->next;
    free(e);
    e = next;
  }
  l->head = l->tail = NULL;
  pthread_mutex_destroy(&l->lock);
}

/* An acknowledgement not kept: unless it was durable already (FUA), a
 * server restart before the next flush loses it. */
static void dropped(struct replay_log *l, uint64_t seq, uint32_t flags,
                    uint64_t bytes) {
  if (flags & BD_F_FUA)
    return;
  l->dropped_seq = seq;
  l->past += bytes;
}

/* Make room for NEED bytes by dropping the oldest entries. */
static void make_room(struct replay_log *l, uint64_t need) {
  while (l->head && l->bytes + need > l->limit) {
    struct replay_entry *e = l->head;
    l->head = e->next;
    if (!l->head)
      l->tail = NULL;
    l->bytes -= cost(e);
    dropped(l, e->seq, e->flags, cost(e));
    free(e);
  }
}

void replay_add(struct replay_log *l, enum bd_cmd cmd, uint32_t flags,
                uint64_t off, uint64_t len, const void *data) {
  uint64_t dlen = cmd == BD_WRITE ? len : 0;
  uint64_t need = sizeof(struct replay_entry) + dlen;
  pthread_mutex_lock(&l->lock);
  uint64_t seq = ++l->seq;
  struct replay_entry *e = need <= l->limit ? malloc(need) : NULL;
  if (!e) {
    dropped(l, seq, flags, need);
    pthread_mutex_unlock(&l->lock);
    return;
  }
  make_room(l, need);
  *e = (struct replay_entry){
      .seq = seq, .off = off, .len = len, .flags = flags, .cmd = cmd};
  if (dlen)
    memcpy(e->data, data, dlen);
  if (l->tail)
    l->tail->next = e;
  else
    l->head = e;
  l->tail = e;
  l->bytes += need;
  /* Debug: each new high-water mark past another MiB. */
  if (l->bytes > l->peak && (l->bytes >> 20) > (l->peak >> 20))
    log_debug("nbd replay log: %llu bytes kept", (unsigned long long)l->bytes);
  if (l->bytes > l->peak)
    l->peak = l->bytes;
  pthread_mutex_unlock(&l->lock);
}

uint64_t replay_mark(struct replay_log *l) {
  pthread_mutex_lock(&l->lock);
  uint64_t m = l->seq;
  pthread_mutex_unlock(&l->lock);
  return m;
}

void replay_flushed(struct replay_log *l, uint64_t mark) {
  pthread_mutex_lock(&l->lock);
  while (l->head && l->head->seq <= mark) {
    struct replay_entry *e = l->head;
    l->head = e->next;
    l->bytes -= cost(e);
    free(e);
  }
  if (!l->head)
    l->tail = NULL;
  if (l->dropped_seq && l->dropped_seq <= mark) {
    l->dropped_seq = 0;
    l->past = 0;
  }
  if (mark > l->flushed)
    l->flushed = mark;
  pthread_mutex_unlock(&l->lock);
}

bool replay_clean(struct replay_log *l) {
  pthread_mutex_lock(&l->lock);
  bool r = l->flushed == l->seq;
  pthread_mutex_unlock(&l->lock);
  return r;
}

uint64_t replay_past(struct replay_log *l) {
  pthread_mutex_lock(&l->lock);
  uint64_t r = l->past;
  pthread_mutex_unlock(&l->lock);
  return r;
}

void replay_stats(struct replay_log *l, uint64_t *n, uint64_t *bytes) {
  pthread_mutex_lock(&l->lock);
  *n = 0;
  for (struct replay_entry *e = l->head; e; e = e->next)
    ++*n;
  *bytes = l->bytes;
  pthread_mutex_unlock(&l->lock);
}
