/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport: opening a block device by name.
 *
 * A spec (a path, null:SIZE, an NBD URI, rbd:..., a plugin) and a format
 * name choose a source from the table of formats the program installs
 * (formats/registry.h); the core knows no format.  Options a source takes
 * are in struct bd_open_opts.  What an opened device does is in
 * core/blockdev.h; how a source is written is in core/source.h.
 */
#ifndef BLOCKPORT_OPEN_H
#define BLOCKPORT_OPEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blockdev.h"

/* The format of the image at PATH by its content, as the installed
 * formats' probe finds it: "qcow2", "raw", or the name of a format
 * blockport does not support.  "raw" when the file cannot be read
 * (opening it then reports why) or no probe is installed. */
const char *bd_probe_format(const char *path);

/* How bd_open_flags() opens a source. */
enum {
  BD_OPEN_READONLY = 1u << 0,
  /* -U / force-share: read-only, and lock nobody out: the image may be in
   * use by a writer (core/filelock.h). */
  BD_OPEN_SHARE = 1u << 1,
  /* The format was guessed by probing: a writable raw image then refuses
   * writes that would make the next probe find another format. */
  BD_OPEN_PROBED = 1u << 2,
  /* qcow2 opened for writing with a backing file: a read of clusters the
   * image does not hold copies them whole into the image (QEMU's
   * copy-on-read), so the next read of them stays local: a filter over the
   * image (formats/qcow2/copy-on-read.c). */
  BD_OPEN_COPY_ON_READ = 1u << 3,
  /* What a read-only user refuses to share, for the formats that lock
   * their file as their user asks (raw: QEMU's raw passes its user's
   * permissions to the file, where qcow2 always refuses writers for its
   * metadata).  Without them a raw reader shares everything, as
   * qemu-img map, qemu-img compare, qemu-io -r and QEMU's FUSE export
   * do.  UNSHARE_RESIZE: an NBD export (qemu-nbd -r); UNSHARE_WRITE:
   * convert's source (qemu-img convert), which wants both. */
  BD_OPEN_UNSHARE_RESIZE = 1u << 4,
  BD_OPEN_UNSHARE_WRITE = 1u << 5,
};

/* Opening.  SPEC is a path, or "null:SIZE" / "memory:SIZE", an NBD URI or
 * a plugin's spec.  FORMAT is NULL to probe by content.  Image files are
 * locked as QEMU locks them (a busy image is refused); formats blockport
 * does not support are refused by name.  Returns NULL with a message in
 * bd_errmsg().  bd_open_with() with the other options at their defaults. */
struct bd *bd_open_flags(const char *spec, const char *format, unsigned flags);
/* bd_open_flags() with BD_OPEN_READONLY when READONLY. */
struct bd *bd_open(const char *spec, const char *format, bool readonly);

/* Everything a command line or a config file can say about how to open a
 * source.  Start from BD_OPEN_OPTS_INIT; unset fields keep the defaults. */
