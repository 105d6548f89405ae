/* SPDX-License-Identifier: BSD-3-Clause */
/* RBD specs as QEMU writes them (formats/rbd-spec.c): pool, namespace,
 * image, snapshot, conf, id and the other KEY=VALUE options, escapes, and
 * the malformed ones refused with a message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "core/error.h"
#include "formats/rbd-spec.h"

static void expect_str(const char *got, const char *want) {
  if (!want)
    cr_expect_null(got, "expected NULL, got '%s'", got ? got : "");
  else {
    cr_assert_not_null(got, "expected '%s'", want);
    cr_expect_str_eq(got, want);
  }
}

Test(rbd_spec, pool_and_image) {
  struct rbd_spec s;
  cr_assert_eq(rbd_spec_parse("rbd:rbd/disk0", &s), 0);
  expect_str(s.pool, "rbd");
  expect_str(s.image, "disk0");
  expect_str(s.ns, NULL);
  expect_str(s.snap, NULL);
  expect_str(s.conf, NULL);
  expect_str(s.id, NULL);
  cr_expect_eq(s.nopts, 0);
  rbd_spec_free(&s);
}

Test(rbd_spec, namespace_snapshot_and_options) {
  struct rbd_spec s;
  cr_assert_eq(rbd_spec_parse("rbd:vms/tenant1/img@base:conf=/etc/c.conf:"
                              "id=gw:keyring=/k:mon_host=127.0.0.1:6789",
                              &s),
               -EINVAL, "a ':' in a value must be escaped");
  cr_assert_eq(rbd_spec_parse("rbd:vms/tenant1/img@base:conf=/etc/c.conf:"
                              "id=gw:keyring=/k:mon_host=127.0.0.1\\:6789",
                              &s),
               0, "%s", bd_errmsg());
  expect_str(s.pool, "vms");
  expect_str(s.ns, "tenant1");
  expect_str(s.image, "img");
  expect_str(s.snap, "base");
  expect_str(s.conf, "/etc/c.conf");
  expect_str(s.id, "gw");
  cr_assert_eq(s.nopts, 2);
  expect_str(s.opts[0].key, "keyring");
  expect_str(s.opts[0].value, "/k");
  expect_str(s.opts[1].key, "mon_host");
  expect_str(s.opts[1].value, "127.0.0.1:6789");
  char name[128];
  cr_expect_str_eq(rbd_spec_name(&s, name, sizeof name),
                   "vms/tenant1/img@base");
  rbd_spec_free(&s);
}

Test(rbd_spec, escapes) {
  struct rbd_spec s;
  cr_assert_eq(rbd_spec_parse("rbd:p/a\\:b\\@c@s\\:1", &s), 0);
  expect_str(s.image, "a:b@c");
  expect_str(s.snap, "s:1");
  rbd_spec_free(&s);
}

static void refused(const char *spec, const char *why) {
  struct rbd_spec s;
  bd_clear_error();
  cr_expect_eq(rbd_spec_parse(spec, &s), -EINVAL, "%s accepted", spec);
  cr_expect(strstr(bd_errmsg(), why), "%s: message '%s' lacks '%s'", spec,
            bd_errmsg(), why);
  cr_expect_null(s.buf);
}

Test(rbd_spec, malformed_refused) {
  refused("nbd://x", "no rbd: prefix");
  refused("rbd:", "no '/'");
  refused("rbd:pool", "no '/'");
  refused("rbd:/img", "empty pool");
  refused("rbd:pool/", "empty pool, image");
  refused("rbd:pool/img@", "snapshot");
  refused("rbd:pool/ns/", "empty");
  refused("rbd:pool/a/b/c", "too many '/'");
  refused("rbd:pool/img:conf", "KEY=VALUE");
  refused("rbd:pool/img:=x", "KEY=VALUE");
  refused("rbd:pool/img:", "KEY=VALUE");
}

Test(rbd_spec, option_count_bounded) {
  char spec[4096] = "rbd:p/i";
  for (int i = 0; i <= RBD_SPEC_MAX_OPTS; i++)
    strcat(spec, ":k=v");
  refused(spec, "too many options");
}

Test(rbd_spec, matches) {
  cr_expect(rbd_spec_matches("rbd:p/i"));
  cr_expect_not(rbd_spec_matches("rbd"));
  cr_expect_not(rbd_spec_matches("./rbd:p/i"));
}

Test(rbd_spec, glance_uri) {
  struct rbd_spec s;
  cr_assert_eq(rbd_spec_parse("rbd://0a1b-2c/images/ab%3Acd/snap", &s), 0, "%s",
               bd_errmsg());
  expect_str(s.fsid, "0a1b-2c");
  expect_str(s.pool, "images");
  expect_str(s.image, "ab:cd");
  expect_str(s.snap, "snap");
  expect_str(s.ns, NULL);
  rbd_spec_free(&s);
  cr_assert_eq(rbd_spec_parse("rbd:///rbd/img", &s), 0, "%s", bd_errmsg());
  expect_str(s.fsid, "");
  expect_str(s.snap, NULL);
  rbd_spec_free(&s);
}

Test(rbd_spec, glance_uri_malformed_refused) {
  refused("rbd://fsid/pool", "rbd://FSID/POOL/IMAGE");
  refused("rbd://fsid/pool/img/snap/x", "rbd://FSID/POOL/IMAGE");
  refused("rbd://fsid//img", "empty pool");
  refused("rbd://fsid/pool/img/", "snapshot");
  refused("rbd://fsid/pool/im%2", "%-escape");
  refused("rbd://fsid/pool/im%00g", "%-escape");
  refused("rbd://fsid/pool/a%2Fb", "a '/' in a name");
}
