/* SPDX-License-Identifier: BSD-3-Clause */
/* qemu-img amend on a qcow2 image (see amend.h). */
#include "amend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/io.h"
#include "guard.h"
#include "header-build.h"
#include "overlap.h"
#include "qcow2-internal.h"

int qcow2_write_header(struct qcow2dev *q, const struct qcow2_header *h) {
  size_t len = q->file_size < q->csize ? (size_t)q->file_size : q->csize;
  uint8_t *old = calloc(1, q->csize), *out = malloc(q->csize);
  int r = old && out ? io_pread_zero(q->fd, old, len, 0) : -ENOMEM;
  if (r == 0)
    r = qcow2_build_header(h, &q->h, old, len, out, q->csize);
  if (r == 0)
    r = qcow2_guard_pwrite(q, QCOW2_OL_HEADER, out, q->csize, 0);
  if (r == 0)
    r = io_fdatasync(q->fd);
  struct qcow2_header nh;
  uint64_t fsize = q->file_size > q->csize ? q->file_size : q->csize;
  if (r == 0)
    r = qcow2_parse_header(out, q->csize, fsize, &nh);
  if (r == 0)
    q->h = nh;
  else if (r != -EFBIG)
    bd_set_error("Failed to update the image header: %s", strerror(-r));
  free(old);
  free(out);
  return r;
}

static bool same(const char *a, const char *b) {
  return (!a && !b) || (a && b && !strcmp(a, b));
}

static int check_options(const struct qcow2dev *q,
                         const struct qcow2_amend_opts *o) {
  bool has_data_file = q->h.incompatible & QCOW2_INCOMPAT_DATA_FILE;
  bool raw = has_data_file && (q->h.autoclear & QCOW2_AUTOCLEAR_DATA_FILE_RAW);
  if (o->data_file && !has_data_file)
    return qcow2_err(-EINVAL, "data-file can only be set for images that "
                              "use an external data file");
  if (o->data_file_raw == 1 && !raw)
    return qcow2_err(-EINVAL, "data-file-raw cannot be set on existing images");
  return 0;
}

static int upgrade(struct bd *bd) {
  struct qcow2dev *q = bd->priv;
  struct qcow2_header h = q->h;
  h.version = 3;
  h.refcount_order = 4;
  h.incompatible = h.compatible = h.autoclear = 0;
  h.compression_type = 0;
  int r = qcow2_write_header(q, &h);
  if (r < 0)
    return r;
  q->g.v3 = true;
  if (!q->g.extended_l2 && !q->g.data_file)
    q->l2_check_bits &= ~QCOW2_L2_ZERO;
  bd->caps.can_fast_zero = true;
  return 0;
}

/* Data file name and rawness: the header is rewritten either way, as
 * QEMU rewrites it. */
static int data_file(struct qcow2dev *q, const struct qcow2_amend_opts *o) {
  struct qcow2_header h = q->h;
  if (o->data_file_raw == 0)
    h.autoclear &= ~QCOW2_AUTOCLEAR_DATA_FILE_RAW;
  if (o->data_file && strlen(o->data_file) >= sizeof h.data_file)
    return qcow2_err(-EINVAL, "data file name too long");
  if (o->data_file)
    strcpy(h.data_file, o->data_file);
  return qcow2_write_header(q, &h);
}

static int backing(const struct qcow2dev *q, const struct qcow2_amend_opts *o) {
  char name[QCOW2_MAX_BACKING_NAME + 1] = "";
  if (!o->backing_given)
    return 0;
  if (q->h.backing_offset) {
    size_t len = q->h.backing_size;
    if (io_pread_zero(q->fd, name, len, q->h.backing_offset) < 0)
      len = 0;
    name[len] = 0;
  }
  const char *cur = q->h.backing_offset ? name : NULL;
  const char *fmt = q->h.backing_format[0] ? q->h.backing_format : NULL;
  if (same(o->backing_file, cur) && same(o->backing_fmt, fmt))
    return 0;
  return qcow2_err(-EINVAL, "Cannot amend the backing file\n"
                            "You can use 'blockport rebase' instead.");
}

static int lazy(struct qcow2dev *q, const struct qcow2_amend_opts *o,
                unsigned version) {
  bool cur = q->h.compatible & QCOW2_COMPAT_LAZY_REFCOUNTS;
  if (o->lazy_refcounts < 0 || (bool)o->lazy_refcounts == cur)
    return 0;
  if (o->lazy_refcounts && version < 3)
    return qcow2_err(-EINVAL,
                     "Lazy refcounts only supported with compatibility level "
                     "1.1 and above (use compat=1.1 or greater)");
  /* Off: a dirty image was made clean (its refcounts repaired) when it
   * was opened for writing. */
  struct qcow2_header h = q->h;
  h.compatible ^= QCOW2_COMPAT_LAZY_REFCOUNTS;
  return qcow2_write_header(q, &h);
}

static int refcount_width(struct qcow2dev *q, const struct qcow2_amend_opts *o,
                          unsigned version, void (*progress)(double, void *),
                          void *ctx) {
  if (o->refcount_order < 0 ||
      (unsigned)o->refcount_order == q->h.refcount_order)
    return 0;
  if (version < 3 && o->refcount_order != 4)
    return qcow2_err(-EINVAL,
                     "Refcount widths other than 16 bits require "
                     "compatibility level 1.1 or above (use compat=1.1 or "
                     "greater)");
  return qcow2_change_refcount_order(q, (unsigned)o->refcount_order, progress,
                                     ctx);
}

int qcow2_amend(struct bd *bd, const struct qcow2_amend_opts *o,
                void (*progress)(double done, void *ctx), void *ctx) {
  struct qcow2dev *q = bd->priv;
  unsigned old = q->h.version, version = o->version ? o->version : old;
  int r = check_options(q, o);
  if (r == 0 && version > old)
    r = upgrade(bd);
  if (r == 0)
    r = refcount_width(q, o, version, progress, ctx);
  if (r == 0)
    r = data_file(q, o);
  if (r == 0)
    r = backing(q, o);
  if (r == 0)
    r = lazy(q, o, version);
  if (r == 0 && o->size % 512)
    r = qcow2_err(-EINVAL, "The new size must be a multiple of 512");
  if (r == 0 && o->size && o->size != bd->size)
    r = bd_resize(bd, o->size, BD_PREALLOC_OFF);
  if (r == 0 && version < old)
    r = qcow2_downgrade(bd);
  return r;
}
