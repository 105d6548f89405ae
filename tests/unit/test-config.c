/* SPDX-License-Identifier: BSD-3-Clause */
/* The --config file parser (server/config.c, docs/CONFIG.md). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "server/config.h"

static struct config parse_len(const char *file, const char *text, size_t len) {
  struct config c;
  int r = config_parse(text, len, file, &c);
  cr_assert_eq(r, 0, "unexpected error: %s", bd_errmsg());
  cr_assert_gt(c.n, 0);
  return c;
}

static struct config parse(const char *file, const char *text) {
  return parse_len(file, text, strlen(text));
}

/* TEXT (LEN bytes) is rejected at LINE with a reason containing REASON. */
static void rejects_len(const char *text, size_t len, unsigned line,
                        const char *reason) {
  struct config c = {(struct export_conf *)1, 42}; /* overwritten */
  cr_assert_eq(config_parse(text, len, "x.conf", &c), -EINVAL, "accepted: %s",
               text);
  cr_assert_null(c.v);
  cr_assert_eq(c.n, 0);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "x.conf:%u: ", line);
  cr_assert_eq(strncmp(bd_errmsg(), prefix, strlen(prefix)), 0,
               "'%s' does not start with '%s'", bd_errmsg(), prefix);
  cr_assert_not_null(strstr(bd_errmsg(), reason), "'%s' does not say '%s'",
                     bd_errmsg(), reason);
}

static void rejects(const char *text, unsigned line, const char *reason) {
  rejects_len(text, strlen(text), line, reason);
}

Test(config, full_example) {
  struct config c = parse("/etc/blockport/exports.conf",
                          "# exports\n"
                          "\n"
                          "[export build-root]\n"
                          "path = /srv/images/build-root.qcow2\n"
                          "description = Build VM root disk\n"
                          "default = yes\n"
                          "format = qcow2\n"
                          "\n"
                          "  # an indented comment\n"
                          "[export scratch]\n"
                          "\tpath\t=\tscratch.raw  \n"
                          "format = raw\n"
                          "allow = 10.0.0.0/8, fd00::/8\n"
                          "allow = 192.168.1.7\n"
                          "read-only = no\n"
                          "require-tls = off\n"
                          "default = no\n"
                          "[export golden]\n"
                          "path = /srv/images/golden.qcow2\n"
                          "read-only = yes\n"
                          "require-tls = TRUE\n"
                          "[export ram]\n"
                          "path = memory:4G\n");
  cr_assert_eq(c.n, 4);
  struct export_conf *e = &c.v[0];
  cr_assert_str_eq(e->name, "build-root");
  cr_assert_str_eq(e->path, "/srv/images/build-root.qcow2");
  cr_assert_str_eq(e->description, "Build VM root disk");
  cr_assert_str_eq(e->format, "qcow2");
  cr_assert(e->is_default);
  cr_assert_not(e->readonly);
  cr_assert_not(e->tls_required);
  cr_assert_eq(e->nallow, 0);
  cr_assert_eq(e->line, 3);

  e = &c.v[1];
  cr_assert_str_eq(e->name, "scratch");
  cr_assert_str_eq(e->path, "/etc/blockport/scratch.raw");
  cr_assert_str_eq(e->format, "raw");
  cr_assert_null(e->description);
  cr_assert_not(e->is_default || e->readonly || e->tls_required);
  cr_assert_eq(e->line, 10);
  cr_assert_eq(e->nallow, 3);
  uint8_t a[16];
  cr_assert_eq(e->allow[0].family, AF_INET);
  cr_assert_eq(e->allow[0].prefix, 8);
  inet_pton(AF_INET, "10.0.0.0", a);
  cr_assert_arr_eq(e->allow[0].addr, a, 4);
  cr_assert_eq(e->allow[1].family, AF_INET6);
  cr_assert_eq(e->allow[1].prefix, 8);
  cr_assert_eq(e->allow[2].family, AF_INET);
  cr_assert_eq(e->allow[2].prefix, 32);
  inet_pton(AF_INET, "192.168.1.7", a);
  cr_assert_arr_eq(e->allow[2].addr, a, 4);

  e = &c.v[2];
  cr_assert_str_eq(e->name, "golden");
  cr_assert(e->readonly && e->tls_required && !e->is_default);
  cr_assert_null(e->format);

  e = &c.v[3];
  cr_assert_str_eq(e->name, "ram");
  cr_assert_str_eq(e->path, "memory:4G");
  config_free(&c);
  cr_assert_null(c.v);
  cr_assert_eq(c.n, 0);
}

