/* SPDX-License-Identifier: BSD-3-Clause */
/* cli_parse_qemu_size(): image sizes as qemu-img reads them. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "cli/cli.h"

static uint64_t ok(const char *s) {
  uint64_t v = 0;
  cr_assert_eq(cli_parse_qemu_size(s, &v), 0, "'%s' refused", s);
  return v;
}

static void bad(const char *s) {
  uint64_t v = 12345;
  cr_assert_eq(cli_parse_qemu_size(s, &v), -1, "'%s' taken", s);
  cr_assert_eq(v, 12345, "'%s' changed the output", s);
}

Test(qemu_size, suffixes_are_powers_of_1024_in_any_case) {
  cr_assert_eq(ok("1"), 1);
  cr_assert_eq(ok("1b"), 1);
  cr_assert_eq(ok("1B"), 1);
  cr_assert_eq(ok("1k"), 1024);
  cr_assert_eq(ok("1K"), 1024);
  cr_assert_eq(ok("2m"), 2u << 20);
  cr_assert_eq(ok("3G"), 3ull << 30);
  cr_assert_eq(ok("1T"), 1ull << 40);
  cr_assert_eq(ok("1p"), 1ull << 50);
  cr_assert_eq(ok("7E"), 7ull << 60);
  cr_assert_eq(ok(" 1G"), 1ull << 30);
  cr_assert_eq(ok("0x1000"), 4096);
  cr_assert_eq(ok("010"), 10);
}

Test(qemu_size, fractions_only_with_a_multiplying_suffix) {
  cr_assert_eq(ok("1.5G"), 3ull << 29);
  cr_assert_eq(ok("1.5K"), 1536);
  cr_assert_eq(ok("0.1k"), 102);
  cr_assert_eq(ok("1.0"), 1);
  bad("1.3");
  bad("1.5b");
  bad("0x1.5k");
}

Test(qemu_size, what_qemu_img_refuses) {
  bad("");
  bad("-1");
  bad("1MiB");
  bad("1KB");
  bad("1e3");
  bad("1G5");
  bad("8E"); /* 2^63 */
  bad("99999999999999999999");
  bad("G");
  bad(".5G");
}
