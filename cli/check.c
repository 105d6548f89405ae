/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport check: qemu-img check for qcow2 images, with its exit codes. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "core/blockdev.h"
#include "formats/formats.h"
#include "formats/probe.h"
#include "formats/qcow2/check.h"
#include "formats/rbd-spec.h"

#include "cli.h"
#include "commands.h"

static const char check_usage[] =
    "Usage: blockport check [-q] [-U] [-f FMT] [--output human|json]\n"
    "                       [--repair leaks|all] IMAGE\n"
    "Check a qcow2 image's metadata as qemu-img check does: every host\n"
    "cluster's refcount against the references to it (tables, data,\n"
    "snapshots, persistent bitmaps), and the COPIED flags.\n"
    "  -r, --repair leaks  set leaked clusters' refcounts right\n"
    "  -r, --repair all    also repair corruptions (rebuilding the refcount\n"
    "                      structure when needed) and clear the image's\n"
    "                      dirty and corrupt bits once nothing is left\n"
    "  -U, --force-share   check an image that another process writes\n"
    "                      (read-only, so no repair)\n"
    "  -f, --format FMT    the image's format (qcow2 or raw; default:\n"
    "                      probed)\n"
    "      --output human|json  the result as text (default) or as the\n"
    "                      JSON object qemu-img check --output=json prints\n"
    "  -q, --quiet         print no result (the exit status says it)\n"
    "Each problem is named on stderr, as qemu-img does.\n"
    "IMAGE may also be an NBD URI, which shows no metadata to check.\n"
    "Exit status, as qemu-img check's (after a repair: of the image as\n"
    "repaired): 0 no errors, 2 corruptions, 3 leaks only, 1 the check could\n"
    "not run (or a usage error), 63 the image has no metadata to check\n"
    "(raw, NBD).\n";

static void print_result(const struct qcow2_check_result *r) {
  if (!r->corruptions && !r->leaks && !r->check_errors)
    printf("No errors were found on the image.\n");
  if (r->corruptions)
    printf("\n%llu errors were found on the image.\nData may be corrupted, "
           "or further writes to the image may corrupt it.\n",
           (unsigned long long)r->corruptions);
  if (r->leaks)
    printf("\n%llu leaked clusters were found on the image.\nThis means "
           "waste of disk space, but no harm to data.\n",
           (unsigned long long)r->leaks);
  if (r->check_errors)
    printf("\n%llu internal errors have occurred during the check.\n",
           (unsigned long long)r->check_errors);
  if (r->total && r->allocated)
    printf("%llu/%llu = %0.2f%% allocated, %0.2f%% fragmented, %0.2f%% "
           "compressed clusters\n",
           (unsigned long long)r->allocated, (unsigned long long)r->total,
           r->allocated * 100.0 / r->total,
           r->fragmented * 100.0 / r->allocated,
           r->compressed * 100.0 / r->allocated);
  if (r->image_end)
    printf("Image end offset: %llu\n", (unsigned long long)r->image_end);
}

/* The JSON of qemu-img check --output=json: counts that are 0 are left
 * out, as qemu-img leaves them out. */
static void print_json(const struct qcow2_check_result *r, const char *path) {
  const struct {
    const char *key;
    uint64_t v;
    bool always;
  } f[] = {{"image-end-offset", r->image_end, false},
           {"total-clusters", r->total, false},
           {"corruptions", r->corruptions, false},
           {"check-errors", r->check_errors, true},
           {"leaks", r->leaks, false},
           {"corruptions-fixed", r->corruptions_fixed, false},
           {"leaks-fixed", r->leaks_fixed, false},
           {"allocated-clusters", r->allocated, false},
           {"fragmented-clusters", r->fragmented, false},
           {"compressed-clusters", r->compressed, false}};
  printf("{\n");
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    if (f[i].v || f[i].always)
      printf("    \"%s\": %llu,\n", f[i].key, (unsigned long long)f[i].v);
  printf("    \"filename\": ");
  cli_json_str(path);
  printf(",\n    \"format\": \"qcow2\"\n}\n");
}

