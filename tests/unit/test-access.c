/* SPDX-License-Identifier: BSD-3-Clause */
/* --allow CIDR parsing and matching. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "core/blockdev.h"
#include "server/access.h"

static struct sockaddr_storage v4(const char *a) {
  struct sockaddr_storage ss = {0};
  struct sockaddr_in *s = (struct sockaddr_in *)&ss;
  s->sin_family = AF_INET;
  cr_assert_eq(inet_pton(AF_INET, a, &s->sin_addr), 1);
  return ss;
}

static struct sockaddr_storage v6(const char *a) {
  struct sockaddr_storage ss = {0};
  struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
  s->sin6_family = AF_INET6;
  cr_assert_eq(inet_pton(AF_INET6, a, &s->sin6_addr), 1);
  return ss;
}

static bool allows(const char *rule, struct sockaddr_storage ss) {
  struct acl_rule r;
  cr_assert_eq(acl_parse(rule, &r), 0, "%s: %s", rule, bd_errmsg());
  return acl_allows(&r, 1, (struct sockaddr *)&ss);
}

Test(acl, ipv4_prefixes) {
  cr_assert(allows("10.0.0.0/8", v4("10.200.3.4")));
  cr_assert_not(allows("10.0.0.0/8", v4("11.0.0.1")));
  cr_assert(allows("192.168.1.7", v4("192.168.1.7")));
  cr_assert_not(allows("192.168.1.7", v4("192.168.1.8")));
  cr_assert(allows("172.16.0.0/12", v4("172.31.255.255")));
  cr_assert_not(allows("172.16.0.0/12", v4("172.32.0.0")));
  cr_assert(allows("0.0.0.0/0", v4("8.8.8.8")));
}

Test(acl, ipv6_and_mapped) {
  cr_assert(allows("2001:db8::/32", v6("2001:db8:1::5")));
  cr_assert_not(allows("2001:db8::/32", v6("2001:db9::1")));
  cr_assert(allows("::1", v6("::1")));
  /* A dual-stack socket sees IPv4 clients as ::ffff:a.b.c.d. */
  cr_assert(allows("127.0.0.0/8", v6("::ffff:127.0.0.1")));
  cr_assert_not(allows("10.0.0.0/8", v6("::ffff:127.0.0.1")));
  cr_assert_not(allows("2001:db8::/32", v4("10.0.0.1")));
}

Test(acl, no_rules_allow_everyone) {
  struct sockaddr_storage ss = v4("1.2.3.4");
  cr_assert(acl_allows(NULL, 0, (struct sockaddr *)&ss));
}

Test(acl, bad_input) {
  struct acl_rule r;
  const char *bad[] = {
      "",          "/8",          "10.0.0.0/",    "10.0.0.0/33",
      "::/129",    "10.0.0.0/8x", "host.example", "10.0.0.256",
      "1.2.3.4/-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    bd_set_error("%s", "");
    cr_assert_eq(acl_parse(bad[i], &r), -EINVAL, "%s", bad[i]);
    cr_assert_str_neq(bd_errmsg(), "unknown error");
  }
}
