/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD URIs made absolute (formats/nbd-uri.c): relative socket= and TLS
 * file paths gain the current directory, percent-encoded; everything else
 * is kept as written. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/nbd-uri.h"

static void init(void) {
  cr_assert_eq(chdir("/tmp"), 0);
}

TestSuite(nbd_uri, .init = init);

static void expect(const char *in, const char *want) {
  char *got = nbd_uri_absolute(in);
  cr_assert_not_null(got);
  cr_expect_str_eq(got, want, "%s", in);
  free(got);
}

Test(nbd_uri, relative_socket_gains_the_directory) {
  expect("nbd+unix:///?socket=up.sock", "nbd+unix:///?socket=/tmp/up.sock");
  expect("nbd+unix:///exp?socket=d/up.sock&tls=off",
         "nbd+unix:///exp?socket=/tmp/d/up.sock&tls=off");
}

Test(nbd_uri, absolute_paths_and_other_keys_unchanged) {
  expect("nbd+unix:///?socket=/run/x.sock", "nbd+unix:///?socket=/run/x.sock");
  expect("nbd+unix:///?socket=%2Frun%2Fx", "nbd+unix:///?socket=%2Frun%2Fx");
  expect("nbd://host/exp", "nbd://host/exp");
  expect("nbd://host/exp?tls=require", "nbd://host/exp?tls=require");
  expect("nbd://h/?mysocket=a", "nbd://h/?mysocket=a");
}

Test(nbd_uri, tls_files_and_fragments) {
  expect("nbds://h/?tls-certificates=pki&tls-psk-file=k.psk#socket=x",
         "nbds://h/?tls-certificates=/tmp/pki&tls-psk-file=/tmp/k.psk"
         "#socket=x");
}

Test(nbd_uri, directory_is_percent_encoded) {
  char dir[] = "/tmp/bp uri&?XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(chdir(dir), 0);
  char *got = nbd_uri_absolute("nbd+unix:///?socket=s");
  char want[128];
  snprintf(want, sizeof want, "nbd+unix:///?socket=/tmp/bp%%20uri%%26%%3F%s/s",
           dir + strlen("/tmp/bp uri&?"));
  cr_expect_str_eq(got, want);
  free(got);
  cr_assert_eq(chdir("/tmp"), 0);
  rmdir(dir);
}
