/* SPDX-License-Identifier: BSD-3-Clause */
/* --metrics for mount and vhost (frontend-metrics.h). */
#include "frontend-metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/io.h"
#include "core/log.h"

int cli_metrics_start(struct cli_metrics *cm, const char *addr,
                      enum metrics_frontend f, const char *path) {
  memset(cm, 0, sizeof *cm);
  if (!addr)
    return 0;
  if (!(cm->name = io_absolute_path(path))) {
    log_error("--metrics: %s: %s", path, strerror(errno));
    return -1;
  }
  if (!(cm->m = metrics_create_for(f)) ||
      !(cm->sources = metrics_export_sources(cm->m, cm->name))) {
    log_error("--metrics: out of memory");
    cli_metrics_stop(cm);
    return -1;
  }
  if (!(cm->http = metrics_http_start(addr, cm->m))) {
    log_error("%s", bd_errmsg()); /* it names --metrics */
    cli_metrics_stop(cm);
    return -1;
  }
  return 0;
}

struct metrics_reqs *cli_metrics_disk(struct cli_metrics *cm, uint64_t size) {
  if (!cm->m)
    return NULL;
  struct metrics_export *e = metrics_export_get(cm->m, cm->name, size);
  return e ? &e->req : NULL;
}

void cli_metrics_stop(struct cli_metrics *cm) {
  metrics_http_stop(cm->http);
  metrics_free(cm->m);
  free(cm->name);
  memset(cm, 0, sizeof *cm);
}
