/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the control socket's request parser and answer writer
 * (core/control-json.c).
 *
 * The input is one request line as a client may send it (any bytes).  The
 * verdict is the same twice; an accepted request has a verb and arguments
 * of valid UTF-8 without NUL, and its id is a JSON value that the answer
 * carries back: the answer, with the request's strings as fields, is one
 * line that reads back as an object with "ok":true, the same "id" and the
 * same strings.  A refused one has a message.  The input read as a string
 * value goes through the writer and back unchanged when it is UTF-8. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/control.h"
#include "fuzz-check.h"

static void check_answer(const struct ctl_request *r) {
  struct ctl_answer *a = ctl_answer_new(r->id);
  CHECK(a);
  ctl_add_str(a, "verb", r->verb);
  ctl_add_strv(a, "args", (const char *const *)r->args, r->nargs);
  ctl_array_begin(a, "objects");
  ctl_object_begin(a);
  ctl_add_u64(a, "n", r->nargs);
  ctl_object_end(a);
  ctl_array_end(a);
  size_t len;
  const char *line = ctl_answer_finish(a, &len);
  CHECK(line && len > 1 && line[len - 1] == '\n');
  CHECK(!memchr(line, '\n', len - 1));
  char *ok = ctl_json_member(line, len - 1, "ok");
  CHECK(ok && !strcmp(ok, "true"));
  free(ok);
  char *id = ctl_json_member(line, len - 1, "id");
  CHECK(!id == !r->id);
  CHECK(!id || !strcmp(id, r->id));
  free(id);
  char *verb = ctl_json_member(line, len - 1, "verb");
  char *back = verb ? ctl_json_decode_str(verb) : NULL;
  CHECK(back && !strcmp(back, r->verb));
  free(back);
  free(verb);
  ctl_answer_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly SIZE bytes, so reading past it is caught. */
  char *buf = malloc(size ? size : 1);
  CHECK(buf);
  memcpy(buf, data, size);
  struct ctl_request r, again;
  char err[256], err2[256];
  int v = ctl_parse_request(buf, size, &r, err, sizeof err);
  CHECK(ctl_parse_request(buf, size, &again, err2, sizeof err2) == v);
  ctl_request_free(&again);
  if (v == 0) {
    CHECK(r.verb && ctl_utf8_valid(r.verb));
    CHECK(r.args && r.nargs <= CTL_MAX_ARGS);
    for (size_t i = 0; i < r.nargs; i++)
      CHECK(r.args[i] && ctl_utf8_valid(r.args[i]));
    check_answer(&r);
  } else {
    CHECK(err[0]);
  }
  ctl_request_free(&r);

  /* The input as a string: written, read back the same. */
  char *s = malloc(size + 1);
  CHECK(s);
  memcpy(s, data, size);
  s[size] = 0;
  char *out = NULL;
  size_t len = 0, cap = 0;
  CHECK(ctl_json_str(&out, &len, &cap, s) == 0);
  char *back = ctl_json_decode_str(out);
  if (ctl_utf8_valid(s) && strlen(s) == size)
    CHECK(back && !strcmp(back, s));
  else
    CHECK(!back || ctl_utf8_valid(back));
  free(back);
  free(out);
  /* Any member of the input, if it is an object. */
  free(ctl_json_member(buf, size, "verb"));
  free(s);
  free(buf);
  return 0;
}
