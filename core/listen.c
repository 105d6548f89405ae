/* SPDX-License-Identifier: BSD-3-Clause */
/* Socket activation without libsystemd.  See listen.h. */
#include "listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "blockdev.h"
#include "log.h"

/* A decimal number without sign, spaces or trailing junk. */
static bool parse_decimal(const char *s, long max, long *out) {
  if (!s || *s < '0' || *s > '9')
    return false;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v > max)
    return false;
  *out = v;
  return true;
}

int listen_env_parse(const char *listen_pid, const char *listen_fds, pid_t self,
                     int max) {
  long pid, n;
  if (!listen_pid || !listen_fds)
    return 0;
  if (!parse_decimal(listen_pid, 0x7fffffff, &pid)) {
    bd_set_error("LISTEN_PID=%s is not a process id", listen_pid);
    return -EINVAL;
  }
  if (pid != (long)self)
    return 0; /* meant for another process, e.g. our parent */
  if (!parse_decimal(listen_fds, 0x7fffffff, &n)) {
    bd_set_error("LISTEN_FDS=%s is not a number", listen_fds);
    return -EINVAL;
  }
  if (n > max) {
    bd_set_error("LISTEN_FDS=%ld: at most %d sockets are supported", n, max);
    return -EINVAL;
  }
  return (int)n;
}

int listen_fd_check(int fd) {
  int type = 0, listening = 0, domain = 0;
  socklen_t l1 = sizeof type, l2 = sizeof listening, l3 = sizeof domain;
  if (fcntl(fd, F_GETFD) < 0) {
    int e = errno;
    bd_set_error("fd %d: %s", fd, strerror(e));
    return -e;
  }
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l1) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l2) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l3) < 0) {
    int e = errno;
    bd_set_error("fd %d is not a socket: %s", fd, strerror(e));
    return -e;
  }
  const char *why = NULL;
  if (domain != AF_UNIX && domain != AF_INET && domain != AF_INET6)
    why = "not a Unix, IPv4 or IPv6 socket";
  else if (type != SOCK_STREAM)
    why = "not a stream socket (use ListenStream=)";
  else if (!listening)
    why = "not listening (Accept=yes is not supported)";
  if (why) {
    bd_set_error("fd %d: %s", fd, why);
    return -EINVAL;
  }
  return 0;
}

static int take_fd(int fd) {
  int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
  if (fl < 0 || fdfl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
      fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0) {
    int e = errno;
    bd_set_error("socket activation: fd %d: %s", fd, strerror(e));
    return -e;
  }
  return 0;
}

/* Prefix the message of the failure just reported with "socket activation". */
static int activation_error(int err) {
  char why[256];
  snprintf(why, sizeof why, "%s", bd_errmsg()); /* bd_set_error overwrites */
  bd_set_error("socket activation: %s", why);
  return err;
}

int listen_fds_take(int *fds, int max) {
  int n = listen_env_parse(getenv("LISTEN_PID"), getenv("LISTEN_FDS"), getpid(),
                           max);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (n < 0)
    return activation_error(n);
  for (int i = 0; i < n; i++) {
    int fd = LISTEN_FDS_START + i, r = listen_fd_check(fd);
    if (r < 0)
      return activation_error(r);
    if ((r = take_fd(fd)) < 0)
      return r;
    fds[i] = fd;
  }
  return n;
}

void listen_fd_describe(int fd, char *out, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
    snprintf(out, len, "fd %d", fd);
  } else if (ss.ss_family == AF_UNIX) {
    const struct sockaddr_un *su = (const struct sockaddr_un *)&ss;
    size_t pl = sl > offsetof(struct sockaddr_un, sun_path)
                    ? sl - offsetof(struct sockaddr_un, sun_path)
                    : 0;
    /* An abstract address starts with a NUL; show it as '@'. */
    if (pl > 0 && su->sun_path[0] == '\0')
      snprintf(out, len, "unix @%.*s", (int)pl - 1, su->sun_path + 1);
    else
      snprintf(out, len, "unix %.*s", (int)strnlen(su->sun_path, pl),
               su->sun_path);
  } else if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, serv,
                         sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    snprintf(out, len, ss.ss_family == AF_INET6 ? "tcp [%s]:%s" : "tcp %s:%s",
             host, serv);
  } else {
    snprintf(out, len, "fd %d", fd);
  }
}
