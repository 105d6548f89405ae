/* SPDX-License-Identifier: BSD-3-Clause */
/* Scope-based cleanup: a variable declared CLEANUP_FREE is freed when it
 * goes out of scope, so early returns cannot leak. */
#ifndef BLOCKPORT_CLEANUP_H
#define BLOCKPORT_CLEANUP_H

#include <stdlib.h>
#include <unistd.h>

static inline void cleanup_free(void *ptr) {
  free(*(void **)ptr);
}
static inline void cleanup_close(int *fd) {
  if (*fd >= 0)
    close(*fd);
}

#define CLEANUP_FREE __attribute__((cleanup(cleanup_free)))
#define CLEANUP_CLOSE __attribute__((cleanup(cleanup_close)))

#endif
