/* SPDX-License-Identifier: BSD-3-Clause */
#include "disk-ckpt.h"

#include <stdio.h>

#include "core/blockdev.h"
#include "core/checkpoint.h"
#include "core/log.h"
#include "server/checkpoints.h"
#include "server/view-server.h"

#include "options.h"

int disk_ckpt_start(struct disk_ckpt *d, const struct cli_common *co,
                    struct bd **bd, bool readonly) {
  *d = (struct disk_ckpt){0};
  if (!co->control)
    return 0;
  readonly = readonly || (*bd)->caps.readonly;
  if (co->views_unix && !readonly) {
    struct bd *live = ckpt_live_open(*bd, &co->ckpt);
    if (!live) {
      log_error("%s", bd_errmsg());
      return -1;
    }
    *bd = live;
  }
  if (co->views_unix && !(d->vs = view_server_start(co->views_unix))) {
    log_error("--views-unix %s", bd_errmsg());
    return -1;
  }
  snprintf(d->hint, sizeof d->hint,
           "start %s with --views-unix PATH, where the views are served",
           co->cmd);
  struct ckpt_host h = {
      .views = view_server_srv(d->vs),
      .ckpt = co->ckpt,
      .hint = d->hint,
      .disk = {
          .name = "", .bd = *bd, .readonly = readonly, .is_default = true}};
  if (!(d->cp = checkpoints_start(&h, co->control))) {
    log_error("%s", bd_errmsg());
    view_server_stop(d->vs);
    d->vs = NULL;
    return -1;
  }
  return 0;
}

void disk_ckpt_stop(struct disk_ckpt *d) {
  checkpoints_stop(d->cp);
  view_server_stop(d->vs);
  *d = (struct disk_ckpt){0};
}
