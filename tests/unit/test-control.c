/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's JSON (core/control-json.c): the request parser,
 * the answer writer and its string escaping; and one round trip through
 * a real server (core/control.c) with a verb of the caller's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/control.h"

static int parse(const char *text, struct ctl_request *r, char *err,
                 size_t errlen) {
  return ctl_parse_request(text, strlen(text), r, err, errlen);
}

/* TEXT is refused, with a message naming WHY. */
static void refused(const char *text, size_t len, const char *why) {
  struct ctl_request r;
  char err[256];
  cr_assert_eq(ctl_parse_request(text, len, &r, err, sizeof err), -EINVAL,
               "accepted: %.*s", (int)len, text);
  cr_assert(strstr(err, why), "'%.*s': '%s' lacks '%s'", (int)len, text, err,
            why);
  ctl_request_free(&r);
}
#define REFUSED(text, why) refused(text, strlen(text), why)

Test(parse, verb_args_id) {
  struct ctl_request r;
  char err[256];
  cr_assert_eq(parse(" { \"verb\" : \"checkpoint\", \"args\":[\"c1\",\"vm\"],"
                     "\"id\":{\"n\":[1,-2.5e+3,true,null]} } ",
                     &r, err, sizeof err),
               0, "%s", err);
  cr_assert_str_eq(r.verb, "checkpoint");
  cr_assert_eq(r.nargs, 2);
  cr_assert_str_eq(r.args[0], "c1");
  cr_assert_str_eq(r.args[1], "vm");
  cr_assert_str_eq(r.id, "{\"n\":[1,-2.5e+3,true,null]}");
  ctl_request_free(&r);
  cr_assert_eq(parse("{\"verb\":\"list\"}", &r, err, sizeof err), 0);
  cr_assert_eq(r.nargs, 0);
  cr_assert_not_null(r.args);
  cr_assert_null(r.id);
  ctl_request_free(&r);
}

Test(parse, unknown_members_ignored) {
  struct ctl_request r;
  char err[256];
  cr_assert_eq(parse("{\"future\":{\"a\":[[],{}]},\"verb\":\"v\",\"x\":null,"
                     "\"args\":[],\"y\":\"\\u0000\"}",
                     &r, err, sizeof err),
               0, "%s", err);
  cr_assert_str_eq(r.verb, "v");
  ctl_request_free(&r);
}

