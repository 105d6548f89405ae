/* SPDX-License-Identifier: BSD-3-Clause */
/* serve --run CMD: start the server, run CMD against it with nbdkit's
 * variables ($uri, $nbd, $unixsocket, $port, $exportname, $tls), stop the
 * server when CMD exits and exit with CMD's status (128 + N when signal N
 * killed it).  Without --unix or --port the server listens on a Unix
 * socket in a private directory.
 *
 * serve --fork: go into the background once clients can connect (the pid
 * file written then), as qemu-nbd --fork does. */
#ifndef BLOCKPORT_CLI_SERVE_RUN_H
#define BLOCKPORT_CLI_SERVE_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "server/server.h"

struct serve_run {
  const char *cmd;      /* --run, or NULL */
  bool fork;            /* --fork */
  const char *pid_file; /* written when ready, or NULL */
  char dir[4096];       /* the private socket's directory, "" for none */
  char sock[4200];
  pid_t child;
  pthread_t waiter;
  bool waiting;       /* the waiter thread runs */
  atomic_bool reaped; /* the command has exited */
  int status;         /* its wait status, -1 when lost */
  int notify_fd;      /* --fork: the pipe to the waiting parent */
};

/* Before server_run(): the private socket (setting O->unix_path), and the
 * fork of --fork (the parent exits in here).  0, or -1 (said). */
int serve_run_prepare(struct serve_run *r, struct serve_opts *o);
/* The server's ready callback: pid file, command, detaching.  0 or -1. */
int serve_run_ready(struct serve_run *r, const struct serve_opts *o);
/* After server_run() returned SERVER_STATUS: the exit status. */
int serve_run_finish(struct serve_run *r, int server_status);

#endif
