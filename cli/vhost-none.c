/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport vhost in a build without vhost-user (BLOCKPORT_VHOST=OFF),
 * compiled instead of vhost.c. */
#include "cli.h"
#include "commands.h"

int vhost_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return cli_built_without("vhost", FEATURE_VHOST);
}
