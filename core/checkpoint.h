/* SPDX-License-Identifier: BSD-3-Clause */
/* Checkpoint views by copy-before-write: a source that wraps another.
 *
 * ckpt_live_open() wraps a device INNER in a "live" filter
 * (core/filter.h: copy-before-write), a struct bd of its own that every user of
 * the export talks to instead of INNER.  ckpt_take(live, NAME) then, atomically
 * with respect to writes (a write acknowledged before it is in the checkpoint,
 * one submitted after it returns is not):
 *   - freezes the dirty bitmap recording since the previous checkpoint,
 *   - starts a new one, named NAME, recording writes, zeroes and trims,
 *   - returns a read-only view device showing the image as it was then.
 * Before a write, zero or trim reaches a granule some open view still
 * needs, its old content is copied aside into that view's fleece file (a
 * temporary, unlinked file in ckpt_opts.fleece_dir): QEMU's
 * copy-before-write filter with on-cbw-error=break-snapshot.  A view
 * reads the fleece where it holds a granule and INNER elsewhere.
 *
 * The view offers block status base:allocation (context 0: copied
 * granules are data, depth 1; elsewhere INNER's answer) and, from the
 * second checkpoint on, the named context qemu:dirty-bitmap:PREV (PREV the
 * previous checkpoint's name): BD_CTX_DIRTY exactly on the granules
 * written (write, zero or trim, whether it succeeded or not) between
 * checkpoint PREV and this one.
 *
 * Persistence: when INNER keeps bitmaps of its own (the bd_ops bitmap_*
 * of core/blockdev.h: a writable qcow2 image of version 3), each
 * checkpoint's bitmap is also one of INNER's, named as the checkpoint:
 * ckpt_take() stops INNER's bitmap of the previous checkpoint and starts
 * bitmap NAME in the same pause, and ckpt_live_open() takes up the one
 * INNER still records (bitmap_resume()) as the latest checkpoint, its
 * bits as INNER stored them: no view, recording, so that the next
 * checkpoint offers qemu:dirty-bitmap:PREV across a restart.  The
 * bitmaps in memory stay the ones views answer from.  INNER's bitmaps
 * stay in the image after their checkpoint is forgotten (for the user to
 * remove).  Other sources keep bitmaps in memory only: a restart makes
 * the next checkpoint one without PREV.
 *
 * When the fleece limit (over all views) would be passed, or a copy fails
 * (the fleece write: ENOSPC...; or reading INNER), the view that needed
 * it breaks: its fleece is freed, its reads and allocation block status
 * fail with EIO, ckpt_list() tells why.  Writers never see an error of
 * the copy.
 *
 * The live device is a filter (core/filter.h) that guards writes: it has
 * INNER's size, caps, contexts and connections, and forwards every request
 * from the submitting thread (INNER's pollers and plugs keep working).
 * With no view open a write costs two atomic operations on a counter and
 * setting bits in the recording bitmap (no lock).  With views open, a
 * write whose range holds granules not yet copied for one of them runs
 * its copies on the worker pool first (bd_filter_offload()), then is
 * forwarded; other writes take one mutex to look that up.
 * Granules are the bitmap granularity, raised to INNER's minimum block
 * when that is larger (so INNER's aligner never read-modify-writes a
 * granule the write does not cover).
 *
 * Lifetimes: ownership of INNER passes to the live device on success.
 * bd_close(live) flushes INNER and returns that (an INNER with
 * connections, see core/filter.h, is flushed by its own close instead); INNER
 * itself is closed when the live device and every view are closed (views keep
 * it alive by reference, and stay readable).  bd_close(view) drops the view and
 * frees its fleece. A checkpoint's bitmap is kept while it records (the latest
 * checkpoint) or while the next checkpoint's view, which offers it, is open; a
 * checkpoint is forgotten (its name free again) once it has neither a view nor
 * a bitmap.  No request may be in flight on a device being closed.
 *
 * Memory: a view costs O(granules copied for it) (a hash map), plus the
 * bitmaps (1 bit per granule each).  Fleece: a granule copied takes its
 * size in the view's file and counts against the limit, unless it read as
 * zeroes (left a hole: a trim of an empty disk costs nothing).  Thread safety:
 * every function may be called from any thread, but ckpt_take() waits for
 * writes in flight, so never from a completion callback, nor from a thread
 * that must turn for its own requests to complete (a bd_poller_begin()
 * event loop, inside a plug): a control thread is the place. */
