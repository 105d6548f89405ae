/* SPDX-License-Identifier: BSD-3-Clause */
/* core/unix-socket.c: socket addresses, and replacing only a socket
 * nobody listens on (serve --unix, --control). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/unix-socket.h"

static char dir[] = "/tmp/bp-unix-socket-XXXXXX";
static char path[256];

static void setup(void) {
  cr_assert(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s", dir);
}

static void teardown(void) {
  unlink(path);
  rmdir(dir);
}

/* A socket bound at PATH: listening, or left behind (closed). */
static int bound(struct sockaddr_un *sa, bool listening) {
  cr_assert(unix_socket_addr(path, sa));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0);
  cr_assert_eq(bind(fd, (struct sockaddr *)sa, sizeof *sa), 0);
  if (listening)
    cr_assert_eq(listen(fd, 1), 0);
  else
    close(fd);
  return fd;
}

static bool exists(void) {
  struct stat st;
  return lstat(path, &st) == 0;
}

Test(unix_socket, addr) {
  struct sockaddr_un sa;
  cr_assert(unix_socket_addr("/run/x.sock", &sa));
  cr_expect_eq(sa.sun_family, AF_UNIX);
  cr_expect_str_eq(sa.sun_path, "/run/x.sock");
  char longer[sizeof sa.sun_path + 1];
  memset(longer, 'a', sizeof longer - 1);
  longer[sizeof longer - 1] = 0;
  errno = 0;
  cr_expect_not(unix_socket_addr(longer, &sa));
  cr_expect_eq(errno, ENAMETOOLONG);
  longer[sizeof sa.sun_path - 1] = 0; /* fits with its terminator */
  cr_expect(unix_socket_addr(longer, &sa));
}

Test(unix_socket, nothing_there, .init = setup, .fini = teardown) {
  struct sockaddr_un sa;
  cr_assert(unix_socket_addr(path, &sa));
  cr_expect_eq(unix_socket_remove_stale(path, &sa), 0);
}

Test(unix_socket, stale_removed, .init = setup, .fini = teardown) {
  struct sockaddr_un sa;
  bound(&sa, false);
  cr_assert(exists());
  cr_expect_eq(unix_socket_remove_stale(path, &sa), 0);
  cr_expect_not(exists());
}

Test(unix_socket, live_kept, .init = setup, .fini = teardown) {
  struct sockaddr_un sa;
  int fd = bound(&sa, true);
  cr_expect_eq(unix_socket_remove_stale(path, &sa), -EADDRINUSE);
  cr_expect(exists());
  close(fd);
}

Test(unix_socket, file_kept, .init = setup, .fini = teardown) {
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fclose(f);
  struct sockaddr_un sa;
  cr_assert(unix_socket_addr(path, &sa));
  cr_expect_eq(unix_socket_remove_stale(path, &sa), -ENOTSOCK);
  cr_expect(exists());
}
