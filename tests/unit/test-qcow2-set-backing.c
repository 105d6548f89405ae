/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for the header cluster rebuilt with another backing file
 * (formats/qcow2/set-backing.c): the name and format land where the
 * parser finds them, the other extensions are kept, the backing format
 * extension goes or comes, and a name too long or too large for the
 * cluster is refused as QEMU refuses it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/byteorder.h"
#include "formats/qcow2/qcow2.h"
#include "formats/qcow2/set-backing.h"

#define FILE_SIZE (1ull << 30)
#define EXT_OTHER 0x12345678u

/* A version 3 header of CS-byte clusters, 104 bytes, with the
 * backing format extension FMT (NULL: none), another extension when
 * OTHER, and the backing file NAME (NULL: none). */
static void build(uint8_t *b, size_t cs, const char *fmt, bool other,
                  const char *name) {
  unsigned bits = 0;
  while ((1u << bits) < cs)
    bits++;
  memset(b, 0, cs);
  put_be32(b, QCOW2_MAGIC);
  put_be32(b + 4, 3);
  put_be32(b + 20, bits);
  put_be64(b + 24, 1u << 20);
  put_be32(b + 36, 64);
  put_be64(b + 40, 3 * cs);
  put_be64(b + 48, cs);
  put_be32(b + 56, 1);
  put_be32(b + 96, 4);
  put_be32(b + 100, 104);
  size_t pos = 104;
  if (fmt) {
    put_be32(b + pos, QCOW2_EXT_BACKING_FORMAT);
    put_be32(b + pos + 4, (uint32_t)strlen(fmt));
    memcpy(b + pos + 8, fmt, strlen(fmt));
    pos += 8 + ((strlen(fmt) + 7) & ~7ul);
  }
  if (other) {
    put_be32(b + pos, EXT_OTHER);
    put_be32(b + pos + 4, 3);
    memcpy(b + pos + 8, "abc", 3);
    pos += 16;
  }
  pos += 8;
  if (name) {
    memcpy(b + pos, name, strlen(name));
    put_be64(b + 8, pos);
    put_be32(b + 16, (uint32_t)strlen(name));
  }
}

/* Rebuild B with NAME and FMT into OUT and parse it into H. */
static int rebuild(const uint8_t *b, size_t cs, const char *name,
                   const char *fmt, uint8_t *out, struct qcow2_header *h) {
  struct qcow2_header old;
  cr_assert_eq(qcow2_parse_header(b, cs, FILE_SIZE, &old), 0);
  uint32_t bpos;
  int r = qcow2_header_set_backing(b, cs, &old, name, fmt, out, &bpos);
  if (r == 0)
    cr_assert_eq(qcow2_parse_header(out, cs, FILE_SIZE, h), 0);
  return r;
}

static bool has_other(const uint8_t *b, size_t cs) {
  for (size_t p = 104; p + 16 <= cs; p += 8)
    if (get_be32(b + p) == EXT_OTHER)
      return !memcmp(b + p + 8, "abc", 3);
  return false;
}

Test(set_backing, names_a_new_backing_file_keeping_other_extensions) {
  size_t cs = 65536;
  uint8_t *b = malloc(cs), *out = malloc(cs);
  struct qcow2_header h;
  build(b, cs, "raw", true, "old.raw");
  cr_assert_eq(rebuild(b, cs, "new.qcow2", "qcow2", out, &h), 0);
  cr_assert_eq(h.backing_size, 9);
  cr_assert(!memcmp(out + h.backing_offset, "new.qcow2", 9));
  cr_assert_str_eq(h.backing_format, "qcow2");
  cr_assert(has_other(out, cs));
  cr_assert_eq(get_be64(out + 40), 3 * cs, "the rest of the header kept");
  free(b);
  free(out);
}

Test(set_backing, removes_the_backing_file_and_its_format) {
  size_t cs = 65536;
  uint8_t *b = malloc(cs), *out = malloc(cs);
  struct qcow2_header h;
  build(b, cs, "qcow2", true, "base.qcow2");
  cr_assert_eq(rebuild(b, cs, NULL, NULL, out, &h), 0);
  cr_assert_eq(h.backing_offset, 0);
  cr_assert_eq(h.backing_size, 0);
  cr_assert_str_eq(h.backing_format, "");
  cr_assert(has_other(out, cs));
  free(b);
  free(out);
}

Test(set_backing, a_name_without_format_drops_the_extension) {
  size_t cs = 4096;
  uint8_t *b = malloc(cs), *out = malloc(cs);
  struct qcow2_header h;
  build(b, cs, "qcow2", false, "base.qcow2");
  cr_assert_eq(rebuild(b, cs, "x", NULL, out, &h), 0);
  cr_assert_str_eq(h.backing_format, "");
  cr_assert_eq(h.backing_offset, 112, "after the end marker");
  free(b);
  free(out);
}

Test(set_backing, refuses_names_that_do_not_fit) {
  size_t cs = 512;
  uint8_t *b = malloc(cs), *out = malloc(cs);
  struct qcow2_header h;
  char name[1100];
  build(b, cs, NULL, false, NULL);
  /* 104 + 16 (format) + 8 (end) = 128: 384 bytes left, as qemu-img. */
  memset(name, 'b', 384);
  name[384] = 0;
  cr_assert_eq(rebuild(b, cs, name, "qcow2", out, &h), 0);
  cr_assert_eq(h.backing_size, 384);
  name[384] = 'b';
  name[385] = 0;
  cr_assert_eq(rebuild(b, cs, name, "qcow2", out, &h), -ENOSPC);
  memset(name, 'b', 1024);
  name[1024] = 0;
  cr_assert_eq(rebuild(b, cs, name, "qcow2", out, &h), -EINVAL);
  free(b);
  free(out);
}
