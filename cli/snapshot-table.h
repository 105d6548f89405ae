/* SPDX-License-Identifier: BSD-3-Clause */
/* The snapshot table as qemu-img prints it (info, snapshot -l), and its
 * sizes as QEMU's size_to_str writes them. */
#ifndef BLOCKPORT_CLI_SNAPSHOT_TABLE_H
#define BLOCKPORT_CLI_SNAPSHOT_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct qcow2_snapshot;

/* Three significant digits and a binary unit: "1.5 MiB". */
void cli_human_size(char *buf, size_t len, uint64_t v);
/* "Snapshot list:" and the header of the columns. */
void cli_snapshot_header(void);
/* One snapshot's row. */
void cli_snapshot_line(const struct qcow2_snapshot *s);

#endif