Test(config, booleans) {
  const char *yes[] = {"yes", "true", "on", "1", "Yes", "ON"};
  const char *no[] = {"no", "false", "off", "0", "NO", "False"};
  char text[128];
  for (size_t i = 0; i < 6; i++) {
    snprintf(text, sizeof text, "[export a]\npath=a\nread-only=%s\n", yes[i]);
    struct config c = parse("x.conf", text);
    cr_assert(c.v[0].readonly, "%s", yes[i]);
    config_free(&c);
    snprintf(text, sizeof text, "[export a]\npath=a\nread-only=%s\n", no[i]);
    c = parse("x.conf", text);
    cr_assert_not(c.v[0].readonly, "%s", no[i]);
    config_free(&c);
  }
}

Test(config, hash_in_value_is_part_of_it) {
  struct config c = parse("x.conf", "[export a]\n"
                                    "path = /i/a#1.img\n"
                                    "description = disk #1 # of 2\n");
  cr_assert_str_eq(c.v[0].path, "/i/a#1.img");
  cr_assert_str_eq(c.v[0].description, "disk #1 # of 2");
  config_free(&c);
  /* So a trailing comment spoils a word value; the message says why. */
  rejects("[export a]\npath=a\ndefault = yes   # the default\n", 3,
          "comment must be on a line of its own");
}

Test(config, empty_description_is_none) {
  struct config c = parse("x.conf", "[export a]\npath=a\ndescription =\n");
  cr_assert_null(c.v[0].description);
  config_free(&c);
}

static void resolves(const char *file, const char *path, const char *want) {
  char text[256];
  snprintf(text, sizeof text, "[export a]\npath = %s\n", path);
  struct config c = parse(file, text);
  cr_assert_str_eq(c.v[0].path, want, "%s in %s", path, file);
  config_free(&c);
}

Test(config, relative_paths) {
  resolves("dir/x.conf", "a.img", "dir/a.img");
  resolves("dir/x.conf", "sub/a.img", "dir/sub/a.img");
  resolves("/etc/bp/x.conf", "../a.img", "/etc/bp/../a.img");
  resolves("/x.conf", "a.img", "/a.img");
  resolves("x.conf", "a.img", "a.img");
  resolves("dir/x.conf", "/srv/a.img", "/srv/a.img");
  resolves("dir/x.conf", "null:1G", "null:1G");
  resolves("dir/x.conf", "memory:1G", "memory:1G");
  resolves("dir/x.conf", "nbd://h/x", "nbd://h/x");
  resolves("dir/x.conf", "nbd+unix:///x?socket=/s", "nbd+unix:///x?socket=/s");
  resolves("dir/x.conf", "./a:b.img", "dir/./a:b.img");
  resolves("x.conf", "./a:b.img", "./a:b.img");
  resolves("dir/x.conf", "sub/a:b.img", "dir/sub/a:b.img");
}

Test(config, quoted_names) {
  struct config c = parse("x.conf", "[export \"a ] b\"]\npath=a\n"
                                    "[export \" spaced \" ]\npath=a\n"
                                    "[export \"q\\\"uote\\\\back\"]\npath=a\n"
                                    "[export two words]\npath=a\n"
                                    "[export   padded   ]\npath=a\n"
                                    "[export a\\b]\npath=a\n");
  cr_assert_eq(c.n, 6);
  cr_assert_str_eq(c.v[0].name, "a ] b");
  cr_assert_str_eq(c.v[1].name, " spaced ");
  cr_assert_str_eq(c.v[2].name, "q\"uote\\back");
  cr_assert_str_eq(c.v[3].name, "two words");
  cr_assert_str_eq(c.v[4].name, "padded");
  cr_assert_str_eq(c.v[5].name, "a\\b");
  config_free(&c);
}