Test(parse, escapes) {
  struct ctl_request r;
  char err[256];
  cr_assert_eq(parse("{\"verb\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\","
                     "\"args\":[\"\\u00e9\\u20ac\\ud83d\\ude00\", \"é€😀\"]}",
                     &r, err, sizeof err),
               0, "%s", err);
  cr_assert_str_eq(r.verb, "a\"b\\c/d\b\f\n\r\t");
  cr_assert_str_eq(r.args[0], "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  cr_assert_str_eq(r.args[1], "é€😀");
  ctl_request_free(&r);
}

Test(parse, refusals) {
  REFUSED("", "a request is a JSON object");
  REFUSED("[1]", "a request is a JSON object");
  REFUSED("\"verb\"", "a request is a JSON object");
  REFUSED("{}", "no \"verb\"");
  REFUSED("{\"verb\":1}", "\"verb\" must be a string");
  REFUSED("{\"verb\":\"a\",\"verb\":\"b\"}", "given twice");
  REFUSED("{\"verb\":\"a\",\"args\":[1]}", "array of strings");
  REFUSED("{\"verb\":\"a\",\"args\":\"x\"}", "array of strings");
  REFUSED("{\"verb\":\"a\"} x", "text after");
  REFUSED("{\"verb\":\"a\",}", "expected a string");
  REFUSED("{\"verb\":\"a\"", "expected ',' or '}'");
  REFUSED("{\"verb\":\"a", "unterminated string");
  REFUSED("{\"verb\":\"a\\x\"}", "unknown escape");
  REFUSED("{\"verb\":\"\\u12\"}", "four hex digits");
  REFUSED("{\"verb\":\"\\ud800\"}", "without its low one");
  REFUSED("{\"verb\":\"\\ud800\\u0041\"}", "without its low one");
  REFUSED("{\"verb\":\"\\udc00\"}", "lone low surrogate");
  REFUSED("{\"verb\":\"a\\u0000b\"}", "\\u0000");
  REFUSED("{\"verb\":\"a\tb\"}", "control character");
  REFUSED("{\"verb\":\"\xff\"}", "invalid UTF-8");
  REFUSED("{\"verb\":\"\xc0\xaf\"}", "invalid UTF-8");     /* overlong */
  REFUSED("{\"verb\":\"\xed\xa0\x80\"}", "invalid UTF-8"); /* surrogate */
  REFUSED("{\"verb\":\"\xf4\x90\x80\x80\"}", "invalid UTF-8");
  REFUSED("{\"verb\":\"\xe2\x82\"}", "invalid UTF-8"); /* cut short */
  REFUSED("{\"verb\":\"a\",\"id\":01}", "expected ',' or '}'");
  REFUSED("{\"verb\":\"a\",\"id\":1.}", "after '.'");
  REFUSED("{\"verb\":\"a\",\"id\":1e}", "exponent");
  REFUSED("{\"verb\":\"a\",\"id\":tru}", "expected a value");
  REFUSED("{\"verb\":\"a\",\"id\":-}", "expected a value");
  refused("{\"verb\":\"a\0\"}", 11, "control character");
  refused("{\"verb\":\"a\"}\0", 13, "text after");
}

Test(parse, depth_and_arg_limits) {
  char deep[200] = "{\"verb\":\"a\",\"id\":";
  size_t n = strlen(deep);
  for (int i = 0; i < 40; i++)
    deep[n++] = '[';
  deep[n] = 0;
  REFUSED(deep, "nested deeper than");
  char *many = malloc(16 + 5 * (CTL_MAX_ARGS + 1) + 8);
  strcpy(many, "{\"verb\":\"a\",\"args\":[");
  for (int i = 0; i <= CTL_MAX_ARGS; i++)
    strcat(many, i ? ",\"x\"" : "\"x\"");
  strcat(many, "]}");
  REFUSED(many, "more than 64 args");
  free(many);
}

Test(parse, id_kept_on_error) {
  struct ctl_request r;
  char err[256];
  cr_assert_eq(parse("{\"id\":42,\"verb\":7}", &r, err, sizeof err), -EINVAL);
  cr_assert_str_eq(r.id, "42");
  ctl_request_free(&r);
}

static char *json(const char *s) {
  char *out = NULL;
  size_t len = 0, cap = 0;
  cr_assert_eq(ctl_json_str(&out, &len, &cap, s), 0);
  cr_assert_eq(strlen(out), len);
  return out;
}

Test(writer, escaping) {
  struct {
    const char *in, *out;
  } cases[] = {
      {"plain", "\"plain\""},
      {"q\"b\\s/", "\"q\\\"b\\\\s/\""},
      {"\b\f\n\r\t", "\"\\b\\f\\n\\r\\t\""},
      {"\x01\x1f\x7f", "\"\\u0001\\u001f\\u007f\""},
      {"é€😀", "\"é€😀\""},
      {"a\xff"
       "b",
       "\"a\xef\xbf\xbd"
       "b\""},                                      /* not UTF-8: U+FFFD */
      {"\xe2\x82", "\"\xef\xbf\xbd\xef\xbf\xbd\""}, /* cut short */
      {"\xed\xa0\x80", "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""},
      {"", "\"\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *s = json(cases[i].in);
    cr_assert_str_eq(s, cases[i].out, "case %zu", i);
    free(s);
  }
}

/* What the writer writes, the parser reads back as it was. */
Test(writer, round_trip) {
  const char *in = "x\"\\\x01\n é😀";
  char *s = json(in);
  char *back = ctl_json_decode_str(s);
  cr_assert_str_eq(back, in);
  free(back);
  free(s);
}

static const char *finish(struct ctl_answer *a) {
  size_t len;
  const char *line = ctl_answer_finish(a, &len);
  cr_assert_not_null(line);
  cr_assert_eq(strlen(line), len);
  cr_assert_eq(line[len - 1], '\n');
  return line;
}

Test(writer, fields_arrays_objects) {
  struct ctl_answer *a = ctl_answer_new("\"r1\"");
  ctl_add_str(a, "name", "c\"1");
  ctl_add_i64(a, "neg", -5);
  ctl_add_u64(a, "big", UINT64_MAX);
  ctl_add_bool(a, "yes", true);
  const char *v[] = {"a", "b"};
  ctl_add_strv(a, "names", v, 2);
  ctl_add_strv(a, "none", v, 0);
  ctl_array_begin(a, "items");
  for (int i = 0; i < 2; i++) {
    ctl_object_begin(a);
    ctl_add_i64(a, "i", i);
    ctl_object_end(a);
  }
  ctl_array_end(a);
  cr_assert_not(ctl_answer_failed(a));
  cr_assert_str_eq(finish(a),
                   "{\"ok\":true,\"id\":\"r1\",\"name\":\"c\\\"1\",\"neg\":-5,"
                   "\"big\":18446744073709551615,\"yes\":true,\"names\":[\"a\","
                   "\"b\"],\"none\":[],\"items\":[{\"i\":0},{\"i\":1}]}\n");
  ctl_answer_free(a);
}

Test(writer, failure_drops_fields) {
  struct ctl_answer *a = ctl_answer_new(NULL);
  ctl_add_str(a, "name", "x");
  cr_assert_eq(ctl_fail(a, ENOENT, "no checkpoint '%s'", "c\n1"), -ENOENT);
  cr_assert_str_eq(finish(a), "{\"ok\":false,\"error\":\"no checkpoint "
                              "'c\\n1'\",\"errno\":\"ENOENT\"}\n");
  ctl_answer_free(a);
}

Test(writer, misuse_is_an_error) {
  struct ctl_answer *a = ctl_answer_new(NULL);
  ctl_array_begin(a, "x");
  ctl_add_str(a, "key-in-array", "y"); /* needs an object first */
  cr_assert(ctl_answer_failed(a));
  cr_assert(strstr(finish(a), "\"errno\":\"EPROTO\""));
  ctl_answer_free(a);
  a = ctl_answer_new(NULL);
  ctl_array_begin(a, "unclosed");
  cr_assert(strstr(finish(a), "\"ok\":false"));
  ctl_answer_free(a);
}

Test(client, member_lookup) {
  const char *t = "{\"ok\":false,\"error\":\"a \\\"b\\\"\",\"x\":[1,{}]}";
  char *ok = ctl_json_member(t, strlen(t), "ok");
  cr_assert_str_eq(ok, "false");
  char *e = ctl_json_member(t, strlen(t), "error");
  char *msg = ctl_json_decode_str(e);
  cr_assert_str_eq(msg, "a \"b\"");
  cr_assert_null(ctl_json_member(t, strlen(t), "missing"));
  cr_assert_null(ctl_json_member("{\"ok\":", 6, "ok"));
  free(ok);
  free(e);
  free(msg);
  cr_assert(ctl_utf8_valid("é😀"));
  cr_assert_not(ctl_utf8_valid("\xc3"));
}

/* ---- a server ---- */

static int echo_verb(const struct ctl_request *req, struct ctl_answer *a) {
  if (req->nargs && !strcmp(req->args[0], "fail"))
    return ctl_fail(a, EBUSY, "busy: %s", (const char *)req->opaque);
  ctl_add_strv(a, "args", (const char *const *)req->args, req->nargs);
  ctl_add_str(a, "opaque", req->opaque);
  return 0;
}

static int raw_errno_verb(const struct ctl_request *req, struct ctl_answer *a) {
  (void)req;
  (void)a;
  return -ENOSPC;
}

static const struct ctl_verb verbs[] = {
    {"echo", 0, 3, "echo [ARG...]", "the arguments back", echo_verb},
    {"raw", 0, 0, "raw", "fails with ENOSPC", raw_errno_verb},
};

static char *ask(int fd, const char *line) {
  cr_assert_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
  static char buf[4096];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t r = read(fd, buf + n, 1);
    cr_assert_eq(r, 1);
    if (buf[n++] == '\n')
      break;
  }
  buf[n] = 0;
  return buf;
}

Test(server, live_and_stale_sockets) {
  char dir[] = "/tmp/test-control-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/ctl", dir);
  struct ctl_server *s = ctl_start(path, verbs, 2, NULL);
  cr_assert_not_null(s);
  cr_assert_null(ctl_start(path, verbs, 2, NULL), "a live socket is taken");
  /* A stale socket (nobody listening) is replaced. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/stale", dir);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  close(fd);
  struct ctl_server *s2 = ctl_start(sa.sun_path, NULL, 0, NULL);
  cr_assert_not_null(s2);
  ctl_stop(s2);
  /* Anything else is left alone. */
  FILE *f = fopen(sa.sun_path, "w");
  fclose(f);
  cr_assert_null(ctl_start(sa.sun_path, NULL, 0, NULL));
  unlink(sa.sun_path);
  ctl_stop(s);
  rmdir(dir);
}

Test(server, answers) {
  char dir[] = "/tmp/test-control-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/ctl", dir);
  struct ctl_server *s = ctl_start(path, verbs, 2, "cookie");
  cr_assert_not_null(s);
  struct ctl_verb dup[] = {{"help", 0, 0, "help", "", echo_verb}};
  cr_assert_null(ctl_start(path, dup, 1, NULL), "help is built in");
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_str_eq(ask(fd, ""), "{\"blockport\":\"0.1.0\",\"protocol\":1,"
                                "\"verbs\":[\"help\",\"version\",\"echo\","
                                "\"raw\"]}\n");
  cr_assert_str_eq(ask(fd, "{\"verb\":\"echo\",\"args\":[\"a\"],\"id\":3}\n"),
                   "{\"ok\":true,\"id\":3,\"args\":[\"a\"],\"opaque\":"
                   "\"cookie\"}\n");
  cr_assert(strstr(ask(fd, "{\"verb\":\"echo\",\"args\":[\"fail\"]}\n"),
                   "\"error\":\"busy: cookie\",\"errno\":\"EBUSY\""));
  cr_assert(strstr(ask(fd, "{\"verb\":\"raw\"}\n"), "\"errno\":\"ENOSPC\""));
  cr_assert(strstr(ask(fd, "{\"verb\":\"echo\",\"args\":[\"1\",\"2\",\"3\","
                           "\"4\"]}\n"),
                   "echo takes 0 to 3 arguments, not 4"));
  close(fd);
  ctl_stop(s);
  cr_assert_neq(access(path, F_OK), 0, "the socket is removed");
  rmdir(dir);
}
