/* SPDX-License-Identifier: BSD-3-Clause */
/* Persistent dirty bitmaps as named block-status contexts.
 *
 * Each bitmap asked for is read whole into memory at open, as QEMU loads
 * it: the bitmap table, then its data clusters (bit 0 of byte 0 is the
 * first granule), every entry checked before use.  On an image opened for
 * writing, an enabled bitmap is also tracked by dirty-bitmaps.c, whose
 * bits set since open are ORed in at each query: writes made through this
 * opening show at once, as they do with qemu-nbd and a writable export. */
#include "bitmap-context.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "core/bitrun.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/source.h"
#include "qcow2-internal.h"

struct ctx_bitmap {
  char *name;
  unsigned gran_bits;
  uint64_t nbits;       /* granules covering the image */
  uint64_t *bits;       /* as stored at open, host-endian words */
  const uint64_t *live; /* set since open (dirty-bitmaps.c), or NULL */
};

struct qcow2_contexts {
  struct ctx_bitmap *v;
  size_t n;
};

void qcow2_contexts_free(struct qcow2_contexts *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->n; i++) {
    free(c->v[i].name);
    free(c->v[i].bits);
  }
  free(c->v);
  free(c);
}

static int read_dir(struct qcow2dev *q, struct qcow2_bitmap **dir) {
  *dir = NULL;
  if (q->h.bitmaps_nb == 0)
    return 0;
  size_t len = (size_t)q->h.bitmaps_dir_size;
  uint8_t *raw = malloc(len ? len : 1);
  if (!raw)
    return -ENOMEM;
  int r = io_pread_zero(q->fd, raw, len, q->h.bitmaps_dir_offset);
  if (r == 0)
    r = qcow2_parse_bitmap_dir(raw, len, q->h.bitmaps_nb, q->h.cluster_bits,
                               q->h.size, dir);
  free(raw);
  if (r < 0) {
    char why[256]; /* bd_errmsg()'s buffer is about to be rewritten */
    snprintf(why, sizeof why, "%s", r == -EINVAL ? bd_errmsg() : strerror(-r));
    bd_set_error("qcow2 %s: cannot read the bitmaps: %s", q->path, why);
  }
  return r;
}

/* "no bitmap 'x'", naming those the image has (as many as fit). */
static int no_such_bitmap(struct qcow2dev *q, const char *name,
                          const struct qcow2_bitmap *dir) {
  char have[300] = "";
  size_t used = 0;
  for (uint32_t i = 0; dir && i < q->h.bitmaps_nb && used < sizeof have; i++)
    used += (size_t)snprintf(have + used, sizeof have - used, "%s'%s'",
                             i ? ", " : "", dir[i].name);
  if (used >= sizeof have)
    memcpy(have + sizeof have - 5, "...", 4);
  bd_set_error("qcow2 %s: no bitmap '%s': %s%s", q->path, name,
               q->h.bitmaps_nb ? "the image has " : "the image has no bitmaps",
               have);
  return -ENOENT;
}

/* Data cluster I of B's table ENTRY into P (csize bytes). */
static int load_cluster(struct qcow2dev *q, const struct qcow2_bitmap *b,
                        uint64_t entry, uint8_t *p) {
  uint64_t off = entry & QCOW2_OFFSET_MASK;
  if (!qcow2_bitmap_entry_ok(entry, q->h.cluster_bits) ||
      (off && (off > q->file_size || q->file_size - off < q->csize))) {
    bd_set_error("qcow2 %s: bitmap '%s' has an invalid table entry", q->path,
                 b->name);
    return -EINVAL;
  }
  if (off)
    return io_pread_zero(q->fd, p, q->csize, off);
  memset(p, (entry & QCOW2_BITMAP_ALL_ONES) ? 0xff : 0, q->csize);
  return 0;
}

static int load_bits(struct qcow2dev *q, const struct qcow2_bitmap *b,
                     struct ctx_bitmap *cb) {
  uint64_t tbytes = (uint64_t)b->table_size * 8;
  if (b->table_offset > q->file_size ||
      q->file_size - b->table_offset < tbytes) {
    bd_set_error("qcow2 %s: bitmap '%s': its table is past the end of the "
                 "file",
                 q->path, b->name);
    return -EINVAL;
  }
  uint8_t *table = malloc(tbytes);
  /* Sizes were bounded by the directory's checks (QCOW2_BITMAP_MAX_*). */
  cb->bits = calloc(b->table_size, q->csize);
  int r = table && cb->bits ? 0 : -ENOMEM;
  if (r == 0)
    r = io_pread_zero(q->fd, table, tbytes, b->table_offset);
  uint8_t *p = (uint8_t *)cb->bits;
  for (uint32_t i = 0; r == 0 && i < b->table_size; i++)
    r = load_cluster(q, b, get_be64(table + 8ull * i), p + i * q->csize);
  uint64_t words = (uint64_t)b->table_size * q->csize / 8;
  for (uint64_t w = 0; r == 0 && w < words; w++)
    cb->bits[w] = get_le64(p + 8 * w); /* little-endian bit order */
  free(table);
  return r;
}

