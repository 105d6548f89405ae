/* SPDX-License-Identifier: BSD-3-Clause */
/* The `blockport serve --config FILE` file (docs/CONFIG.md).  Pure: text in,
 * export declarations out; opening the images is the server's job. */
#ifndef BLOCKPORT_CONFIG_H
#define BLOCKPORT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "access.h"
#include "core/blockdev.h"

/* Limits of the format. */
#define CONFIG_MAX_NAME 4096        /* bytes in an export name (NBD's limit) */
#define CONFIG_MAX_LINE 65536       /* bytes in one line, without its '\n' */
#define CONFIG_MAX_FILE (1u << 20)  /* bytes config_load reads */
#define CONFIG_MAX_BITMAPS 16       /* bitmaps per export (HS_MAX_EXTRA) */
#define CONFIG_MAX_BITMAP_NAME 1023 /* bytes (qcow2's limit) */
#define CONFIG_MAX_OPTIONS 64       /* option lines per export */

/* One export as the config file (or the command line) declares it. */
struct export_conf {
  char *name;        /* never NULL; "" only from the command line */
  char *path;        /* image spec; a relative file path already resolved
                      * against the config file's directory */
  char *format;      /* NULL: probe; any name: the format table judges */
  char *description; /* NULL: none given */
  bool readonly;
  bool tls_required;
  bool is_default; /* also the default export "" */
  bool has_cache;  /* cache was given: it overrides --cache */
  enum bd_cache cache;
  bool has_aio; /* aio was given: it overrides --aio */
  enum bd_aio aio;
  struct acl_rule *allow; /* TCP clients admitted; nallow == 0: everyone */
  size_t nallow;
  char **bitmaps; /* persistent bitmaps exported (qemu:dirty-bitmap:NAME) */
  size_t nbitmaps;
  /* option = KEY=VALUE lines, in order: the source's format judges the
   * keys when it opens (struct bd_open_opts options). */
  char **options;
  size_t noptions;
  unsigned line; /* line of its [export] header, for messages */
};

struct config {
  struct export_conf *v;
  size_t n;
};

/* Parse TEXT (LEN bytes, not necessarily NUL-terminated, may contain NUL
 * bytes which are an error) read from FILE (used for messages and to resolve
 * relative paths: its directory; FILE may be relative, e.g. "exports.conf",
 * then paths are relative to ".").  Returns 0, or -EINVAL (-ENOMEM) with
 * "FILE:LINE: reason" in bd_errmsg() and OUT left empty.  OUT is
 * overwritten, not freed. */
int config_parse(const char *text, size_t len, const char *file,
                 struct config *out);
/* Read FILE and parse it; -errno and "FILE: strerror" on a read error.
 * Refuse files larger than 1 MiB (-EFBIG). */
int config_load(const char *file, struct config *out);
/* Safe on a zeroed or already-freed struct; leaves it zeroed. */
void config_free(struct config *c);

/* Deep copy of SRC into DST (for keeping an export across a reload).
 * Returns 0, or -1 (out of memory) with DST zeroed. */
int config_export_copy(struct export_conf *dst, const struct export_conf *src);
/* Free what E owns; leaves it zeroed. */
void config_export_free(struct export_conf *e);

#endif
