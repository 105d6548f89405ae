/* blockport check: qemu-img check for qcow2 images, with its exit codes. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core/blockdev.h"
#include "../formats/formats.h"
#include "../formats/qcow2/check.h"
#include "commands.h"

static const char check_usage[] =
    "Usage: blockport check [--repair leaks|all] IMAGE\n"
    "Check a qcow2 image's metadata: every host cluster's refcount against\n"
    "the references to it.  --repair rebuilds the refcounts (leaks: only\n"
    "when there is no corruption; all: always).\n"
    "IMAGE may also be an NBD URI, which shows no metadata to check.\n"
    "Exit status: 0 no errors, 2 corruptions, 3 leaks only, 1 the check\n"
    "could not run, 63 the image has no metadata to check (raw, NBD), as\n"
    "qemu-img check.\n";

int check_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"repair", required_argument, NULL, 'r'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  enum qcow2_repair repair = QCOW2_REPAIR_NONE;
  int ch;
  while ((ch = getopt_long(argc, argv, "r:h", longopts, NULL)) != -1) {
    if (ch == 'r' && !strcmp(optarg, "leaks"))
      repair = QCOW2_REPAIR_LEAKS;
    else if (ch == 'r' && !strcmp(optarg, "all"))
      repair = QCOW2_REPAIR_ALL;
    else if (ch == 'h') {
      fputs(check_usage, stdout);
      return 0;
    } else {
      fputs(check_usage, stderr);
      return 2;
    }
  }
  if (optind + 1 != argc) {
    fputs(check_usage, stderr);
    return 2;
  }
  const char *path = argv[optind];
  if (nbd_is_uri(path)) {
    fprintf(stderr,
            "blockport check: %s: an NBD export shows only its guest data, "
            "no image metadata to check (check the image on the server)\n",
            path);
    return 63;
  }
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "blockport check: %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (strcmp(bd_probe_format(path), "qcow2") != 0) {
    fprintf(stderr,
            "blockport check: %s: a raw image has no metadata to check\n",
            path);
    return 63;
  }
  struct qcow2_check_result res;
  if (qcow2_check_path(path, repair, stdout, &res) < 0) {
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
