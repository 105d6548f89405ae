/* SPDX-License-Identifier: BSD-3-Clause */
/* Socket activation without libsystemd: the listening sockets a service
 * manager passes (LISTEN_PID, LISTEN_FDS), taken as nbdkit and qemu-nbd
 * take them.  The protocol is a few environment variables, so it is
 * written here rather than linked.  Failures return -errno with the
 * reason in bd_errmsg(). */
#ifndef BLOCKPORT_LISTEN_H
#define BLOCKPORT_LISTEN_H

#include <stddef.h>
#include <sys/types.h>

/* The first fd the service manager passes. */
#define LISTEN_FDS_START 3

/* Parse LISTEN_PID and LISTEN_FDS (either may be NULL) for process SELF.
 * Returns the number of fds passed to SELF (0: none, or meant for another
 * process), or -EINVAL when they are malformed or more than MAX.  Pure. */
int listen_env_parse(const char *listen_pid, const char *listen_fds, pid_t self,
                     int max);

/* 0 if FD is a listening stream socket (Unix, IPv4 or IPv6), else -errno. */
int listen_fd_check(int fd);

/* Take the sockets the service manager passed: fds 3..3+n-1 after checking
 * each, made non-blocking and close-on-exec, stored in FDS.  Unsets
 * LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES either way, so children never
 * see them.  Returns n (0: not socket-activated) or -errno; the message
 * starts "socket activation: ". */
int listen_fds_take(int *fds, int max);

/* "tcp [::]:10809" or "unix /run/x.sock" for listening socket FD. */
void listen_fd_describe(int fd, char *out, size_t len);

#endif
