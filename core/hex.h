/* SPDX-License-Identifier: BSD-3-Clause */
/* Hexadecimal digits, for the parsers of percent escapes (URIs, RBD
 * specs) and JSON \u escapes. */
#ifndef BLOCKPORT_HEX_H
#define BLOCKPORT_HEX_H

/* The value of the digit C (either case), or -1. */
static inline int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* The byte two digits at P spell, or -1.  P[1] is read only when P[0] is
 * a digit, so P may point at the last character of a string. */
static inline int hex_byte(const char *p) {
  int hi = hex_digit(p[0]);
  int lo = hi < 0 ? -1 : hex_digit(p[1]);
  return lo < 0 ? -1 : hi * 16 + lo;
}

#endif
