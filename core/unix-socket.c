/* SPDX-License-Identifier: BSD-3-Clause */
#include "unix-socket.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

bool unix_socket_addr(const char *path, struct sockaddr_un *sa) {
  *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return false;
  }
  strcpy(sa->sun_path, path);
  return true;
}

int unix_socket_remove_stale(const char *path, const struct sockaddr_un *sa) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return 0;
  if (!S_ISSOCK(st.st_mode))
    return -ENOTSOCK;
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool live = probe >= 0 &&
              connect(probe, (const struct sockaddr *)sa, sizeof *sa) == 0;
  if (probe >= 0)
    close(probe);
  if (live)
    return -EADDRINUSE;
  unlink(path);
  return 0;
}
