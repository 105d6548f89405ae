/* SPDX-License-Identifier: BSD-3-Clause */
#include "options.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "server/metrics.h"

#include "cli.h"
#include "core/open.h"

/* getopt values of the shared options without a short form. */
enum {
  ID_PLUGIN = 4000,
  ID_L2_CACHE,
  ID_NBD_CONNECTIONS,
  ID_NBD_TIMEOUT,
  ID_NBD_REPLAY_LIMIT,
  ID_LOG_LEVEL,
  ID_SYSLOG,
  ID_COPY_ON_READ,
  ID_RBD_TIMEOUT,
  ID_RBD_LOCK,
  ID_CACHE,
  ID_AIO,
  ID_CONTROL,
  ID_FLEECE_DIR,
  ID_FLEECE_LIMIT,
  ID_VIEWS_UNIX,
  ID_SOURCE_OPT,
  ID_METRICS,
};

_Static_assert(BD_POOL_MAX_WORKERS == 1024, "--workers' help names 1024");

struct shared_opt {
  unsigned group;   /* CO_* */
  int val;          /* getopt's value: the short letter, if any */
  const char *name; /* the long name, NULL: short only */
  const char *arg;  /* the argument's name in --help, NULL: none */
  unsigned min, max;
  const char *help; /* lines after the first indented; %u: the default */
};

/* The canonical spelling of each option comes before its aliases. */
static const struct shared_opt table[] = {
    {CO_FORMAT, 'f', "format", "FMT", 0, 0,
     "image format instead of probing: raw, qcow2"},
    {CO_SOURCE_OPT, ID_SOURCE_OPT, "source-option", "KEY=VALUE", 0, 0,
     "an option of the source's format (repeatable;\n"
     "docs/CONFIG.md lists them): a key the format\n"
     "does not take is refused"},
    {CO_WORKERS, 'w', "workers", "N", 1, BD_POOL_MAX_WORKERS,
     "worker threads for blocking I/O, 1-1024\n"
     "(default %u)"},
    {CO_PLUGIN, ID_PLUGIN, "plugin", "PLUGIN", 0, 0,
     "the source is an nbdkit plugin: a .so path or a\n"
     "name in nbdkit's plugin directory (memory,\n"
     "pattern, file, ...), the arguments its KEY=VALUE\n"
     "parameters"},
    {CO_PLUGIN, 'D', NULL, "NAME.FLAG=N", 0, 0,
     "set an nbdkit plugin's debug flag NAME_debug_FLAG"},
    {CO_CACHE, ID_CACHE, "cache", "MODE", 0, 0,
     "the image's cache mode, as qemu-nbd's:\n"
     "writeback (default: the host page cache), none\n"
     "(O_DIRECT, flush = fdatasync), writethrough\n"
     "(every write FUA), directsync (both), unsafe\n"
     "(flushes ignored)"},
    {CO_AIO, ID_AIO, "aio", "MODE", 0, 0,
     "how local images are read and written: io_uring\n"
     "(default where the kernel allows it) or threads\n"
     "(blocking calls on the worker pool)"},
    {CO_L2_CACHE, ID_L2_CACHE, "l2-cache-size", "SIZE", 0, 0,
     "qcow2 L2 cache per image, at least 64K (default\n"
     "32M: maps 256G of 64k clusters)"},
    {CO_L2_CACHE, ID_COPY_ON_READ, "copy-on-read", NULL, 0, 0,
     "a writable qcow2 image keeps what it reads from\n"
     "its backing file: later reads stay local (off)"},
    {CO_NBD, ID_NBD_CONNECTIONS, "nbd-connections", "N", 0, 16,
     "connections to each NBD source, 0-16 (default 0:\n"
     "4 when its server allows multi-conn, else 1)"},
    {CO_NBD, ID_NBD_TIMEOUT, "nbd-timeout", "SECONDS", 0, 86400,
     "a request to an NBD server that is gone or does\n"
     "not answer fails with EIO at most this long after\n"
     "it was made (plus 1 s for one reconnection),\n"
     "0-86400 (default 30; 0: forever)"},
    {CO_NBD, ID_NBD_REPLAY_LIMIT, "nbd-replay-limit", "SIZE", 0, 0,
     "acknowledged writes kept until a flush, sent\n"
     "again to an NBD server that restarted (default\n"
     "64M; 0: none); past it a loss fails the next flush"},
    {CO_RBD, ID_RBD_TIMEOUT, "rbd-timeout", "SECONDS", 0, 86400,
     "a Ceph monitor or OSD operation of an RBD source\n"
     "that takes longer fails with EIO, 0-86400\n"
     "(default 30; 0: forever)"},
    {CO_RBD, ID_RBD_LOCK, "rbd-lock", "MODE", 0, 0,
     "a writable RBD image held by another writer:\n"
     "fail (default), wait for it, or none (take no\n"
     "lock; writers pass it back and forth, as QEMU)"},
    {CO_NBD_OLD, 'C', "connections", "N", 0, 16,
     "the same as --nbd-connections"},
    {CO_NBD_OLD, ID_NBD_TIMEOUT, "timeout", "SECONDS", 0, 86400,
     "the same as --nbd-timeout"},
    {CO_LOG, 'v', "verbose", NULL, 0, 0,
     "log more: the same as --log-level debug"},
    {CO_LOG, ID_LOG_LEVEL, "log-level", "LEVEL", 0, 0,
     "error, warn, info (default) or debug"},
    {CO_LOG, ID_SYSLOG, "syslog", NULL, 0, 0,
     "log to syslog (daemon facility), not stderr"},
    {CO_PID_FILE, 'P', "pid-file", "FILE", 0, 0,
     "write the pid once ready (connections accepted,\n"
     "the mount live, the socket listening); removed\n"
     "at exit"},
    {CO_CONTROL, ID_CONTROL, "control", "PATH", 0, 0,
     "take commands on the Unix socket PATH (mode\n"
     "0600; blockport ctl PATH help), made before\n"
     "ready and removed at exit (docs/CONTROL.md)"},
    {CO_METRICS, ID_METRICS, "metrics", "ADDR:PORT", 0, 0,
     "serve Prometheus metrics at\n"
     "http://ADDR:PORT/metrics ([ADDR] for IPv6;\n"
     "docs/METRICS.md)"},
    {CO_VIEWS, ID_VIEWS_UNIX, "views-unix", "PATH", 0, 0,
     "with --control: the disk takes checkpoints,\n"
     "their views served read-only over NBD on the\n"
     "Unix socket PATH (mode 0600; docs/BACKUP.md)"},
    {CO_FLEECE, ID_FLEECE_DIR, "fleece-dir", "DIR", 0, 0,
     "with checkpoints: where their views keep the\n"
     "data writes replace (unlinked files; default\n"
     "/var/tmp; docs/BACKUP.md)"},
    {CO_FLEECE, ID_FLEECE_LIMIT, "fleece-limit", "SIZE", 0, 0,
     "with checkpoints: fleece bytes of all views\n"
     "together; a view that needs more breaks (its\n"
     "reads fail), writes never do (default 0: none)"},
};
#define NTABLE (sizeof table / sizeof table[0])

