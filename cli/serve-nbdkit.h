/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit's habits on blockport serve, for people who type nbdkit's
 * options: -U SOCKET (here -U is qemu-img's --force-share), the private
 * socket of "-U -" and "--unix -", --exit-with-parent and --dump-config. */
#ifndef BLOCKPORT_CLI_SERVE_NBDKIT_H
#define BLOCKPORT_CLI_SERVE_NBDKIT_H

#include <stdbool.h>
#include <stdio.h>

/* Before getopt sees ARGV: "-U -" becomes "--unix -" (nbdkit's private
 * socket), and "-U PATH" where PATH is plainly a socket (an existing one,
 * or a name ending in .sock) is refused with a pointer to --unix.  0, or
 * -1 (said). */
int serve_nbdkit_argv(int argc, char **argv);
/* The hint for -U given without --readonly: where it may have been meant
 * as nbdkit's -U SOCKET. */
extern const char serve_nbdkit_force_share_hint[];
/* --exit-with-parent: SIGTERM (a clean stop) when the parent exits.  0,
 * or -1 (said). */
int serve_nbdkit_exit_with_parent(void);
/* --dump-config: KEY=VALUE lines, nbdkit's keys where they apply and the
 * optional parts of this build. */
void serve_nbdkit_dump_config(FILE *f);

#endif
