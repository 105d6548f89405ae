/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport: one program, subcommands for each way to reach a disk. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "core/blockdev.h"
#include "core/features.h"
#include "core/filelock.h"
#include "core/log.h"
#include "core/open.h"
#include "core/version.h"
#include "formats/registry.h"

static const struct command {
  const char *name;
  int (*main)(int argc, char **argv);
  const char *summary;
  bool force_share; /* has -U/--force-share (core/filelock.h) */
} commands[] = {
    {"serve", serve_main, "serve images over NBD", true},
    {"mount", mount_main, "mount an image or NBD export as a file (FUSE)"},
    {"vhost", vhost_main, "serve an image to QEMU as vhost-user-blk"},
    {"ctl", ctl_main, "send a command to a running serve, vhost or mount"},
    /* Image tools: keep in the order `qemu-img` users know. */
    {"check", check_main, "check (and repair) a qcow2 image's refcounts", true},
    {"create", create_main, "create a raw or qcow2 image, or an RBD image"},
    {"info", info_main, "show facts about an image", true},
    {"map", map_main, "show where an image's data lives", true},
    {"convert", convert_main,
     "copy an image into a new raw or qcow2 file or RBD image", true},
    {"compare", compare_main, "whether two images hold the same bytes", true},
    {"resize", resize_main, "grow or shrink a raw, qcow2 or RBD image"},
    {"bitmap", bitmap_main, "change the persistent bitmaps of a qcow2 image"},
    {"snapshot", snapshot_main, "list, create, apply or delete qcow2 snapshots",
     true},
    {"measure", measure_main, "how large a new raw or qcow2 image would be",
     true},
    {"dd", dd_main, "copy part of an image into a new one, as dd", true},
    {"amend", amend_main, "change the options of a qcow2 image in place"},
    {"commit", commit_main, "copy an image's data into its backing file"},
    {"rebase", rebase_main, "change the backing file of a qcow2 image"},
};

static void usage(FILE *f) {
  fputs("Usage: blockport COMMAND [OPTIONS] ...\n"
        "Serve and reach disk images (raw, qcow2, Ceph RBD).\n\nCommands:\n",
        f);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-9s %s (blockport %s --help)\n", commands[i].name,
            commands[i].summary, commands[i].name);
  fputs("\n  blockport --version | --help\n", f);
}

/* The optional parts (core/features.h) that were built in, or not, on
 * one line after LABEL; none: no line. */
static void print_features(const char *label, bool built) {
  const char *sep = label;
  for (int f = 0; f < FEATURE_COUNT; f++)
    if (feature_built(f) == built) {
      printf("%s %s", sep, feature_id(f));
      sep = "";
    }
  if (sep != label)
    putchar('\n');
}

static int print_version(void) {
  printf("blockport %s\n", BLOCKPORT_VERSION);
  print_features("built with:", true);
  print_features("built without:", false);
  return 0;
}

/* --version among a command's options (before any "--"). */
static bool asks_version(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--version"))
      return true;
  return false;
}

static int run_command(const struct command *c, int argc, char **argv) {
  if (asks_version(argc, argv))
    return print_version();
  /* getopt names the program by argv[0] in its messages. */
  char name[64];
  snprintf(name, sizeof name, "blockport %s", c->name);
  argv[0] = name;
  if (c->force_share)
    filelock_share_hint = "-U/--force-share";
  /* The image tools speak as qemu-img does: results, warnings and errors,
   * no information lines (the servers log those). */
  if (c->main != serve_main && c->main != mount_main && c->main != vhost_main &&
      c->main != ctl_main)
    log_threshold = LOG_LEVEL_WARN;
  return c->main(argc, argv);
}

int main(int argc, char **argv) {
  bd_formats_install(formats_registry);
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V"))
    return print_version();
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name))
      return run_command(&commands[i], argc - 1, argv + 1);
  fprintf(stderr, "blockport: unknown command '%s'\nTry 'blockport --help'.\n",
          cmd);
  return 1;
}