void cli_opts_init(struct cli_common *c, const char *cmd, unsigned which,
                   unsigned workers) {
  *c = (struct cli_common){.cmd = cmd,
                           .which = which,
                           .open = BD_OPEN_OPTS_INIT,
                           .workers = workers};
  c->open.options = c->options;
  c->open.defaults = c->defaults;
}

void cli_opts_tables(const struct cli_common *c, const struct option *own,
                     const char *own_short, struct option lo[CLI_MAX_LONGOPTS],
                     char so[64]) {
  size_t n = 0, ns = strlen(own_short);
  memcpy(so, own_short, ns);
  for (; own[n].name; n++)
    lo[n] = own[n];
  for (size_t i = 0; i < NTABLE; i++) {
    const struct shared_opt *t = &table[i];
    if (!(c->which & t->group))
      continue;
    int has_arg = t->arg ? required_argument : no_argument;
    if (t->name && n + 1 < CLI_MAX_LONGOPTS)
      lo[n++] = (struct option){t->name, has_arg, NULL, t->val};
    if (t->val < 128 && ns + 3 < 64) {
      so[ns++] = (char)t->val;
      if (t->arg)
        so[ns++] = ':';
    }
  }
  lo[n] = (struct option){0, 0, 0, 0};
  so[ns] = '\0';
}

