/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the format probe's magic table (formats/probe.c).
 *
 * The input is the start of a file.  Whatever it holds, the probe names
 * one of the known formats, looks at no more than PROBE_HEAD bytes (a
 * longer buffer probes as its first PROBE_HEAD bytes), and gives the same
 * answer twice. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/probe.h"
#include "fuzz-check.h"

static const char *const known[] = {
    "raw", "qcow2", "qcow", "qed",       "vmdk",  "vdi",   "vhdx",
    "vpc", "luks",  "dmg",  "parallels", "bochs", "cloop",
};

static int is_known(const char *f) {
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (!strcmp(f, known[i]))
      return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly SIZE bytes, so reading past it is caught. */
  uint8_t *buf = malloc(size ? size : 1);
  CHECK(buf);
  memcpy(buf, data, size);
  const char *f = probe_format(buf, size, NULL);
  CHECK(is_known(f));
  CHECK(strcmp(f, "dmg") != 0); /* only by name */
  CHECK(!strcmp(f, probe_format(buf, size, NULL)));
  if (size > PROBE_HEAD)
    CHECK(!strcmp(f, probe_format(buf, PROBE_HEAD, NULL)));
  CHECK(is_known(probe_format(buf, size, "x.dmg")));
  free(buf);
  return 0;
}