Test(config, crlf_and_bom) {
  struct config c = parse("x.conf", "\xef\xbb\xbf# bom\r\n"
                                    "[export a]\r\n"
                                    "path = a.img\r\n"
                                    "description = d\r\n"
                                    "read-only = yes\r\n"
                                    "\r\n"
                                    "[export \"b\"]\r\n"
                                    "path = b.img");
  cr_assert_eq(c.n, 2);
  cr_assert_str_eq(c.v[0].name, "a");
  cr_assert_str_eq(c.v[0].path, "a.img");
  cr_assert_str_eq(c.v[0].description, "d");
  cr_assert(c.v[0].readonly);
  cr_assert_str_eq(c.v[1].name, "b");
  cr_assert_str_eq(c.v[1].path, "b.img");
  config_free(&c);
  /* A BOM on the first line of a section header. */
  c = parse("x.conf", "\xef\xbb\xbf[export a]\npath=a\n");
  cr_assert_str_eq(c.v[0].name, "a");
  config_free(&c);
}

Test(config, text_outside_section) {
  rejects("# c\npath = a\n[export a]\npath = a\n", 2,
          "key outside an [export] section");
  rejects("junk\n", 1, "key outside an [export] section");
}

Test(config, bad_headers) {
  rejects("[exports a]\npath=a\n", 1, "unknown section kind 'exports'");
  rejects("[global]\n", 1, "unknown section kind 'global'");
  rejects("[export a]\npath=a\n[export b\npath=b\n", 3, "missing ']'");
  rejects("[export \"a]\npath=a\n", 1, "missing closing '\"'");
  rejects("[export \"a\" b]\npath=a\n", 1, "missing ']' after the quoted");
  rejects("[export \"a\\x\"]\npath=a\n", 1, "bad escape '\\x'");
  rejects("[export a\"b]\npath=a\n", 1, "'\"' in an unquoted export name");
  rejects("[export a] b]\npath=a\n", 1, "unexpected text after ']': 'b]'");
  rejects("[export a] # c\npath=a\n", 1, "comment must be on a line");
  rejects("[export \"a\"] x\npath=a\n", 1, "unexpected text after ']'");
}

Test(config, bad_names) {
  rejects("[export]\npath=a\n", 1, "empty export name");
  rejects("[export   ]\npath=a\n", 1, "empty export name");
  rejects("[export \"\"]\npath=a\n", 1, "empty export name");
  rejects("[export a\tb]\npath=a\n", 1, "control character in export name");
  rejects("[export \"a\x1b\"]\npath=a\n", 1, "control character");
  rejects("[export a\rb]\npath=a\n", 1, "control character");
}

static char *export_named(size_t namelen) {
  char *t = malloc(namelen + 32);
  cr_assert_not_null(t);
  strcpy(t, "[export ");
  memset(t + 8, 'n', namelen);
  strcpy(t + 8 + namelen, "]\npath=a\n");
  return t;
}

Test(config, name_length) {
  char *t = export_named(4096);
  struct config c = parse("x.conf", t);
  cr_assert_eq(strlen(c.v[0].name), 4096);
  config_free(&c);
  free(t);
  t = export_named(4097);
  rejects(t, 1, "export name longer than 4096 bytes");
  free(t);
}

Test(config, duplicate_names) {
  rejects("[export x]\npath=a\n\n[export y]\npath=b\n[export x]\npath=c\n", 6,
          "export 'x' is declared twice (first at line 1)");
  /* Quoting does not make a name different. */
  rejects("[export x]\npath=a\n[export \"x\"]\npath=c\n", 3,
          "export 'x' is declared twice (first at line 1)");
}

Test(config, many_exports) {
  /* Enough to grow the name table a few times. */
  size_t n = 3000, size = n * 40 + 64, o = 0;
  char *t = malloc(size);
  cr_assert_not_null(t);
  for (size_t i = 0; i < n; i++)
    o += (size_t)snprintf(t + o, size - o, "[export e%zu]\npath=a\n", i);
  struct config c = parse("x.conf", t);
  cr_assert_eq(c.n, n);
  cr_assert_str_eq(c.v[n - 1].name, "e2999");
  config_free(&c);
  snprintf(t + o, size - o, "[export e1234]\npath=a\n");
  rejects(t, (unsigned)(2 * n + 1),
          "export 'e1234' is declared twice (first at line 2469)");
  free(t);
}