/* The canonical entry for getopt value CH among the groups C takes. */
static const struct shared_opt *find(const struct cli_common *c, int ch) {
  if (ch == 'C')
    ch = ID_NBD_CONNECTIONS;
  for (size_t i = 0; i < NTABLE; i++)
    if (table[i].val == ch && (c->which & table[i].group))
      return &table[i];
  return NULL;
}

/* "--NAME ARG: WHY" as a usage error; -1. */
static int bad_why(const struct cli_common *c, const struct shared_opt *t,
                   const char *arg, const char *why) {
  char opt[40];
  snprintf(opt, sizeof opt, "%s%s", t->name ? "--" : "-",
           t->name ? t->name : (char[]){(char)t->val, 0});
  cli_usage_error(c->cmd, "%s %s: %s", opt, arg, why);
  return -1;
}

static int bad(const struct cli_common *c, const struct shared_opt *t,
               const char *arg, const char *expected) {
  char why[256];
  snprintf(why, sizeof why, "expected %s", expected);
  return bad_why(c, t, arg, why);
}

static int number(const struct cli_common *c, const struct shared_opt *t,
                  const char *arg, unsigned *out) {
  char range[64];
  if (cli_parse_uint(arg, t->min, t->max, out) == 0)
    return 1;
  snprintf(range, sizeof range, "a number in %u-%u", t->min, t->max);
  return bad(c, t, arg, range);
}

/* "FORMAT.KEY=ARG" as a default of the source's options: a format flag
 * reaches its format without the core knowing either. */
static int add_default(struct cli_common *c, const struct shared_opt *t,
                       const char *format, const char *key, const char *arg) {
  size_t room = sizeof c->arena - c->arena_used;
  char *s = c->arena + c->arena_used;
  int n = snprintf(s, room, "%s.%s=%s", format, key, arg);
  if (c->open.ndefaults == CLI_MAX_SOURCE_OPTS || n < 0 || (size_t)n >= room)
    return bad(c, t, arg, "fewer source options");
  c->arena_used += (size_t)n + 1;
  c->defaults[c->open.ndefaults++] = s;
  return 1;
}

static int metrics_addr(struct cli_common *c, const struct shared_opt *t,
                        const char *arg) {
  char host[256], port[8];
  if (!metrics_http_parse_addr(arg, host, sizeof host, port, sizeof port))
    return bad(c, t, arg, "ADDR:PORT");
  c->metrics = arg;
  return 1;
}

/* --source-option KEY=VALUE: the form now, the key when the source
 * opens (only its format knows its keys). */
static int source_option(struct cli_common *c, const struct shared_opt *t,
                         const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg)
    return bad(c, t, arg, "KEY=VALUE");
  if (c->open.noptions == CLI_MAX_SOURCE_OPTS)
    return bad(c, t, arg, "at most 64 source options");
  c->options[c->open.noptions++] = arg;
  return 1;
}

/* A format flag with a number in the table's range. */
static int number_default(struct cli_common *c, const struct shared_opt *t,
                          const char *arg, const char *format,
                          const char *key) {
  unsigned v;
  int r = number(c, t, arg, &v);
  return r < 0 ? r : add_default(c, t, format, key, arg);
}

/* -D NAME.FLAG=N: the form is checked now (by the plugin host), the name
 * when the plugin loads. */
static int debug_flag(struct cli_common *c, const struct shared_opt *t,
                      const char *arg) {
  if (plugin_check_debug_flag(arg) < 0)
    return bad(c, t, arg, "NAME.FLAG=N");
  return add_default(c, t, "nbdkit", "debug", arg);
}

/* A size that does not parse: what is wrong with it (an unknown suffix, a
 * number too large), then what a right one looks like. */
static int bad_size(const struct cli_common *c, const struct shared_opt *t,
                    const char *arg, const char *expected) {
  char why[96], what[256];
  bd_size_problem(arg, why, sizeof why);
  if (!strncmp(why, "expected", 8)) /* not a number: the form says it */
    return bad(c, t, arg, expected);
  snprintf(what, sizeof what, "%s; expected %s", why, expected);
  return bad_why(c, t, arg, what);
}

