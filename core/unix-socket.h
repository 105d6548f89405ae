/* SPDX-License-Identifier: BSD-3-Clause */
/* Unix socket paths: the address of one, and making room for a listener
 * where a previous run left its socket (serve --unix, --control). */
#ifndef BLOCKPORT_UNIX_SOCKET_H
#define BLOCKPORT_UNIX_SOCKET_H

#include <stdbool.h>
#include <sys/un.h>

/* *SA for PATH; false (errno ENAMETOOLONG) when PATH does not fit. */
bool unix_socket_addr(const char *path, struct sockaddr_un *sa);

/* Remove a socket at PATH (address SA) that nobody listens on any more.
 * Returns 0 when PATH is free now, -ENOTSOCK when something else is
 * there, -EADDRINUSE when a process still listens on it; nothing is
 * removed then, and the caller says so in its own words. */
int unix_socket_remove_stale(const char *path, const struct sockaddr_un *sa);

#endif
