/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport snapshot: list, create, apply and delete the internal
 * snapshots of a qcow2 image, as `qemu-img snapshot` does (its options,
 * table, messages and exit statuses). */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"
#include "formats/qcow2/snapshot-edit.h"
#include "formats/qcow2/snapshot.h"

#include "cli.h"
#include "commands.h"
#include "snapshot-table.h"

static const char snapshot_usage[] =
    "Usage: blockport snapshot [-f FMT] [-U] [-q] (-l | -a SNAPSHOT |\n"
    "                          -c SNAPSHOT | -d SNAPSHOT) FILENAME\n"
    "List, create, apply or delete the internal snapshots of the qcow2\n"
    "image FILENAME (qemu-img snapshot).\n"
    "\n"
    "  -l                     list the snapshots\n"
    "  -c SNAPSHOT            create a snapshot named SNAPSHOT of the image\n"
    "                         as it is now\n"
    "  -a SNAPSHOT            apply (revert to) SNAPSHOT: the image's data\n"
    "                         (and size) become the snapshot's\n"
    "  -d SNAPSHOT            delete SNAPSHOT\n"
    "  -f, --format FMT       format of FILENAME (default: probed)\n"
    "  -U, --force-share      list the snapshots of an image another\n"
    "                         process writes (with -l only)\n"
    "  -q, --quiet            print nothing but the list\n"
    "  -h, --help             show this help\n"
    "\n"
    "SNAPSHOT names a snapshot by its ID, else by its name.  The image is\n"
    "locked while it changes: not while it is served or used by QEMU.\n"
    "Exit status: 0 done, 1 on error.\n";

enum action { NONE, LIST, APPLY, CREATE, DELETE };

struct snapshot_args {
  enum action action;
  const char *name, *format, *path;
  bool share;
};

static int list(struct bd *bd) {
  struct qcow2_snapshot *s;
  uint32_t n;
  if (qcow2_snapshot_list(bd, &s, &n) < 0) {
    cli_error("snapshot", NULL, "%s", bd_errmsg());
    return 1;
  }
  if (n)
    cli_snapshot_header();
  for (uint32_t i = 0; i < n; i++)
    cli_snapshot_line(&s[i]);
  qcow2_free_snapshots(s, n);
  return 0;
}

static int create(struct bd *bd, const char *name) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  /* QEMU takes the time in microseconds. */
  uint32_t nsec = (uint32_t)(ts.tv_nsec / 1000 * 1000);
  int r = qcow2_snapshot_create(bd, name, (uint32_t)ts.tv_sec, nsec);
  if (r < 0) {
    cli_error("snapshot", NULL, "Could not create snapshot '%s': %d (%s)", name,
              r, strerror(-r));
    return 1;
  }
  return 0;
}

static int run(struct bd *bd, const struct snapshot_args *a) {
  int r = 0;
  switch (a->action) {
  case NONE: return 0; /* qemu-img opens the image and does nothing */
  case LIST: return list(bd);
  case CREATE: return create(bd, a->name);
  case APPLY:
    r = qcow2_snapshot_apply(bd, a->name);
    if (r < 0)
      cli_error("snapshot", NULL, "Could not apply snapshot '%s': %s", a->name,
                bd_errmsg());
    break;
  case DELETE:
    r = qcow2_snapshot_delete(bd, a->name);
    if (r < 0)
      cli_error("snapshot", NULL, "Could not delete snapshot '%s': %s", a->name,
                bd_errmsg());
    break;
  }
  return r < 0 ? 1 : 0;
}

static int snapshot_run(const struct snapshot_args *a) {
  if (a->share && a->action != LIST) {
    cli_error("snapshot", NULL,
              "Could not open '%s': force-share=on can only be used with "
              "read-only images",
              a->path);
    return 1;
  }
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = a->format;
  if (a->action == LIST)
    o.flags = BD_OPEN_READONLY | (a->share ? BD_OPEN_SHARE : 0);
  struct bd *bd = bd_open_with(a->path, &o);
  if (!bd) {
    cli_error("snapshot", NULL, "%s", bd_errmsg());
    return 1;
  }
  int ret = run(bd, a);
  if (bd_close(bd) < 0 && ret == 0) {
    cli_error("snapshot", NULL, "%s", bd_errmsg());
    ret = 1;
  }
  return ret;
}

static int set_action(struct snapshot_args *a, enum action act,
                      const char *name) {
  if (a->action != NONE) {
    cli_usage_error("snapshot", "Cannot mix '-l', '-a', '-c', '-d'");
    return -1;
  }
  a->action = act;
  a->name = name;
  return 0;
}

static int parse(int argc, char **argv, struct snapshot_args *a) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"format", required_argument, NULL, 'f'},
      {"quiet", no_argument, NULL, 'q'},
      {"force-share", no_argument, NULL, 'U'},
      {0, 0, 0, 0}};
  int ch, r = 0;
  while (r == 0 &&
         (ch = getopt_long(argc, argv, "la:c:d:f:hqU", longopts, NULL)) != -1) {
    switch (ch) {
    case 'h': fputs(snapshot_usage, stdout); exit(0);
    case 'l': r = set_action(a, LIST, NULL); break;
    case 'a': r = set_action(a, APPLY, optarg); break;
    case 'c': r = set_action(a, CREATE, optarg); break;
    case 'd': r = set_action(a, DELETE, optarg); break;
    case 'f': a->format = optarg; break;
    case 'q': break; /* only the list is ever printed, and it still is */
    case 'U': a->share = true; break;
    default: cli_usage_error("snapshot", NULL); return -1;
    }
  }
  if (r < 0)
    return -1;
  if (optind != argc - 1) {
    cli_usage_error("snapshot", "Expecting one image file name");
    return -1;
  }
  a->path = argv[optind];
  return 0;
}

int snapshot_main(int argc, char **argv) {
  struct snapshot_args a = {0};
  /* qemu-img's lines only: what a source logs on opening is for servers. */
  log_threshold = LOG_LEVEL_WARN;
  return parse(argc, argv, &a) < 0 ? 1 : snapshot_run(&a);
}