static int l2_cache(struct cli_common *c, const struct shared_opt *t,
                    const char *arg) {
  uint64_t v;
  if (bd_parse_size(arg, &v) < 0)
    return bad_size(c, t, arg, "a size of at least 64K");
  if (v < QCOW2_L2_CACHE_MIN)
    return bad(c, t, arg, "a size of at least 64K");
  return add_default(c, t, "qcow2", "l2-cache-size", arg);
}

static int cache_mode(struct cli_common *c, const struct shared_opt *t,
                      const char *arg) {
  if (bd_cache_parse(arg, &c->open.cache) < 0)
    return bad(c, t, arg,
               "none, writeback, writethrough, directsync or unsafe");
  return 1;
}

static int aio_mode(struct cli_common *c, const struct shared_opt *t,
                    const char *arg) {
  if (bd_aio_parse(arg, &c->open.aio) < 0)
    return bad(c, t, arg, "io_uring or threads");
  if (c->open.aio == BD_AIO_IO_URING && !feature_built(FEATURE_IO_URING)) {
    feature_missing(FEATURE_IO_URING);
    cli_error(c->cmd, NULL, "--aio io_uring: %s", bd_errmsg());
    return -1;
  }
  return 1;
}

static int replay_limit(struct cli_common *c, const struct shared_opt *t,
                        const char *arg) {
  uint64_t v;
  if (bd_parse_size(arg, &v) < 0)
    return bad_size(c, t, arg, "a size (4096, 512K, 64M, ...)");
  return add_default(c, t, "nbd", "replay-limit", arg);
}

static int rbd_lock(struct cli_common *c, const struct shared_opt *t,
                    const char *arg) {
  static const char *const modes[] = {RBD_LOCK_MODES};
  for (unsigned i = 0; i < sizeof modes / sizeof *modes; i++)
    if (strcmp(arg, modes[i]) == 0)
      return add_default(c, t, "rbd", "lock", arg);
  return bad(c, t, arg, "fail, wait or none");
}

static int fleece_limit(struct cli_common *c, const struct shared_opt *t,
                        const char *arg) {
  if (bd_parse_size(arg, &c->ckpt.fleece_limit) < 0)
    return bad_size(c, t, arg, "a size (say 10G), 0 for no limit");
  return 1;
}

static int logging(struct cli_common *c, const struct shared_opt *t,
                   const char *arg) {
  c->log_chosen |= t->val != ID_SYSLOG;
  if (t->val == 'v')
    log_threshold = LOG_LEVEL_DEBUG;
  else if (t->val == ID_SYSLOG)
    log_to_syslog("blockport");
  else if (log_parse_level(arg, &log_threshold) < 0)
    return bad(c, t, arg, "error, warn, info or debug");
  return 1;
}

int cli_opts_handle(struct cli_common *c, int ch, const char *arg) {
  const struct shared_opt *t = find(c, ch);
  if (!t)
    return 0;
  switch (t->val) {
  case 'f': c->open.format = arg; return 1;
  case 'w': return number(c, t, arg, &c->workers);
  case ID_PLUGIN: c->plugin = arg; return 1;
  case 'D': return debug_flag(c, t, arg);
  case ID_L2_CACHE: return l2_cache(c, t, arg);
  case ID_CACHE: return cache_mode(c, t, arg);
  case ID_AIO: return aio_mode(c, t, arg);
  case ID_COPY_ON_READ: c->open.flags |= BD_OPEN_COPY_ON_READ; return 1;
  case ID_SOURCE_OPT: return source_option(c, t, arg);
  case ID_NBD_CONNECTIONS:
    return number_default(c, t, arg, "nbd", "connections");
  case ID_NBD_TIMEOUT: return number_default(c, t, arg, "nbd", "timeout");
  case ID_NBD_REPLAY_LIMIT: return replay_limit(c, t, arg);
  case ID_RBD_TIMEOUT: return number_default(c, t, arg, "rbd", "timeout");
  case ID_RBD_LOCK: return rbd_lock(c, t, arg);
  case 'P': c->pid_file = arg; return 1;
  case ID_CONTROL: c->control = arg; return 1;
  case ID_VIEWS_UNIX: c->views_unix = arg; return 1;
  case ID_METRICS: return metrics_addr(c, t, arg);
  case ID_FLEECE_DIR: c->ckpt.fleece_dir = arg; return 1;
  case ID_FLEECE_LIMIT: return fleece_limit(c, t, arg);
  default: return logging(c, t, arg);
  }
}

