/* systemd integration without libsystemd: socket activation (LISTEN_PID,
 * LISTEN_FDS) as nbdkit and qemu-nbd take it.  The protocol is a few
 * environment variables, so it is written here rather than linked. */
#ifndef BLOCKPORT_SD_DAEMON_H
#define BLOCKPORT_SD_DAEMON_H

#include <stddef.h>
#include <sys/types.h>

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

#endif
