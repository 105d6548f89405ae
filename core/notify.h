/* SPDX-License-Identifier: BSD-3-Clause */
/* Service manager integration without libsystemd: readiness
 * notification (NOTIFY_SOCKET; socket activation is listen.h).  The
 * protocol is an environment variable and a datagram, so it is written
 * here rather than linked.  Failures return -errno with the reason in
 * bd_errmsg(). */
#ifndef BLOCKPORT_NOTIFY_H
#define BLOCKPORT_NOTIFY_H

#include <sys/socket.h>
#include <sys/un.h>

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