static int usage_error(const char *why) {
  if (why)
    cli_usage_error("check", "%s", why);
  else
    cli_usage_error("check", NULL);
  return 1;
}

enum output { OUT_HUMAN, OUT_JSON, OUT_QUIET };

/* Which format to check: the one given, or the probe's.  0, 63 (no
 * metadata to check) or 1, said. */
static int image_format(const char *path, const char *given) {
  const char *fmt = given;
  if (!fmt && probe_file(path, &fmt) < 0) {
    cli_error("check", NULL, "%s", bd_errmsg());
    return 1;
  }
  if (!probe_supported(fmt)) {
    probe_set_unsupported_error(path, fmt);
    cli_error("check", NULL, "%s", bd_errmsg());
    return 1;
  }
  if (strcmp(fmt, "qcow2") != 0) {
    cli_error("check", path, "a raw image has no metadata to check");
    return 63;
  }
  return 0;
}

int check_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"repair", required_argument, NULL, 'r'},
      {"force-share", no_argument, NULL, 'U'},
      {"format", required_argument, NULL, 'f'},
      {"output", required_argument, NULL, 'o'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  enum qcow2_repair repair = QCOW2_REPAIR_NONE;
  enum output out = OUT_HUMAN;
  const char *fmt = NULL;
  bool share = false, quiet = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "r:Uf:qh", longopts, NULL)) != -1) {
    if (ch == 'U')
      share = true;
    else if (ch == 'f')
      fmt = optarg;
    else if (ch == 'q')
      quiet = true;
    else if (ch == 'o' && (!strcmp(optarg, "human") || !strcmp(optarg, "json")))
      out = !strcmp(optarg, "json") ? OUT_JSON : OUT_HUMAN;
    else if (ch == 'o')
      return usage_error("--output must be human or json");
    else if (ch == 'r' && !strcmp(optarg, "leaks"))
      repair = QCOW2_REPAIR_LEAKS;
    else if (ch == 'r' && !strcmp(optarg, "all"))
      repair = QCOW2_REPAIR_ALL;
    else if (ch == 'r')
      return usage_error("--repair must be leaks or all");
    else if (ch == 'h') {
      fputs(check_usage, stdout);
      return 0;
    } else
      return usage_error(NULL);
  }
  if (optind + 1 != argc)
    return usage_error("expected one image");
  if (quiet)
    out = OUT_QUIET;
  if (share && repair != QCOW2_REPAIR_NONE) {
    cli_error("check", NULL,
              "--force-share opens read-only: it cannot be used with "
              "--repair");
    return 1;
  }
  const char *path = argv[optind];
  if (nbdsrc_is_uri(path)) {
    cli_error("check", path,
              "an NBD export shows only its guest data, no image metadata "
              "to check (check the image on the server)");
    return 63;
  }
  if (rbd_spec_matches(path)) {
    /* qemu-img: "This image format does not support checks", also 63. */
    cli_error("check", path,
              "an RBD image is raw: it has no image metadata to check "
              "(rbd object-map check checks RBD's own)");
    return 63;
  }
  int r = image_format(path, fmt);
  if (r != 0)
    return r;
  struct qcow2_check_result res;
  fflush(stdout);
  /* The summary of a repair goes to stdout, as qemu-img prints it (not
   * with --output=json or -q). */
  FILE *summary = out == OUT_HUMAN ? stdout : NULL;
  if (qcow2_check_path(path, repair, share, stderr, summary, &res) < 0) {
    cli_error("check", NULL, "Check failed: %s", bd_errmsg());
    return 1;
  }
  if (out == OUT_JSON)
    print_json(&res, path);
  else if (out == OUT_HUMAN)
    print_result(&res);
  if (res.check_errors) {
    cli_error("check", NULL, "Check failed");
    return 1;
  }
  return res.corruptions ? 2 : res.leaks ? 3 : 0;
}
