/* SPDX-License-Identifier: BSD-3-Clause */
/* Persistent dirty bitmaps offered as named block-status contexts
 * (core/blockdev.h, BD_CTX_BITMAP_PREFIX): what `serve -B NAME` exports as
 * qemu:dirty-bitmap:NAME, whoever asks. */
#ifndef BLOCKPORT_QCOW2_BITMAP_CONTEXT_H
#define BLOCKPORT_QCOW2_BITMAP_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

struct bd;
struct bd_extents;
struct bd_open_opts;
struct qcow2dev;
struct qcow2_contexts;

/* Load the bitmaps O's contexts name, as they are stored: before the
 * image is opened for writing (which marks tracked bitmaps in use).  A
 * context that is no bitmap of the image, or an inconsistent bitmap, is
 * an error with a message.  Sets Q's contexts (NULL when none asked). */
int qcow2_contexts_load(struct qcow2dev *q, const struct bd_open_opts *o,
                        struct qcow2_contexts **out);
/* Once BD exists (and the image is open for writing, if it is): offer
 * the contexts, and follow the writes to those bitmaps tracked since. */
int qcow2_contexts_attach(struct qcow2dev *q, struct qcow2_contexts *c,
                          struct bd *bd);
void qcow2_contexts_free(struct qcow2_contexts *c);
/* dirty-bitmaps.c: the bits writes set since open in bitmap NAME, when it
 * is tracked and enabled, else NULL; valid until the image closes. */
const uint64_t *qcow2_bitmaps_live(const struct qcow2dev *q, const char *name);
/* bd_ops.context_extents: dirty (BD_CTX_DIRTY) and clean runs of context
 * CTX over [OFF, OFF+LEN), in the bitmap's granularity, clipped to it. */
int qcow2_contexts_extents(const struct qcow2_contexts *c, size_t ctx,
                           uint64_t len, uint64_t off, uint32_t flags,
                           struct bd_extents *ext);

#endif
