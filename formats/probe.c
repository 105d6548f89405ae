/* SPDX-License-Identifier: BSD-3-Clause */
#include "probe.h"

#include <string.h>

/* Does HEAD hold the LEN bytes of MAGIC at offset OFF? */
static bool has(const uint8_t *head, size_t len, size_t off, const void *magic,
                size_t mlen) {
  return len >= off + mlen && memcmp(head + off, magic, mlen) == 0;
}

/* A C string of at most FIELD bytes (NUL included) at OFF equal to S. */
static bool has_cstr(const uint8_t *head, size_t len, size_t off, size_t field,
                     const char *s) {
  size_t n = strlen(s) + 1;
  return n <= field && has(head, len, off, s, n);
}

/* "QFI\xfb" and a big-endian version: 1 is qcow, 2 and above qcow2 (an
 * unknown version is then refused by the qcow2 driver, not served raw). */
static const char *probe_qcow(const uint8_t *h, size_t len) {
  if (!has(h, len, 0, "QFI\xfb", 4) || len < 8)
    return NULL;
  uint32_t v =
      (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 | (uint32_t)h[6] << 8 | h[7];
  return v == 1 ? "qcow" : v >= 2 ? "qcow2" : NULL;
}

/* VMDK: a sparse extent's magic, or a text descriptor whose first line
 * after comments and blank lines is "version=1", 2 or 3. */
static const char *probe_vmdk(const uint8_t *h, size_t len) {
  if (has(h, len, 0, "KDMV", 4) || has(h, len, 0, "COWD", 4))
    return "vmdk";
  size_t p = 0;
  while (p < len) {
    if (h[p] == '#') {
      while (p < len && h[p] != '\n')
        p++;
      p++;
      continue;
    }
    if (h[p] == ' ' || h[p] == '\r' || h[p] == '\n') {
      while (p < len && h[p] == ' ')
        p++;
      if (p < len && h[p] == '\r')
        p++;
      if (p >= len || h[p] != '\n')
        return NULL;
      p++;
      continue;
    }
    break;
  }
  static const char *const lines[] = {"version=1", "version=2", "version=3"};
  for (size_t i = 0; i < 3; i++) {
    if (has(h, len, p, lines[i], 9) &&
        (has(h, len, p + 9, "\n", 1) || has(h, len, p + 9, "\r\n", 2)))
      return "vmdk";
  }
  return NULL;
}

static const char *probe_bochs(const uint8_t *h, size_t len) {
  if (!has_cstr(h, len, 0, 32, "Bochs Virtual HD Image") ||
      !has_cstr(h, len, 32, 16, "Redolog") ||
      !has_cstr(h, len, 48, 16, "Growing"))
    return NULL;
  /* Little-endian version 0x00020000 or 0x00010000. */
  if (has(h, len, 64, "\0\0\2\0", 4) || has(h, len, 64, "\0\0\1\0", 4))
    return "bochs";
  return NULL;
}

static const char *probe_parallels(const uint8_t *h, size_t len) {
  if (len < 64)
    return NULL;
  if ((has(h, len, 0, "WithoutFreeSpace", 16) ||
       has(h, len, 0, "WithouFreSpacExt", 16)) &&
      has(h, len, 16, "\2\0\0\0", 4))
    return "parallels";
  return NULL;
}

/* Formats recognised by fixed bytes at a fixed offset. */
static const struct magic {
  const char *fmt;
  size_t off;
  const char *bytes;
  size_t len;
} magics[] = {
    {"qed", 0, "QED\0", 4},
    {"vdi", 64, "\x7f\x10\xda\xbe", 4},
    {"vhdx", 0, "vhdxfile", 8},
    {"vpc", 0, "conectix", 8},
    {"luks", 0, "LUKS\xba\xbe", 6},
    {"cloop", 0,
     "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 "
     "/dev/cloop $1\n",
     84},
};

const char *probe_format(const uint8_t *head, size_t len, const char *name) {
  if (len > PROBE_HEAD)
    len = PROBE_HEAD;
  const char *f = probe_qcow(head, len);
  if (!f)
    f = probe_vmdk(head, len);
  if (!f)
    f = probe_bochs(head, len);
  if (!f)
    f = probe_parallels(head, len);
  for (size_t i = 0; !f && i < sizeof magics / sizeof magics[0]; i++) {
    const struct magic *m = &magics[i];
    if (has(head, len, m->off, m->bytes, m->len))
      f = m->fmt;
  }
  if (f)
    return f;
  /* dmg has no magic at the start: QEMU goes by the name. */
  size_t n = name ? strlen(name) : 0;
  if (n > 4 && strcmp(name + n - 4, ".dmg") == 0)
    return "dmg";
  return "raw";
}

bool probe_supported(const char *fmt) {
  return strcmp(fmt, "raw") == 0 || strcmp(fmt, "qcow2") == 0;
}