static int load_one(struct qcow2dev *q, const struct qcow2_bitmap *dir,
                    const char *ctx, struct ctx_bitmap *cb) {
  size_t plen = strlen(BD_CTX_BITMAP_PREFIX);
  if (strncmp(ctx, BD_CTX_BITMAP_PREFIX, plen) != 0) {
    bd_set_error("qcow2 %s: offers no block-status context '%s', only "
                 "bitmaps (" BD_CTX_BITMAP_PREFIX "NAME)",
                 q->path, ctx);
    return -ENOTSUP;
  }
  const char *name = ctx + plen;
  const struct qcow2_bitmap *b = NULL;
  for (uint32_t i = 0; dir && i < q->h.bitmaps_nb && !b; i++)
    if (!strcmp(dir[i].name, name))
      b = &dir[i];
  if (!b)
    return no_such_bitmap(q, name, dir);
  if (b->flags & QCOW2_BME_IN_USE) {
    /* QEMU's words, so that scripts matching them keep working. */
    bd_set_error("qcow2 %s: Bitmap '%s' is inconsistent and cannot be used "
                 "(its writer did not close it; remove it with qemu-img "
                 "bitmap --remove)",
                 q->path, name);
    return -EINVAL;
  }
  cb->name = strdup(name);
  cb->gran_bits = b->granularity_bits;
  cb->nbits = (q->h.size >> cb->gran_bits) +
              !!(q->h.size & ((1ull << cb->gran_bits) - 1));
  return cb->name ? load_bits(q, b, cb) : -ENOMEM;
}

int qcow2_contexts_load(struct qcow2dev *q, const struct bd_open_opts *o,
                        struct qcow2_contexts **out) {
  *out = NULL;
  if (o->ncontexts == 0)
    return 0;
  struct qcow2_bitmap *dir;
  int r = read_dir(q, &dir);
  struct qcow2_contexts *c = r == 0 ? calloc(1, sizeof *c) : NULL;
  if (c)
    c->v = calloc(o->ncontexts, sizeof *c->v);
  if (r == 0 && (!c || !c->v))
    r = -ENOMEM;
  for (size_t i = 0; r == 0 && i < o->ncontexts; i++)
    r = load_one(q, dir, o->contexts[i], &c->v[c->n++]);
  qcow2_free_bitmaps(dir, q->h.bitmaps_nb);
  if (r < 0) {
    qcow2_contexts_free(c);
    return r;
  }
  *out = c;
  return 0;
}

int qcow2_contexts_attach(struct qcow2dev *q, struct qcow2_contexts *c,
                          struct bd *bd) {
  int r = 0;
  for (size_t i = 0; c && r == 0 && i < c->n; i++) {
    c->v[i].live = qcow2_bitmaps_live(q, c->v[i].name);
    char name[sizeof BD_CTX_BITMAP_PREFIX + QCOW2_BITMAP_MAX_NAME];
    snprintf(name, sizeof name, BD_CTX_BITMAP_PREFIX "%s", c->v[i].name);
    r = bd_add_context(bd, name);
  }
  return r;
}

/* Word W of B: stored bits, and those writes set since open. */
static uint64_t word(const struct ctx_bitmap *b, uint64_t w) {
  uint64_t v = b->bits[w];
  if (b->live)
    v |= __atomic_load_n(&b->live[w], __ATOMIC_RELAXED);
  return v;
}

static uint64_t word_of(const void *b, uint64_t w) {
  return word(b, w);
}

int qcow2_contexts_extents(const struct qcow2_contexts *c, size_t ctx,
                           uint64_t len, uint64_t off, uint32_t flags,
                           struct bd_extents *ext) {
  if (!c || ctx >= c->n)
    return -EINVAL;
  const struct ctx_bitmap *b = &c->v[ctx];
  return bitrun_extents(word_of, b, b->nbits, b->gran_bits, len, off, flags,
                        ext);
}
