/* SPDX-License-Identifier: BSD-3-Clause */
/* The optional parts of blockport, each a CMake option (BLOCKPORT_RBD,
 * BLOCKPORT_FUSE, ...; on by default).  A part left out is not compiled:
 * a small file of the same API is compiled instead, whose entry points
 * fail with "built without NAME" (feature_missing()), so that no other
 * code asks which parts are in.  `blockport --version` lists them. */
#ifndef BLOCKPORT_CORE_FEATURES_H
#define BLOCKPORT_CORE_FEATURES_H

#include <stdbool.h>

enum feature {
  FEATURE_RBD,      /* rbd: sources and images (librbd) */
  FEATURE_FUSE,     /* blockport mount (libfuse3) */
  FEATURE_VHOST,    /* blockport vhost (vhost-user-blk) */
  FEATURE_PLUGINS,  /* nbdkit plugins as sources, and blockport's own */
  FEATURE_TLS,      /* TLS for the NBD server (GnuTLS) */
  FEATURE_IO_URING, /* --aio io_uring (liburing); else worker threads */
  FEATURE_COUNT
};

/* Whether F was built in. */
bool feature_built(enum feature f);
/* Its name in --version, as the CMake option's: "rbd", "io_uring". */
const char *feature_id(enum feature f);
/* Sets "built without NAME" (NAME as users know it: "FUSE", "TLS") as
 * this thread's error (core/error.h) and returns -ENOTSUP: what a part
 * left out answers. */
int feature_missing(enum feature f);

#endif
