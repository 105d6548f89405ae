/* SPDX-License-Identifier: BSD-3-Clause */
/* Readiness notification without libsystemd.  See notify.h. */
#include "notify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "blockdev.h"
#include "log.h"

int notify_parse_addr(const char *spec, struct sockaddr_un *sa,
                      socklen_t *len) {
  size_t n = strlen(spec);
  *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
  if (spec[0] != '/' && spec[0] != '@') {
    bd_set_error(
        "NOTIFY_SOCKET=%s: neither an absolute path nor '@' (abstract)", spec);
    return -EINVAL;
  }
  if (n < 2 || n > sizeof sa->sun_path - (spec[0] == '/')) {
    bd_set_error("NOTIFY_SOCKET=%s: bad length", spec);
    return -EINVAL;
  }
  memcpy(sa->sun_path, spec, n);
  if (spec[0] == '@')
    sa->sun_path[0] = '\0'; /* abstract: no terminator, length says it */
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                     (spec[0] == '/'));
  return 0;
}

static struct {
  int fd; /* -1: no service manager to tell */
  struct sockaddr_un sa;
  socklen_t len;
} notify = {.fd = -1};

int notify_init(void) {
  const char *spec = getenv("NOTIFY_SOCKET");
  if (!spec || notify.fd >= 0)
    return 0;
  int r = notify_parse_addr(spec, &notify.sa, &notify.len);
  if (r == 0 &&
      (notify.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
    r = -errno;
    bd_set_error("NOTIFY_SOCKET: %s", strerror(-r));
  }
  unsetenv("NOTIFY_SOCKET");
  return r;
}

void notify_send(const char *msg) {
  if (notify.fd < 0)
    return;
  ssize_t r;
  do
    r = sendto(notify.fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT,
               (struct sockaddr *)&notify.sa, notify.len);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    char first[32];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(msg, "\n"), msg);
    log_warn("NOTIFY_SOCKET: sending %s: %s", first, strerror(errno));
  }
}