#ifndef BLOCKPORT_CHECKPOINT_H
#define BLOCKPORT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blockdev.h"
#include "source.h"

struct ckpt_opts {
  const char *fleece_dir; /* where fleece files go; NULL: "/var/tmp" */
  uint64_t fleece_limit;  /* total fleece bytes over all views; 0: none */
  /* Bitmap and copy granule: a power of two from 512 B to 2 GiB (QEMU's
   * bitmap limits); 0: 64 KiB. */
  uint32_t granularity;
};
#define CKPT_DEFAULT_GRANULARITY (64u * 1024)
#define CKPT_DEFAULT_FLEECE_DIR "/var/tmp"
#define CKPT_NAME_MAX 1023

/* Wraps INNER (see above).  O NULL: the defaults.  A read-only INNER is
 * wrapped too (passthrough only: ckpt_take() refuses it).  NULL with
 * bd_errmsg() for a bad granularity or no memory (INNER then stays the
 * caller's). */
struct bd *ckpt_live_open(struct bd *inner, const struct ckpt_opts *o);
/* Whether BD is a live device from ckpt_live_open(). */
bool ckpt_is_live(const struct bd *bd);
/* The granule the live device uses (see ckpt_opts.granularity). */
uint32_t ckpt_granularity(const struct bd *live);

/* Takes checkpoint NAME on LIVE: new writes wait (queued, no thread
 * blocked but the caller) until writes in flight, and their copies, are
 * done; the recording bitmap is frozen, bitmap NAME starts, and *VIEW
 * gets a read-only view device of the image at this instant, for the
 * caller to bd_close().  Returns 0; -EINVAL for a bad name (empty, longer
 * than CKPT_NAME_MAX bytes, holding '@' or control characters), -EEXIST
 * for a name in use (a checkpoint's, or a bitmap INNER keeps), -EROFS
 * when LIVE is read-only, other -errno (the fleece file cannot be made,
 * INNER refuses a bitmap...); each with a message in bd_errmsg(), and
 * nothing changed. */
int ckpt_take(struct bd *live, const char *name, struct bd **view);

/* Breaks VIEW (a view device from ckpt_take()) at once, as the fleece
 * limit would, with the reason "released": writes stop copying for it,
 * its fleece is freed, its reads fail with EIO.  For a user that cannot
 * close it yet (clients still hold it); bd_close() it later.  Returns 0,
 * or -EINVAL when VIEW is no view. */
int ckpt_view_release(struct bd *view);

/* One checkpoint, as ckpt_list() reports it. */
struct ckpt_info {
  char *name;
  char *prev;        /* the previous checkpoint's name; NULL for the first */
  bool view_open;    /* its view device is open */
  bool broken;       /* its view broke (then reason says why) */
  char *reason;      /* NULL unless broken */
  uint64_t fleece;   /* fleece bytes its view holds */
  bool has_bitmap;   /* its bitmap (dirty since it) still exists */
  bool recording;    /* ... and records (it is the latest checkpoint) */
  uint64_t dirty;    /* bytes its bitmap marks (granules, the last clipped) */
  uint64_t granules; /* copied for its view */
};
/* The checkpoints LIVE knows, oldest first, into *OUT (*N of them, NULL
 * for none; free with ckpt_info_free()), and the fleece bytes held over
 * all views into *FLEECE_USED (may be NULL).  Returns 0, -EINVAL when
 * LIVE is no live device, or -ENOMEM. */
int ckpt_list(struct bd *live, struct ckpt_info **out, size_t *n,
              uint64_t *fleece_used);
void ckpt_info_free(struct ckpt_info *v, size_t n);

#endif
