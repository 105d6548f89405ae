/* SPDX-License-Identifier: BSD-3-Clause */
/* Fault injection: see fault.h. */
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blockdev.h"
#include "log.h"

#define MAX_RULES 16

struct rule {
  int op; /* enum fault_op, or -1 for any */
  int err;
  uint64_t after, count, from, to;
  unsigned delay_ms;
  atomic_uint_fast64_t seen, hits;
};

static struct rule rules[MAX_RULES];
static atomic_int nrules;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int parse_errno(const char *v, int *err) {
  static const struct {
    const char *name;
    int err;
  } names[] = {{"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EROFS", EROFS}, {"none", 0}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(v, names[i].name)) {
      *err = names[i].err;
      return 0;
    }
  return -1;
}

static int parse_op(const char *v, int *op) {
  if (!strcmp(v, "read"))
    *op = FAULT_READ;
  else if (!strcmp(v, "write"))
    *op = FAULT_WRITE;
  else if (!strcmp(v, "sync"))
    *op = FAULT_SYNC;
  else if (!strcmp(v, "any"))
    *op = -1;
  else
    return -1;
  return 0;
}

static int parse_u64(const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0);
  if (errno || end == v || *end)
    return -1;
  *out = x;
  return 0;
}

/* One KEY=VALUE of a rule. */
static int parse_setting(struct rule *r, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (!eq)
    return -1;
  size_t klen = (size_t)(eq - kv);
  const char *v = eq + 1;
  uint64_t n = 0;
  if (klen == 2 && !strncmp(kv, "op", 2))
    return parse_op(v, &r->op);
  if (klen == 3 && !strncmp(kv, "err", 3))
    return parse_errno(v, &r->err);
  if (parse_u64(v, &n) < 0)
    return -1;
  if (klen == 5 && !strncmp(kv, "after", 5))
    r->after = n;
  else if (klen == 5 && !strncmp(kv, "count", 5))
    r->count = n;
  else if (klen == 4 && !strncmp(kv, "from", 4))
    r->from = n;
  else if (klen == 2 && !strncmp(kv, "to", 2))
    r->to = n;
  else if (klen == 5 && !strncmp(kv, "delay", 5) && n <= 600000)
    r->delay_ms = (unsigned)n;
  else
    return -1;
  return 0;
}

int fault_configure(const char *text) {
  char *copy = strdup(text ? text : "");
  if (!copy)
    return -ENOMEM;
  int n = 0, r = 0;
  char *save1 = NULL;
  for (char *rt = strtok_r(copy, ";", &save1); rt && r == 0;
       rt = strtok_r(NULL, ";", &save1)) {
    if (n == MAX_RULES) {
      bd_set_error("BLOCKPORT_FAULTS: more than %d rules", MAX_RULES);
      r = -EINVAL;
      break;
    }
    struct rule *ru = &rules[n];
    memset(ru, 0, sizeof *ru);
    ru->op = -1;
    ru->err = EIO;
    ru->count = UINT64_MAX;
    ru->to = UINT64_MAX;
    char *save2 = NULL;
    for (char *kv = strtok_r(rt, ",", &save2); kv && r == 0;
         kv = strtok_r(NULL, ",", &save2))
      if (parse_setting(ru, kv) < 0) {
        bd_set_error("BLOCKPORT_FAULTS: bad setting '%s'", kv);
        r = -EINVAL;
      }
    n++;
  }
  free(copy);
  atomic_store(&nrules, r == 0 ? n : 0);
  return r;
}

static void configure_from_env(void) {
  const char *env = getenv("BLOCKPORT_FAULTS");
  if (!env || !*env)
    return;
  if (fault_configure(env) < 0)
    log_error("%s: no faults injected", bd_errmsg());
  else
    log_info("fault injection on: %s", env);
}

int fault_active(void) {
  pthread_once(&once, configure_from_env);
  return atomic_load(&nrules) > 0;
}

static bool matches(const struct rule *r, enum fault_op op, uint64_t off,
                    uint64_t len) {
  if (r->op >= 0 && r->op != (int)op)
    return false;
  /* A sync touches every byte. */
  return op == FAULT_SYNC || (off < r->to && off + len > r->from);
}

static const char *const op_names[] = {"read", "write", "sync"};

int fault_check(enum fault_op op, uint64_t off, uint64_t len) {
  if (!fault_active())
    return 0;
  int n = atomic_load(&nrules);
  for (int i = 0; i < n; i++) {
    struct rule *r = &rules[i];
    if (!matches(r, op, off, len))
      continue;
    if (atomic_fetch_add(&r->seen, 1) < r->after)
      return 0;
    if (atomic_fetch_add(&r->hits, 1) >= r->count)
      return 0;
    if (r->delay_ms) {
      /* Logged before the sleep, so a test can tell the call is waiting. */
      log_info("fault injected: delay %u ms on %s at %llu+%llu", r->delay_ms,
               op_names[op], (unsigned long long)off, (unsigned long long)len);
      struct timespec ts = {r->delay_ms / 1000,
                            (long)(r->delay_ms % 1000) * 1000000};
      nanosleep(&ts, NULL);
    }
    if (r->err)
      log_info("fault injected: %s at %llu+%llu: %s", op_names[op],
               (unsigned long long)off, (unsigned long long)len,
               strerror(r->err));
    return -r->err;
  }
  return 0;
}
