/* SPDX-License-Identifier: BSD-3-Clause */
/* The options several commands share (format, workers, plugin and -D, L2
 * cache, NBD connections and timeout, logging, pid file): one table with
 * one name, one range and one help text each, so that serve, mount and
 * vhost cannot drift apart.  A command lists the groups it takes, merges
 * them into its getopt tables and hands every option it does not know
 * itself to cli_opts_handle(). */
#ifndef BLOCKPORT_CLI_OPTIONS_H
#define BLOCKPORT_CLI_OPTIONS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "core/blockdev.h"
#include "core/checkpoint.h"
#include "core/open.h"

/* Groups of shared options, a bit each. */
enum {
  CO_FORMAT = 1u << 0,   /* -f, --format FMT */
  CO_WORKERS = 1u << 1,  /* -w, --workers N */
  CO_PLUGIN = 1u << 2,   /* --plugin PLUGIN, -D NAME.FLAG=N */
  CO_L2_CACHE = 1u << 3, /* --l2-cache-size SIZE */
  CO_NBD = 1u << 4,      /* --nbd-connections N, --nbd-timeout SECONDS,
                          * --nbd-replay-limit SIZE */
  /* The spellings mount and vhost had for CO_NBD: -C, --connections,
   * --timeout. */
  CO_NBD_OLD = 1u << 5,
  CO_LOG = 1u << 6,      /* -v, --log-level LEVEL, --syslog */
  CO_PID_FILE = 1u << 7, /* -P, --pid-file FILE */
  CO_RBD = 1u << 8,      /* --rbd-timeout SECONDS, --rbd-lock MODE */
  CO_CACHE = 1u << 9,    /* --cache MODE (enum bd_cache) */
  CO_AIO = 1u << 10,     /* --aio MODE (enum bd_aio) */
  CO_CONTROL = 1u << 11, /* --control PATH (core/control.h) */
  /* --fleece-dir DIR, --fleece-limit SIZE: checkpoints' views */
  CO_FLEECE = 1u << 12,
  CO_VIEWS = 1u << 13, /* --views-unix PATH: views over NBD (vhost, mount) */
  /* --source-option KEY=VALUE: an option of the source's format */
  CO_SOURCE_OPT = 1u << 14,
  /* --metrics ADDR:PORT: Prometheus metrics (server/metrics.h) */
  CO_METRICS = 1u << 15,
};

/* --source-option values, and the [FORMAT.]KEY=VALUE defaults the
 * format flags (--nbd-timeout, -D, ...) become, each. */
#define CLI_MAX_SOURCE_OPTS 64
#define CLI_MAX_LONGOPTS 64

/* What the shared options say, once parsed. */
struct cli_common {
  const char *cmd; /* "serve", for messages */
  unsigned which;  /* the CO_* groups the command takes */
  /* Format, flags, cache and the options, for bd_open_with(). */
  struct bd_open_opts open;
  unsigned workers; /* the command's default until -w */
  const char *plugin;
  const char *pid_file;
  const char *control;    /* --control: the control socket, or NULL */
  struct ckpt_opts ckpt;  /* --fleece-dir, --fleece-limit */
  const char *views_unix; /* --views-unix: views' NBD socket, or NULL */
  const char *metrics;    /* --metrics ADDR:PORT, or NULL */
  bool log_chosen;        /* -v or --log-level given */
  /* What open.options and open.defaults point to: --source-option's
   * arguments, and "FORMAT.KEY=VALUE" strings built in ARENA. */
  const char *options[CLI_MAX_SOURCE_OPTS];
  const char *defaults[CLI_MAX_SOURCE_OPTS];
  char arena[8192];
  size_t arena_used;
};

/* Start C for command CMD taking the groups WHICH, with WORKERS worker
 * threads unless -w says otherwise. */
void cli_opts_init(struct cli_common *c, const char *cmd, unsigned which,
                   unsigned workers);
/* getopt_long's tables: the command's own (OWN, ending with a zero entry;
 * OWN_SHORT) followed by the shared groups C takes. */
void cli_opts_tables(const struct cli_common *c, const struct option *own,
                     const char *own_short, struct option lo[CLI_MAX_LONGOPTS],
                     char so[64]);
/* Handle option CH with ARG if it is a shared one: 1 when it was, 0 when
 * it is the command's own (or unknown), -1 for a bad value (said on
 * stderr, naming the option and its range). */
int cli_opts_handle(struct cli_common *c, int ch, const char *arg);
/* A command's getopt loop over its own options OWN / OWN_SHORT and the
 * shared ones of C.  OPTION(CMD, CH, ARG) takes the command's own: 1
 * taken, 0 not its, -1 a bad value (said).  -h prints USAGE to stdout and
 * exits 0; an unknown option prints it to stderr.  0, or -1 on a usage
 * error. */
int cli_getopt(int argc, char **argv, struct cli_common *c,
               const struct option *own, const char *own_short,
               int (*option)(void *cmd, int ch, const char *arg),
               void (*usage)(FILE *f, const void *cmd), void *cmd);
/* The checkpoint options together, once parsed: --fleece-* and
 * --views-unix need --control (and, where C takes --views-unix, the
 * --fleece-* options need it); the fleece directory must be a writable
 * directory.  0, or -1 (said on stderr). */
int cli_ckpt_check(const struct cli_common *c);
/* The time-out of an NBD source C opens, in seconds, for the callers that
 * wait on one (the mount's partition-table retries). */
unsigned cli_nbd_timeout(const struct cli_common *c);
/* The --help lines of the shared options C takes. */
void cli_opts_usage(FILE *f, const struct cli_common *c);

#endif
