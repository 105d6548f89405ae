/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport mount in a build without FUSE (BLOCKPORT_FUSE=OFF), compiled
 * instead of mount.c. */
#include "cli.h"
#include "commands.h"

int mount_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return cli_built_without("mount", FEATURE_FUSE);
}
