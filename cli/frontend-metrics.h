/* SPDX-License-Identifier: BSD-3-Clause */
/* --metrics for mount and vhost: the same endpoint as serve's
 * (server/metrics.h), with one entry, the disk the command serves, named
 * by its mount point or socket.  Started before the image is opened, so a
 * bad address fails first; its scope then goes into the opening, so the
 * image's qcow2 cache and nbd:// connections count there too. */
#ifndef BLOCKPORT_CLI_FRONTEND_METRICS_H
#define BLOCKPORT_CLI_FRONTEND_METRICS_H

#include <stdint.h>

#include "server/metrics.h"

struct cli_metrics {
  struct metrics *m;
  struct metrics_http *http;
  char *name;                    /* the entry's: an absolute path */
  struct bd_stat_scope *sources; /* for the opening's bd_open_opts.stats */
};

/* ADDR NULL (no --metrics): nothing, 0.  Else serve F's metrics on ADDR,
 * with one entry for PATH (made absolute) whose source counters are
 * cm->sources: 0, or -1 (logged, naming the option). */
int cli_metrics_start(struct cli_metrics *cm, const char *addr,
                      enum metrics_frontend f, const char *path);
/* The disk is open, SIZE bytes: its entry is described from now on.
 * Where the front end counts its requests, NULL without --metrics. */
struct metrics_reqs *cli_metrics_disk(struct cli_metrics *cm, uint64_t size);
/* Stop serving and free (after the device is closed). */
void cli_metrics_stop(struct cli_metrics *cm);

#endif
