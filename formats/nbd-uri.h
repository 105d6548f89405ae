/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD URIs: the file paths in their query made absolute. */
#pragma once

/* A malloc'd copy of URI in which each relative file path in the query
 * (socket=, tls-certificates=, tls-psk-file=) is made absolute against the
 * current directory, so that reconnecting after a chdir (a daemon's) finds
 * the same files.  NULL when out of memory or the directory is unknown. */
char *nbd_uri_absolute(const char *uri);
