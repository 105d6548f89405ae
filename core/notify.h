/* SPDX-License-Identifier: BSD-3-Clause */
/* Service manager integration without libsystemd: socket activation
 * (LISTEN_PID, LISTEN_FDS) as nbdkit and qemu-nbd take it, and readiness
 * notification (NOTIFY_SOCKET).  Both protocols are a few environment
 * variables and a datagram, so they are written here rather than linked.
 * Failures return -errno with the reason in bd_errmsg(). */
#ifndef BLOCKPORT_NOTIFY_H
#define BLOCKPORT_NOTIFY_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

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

/* The address of NOTIFY_SOCKET SPEC: an absolute path, or '@' for
 * Linux's abstract namespace.  *LEN gets the address length.  -EINVAL for
 * anything else (relative paths, vsock:, too long).  Pure. */
int notify_parse_addr(const char *spec, struct sockaddr_un *sa, socklen_t *len);

/* Take NOTIFY_SOCKET from the environment (and unset it, so children do
 * not notify in our name).  Without it, notify_send() does nothing; with a
 * bad one, -errno and notify_send() does nothing either. */
int notify_init(void);

/* Send MSG ("READY=1\nSTATUS=...") to the service manager, if any.
 * Failures are logged as warnings, never fatal: nobody could act on them. */
void notify_send(const char *msg);

#endif