Test(config, bad_keys) {
  rejects("[export a]\npath=a\nread-only\n", 3, "missing '='");
  rejects("[export a]\npath=a\n= yes\n", 3, "missing key before '='");
  rejects("[export a]\npath=a\nreadonly = yes\n", 3,
          "unknown key 'readonly' (did you mean 'read-only'?)");
  rejects("[export a]\npath=a\nread_only = yes\n", 3,
          "(did you mean 'read-only'?)");
  rejects("[export a]\npath=a\ntls = yes\n", 3,
          "unknown key 'tls' (did you mean 'require-tls'?)");
  rejects("[export a]\npath=a\nrequire_tls = yes\n", 3,
          "(did you mean 'require-tls'?)");
  rejects("[export a]\nPath=a\n", 2, "(did you mean 'path'?)");
  rejects("[export a]\npath=a\ndescripton = x\n", 3,
          "(did you mean 'description'?)");
  rejects("[export a]\npath=a\nsize = 1G\n", 3, "unknown key 'size' (keys:");
}

Test(config, key_twice) {
  rejects("[export a]\npath=a\nread-only=yes\n\nread-only=yes\n", 5,
          "'read-only' given twice (first at line 3)");
  rejects("[export a]\npath=a\npath=b\n", 3, "'path' given twice");
  /* ... but per section. */
  struct config c =
      parse("x.conf", "[export a]\npath=a\nformat=raw\n[export b]\npath=b\n"
                      "format=raw\n");
  cr_assert_eq(c.n, 2);
  config_free(&c);
}

Test(config, paths) {
  rejects("[export a]\npath =   \n", 2, "empty path");
  rejects("\n[export a]\nformat = raw\n\n[export b]\npath=b\n", 2,
          "export 'a' has no path");
  rejects("[export a]\npath=a\n[export b]\nformat = raw\n", 3,
          "export 'b' has no path");
}

Test(config, bad_values) {
  rejects("[export a]\npath=a\nread-only = maybe\n", 3,
          "read-only: 'maybe' is not a boolean");
  rejects("[export a]\npath=a\nrequire-tls =\n", 3,
          "require-tls: '' is not a boolean");
  /* Which names are formats is the format table's to say, at opening;
   * the file refuses only what cannot be a name. */
  rejects("[export a]\npath=a\nformat = raw qcow2\n", 3,
          "format: 'raw qcow2' is not a format name");
  rejects("[export a]\npath=a\nformat =\n", 3, "is not a format name");
  struct config c = parse("x.conf", "[export a]\npath=a\nformat = vmdk\n");
  cr_assert_str_eq(c.v[0].format, "vmdk");
  config_free(&c);
}

/* option = KEY=VALUE, repeatable, kept in order; the keys are the
 * format's to judge when the export opens. */
Test(config, options) {
  struct config c = parse("x.conf", "[export a]\npath=a\n"
                                    "option = l2-cache-size=1M\n"
                                    "option=anything=x=y\n");
  cr_assert_eq(c.v[0].noptions, 2);
  cr_assert_str_eq(c.v[0].options[0], "l2-cache-size=1M");
  cr_assert_str_eq(c.v[0].options[1], "anything=x=y");
  struct export_conf e;
  cr_assert_eq(config_export_copy(&e, &c.v[0]), 0);
  config_free(&c);
  cr_assert_eq(e.noptions, 2);
  cr_assert_str_eq(e.options[1], "anything=x=y");
  config_export_free(&e);
  rejects("[export a]\npath=a\noption = timeout\n", 3,
          "option: 'timeout' is not KEY=VALUE");
  rejects("[export a]\npath=a\noption = =5\n", 3, "is not KEY=VALUE");
}

