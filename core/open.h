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

struct bd_stat_scope;

/* The format of the image at PATH by its content, as the installed
 * formats' probe finds it, or the name of a format blockport does not
 * support.  When the file cannot be read (opening it then reports why) or
 * nothing probes: the entry marked probe_fallback, NULL without one. */
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
  /* The options are another opening's (an image's, given to its backing
   * file): keys the opened format does not know are ignored, as
   * defaults are. */
  BD_OPEN_LENIENT_OPTIONS = 1u << 6,
  /* qcow2: the image alone, its backing file not opened (unallocated
   * clusters read as zeroes), as QEMU's BDRV_O_NO_BACKING: for tools that
   * edit the image's metadata (rebase -u, commit's emptying). */
  BD_OPEN_NO_BACKING = 1u << 7,
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
 * source.  Start from BD_OPEN_OPTS_INIT; unset fields keep the defaults.
 * The core knows no format: what only one format takes travels as
 * KEY=VALUE strings that the format parses itself (bd_opt_*() below). */
struct bd_open_opts {
  const char *format;  /* NULL: probe a file's content */
  unsigned flags;      /* BD_OPEN_* */
  enum bd_cache cache; /* see enum bd_cache; 0: writeback */
  enum bd_aio aio;     /* how local files are read and written */
  /* KEY=VALUE options for the format that opens the source: a key it does
   * not know (struct bd_format option_keys) fails the opening with a
   * message naming the format.  Needed only while bd_open_with() runs. */
  const char *const *options;
  size_t noptions;
  /* [FORMAT.]KEY=VALUE defaults: each applies where the opened format
   * knows KEY (and is FORMAT, when given); the others are ignored.  How
   * flags such as --nbd-timeout reach a source without the core knowing
   * them.  OPTIONS win over them. */
  const char *const *defaults;
  size_t ndefaults;
  /* Named block-status contexts the source must offer (at most
   * BD_MAX_CONTEXTS; see BD_CTX_BITMAP_PREFIX).  Not passed on to a
   * backing file. */
  const char *const *contexts;
  size_t ncontexts;
  /* Where the sources this opening makes (backing files too) count their
   * events (core/stats.h), as one front end's export, mount or device;
   * NULL: nowhere.  It must outlive the device. */
  struct bd_stat_scope *stats;
};
#define BD_OPEN_OPTS_INIT                                                      \
  { .format = NULL }
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
  /* The KEYs of the KEY=VALUE options it takes (bd_open_opts options),
   * NULL-terminated; NULL: none. */
  const char *const *option_keys;
  /* What bd_probe_format() names when the probe cannot read the file. */
  bool probe_fallback;
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
/* The installed image file formats' names (those --format may name),
 * ", "-separated, in BUF; "" without a table. */
const char *bd_format_names(char *buf, size_t len);

/* ---- options, as a format reads them (core/open-options.c) ----
 *
 * FORMAT is the reading format's name, KEY one of its option_keys.  The
 * value of KEY is the last one O gives: its options first, then the
 * defaults that apply to FORMAT. */

/* Each value of KEY for FORMAT in turn, defaults then options: start with
 * *POS = 0; NULL after the last. */
const char *bd_opt_next(const struct bd_open_opts *o, const char *format,
                        const char *key, size_t *pos);
/* The value of KEY, NULL when O gives none. */
const char *bd_opt_get(const struct bd_open_opts *o, const char *format,
                       const char *key);
/* The value of KEY as a number in MIN-MAX, a size of at least MIN
 * (bd_parse_size()), or the index of one of CHOICES (NULL-terminated),
 * in *OUT: 0 (*OUT untouched when O gives no value), or -EINVAL with
 * "FORMAT: KEY=VALUE: expected ..." in bd_errmsg(). */
int bd_opt_uint(const struct bd_open_opts *o, const char *format,
                const char *key, unsigned min, unsigned max, unsigned *out);
int bd_opt_size(const struct bd_open_opts *o, const char *format,
                const char *key, uint64_t min, uint64_t *out);
int bd_opt_choice(const struct bd_open_opts *o, const char *format,
                  const char *key, const char *const *choices, unsigned *out);
/* Whether every option of O is KEY=VALUE with a KEY that F takes: 0, or
 * -EINVAL with "FORMAT: unknown option 'KEY' (known: ...)" in bd_errmsg().
 * bd_open_with() checks this before F opens anything. */
int bd_opt_check(const struct bd_open_opts *o, const struct bd_format *f);

#endif