struct bd_open_opts {
  const char *format; /* NULL: probe a file's content */
  unsigned flags;     /* BD_OPEN_* */
  /* L2 cache of a qcow2 image, bytes; 0: the default (32 MiB). */
  uint64_t qcow2_l2_cache;
  enum bd_cache cache; /* see enum bd_cache; 0: writeback */
  enum bd_aio aio;     /* how local files are read and written */
  /* Connections of an NBD source: 0 means 4 when the server advertises
   * multi-conn, otherwise 1 (at most 16). */
  unsigned nbd_connections;
  /* Seconds a request to an NBD source may wait for a lost server before
   * failing with EIO; 0 waits forever. */
  unsigned nbd_timeout;
  /* Bytes of acknowledged writes (and trims, zeroes) an NBD source keeps
   * until a flush covers them, to send them again to a server that
   * restarted (formats/nbd.c); 0 keeps none. */
  uint64_t nbd_replay_limit;
  /* Seconds an RBD source's cluster operations (monitor, OSD) may take
   * before failing with EIO; 0 waits forever. */
  unsigned rbd_timeout;
  /* What opening an RBD image for writing does when another client holds
   * its exclusive lock: fail, wait for it, or take no lock at all (as
   * QEMU: writers then pass the lock back and forth). */
  enum bd_rbd_lock {
    BD_RBD_LOCK_FAIL,
    BD_RBD_LOCK_WAIT,
    BD_RBD_LOCK_NONE
  } rbd_lock;
  /* -D NAME.FLAG=N settings for an nbdkit plugin; the strings must outlive
   * the source. */
  const char *const *plugin_debug;
  size_t n_plugin_debug;
  /* Named block-status contexts the source must offer (at most
   * BD_MAX_CONTEXTS; see BD_CTX_BITMAP_PREFIX).  Not passed on to a
   * backing file. */
  const char *const *contexts;
  size_t ncontexts;
};
#define BD_NBD_TIMEOUT_DEFAULT 30
#define BD_NBD_REPLAY_LIMIT_DEFAULT (64ull << 20)
#define BD_RBD_TIMEOUT_DEFAULT 30
#define BD_OPEN_OPTS_INIT                                                      \
  {                                                                            \
    .nbd_timeout = BD_NBD_TIMEOUT_DEFAULT,                                     \
    .nbd_replay_limit = BD_NBD_REPLAY_LIMIT_DEFAULT,                           \
    .rbd_timeout = BD_RBD_TIMEOUT_DEFAULT                                      \
  }
/* Opens SPEC as O says (O NULL: the defaults), through the installed
 * formats (below).  NULL with a message in bd_errmsg(). */
struct bd *bd_open_with(const char *spec, const struct bd_open_opts *o);

/* A kind of source.  The core knows none: formats/ lists them
 * (formats/registry.h), and every program installs that table once,
 * before it opens anything.  bd_open_with() tries, in table order, the
 * entries whose spec matcher accepts SPEC; otherwise the format named by
 * O->format, or the one the probe finds in the file. */
struct bd_format {
  const char *name; /* what --format names it */
  /* Sources a spec names by itself (null:SIZE, nbd://..., a plugin):
   * whether SPEC is one.  Such a spec opens with this entry whatever
   * --format says.  NULL for image file formats. */
  bool (*matches)(const char *spec);
  /* For an entry with a matcher named by --format on a spec it does not
   * match: "format 'NAME' takes USAGE".  NULL: no format has that name. */
  const char *usage;
  /* The format of the image file at PATH by its content: 0 with *FORMAT
   * set; -ENOTSUP with *FORMAT set and a message for a format blockport
   * does not open; other -errno with a message.  The first entry of the
   * table that has one probes. */
  int (*probe)(const char *path, const char **format);
  /* Opens SPEC as O says (never NULL; O->flags has BD_OPEN_PROBED when
   * the probe chose the format).  NULL with a message in bd_errmsg(). */
  struct bd *(*open)(const char *spec, const struct bd_open_opts *o);
  /* Whether an image file may name a spec this entry matches as its
   * backing file (an NBD URI).  Never for a source that loads code (a
   * plugin) or would make no sense there: the image file is not trusted. */
  bool backing;
  /* Optional: BD, as opened by open() and readied by the core (cache
   * mode, aligner), wrapped in the filters (core/filter.h) O asks for of
   * this format (qcow2: copy-on-read); BD itself when none.  NULL with a
   * message in bd_errmsg(), BD then still the caller's. */
  struct bd *(*filter)(struct bd *bd, const struct bd_open_opts *o);
};
/* TABLE: NULL-terminated, and outliving every opening. */
void bd_formats_install(const struct bd_format *const *table);
/* Whether SPEC, as an image's backing file name, names a source rather
 * than a file: the installed entry whose matcher accepts it allows that
 * (struct bd_format's backing: an NBD URI). */
bool bd_spec_is_backing_source(const char *spec);

#endif