Test(config, bad_allow) {
  rejects("[export a]\npath=a\nallow = 10.0.0.0/33\n", 3,
          "allow: '10.0.0.0/33': bad prefix length");
  rejects("[export a]\npath=a\nallow = 10.0.0.1, host.example\n", 3,
          "allow: 'host.example' is not an IPv4 or IPv6 address");
  rejects("[export a]\npath=a\nallow = 10.0.0.1,\n", 3,
          "empty entry in the allow list");
  rejects("[export a]\npath=a\nallow = 10.0.0.1,,::1\n", 3, "empty entry");
  rejects("[export a]\npath=a\nallow =\n", 3, "empty allow list");
}

Test(config, one_default) {
  rejects("[export a]\npath=a\ndefault=yes\n[export b]\npath=b\ndefault=no\n"
          "[export c]\npath=c\ndefault=on\n",
          9, "more than one export says default = yes (also at line 3)");
}

Test(config, no_exports) {
  rejects("", 1, "no exports");
  rejects("# nothing\n\n# here\n", 3, "no exports");
  rejects("\xef\xbb\xbf", 1, "no exports");
}

Test(config, nul_bytes) {
  static const char t[] = "[export a]\npath=a\0b\n";
  rejects_len(t, sizeof t - 1, 2, "NUL byte");
  rejects_len("\0", 1, 1, "NUL byte");
}

Test(config, long_lines) {
  size_t n = 65536;
  char *t = malloc(n + 64);
  cr_assert_not_null(t);
  strcpy(t, "[export a]\npath=a\ndescription=");
  size_t head = strlen(t), line_start = head - strlen("description=");
  memset(t + head, 'x', n - (head - line_start)); /* the line: 64 KiB */
  strcpy(t + line_start + n, "\n");
  rejects(t, 3, "description longer than 4096 bytes");
  strcpy(t + line_start + n, "x\n");
  rejects(t, 3, "line longer than 65536 bytes");
  free(t);
}

Test(config, free_zeroed_and_twice) {
  struct config c = {0};
  config_free(&c);
  c = parse("x.conf", "[export a]\npath=a\nallow=::1\n");
  config_free(&c);
  config_free(&c);
  cr_assert_null(c.v);
}

Test(config, error_is_errno_and_message) {
  struct config c;
  cr_assert_eq(config_parse("junk", 4, "x.conf", &c), -EINVAL);
  cr_assert_eq(strncmp(bd_errmsg(), "x.conf:1: ", 10), 0, "%s", bd_errmsg());
}

Test(config, copy) {
  struct config c = parse("x.conf", "[export a]\npath=a\nformat=raw\n"
                                    "description=d\nallow=::1,10.0.0.0/8\n");
  struct export_conf e;
  cr_assert_eq(config_export_copy(&e, &c.v[0]), 0);
  config_free(&c);
  cr_assert_str_eq(e.name, "a");
  cr_assert_str_eq(e.path, "a");
  cr_assert_str_eq(e.format, "raw");
  cr_assert_str_eq(e.description, "d");
  cr_assert_eq(e.nallow, 2);
  cr_assert_eq(e.allow[1].prefix, 8);
  config_export_free(&e);
  cr_assert_null(e.name);
}

Test(config, load) {
  char dir[] = "/tmp/test-config-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char file[64];
  snprintf(file, sizeof file, "%s/exports.conf", dir);
  struct config c;
  cr_assert_eq(config_load(file, &c), -ENOENT);
  cr_assert_not_null(strstr(bd_errmsg(), "No such file or directory"), "%s",
                     bd_errmsg());

  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fputs("[export a]\npath = a.img\n", f);
  fclose(f);
  cr_assert_eq(config_load(file, &c), 0, "%s", bd_errmsg());
  char want[80];
  snprintf(want, sizeof want, "%s/a.img", dir);
  cr_assert_str_eq(c.v[0].path, want);
  config_free(&c);

  /* 1 MiB is the most it reads. */
  cr_assert_eq(truncate(file, (1 << 20) + 1), 0);
  cr_assert_eq(config_load(file, &c), -EFBIG);
  cr_assert_not_null(strstr(bd_errmsg(), "larger than 1 MiB"), "%s",
                     bd_errmsg());
  cr_assert_eq(c.n, 0);
  unlink(file);
  rmdir(dir);
}
