/* SPDX-License-Identifier: BSD-3-Clause */
/* The program's version, in one place: `blockport --version` prints it and
 * serve --metrics reports it (blockport_build_info). */
#ifndef BLOCKPORT_VERSION_H
#define BLOCKPORT_VERSION_H

#define BLOCKPORT_VERSION "0.1.0"

#endif
