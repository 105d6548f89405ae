/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the --config file parser (server/config.c).
 *
 * The input is a config file.  Whatever it is, the parser must not crash or
 * leak, and must leave a message naming the file; what it accepts must be a
 * usable configuration: at least one export, names unique, valid and in bounds,
 * at most one default, every path non-empty, allow rules well formed, every
 * option KEY=VALUE.  The file is named with a directory so relative paths
 * get resolved. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/error.h"
#include "fuzz-check.h"
#include "server/config.h"

static void check_name(const char *name) {
  size_t n = strlen(name);
  CHECK(n >= 1 && n <= CONFIG_MAX_NAME);
  for (size_t i = 0; i < n; i++)
    CHECK((unsigned char)name[i] >= 0x20 && name[i] != 0x7f);
}

static void check_export(const struct export_conf *e, size_t len) {
  check_name(e->name);
  CHECK(e->path && e->path[0]);
  /* Any name: the format table judges it when the export opens. */
  CHECK(!e->format || (e->format[0] && !strpbrk(e->format, " \t#;")));
  CHECK((e->noptions == 0) == (e->options == NULL));
  CHECK(e->noptions <= CONFIG_MAX_OPTIONS);
  for (size_t i = 0; i < e->noptions; i++) {
    const char *eq = strchr(e->options[i], '=');
    CHECK(eq && eq != e->options[i]);
  }
  CHECK(!e->description ||
        (e->description[0] && strlen(e->description) <= CONFIG_MAX_NAME));
  CHECK(e->line >= 1 && e->line <= len);
  CHECK((e->nallow == 0) == (e->allow == NULL));
  for (size_t i = 0; i < e->nallow; i++) {
    const struct acl_rule *r = &e->allow[i];
    CHECK((r->family == AF_INET && r->prefix <= 32) ||
          (r->family == AF_INET6 && r->prefix <= 128));
  }
}

static void check_config(const struct config *c, size_t len) {
  CHECK(c->n > 0 && c->v);
  size_t defaults = 0;
  for (size_t i = 0; i < c->n; i++) {
    check_export(&c->v[i], len);
    defaults += c->v[i].is_default;
    if (i > 0)
      CHECK(c->v[i].line > c->v[i - 1].line);
    /* Inputs are small: a quadratic check is fine. */
    for (size_t j = 0; j < i; j++)
      CHECK(strcmp(c->v[i].name, c->v[j].name) != 0);
  }
  CHECK(defaults <= 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct config c;
  bd_set_error("%s", "");
  int r = config_parse((const char *)data, size, "etc/exports.conf", &c);
  if (r == 0) {
    check_config(&c, size);
    struct export_conf copy;
    if (config_export_copy(&copy, &c.v[0]) == 0)
      config_export_free(&copy);
  } else {
    CHECK(c.n == 0 && c.v == NULL);
    CHECK(r == -EINVAL || r == -ENOMEM);
    CHECK(strncmp(bd_errmsg(), "etc/exports.conf:", 17) == 0);
  }
  config_free(&c);
  config_free(&c);
  return 0;
}
