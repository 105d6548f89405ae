/* SPDX-License-Identifier: BSD-3-Clause */
/* --allow CIDR lists: see access.h. */
#include "access.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int acl_parse(const char *text, struct acl_rule *out) {
  char host[INET6_ADDRSTRLEN + 1];
  const char *slash = strchr(text, '/');
  size_t hlen = slash ? (size_t)(slash - text) : strlen(text);
  if (hlen == 0 || hlen >= sizeof host) {
    bd_set_error("'%s' is not an address", text);
    return -EINVAL;
  }
  memcpy(host, text, hlen);
  host[hlen] = 0;
  memset(out, 0, sizeof *out);
  if (inet_pton(AF_INET, host, out->addr) == 1) {
    out->family = AF_INET;
    out->prefix = 32;
  } else if (inet_pton(AF_INET6, host, out->addr) == 1) {
    out->family = AF_INET6;
    out->prefix = 128;
  } else {
    bd_set_error("'%s' is not an IPv4 or IPv6 address", host);
    return -EINVAL;
  }
  if (slash) {
    char *end;
    unsigned long p = strtoul(slash + 1, &end, 10);
    if (!slash[1] || *end || p > out->prefix) {
      bd_set_error("'%s': bad prefix length", text);
      return -EINVAL;
    }
    out->prefix = (unsigned)p;
  }
  return 0;
}

/* Whether the first PREFIX bits of A and B agree. */
static bool prefix_equal(const uint8_t *a, const uint8_t *b, unsigned prefix) {
  unsigned whole = prefix / 8, rest = prefix % 8;
  if (memcmp(a, b, whole) != 0)
    return false;
  if (!rest)
    return true;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

bool acl_allows(const struct acl_rule *rules, size_t n,
                const struct sockaddr *sa) {
  if (n == 0)
    return true;
  uint8_t v4[4], v6[16];
  bool has4 = false, has6 = false;
  if (sa->sa_family == AF_INET) {
    memcpy(v4, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    has4 = true;
  } else if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    memcpy(v6, a, 16);
    has6 = true;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
      memcpy(v4, v6 + 12, 4);
      has4 = true;
    }
  }
  for (size_t i = 0; i < n; i++) {
    const struct acl_rule *r = &rules[i];
    if (r->family == AF_INET && has4 && prefix_equal(r->addr, v4, r->prefix))
      return true;
    if (r->family == AF_INET6 && has6 && prefix_equal(r->addr, v6, r->prefix))
      return true;
  }
  return false;
}
