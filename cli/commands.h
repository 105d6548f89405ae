/* SPDX-License-Identifier: BSD-3-Clause */
/* The subcommands of the blockport program: each takes argc/argv starting
 * at its own name and returns the process exit status. */
#ifndef BLOCKPORT_COMMANDS_H
#define BLOCKPORT_COMMANDS_H

int serve_main(int argc, char **argv);
int create_main(int argc, char **argv);
int info_main(int argc, char **argv);
int check_main(int argc, char **argv);
int map_main(int argc, char **argv);
int convert_main(int argc, char **argv);
int compare_main(int argc, char **argv);
int resize_main(int argc, char **argv);
int bitmap_main(int argc, char **argv);
int snapshot_main(int argc, char **argv);
int measure_main(int argc, char **argv);
int dd_main(int argc, char **argv);
int amend_main(int argc, char **argv);
int commit_main(int argc, char **argv);
int rebase_main(int argc, char **argv);
int mount_main(int argc, char **argv);
int vhost_main(int argc, char **argv);
int ctl_main(int argc, char **argv);

#endif
