/* SPDX-License-Identifier: BSD-3-Clause */
/* Compiled with one layer's include directories and one header of
 * another (PROBE_HEADER): tests/integration/test-layers.sh checks that
 * the build refuses the includes the layer rules forbid and accepts the
 * ones they allow. */
#include PROBE_HEADER

int layer_probe(void);
int layer_probe(void) {
  return 0;
}
