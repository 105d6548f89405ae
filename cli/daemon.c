/* SPDX-License-Identifier: BSD-3-Clause */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"

int cli_daemonize(void) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) {
    log_error("pipe: %s", strerror(errno));
    exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    log_error("fork: %s", strerror(errno));
    exit(1);
  }
  if (pid == 0) {
    close(p[0]);
    setsid(); /* no terminal signals from the parent's session */
    return p[1];
  }
  close(p[1]);
  char c;
  ssize_t n;
  while ((n = read(p[0], &c, 1)) < 0 && errno == EINTR)
    ;
  if (n == 1)
    exit(0);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  exit(WIFEXITED(status) && WEXITSTATUS(status) ? WEXITSTATUS(status) : 1);
}

void cli_detach_stdio(const char *log_file) {
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  int log =
      log_file ? open(log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)
               : -1;
  if (log_file && log < 0)
    log_warn("log file %s: %s", log_file, strerror(errno));
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
  }
  dup2(log >= 0 ? log : null, 2);
  if (null > 2)
    close(null);
  if (log > 2)
    close(log);
}

void cli_daemon_ready(int fd) {
  ssize_t r = write(fd, "0", 1);
  (void)r; /* a parent that is gone does not care */
  close(fd);
}
