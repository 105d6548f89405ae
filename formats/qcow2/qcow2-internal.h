/* qcow2 internals shared by the files of formats/qcow2/. */
#ifndef BLOCKPORT_QCOW2_INTERNAL_H
#define BLOCKPORT_QCOW2_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"

struct bd;
struct l2cache;

/* An opened qcow2 image. */
struct qcow2dev {
  int fd;      /* the image */
  int data_fd; /* guest data: the image, or an external data file */
  uint64_t file_size, data_size;
  struct qcow2_header h;
  struct qcow2_geom g;
  uint64_t csize;
  unsigned l2_bits; /* log2 of entries per L2 table */
  uint64_t *l1;     /* host-endian copy of the active L1 table */
  struct l2cache *cache;
  struct bd *backing; /* NULL without a backing file */
  char *path;
};

/* compress.c: TYPE 0 deflate, 1 zstd.  Returns 0 or -EIO. */
int qcow2_decompress(unsigned type, const uint8_t *in, size_t inlen,
                     uint8_t *out, size_t outlen);

/* l2cache.c: L2 tables cached in slices, shared by all threads. */
struct l2cache *l2cache_new(size_t slice_bytes, size_t total_bytes);
void l2cache_free(struct l2cache *c);
struct l2slice;
/* The slice at host offset KEY, loaded with LOAD on a miss.  Returns its
 * entries (host-endian) and pins it in *PIN, or NULL with *ERR set. */
typedef int l2_load_fn(void *ctx, uint64_t key, uint64_t *entries, size_t n);
const uint64_t *l2cache_get(struct l2cache *c, uint64_t key, l2_load_fn *load,
                            void *ctx, struct l2slice **pin, int *err);
void l2cache_put(struct l2cache *c, struct l2slice *pin);

#endif