/* "  -f, --format FMT" padded to the help column, then the help, its
 * further lines indented to that column. */
static void usage_line(FILE *f, const struct shared_opt *t, unsigned dflt) {
  char left[64];
  int n;
  if (t->val < 128 && t->name)
    n = snprintf(left, sizeof left, "  -%c, --%s", t->val, t->name);
  else if (t->val < 128)
    n = snprintf(left, sizeof left, "  -%c", t->val);
  else
    n = snprintf(left, sizeof left, "      --%s", t->name);
  if (t->arg)
    n += snprintf(left + n, sizeof left - (size_t)n, " %s", t->arg);
  fprintf(f, "%s%*s", left, n < 27 ? 28 - n : 1, "");
  for (const char *h = t->help; *h;) {
    size_t len = strcspn(h, "\n");
    const char *u = strstr(h, "%u"); /* the default */
    if (u && u < h + len)
      fprintf(f, "%.*s%u%.*s", (int)(u - h), h, dflt, (int)(h + len - u - 2),
              u + 2);
    else
      fprintf(f, "%.*s", (int)len, h);
    h += len;
    if (*h)
      fprintf(f, "\n%28s", "");
    h += *h == '\n';
  }
  fputc('\n', f);
}

void cli_opts_usage(FILE *f, const struct cli_common *c) {
  for (size_t i = 0; i < NTABLE; i++)
    if (c->which & table[i].group)
      usage_line(f, &table[i], c->workers);
}

unsigned cli_nbd_timeout(const struct cli_common *c) {
  unsigned t = NBD_TIMEOUT_DEFAULT;
  /* A bad value fails the opening itself, which says why. */
  if (bd_opt_uint(&c->open, "nbd", "timeout", 0, 86400, &t) < 0)
    t = NBD_TIMEOUT_DEFAULT;
  return t;
}

/* --fleece-dir, checked at start rather than at the first checkpoint. */
static int check_fleece_dir(const struct cli_common *c, const char *dir) {
  struct stat st;
  int e = stat(dir, &st) < 0             ? errno
          : !S_ISDIR(st.st_mode)         ? ENOTDIR
          : access(dir, W_OK | X_OK) < 0 ? errno
                                         : 0;
  if (e)
    cli_error(c->cmd, NULL, "--fleece-dir %s: %s", dir, strerror(e));
  return e ? -1 : 0;
}

int cli_ckpt_check(const struct cli_common *c) {
  bool fleece = c->ckpt.fleece_dir || c->ckpt.fleece_limit;
  /* Where --views-unix exists, checkpoints need it. */
  bool views = c->which & CO_VIEWS ? c->views_unix != NULL : true;
  const char *err = NULL;
  if (c->views_unix && !c->control)
    err = "--views-unix needs --control (checkpoints are taken there)";
  else if (fleece && !c->control)
    err = "--fleece-dir and --fleece-limit need --control (they are for "
          "checkpoints)";
  else if (fleece && !views)
    err = "--fleece-dir and --fleece-limit need --views-unix (without it "
          "no checkpoint is taken)";
  if (err) {
    cli_usage_error(c->cmd, "%s", err);
    return -1;
  }
  if (!c->control || !views)
    return 0;
  return check_fleece_dir(c, c->ckpt.fleece_dir ? c->ckpt.fleece_dir
                                                : CKPT_DEFAULT_FLEECE_DIR);
}

int cli_getopt(int argc, char **argv, struct cli_common *c,
               const struct option *own, const char *own_short,
               int (*option)(void *cmd, int ch, const char *arg),
               void (*usage)(FILE *f, const void *cmd), void *cmd) {
  struct option lo[CLI_MAX_LONGOPTS];
  char so[64];
  cli_opts_tables(c, own, own_short, lo, so);
  int ch, r;
  while ((ch = getopt_long(argc, argv, so, lo, NULL)) != -1) {
    if (ch == 'h') {
      usage(stdout, cmd);
      exit(0);
    }
    if ((r = option(cmd, ch, optarg)) == 0 &&
        (r = cli_opts_handle(c, ch, optarg)) == 0) {
      cli_usage_error(c->cmd, NULL);
      return -1;
    }
    if (r < 0)
      return -1;
  }
  return 0;
}
