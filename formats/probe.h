/* SPDX-License-Identifier: BSD-3-Clause */
/* Format probing by content, as qemu-img probes: every format QEMU knows
 * is recognised by its magic, so that an image blockport cannot read is
 * refused by name instead of being served as raw, and a raw image guessed
 * by probing can refuse writes that would make the next probe find another
 * format (see raw.c). */
#ifndef BLOCKPORT_PROBE_H
#define BLOCKPORT_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How much of the start of a file the probe looks at (QEMU's too). */
#define PROBE_HEAD 512

/* The format whose magic the first LEN bytes of a file (HEAD, LEN at most
 * PROBE_HEAD; a shorter file gives fewer) carry: "qcow2", "qcow", "qed",
 * "vmdk", "vdi", "vhdx", "vpc", "luks", "parallels", "bochs", "cloop" or
 * "dmg"; "raw" when none.  NAME is the file's name (dmg is recognised by
 * it, as QEMU does) or NULL.  Pure. */
const char *probe_format(const uint8_t *head, size_t len, const char *name);

/* Whether blockport reads and writes FMT itself. */
bool probe_supported(const char *fmt);

/* Probe the file at PATH.  Returns 0 with *FMT set, or -errno with a
 * message in bd_errmsg(): a path that is neither a regular file nor a
 * block device is -EINVAL ("PATH: not a regular file or block device"). */
int probe_file(const char *path, const char **fmt);

/* The message for an image in a format blockport does not support. */
void probe_set_unsupported_error(const char *path, const char *fmt);

#endif
