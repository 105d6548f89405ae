/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: RBD specs (formats/rbd-spec.c), which come from
 * command lines and config files.  Whatever the input, the parser must
 * not crash or leak; what it accepts has a non-empty pool and image, at
 * most one '/' inside the name, non-empty option keys, and a refusal
 * leaves a message and nothing to free. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/rbd-spec.h"
#include "fuzz-check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *spec = malloc(size + 5);
  if (!spec)
    return 0;
  memcpy(spec, "rbd:", 4);
  memcpy(spec + 4, data, size);
  spec[size + 4] = '\0';
  struct rbd_spec s;
  bd_clear_error();
  if (rbd_spec_parse(spec, &s) < 0) {
    CHECK(s.buf == NULL && strlen(bd_errmsg()) > 0);
  } else {
    CHECK(s.pool && s.pool[0] && s.image && s.image[0]);
    CHECK(!strchr(s.image, '/'));
    CHECK(!s.snap || s.snap[0]);
    CHECK(s.nopts <= RBD_SPEC_MAX_OPTS);
    for (size_t i = 0; i < s.nopts; i++)
      CHECK(s.opts[i].key[0] && s.opts[i].value);
    char name[64];
    rbd_spec_name(&s, name, sizeof name);
    rbd_spec_free(&s);
  }
  free(spec);
  return 0;
}
