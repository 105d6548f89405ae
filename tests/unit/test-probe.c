/* SPDX-License-Identifier: BSD-3-Clause */
/* The format probe's magic table (formats/probe.c): every format qemu-img
 * knows, truncated headers, near misses, and the raw fallback. */
#include <criterion/criterion.h>
#include <string.h>

#include "formats/probe.h"

static uint8_t buf[PROBE_HEAD];

static void put(size_t off, const void *p, size_t n) {
  memcpy(buf + off, p, n);
}

static const char *probe(size_t len) {
  return probe_format(buf, len, NULL);
}

static void init(void) {
  memset(buf, 0, sizeof buf);
}

TestSuite(probe, .init = init);

Test(probe, zeroes_and_empty_are_raw) {
  cr_assert_str_eq(probe(0), "raw");
  cr_assert_str_eq(probe(PROBE_HEAD), "raw");
  cr_assert_str_eq(probe_format(NULL, 0, NULL), "raw");
}

Test(probe, qcow_versions) {
  put(0, "QFI\xfb\0\0\0\3", 8);
  cr_assert_str_eq(probe(PROBE_HEAD), "qcow2");
  buf[7] = 2;
  cr_assert_str_eq(probe(8), "qcow2");
  buf[7] = 9; /* unknown version: the qcow2 driver refuses it by name */
  cr_assert_str_eq(probe(8), "qcow2");
  buf[7] = 1;
  cr_assert_str_eq(probe(8), "qcow");
  buf[7] = 0;
  cr_assert_str_eq(probe(8), "raw");
  buf[7] = 3;
  cr_assert_str_eq(probe(7), "raw", "the version is cut off");
  cr_assert_str_eq(probe(3), "raw");
  buf[3] = 0xfa;
  cr_assert_str_eq(probe(8), "raw", "near miss");
}

Test(probe, fixed_magics) {
  static const struct {
    const char *fmt;
    size_t off;
    const char *magic;
    size_t len;
  } cases[] = {
      {"qed", 0, "QED\0", 4},         {"vdi", 64, "\x7f\x10\xda\xbe", 4},
      {"vhdx", 0, "vhdxfile", 8},     {"vpc", 0, "conectix", 8},
      {"luks", 0, "LUKS\xba\xbe", 6}, /* any version: LUKS1 and LUKS2 */
      {"vmdk", 0, "KDMV", 4},         {"vmdk", 0, "COWD", 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    init();
    put(cases[i].off, cases[i].magic, cases[i].len);
    size_t end = cases[i].off + cases[i].len;
    cr_assert_str_eq(probe(PROBE_HEAD), cases[i].fmt);
    cr_assert_str_eq(probe(end), cases[i].fmt, "%s: exactly long enough",
                     cases[i].fmt);
    cr_assert_str_eq(probe(end - 1), "raw", "%s: truncated", cases[i].fmt);
    buf[end - 1] ^= 1;
    cr_assert_str_eq(probe(PROBE_HEAD), "raw", "%s: near miss", cases[i].fmt);
  }
}

Test(probe, vmdk_descriptor) {
  const char *d = "# Disk DescriptorFile\n\nversion=1\nCID=fffffffe\n";
  put(0, d, strlen(d));
  cr_assert_str_eq(probe(strlen(d)), "vmdk");
  init();
  d = "# comment\r\n  \r\nversion=3\r\n";
  put(0, d, strlen(d));
  cr_assert_str_eq(probe(strlen(d)), "vmdk");
  init();
  d = "# Disk DescriptorFile\nversion=4\n";
  put(0, d, strlen(d));
  cr_assert_str_eq(probe(strlen(d)), "raw", "unknown version");
  init();
  d = "# Disk DescriptorFile\nCID=1\nversion=1\n";
  put(0, d, strlen(d));
  cr_assert_str_eq(probe(strlen(d)), "raw", "version must come first");
  init();
  d = "# Disk DescriptorFile\nversion=1";
  put(0, d, strlen(d));
  cr_assert_str_eq(probe(strlen(d)), "raw", "line cut off");
}

Test(probe, parallels) {
  put(0, "WithoutFreeSpace", 16);
  put(16, "\2\0\0\0", 4);
  cr_assert_str_eq(probe(64), "parallels");
  cr_assert_str_eq(probe(63), "raw", "shorter than the header");
  put(0, "WithouFreSpacExt", 16);
  cr_assert_str_eq(probe(64), "parallels");
  buf[16] = 3;
  cr_assert_str_eq(probe(64), "raw", "wrong version");
}

Test(probe, bochs) {
  put(0, "Bochs Virtual HD Image", 23);
  put(32, "Redolog", 8);
  put(48, "Growing", 8);
  put(64, "\0\0\2\0", 4);
  cr_assert_str_eq(probe(PROBE_HEAD), "bochs");
  put(64, "\0\0\1\0", 4);
  cr_assert_str_eq(probe(68), "bochs");
  cr_assert_str_eq(probe(67), "raw", "version cut off");
  put(48, "Growinh", 8);
  cr_assert_str_eq(probe(PROBE_HEAD), "raw", "near miss");
}

Test(probe, cloop) {
  const char *m = "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount "
                  "-r -t iso9660 /dev/cloop $1\n";
  put(0, m, strlen(m));
  cr_assert_str_eq(probe(PROBE_HEAD), "cloop");
  cr_assert_str_eq(probe(strlen(m) - 1), "raw");
}

Test(probe, dmg_by_name) {
  cr_assert_str_eq(probe_format(buf, PROBE_HEAD, "/images/mac.dmg"), "dmg");
  cr_assert_str_eq(probe_format(buf, PROBE_HEAD, ".dmg"), "raw");
  cr_assert_str_eq(probe_format(buf, PROBE_HEAD, "a.dmg.raw"), "raw");
}

Test(probe, supported) {
  cr_assert(probe_supported("raw"));
  cr_assert(probe_supported("qcow2"));
  cr_assert_not(probe_supported("qcow"));
  cr_assert_not(probe_supported("vmdk"));
  cr_assert_not(probe_supported("luks"));
}

Test(probe, longer_buffers_are_cut_to_the_probe_size) {
  static uint8_t big[4096];
  memcpy(big + PROBE_HEAD, "QFI\xfb\0\0\0\3", 8);
  cr_assert_str_eq(probe_format(big, sizeof big, NULL), "raw");
}
