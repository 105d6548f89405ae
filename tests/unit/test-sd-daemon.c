/* SPDX-License-Identifier: BSD-3-Clause */
/* systemd socket activation: LISTEN_PID/LISTEN_FDS parsing and the checks
 * on the sockets passed. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "server/sd-daemon.h"

static int parse(const char *pid, const char *fds, pid_t self) {
  char err[160] = "";
  return sd_parse_listen_env(pid, fds, self, 16, err, sizeof err);
}

Test(listen_env, for_us) {
  cr_assert_eq(parse("1234", "1", 1234), 1);
  cr_assert_eq(parse("1234", "16", 1234), 16);
  cr_assert_eq(parse("1234", "0", 1234), 0);
}

Test(listen_env, absent_or_for_another_process) {
  cr_assert_eq(parse(NULL, NULL, 1234), 0);
  cr_assert_eq(parse("1234", NULL, 1234), 0);
  cr_assert_eq(parse(NULL, "2", 1234), 0);
  cr_assert_eq(parse("4321", "2", 1234), 0);
  /* Not ours: a malformed LISTEN_FDS does not matter. */
  cr_assert_eq(parse("4321", "junk", 1234), 0);
}

Test(listen_env, malformed) {
  char err[160] = "";
  cr_assert_eq(sd_parse_listen_env("12x", "1", 12, 16, err, sizeof err), -1);
  cr_assert(strstr(err, "LISTEN_PID"), "%s", err);
  cr_assert_eq(parse("", "1", 12), -1);
  cr_assert_eq(parse("-12", "1", 12), -1);
  cr_assert_eq(parse("12", "", 12), -1);
  cr_assert_eq(parse("12", "-1", 12), -1);
  cr_assert_eq(parse("12", " 1", 12), -1);
  cr_assert_eq(parse("12", "1 ", 12), -1);
  cr_assert_eq(parse("12", "99999999999999999999", 12), -1);
  cr_assert_eq(sd_parse_listen_env("12", "17", 12, 16, err, sizeof err), -1);
  cr_assert(strstr(err, "at most 16"), "%s", err);
}

Test(listener, accepts_listening_stream_sockets) {
  char err[160];
  int u = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  /* Abstract address: nothing to clean up. */
  snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "bp-sd-test-%d",
           (int)getpid());
  cr_assert_eq(bind(u, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(sd_check_listener(u, err, sizeof err), -1);
  cr_assert(strstr(err, "not listening"), "%s", err);
  cr_assert_eq(listen(u, 1), 0);
  cr_assert_eq(sd_check_listener(u, err, sizeof err), 0, "%s", err);
  char desc[200];
  sd_describe_listener(u, desc, sizeof desc);
  cr_assert(strstr(desc, "unix @bp-sd-test-"), "%s", desc);
  close(u);

  int t = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in in = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(t, (struct sockaddr *)&in, sizeof in), 0);
  cr_assert_eq(listen(t, 1), 0);
  cr_assert_eq(sd_check_listener(t, err, sizeof err), 0, "%s", err);
  sd_describe_listener(t, desc, sizeof desc);
  cr_assert(!strncmp(desc, "tcp 127.0.0.1:", 14), "%s", desc);
  close(t);
}

Test(listener, refuses_the_rest) {
  char err[160];
  int d = socket(AF_INET, SOCK_DGRAM, 0);
  cr_assert_eq(sd_check_listener(d, err, sizeof err), -1);
  cr_assert(strstr(err, "not a stream socket"), "%s", err);
  close(d);
  int p[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(sd_check_listener(p[0], err, sizeof err), -1);
  cr_assert(strstr(err, "not a socket"), "%s", err);
  close(p[0]);
  close(p[1]);
  cr_assert_eq(sd_check_listener(p[0], err, sizeof err), -1);
}

Test(notify_addr, path_and_abstract) {
  struct sockaddr_un sa;
  socklen_t len;
  char err[160];
  cr_assert_eq(
      sd_notify_addr("/run/systemd/notify", &sa, &len, err, sizeof err), 0,
      "%s", err);
  cr_assert_str_eq(sa.sun_path, "/run/systemd/notify");
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + 20);
  cr_assert_eq(sd_notify_addr("@bp/notify", &sa, &len, err, sizeof err), 0);
  cr_assert_eq(sa.sun_path[0], '\0');
  cr_assert_eq(memcmp(sa.sun_path + 1, "bp/notify", 9), 0);
  /* No terminator counted: abstract names are exactly their length. */
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + 10);
}

Test(notify_addr, refused) {
  struct sockaddr_un sa;
  socklen_t len;
  char err[160], longp[200];
  cr_assert_eq(sd_notify_addr("relative/x", &sa, &len, err, sizeof err), -1);
  cr_assert(strstr(err, "absolute"), "%s", err);
  cr_assert_eq(sd_notify_addr("vsock:2:1234", &sa, &len, err, sizeof err), -1);
  cr_assert_eq(sd_notify_addr("", &sa, &len, err, sizeof err), -1);
  cr_assert_eq(sd_notify_addr("@", &sa, &len, err, sizeof err), -1);
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  cr_assert_eq(sd_notify_addr(longp, &sa, &len, err, sizeof err), -1);
  /* The longest that fit: 107 bytes and a NUL; 108 abstract bytes. */
  longp[107] = '\0';
  cr_assert_eq(sd_notify_addr(longp, &sa, &len, err, sizeof err), 0);
  longp[0] = '@';
  longp[107] = 'a';
  longp[108] = '\0';
  cr_assert_eq(sd_notify_addr(longp, &sa, &len, err, sizeof err), 0);
  longp[108] = 'a';
  longp[109] = '\0';
  cr_assert_eq(sd_notify_addr(longp, &sa, &len, err, sizeof err), -1);
}
