/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the rebuilt first cluster of a qcow2 image
 * (formats/qcow2/header-build.c, used by amend): a header made by create,
 * changed (downgraded, upgraded, data file renamed) and parsed back, with
 * the backing file name, backing format and unknown extensions kept. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/byteorder.h"
#include "formats/qcow2/create.h"
#include "formats/qcow2/header-build.h"
#include "formats/qcow2/qcow2.h"

#define CS 65536u

/* A first cluster made by create, parsed into *H. */
static uint8_t *made(struct qcow2_create_opts *o, struct qcow2_header *h) {
  struct qcow2_layout l;
  cr_assert_eq(qcow2_create_layout(o, &l), 0);
  uint8_t *b = calloc(1, CS);
  qcow2_create_header(o, &l, b);
  cr_assert_eq(qcow2_parse_header(b, CS, 1ull << 30, h), 0);
  return b;
}

static void rebuilt(const struct qcow2_header *nh, const struct qcow2_header *h,
                    const uint8_t *old, struct qcow2_header *out,
                    uint8_t *buf) {
  cr_assert_eq(qcow2_build_header(nh, h, old, CS, buf, CS), 0);
  cr_assert_eq(qcow2_parse_header(buf, CS, 1ull << 30, out), 0);
}

static char *backing_name(const uint8_t *b, const struct qcow2_header *h) {
  return strndup((const char *)b + h->backing_offset, h->backing_size);
}

Test(header_build, downgrade_and_upgrade_keep_the_backing_file) {
  struct qcow2_create_opts o = {.size = 1 << 20,
                                .version = 3,
                                .cluster_bits = 16,
                                .refcount_order = 4,
                                .lazy_refcounts = true,
                                .backing_file = "base.qcow2",
                                .backing_fmt = "qcow2"};
  struct qcow2_header h, h2, h3;
  uint8_t *old = made(&o, &h), *b2 = malloc(CS), *b3 = malloc(CS);
  struct qcow2_header nh = h;
  nh.version = 2;
  nh.compatible = 0;
  rebuilt(&nh, &h, old, &h2, b2);
  cr_assert_eq(h2.version, 2);
  cr_assert_eq(h2.header_length, 72);
  cr_assert_eq(h2.refcount_order, 4);
  cr_assert_str_eq(h2.backing_format, "qcow2");
  char *name = backing_name(b2, &h2);
  cr_assert_str_eq(name, "base.qcow2");
  free(name);
  cr_assert_eq(h2.l1_offset, h.l1_offset);
  cr_assert_eq(h2.reftable_offset, h.reftable_offset);
  nh = h2;
  nh.version = 3;
  nh.compatible = QCOW2_COMPAT_LAZY_REFCOUNTS;
  rebuilt(&nh, &h2, b2, &h3, b3);
  cr_assert_eq(h3.version, 3);
  cr_assert_eq(h3.header_length, 112);
  cr_assert_eq(h3.compatible, QCOW2_COMPAT_LAZY_REFCOUNTS);
  name = backing_name(b3, &h3);
  cr_assert_str_eq(name, "base.qcow2");
  free(name);
  free(old);
  free(b2);
  free(b3);
}

Test(header_build, data_file_renamed_unknown_extension_kept) {
  struct qcow2_create_opts o = {.size = 1 << 20,
                                .version = 3,
                                .cluster_bits = 16,
                                .refcount_order = 4,
                                .data_file = "a.raw"};
  struct qcow2_header h, h2;
  uint8_t *old = made(&o, &h), *b2 = malloc(CS);
  /* An extension of a type nobody knows, after the others. */
  size_t off = h.header_length;
  while (get_be32(old + off) != QCOW2_EXT_END)
    off += 8 + ((get_be32(old + off + 4) + 7) & ~7u);
  put_be32(old + off, 0x12345678);
  put_be32(old + off + 4, 3);
  memcpy(old + off + 8, "abc", 3);
  struct qcow2_header nh = h;
  strcpy(nh.data_file, "a-much-longer-name.raw");
  rebuilt(&nh, &h, old, &h2, b2);
  cr_assert_str_eq(h2.data_file, "a-much-longer-name.raw");
  bool found = false;
  for (off = h2.header_length; get_be32(b2 + off) != QCOW2_EXT_END;
       off += 8 + ((get_be32(b2 + off + 4) + 7) & ~7u))
    found |=
        get_be32(b2 + off) == 0x12345678 && !memcmp(b2 + off + 8, "abc", 3);
  cr_assert(found, "the unknown extension is kept");
  free(old);
  free(b2);
}

Test(header_build, too_long_for_the_cluster) {
  struct qcow2_create_opts o = {
      .size = 1 << 20, .version = 3, .cluster_bits = 16, .refcount_order = 4};
  struct qcow2_header h;
  uint8_t *old = made(&o, &h), *b2 = malloc(512);
  struct qcow2_header nh = h;
  memset(nh.data_file, 'x', 600);
  nh.data_file[600] = 0;
  nh.incompatible |= QCOW2_INCOMPAT_DATA_FILE;
  cr_assert_eq(qcow2_build_header(&nh, &h, old, 512, b2, 512), -EFBIG);
  free(old);
  free(b2);
}
