/* SPDX-License-Identifier: BSD-3-Clause */
/* Access control for TCP clients: --allow CIDR lists.  Pure: parsing and
 * matching, no sockets. */
#ifndef BLOCKPORT_ACCESS_H
#define BLOCKPORT_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct acl_rule {
  int family;       /* AF_INET or AF_INET6 */
  uint8_t addr[16]; /* network byte order; 4 bytes used for AF_INET */
  unsigned prefix;  /* 0-32 or 0-128 */
};

/* Parse "ADDR" or "ADDR/PREFIX" (IPv4 or IPv6).  Returns 0, or -EINVAL
 * with the reason in bd_errmsg(). */
int acl_parse(const char *text, struct acl_rule *out);
/* Whether the client at SA may connect: always with no rules; IPv4 clients
 * seen as IPv4-mapped IPv6 addresses match IPv4 rules. */
bool acl_allows(const struct acl_rule *rules, size_t n,
                const struct sockaddr *sa);

#endif
