/* SPDX-License-Identifier: BSD-3-Clause */
/* systemd integration without libsystemd: socket activation (LISTEN_PID,
 * LISTEN_FDS) as nbdkit and qemu-nbd take it, and readiness notification
 * (NOTIFY_SOCKET).  Both protocols are a few environment variables and a
 * datagram, so they are written here rather than linked. */
#ifndef BLOCKPORT_SD_DAEMON_H
#define BLOCKPORT_SD_DAEMON_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* The first fd systemd passes. */
#define SD_LISTEN_FDS_START 3

/* Parse LISTEN_PID and LISTEN_FDS (either may be NULL) for process SELF.
 * Returns the number of fds passed to SELF (0: none, or meant for another
 * process), or -1 with a message in ERR when they are malformed or more
 * than MAX.  Pure. */
int sd_parse_listen_env(const char *listen_pid, const char *listen_fds,
                        pid_t self, int max, char *err, size_t errlen);

/* Whether FD is a listening stream socket (Unix, IPv4 or IPv6); if not,
 * -1 with the reason in ERR. */
int sd_check_listener(int fd, char *err, size_t errlen);

/* Take the sockets systemd passed: fds 3..3+n-1 after checking each, made
 * non-blocking and close-on-exec, stored in FDS.  Unsets LISTEN_PID,
 * LISTEN_FDS and LISTEN_FDNAMES either way, so children never see them.
 * Returns n (0: not socket-activated) or -1 after logging why. */
int sd_listen_fds(int *fds, int max);

/* "tcp [::]:10809" or "unix /run/x.sock" for listening socket FD. */
void sd_describe_listener(int fd, char *out, size_t len);

/* The address of NOTIFY_SOCKET SPEC: an absolute path, or '@' for
 * Linux's abstract namespace.  *LEN gets the address length.  -1 with the
 * reason in ERR for anything else (relative paths, vsock:, too long).
 * Pure. */
int sd_notify_addr(const char *spec, struct sockaddr_un *sa, socklen_t *len,
                   char *err, size_t errlen);

/* Take NOTIFY_SOCKET from the environment (and unset it, so children do
 * not notify in our name).  Without it, sd_notify() does nothing; a bad
 * one is logged once and ignored. */
void sd_notify_init(void);

/* Send MSG ("READY=1\nSTATUS=...") to the service manager, if any.
 * Failures are logged, never fatal. */
void sd_notify(const char *msg);

#endif
