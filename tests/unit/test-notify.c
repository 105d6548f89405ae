/* SPDX-License-Identifier: BSD-3-Clause */
/* systemd without libsystemd: socket activation (core/listen.c),
 * LISTEN_PID/LISTEN_FDS parsing and the checks on the sockets passed; and
 * the NOTIFY_SOCKET address (core/notify.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/listen.h"
#include "core/notify.h"

static int parse(const char *pid, const char *fds, pid_t self) {
  return listen_env_parse(pid, fds, self, 16);
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
  cr_assert_eq(listen_env_parse("12x", "1", 12, 16), -EINVAL);
  cr_assert(strstr(bd_errmsg(), "LISTEN_PID"), "%s", bd_errmsg());
  cr_assert_eq(parse("", "1", 12), -EINVAL);
  cr_assert_eq(parse("-12", "1", 12), -EINVAL);
  cr_assert_eq(parse("12", "", 12), -EINVAL);
  cr_assert_eq(parse("12", "-1", 12), -EINVAL);
  cr_assert_eq(parse("12", " 1", 12), -EINVAL);
  cr_assert_eq(parse("12", "1 ", 12), -EINVAL);
  cr_assert_eq(parse("12", "99999999999999999999", 12), -EINVAL);
  cr_assert_eq(listen_env_parse("12", "17", 12, 16), -EINVAL);
  cr_assert(strstr(bd_errmsg(), "at most 16"), "%s", bd_errmsg());
}

Test(listener, accepts_listening_stream_sockets) {
  int u = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  /* Abstract address: nothing to clean up. */
  snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "bp-sd-test-%d",
           (int)getpid());
  cr_assert_eq(bind(u, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen_fd_check(u), -EINVAL);
  cr_assert(strstr(bd_errmsg(), "not listening"), "%s", bd_errmsg());
  cr_assert_eq(listen(u, 1), 0);
  cr_assert_eq(listen_fd_check(u), 0, "%s", bd_errmsg());
  char desc[200];
  listen_fd_describe(u, desc, sizeof desc);
  cr_assert(strstr(desc, "unix @bp-sd-test-"), "%s", desc);
  close(u);

  int t = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in in = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(t, (struct sockaddr *)&in, sizeof in), 0);
  cr_assert_eq(listen(t, 1), 0);
  cr_assert_eq(listen_fd_check(t), 0, "%s", bd_errmsg());
  listen_fd_describe(t, desc, sizeof desc);
  cr_assert(!strncmp(desc, "tcp 127.0.0.1:", 14), "%s", desc);
  close(t);
}

Test(listener, refuses_the_rest) {
  int d = socket(AF_INET, SOCK_DGRAM, 0);
  cr_assert_eq(listen_fd_check(d), -EINVAL);
  cr_assert(strstr(bd_errmsg(), "not a stream socket"), "%s", bd_errmsg());
  close(d);
  int p[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(listen_fd_check(p[0]), -ENOTSOCK);
  cr_assert(strstr(bd_errmsg(), "not a socket"), "%s", bd_errmsg());
  close(p[0]);
  close(p[1]);
  cr_assert_eq(listen_fd_check(p[0]), -EBADF);
}

Test(notify_addr, path_and_abstract) {
  struct sockaddr_un sa;
  socklen_t len;
  cr_assert_eq(notify_parse_addr("/run/systemd/notify", &sa, &len), 0, "%s",
               bd_errmsg());
  cr_assert_str_eq(sa.sun_path, "/run/systemd/notify");
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + 20);
  cr_assert_eq(notify_parse_addr("@bp/notify", &sa, &len), 0);
  cr_assert_eq(sa.sun_path[0], '\0');
  cr_assert_eq(memcmp(sa.sun_path + 1, "bp/notify", 9), 0);
  /* No terminator counted: abstract names are exactly their length. */
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + 10);
}

Test(notify_addr, refused) {
  struct sockaddr_un sa;
  socklen_t len;
  char longp[200];
  cr_assert_eq(notify_parse_addr("relative/x", &sa, &len), -EINVAL);
  cr_assert(strstr(bd_errmsg(), "absolute"), "%s", bd_errmsg());
  cr_assert_eq(notify_parse_addr("vsock:2:1234", &sa, &len), -EINVAL);
  cr_assert_eq(notify_parse_addr("", &sa, &len), -EINVAL);
  cr_assert_eq(notify_parse_addr("@", &sa, &len), -EINVAL);
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  cr_assert_eq(notify_parse_addr(longp, &sa, &len), -EINVAL);
  /* The longest that fit: 107 bytes and a NUL; 108 abstract bytes. */
  longp[107] = '\0';
  cr_assert_eq(notify_parse_addr(longp, &sa, &len), 0);
  longp[0] = '@';
  longp[107] = 'a';
  longp[108] = '\0';
  cr_assert_eq(notify_parse_addr(longp, &sa, &len), 0);
  longp[108] = 'a';
  longp[109] = '\0';
  cr_assert_eq(notify_parse_addr(longp, &sa, &len), -EINVAL);
}
