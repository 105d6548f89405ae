/* SPDX-License-Identifier: BSD-3-Clause */
/* CHECK(c): how a fuzz target reports a broken invariant.  libFuzzer
 * treats the abort() as a crash and saves the input that caused it.  Only
 * the fuzz targets abort: the code under test never does on input. */
#ifndef BLOCKPORT_FUZZ_CHECK_H
#define BLOCKPORT_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);    \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#endif
