/* SPDX-License-Identifier: BSD-3-Clause */
/* Loading librados and librbd on first use (rbd-lib.h). */
#define RBD_LIB_DEFINE
#include "rbd-lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

struct rbd_lib rbd_lib;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[512]; /* empty once loaded */

static void *open_lib(const char *name) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    snprintf(why, sizeof why,
             "Ceph RBD images need %s (Debian: apt install librbd1): %s", name,
             dlerror());
  return h;
}

static void load(void) {
  void *rbd = open_lib("librbd.so.1");
  void *rados = rbd ? open_lib("librados.so.2") : NULL;
  if (!rados)
    return;
    /* Each symbol from the library that defines it; they stay loaded. */
#define RBD_LIB_SYM(f)                                                         \
  if (!why[0]) {                                                               \
    bool in_rados = strncmp(#f, "rados_", 6) == 0;                             \
    if (!(*(void **)&rbd_lib.f = dlsym(in_rados ? rados : rbd, #f)))           \
      snprintf(why, sizeof why, "Ceph RBD images: %s has no %s",               \
               in_rados ? "librados.so.2" : "librbd.so.1", #f);                \
  }
  RBD_LIB_FUNCS(RBD_LIB_SYM)
#undef RBD_LIB_SYM
}

int rbd_lib_load(void) {
  pthread_once(&once, load);
  if (why[0]) {
    bd_set_error("%s", why);
    return -ENOTSUP;
  }
  return 0;
}
