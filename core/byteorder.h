/* SPDX-License-Identifier: BSD-3-Clause */
/* Fixed-endian loads and stores at any (unaligned) byte address: NBD and
 * qcow2 are big-endian, virtio and partition tables little-endian.  memcpy
 * keeps them free of alignment and aliasing traps; compilers turn each into
 * one load or store and a byte swap. */
#ifndef BLOCKPORT_BYTEORDER_H
#define BLOCKPORT_BYTEORDER_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#define BP_BYTEORDER_ACCESSORS(bits, end)                                      \
  static inline uint##bits##_t get_##end##bits(const void *p) {                \
    uint##bits##_t v;                                                          \
    memcpy(&v, p, sizeof v);                                                   \
    return end##bits##toh(v);                                                  \
  }                                                                            \
  static inline void put_##end##bits(void *p, uint##bits##_t v) {              \
    v = hto##end##bits(v);                                                     \
    memcpy(p, &v, sizeof v);                                                   \
  }

BP_BYTEORDER_ACCESSORS(16, be)
BP_BYTEORDER_ACCESSORS(32, be)
BP_BYTEORDER_ACCESSORS(64, be)
BP_BYTEORDER_ACCESSORS(16, le)
BP_BYTEORDER_ACCESSORS(32, le)
BP_BYTEORDER_ACCESSORS(64, le)

#undef BP_BYTEORDER_ACCESSORS

#endif
