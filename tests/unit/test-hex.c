/* SPDX-License-Identifier: BSD-3-Clause */
/* core/hex.h: hexadecimal digits and bytes. */
#include <criterion/criterion.h>

#include "core/hex.h"

Test(hex, digits) {
  const char *lower = "0123456789abcdef", *upper = "0123456789ABCDEF";
  for (int i = 0; i < 16; i++) {
    cr_expect_eq(hex_digit(lower[i]), i, "'%c'", lower[i]);
    cr_expect_eq(hex_digit(upper[i]), i, "'%c'", upper[i]);
  }
}

Test(hex, non_digits) {
  const char *bad = "gGzZ/:@`[{ %\x7f";
  for (const char *p = bad; *p; p++)
    cr_expect_eq(hex_digit(*p), -1, "'%c'", *p);
  cr_expect_eq(hex_digit('\0'), -1);
  cr_expect_eq(hex_digit((char)0xe9), -1); /* a byte of UTF-8 */
}

Test(hex, bytes) {
  cr_expect_eq(hex_byte("00"), 0);
  cr_expect_eq(hex_byte("2F"), 0x2f);
  cr_expect_eq(hex_byte("2f"), 0x2f);
  cr_expect_eq(hex_byte("fF"), 0xff);
  cr_expect_eq(hex_byte("7e and more"), 0x7e);
}

Test(hex, bad_bytes) {
  cr_expect_eq(hex_byte("g0"), -1);
  cr_expect_eq(hex_byte("0g"), -1);
  cr_expect_eq(hex_byte("0"), -1); /* the string ends after one digit */
  cr_expect_eq(hex_byte(""), -1);  /* P[1] is past the end: not read */
}
