/* blockport check: qemu-img check for qcow2 images, with its exit codes. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core/blockdev.h"
#include "../formats/formats.h"
#include "../formats/probe.h"
#include "../formats/qcow2/check.h"
#include "commands.h"

static const char check_usage[] =
    "Usage: blockport check [-U] [--repair leaks|all] IMAGE\n"
    "Check a qcow2 image's metadata: every host cluster's refcount against\n"
    "the references to it.  --repair rebuilds the refcounts (leaks: only\n"
    "when there is no corruption; all: always).  -U/--force-share checks an\n"
    "image that another process writes (read-only, so no repair).\n"
    "IMAGE may also be an NBD URI, which shows no metadata to check.\n"
    "Exit status: 0 no errors, 2 corruptions, 3 leaks only, 1 bad usage or\n"
    "the check could not run, 63 the image has no metadata to check (raw,\n"
    "NBD), as qemu-img check.\n";

int check_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"repair", required_argument, NULL, 'r'},
      {"force-share", no_argument, NULL, 'U'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  enum qcow2_repair repair = QCOW2_REPAIR_NONE;
  bool share = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "r:Uh", longopts, NULL)) != -1) {
    if (ch == 'U')
      share = true;
    else if (ch == 'r' && !strcmp(optarg, "leaks"))
      repair = QCOW2_REPAIR_LEAKS;
    else if (ch == 'r' && !strcmp(optarg, "all"))
      repair = QCOW2_REPAIR_ALL;
    else if (ch == 'h') {
      fputs(check_usage, stdout);
      return 0;
    } else {
      fputs(check_usage, stderr);
      return 1;
    }
  }
  if (optind + 1 != argc) {
    fputs(check_usage, stderr);
    return 1;
  }
  if (share && repair != QCOW2_REPAIR_NONE) {
    fprintf(stderr, "blockport check: --force-share opens read-only: it "
                    "cannot be used with --repair\n");
    return 1;
  }
  const char *path = argv[optind];
  if (nbd_is_uri(path)) {
    fprintf(stderr,
            "blockport check: %s: an NBD export shows only its guest data, "
            "no image metadata to check (check the image on the server)\n",
            path);
    return 63;
  }
  const char *fmt;
  if (probe_file(path, &fmt) < 0) {
    fprintf(stderr, "blockport check: %s\n", bd_errmsg());
    return 1;
  }
  if (!probe_supported(fmt)) {
    probe_set_unsupported_error(path, fmt);
    fprintf(stderr, "blockport check: %s\n", bd_errmsg());
    return 1;
  }
  if (strcmp(fmt, "qcow2") != 0) {
    fprintf(stderr,
            "blockport check: %s: a raw image has no metadata to check\n",
            path);
    return 63;
  }
  struct qcow2_check_result res;
  if (qcow2_check_path(path, repair, share, stdout, &res) < 0) {
    fprintf(stderr, "blockport check: %s\n", bd_errmsg());
    return 1;
  }
  if (res.corruptions)
    printf("\n%llu errors were found on the image.\n",
           (unsigned long long)res.corruptions);
  if (res.leaks)
    printf("\n%llu leaked clusters were found on the image.\n",
           (unsigned long long)res.leaks);
  if (!res.corruptions && !res.leaks)
    printf("No errors were found on the image.\n");
  printf("%llu/%llu clusters allocated\n", (unsigned long long)res.allocated,
         (unsigned long long)res.clusters);
  return res.corruptions ? 2 : res.leaks ? 3 : 0;
}
