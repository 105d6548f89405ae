/* SPDX-License-Identifier: BSD-3-Clause */
/* serve --run CMD (nbdkit's captive mode) and serve --fork (qemu-nbd's). */
#include "serve-run.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"

#include "cli.h"
#include "daemon.h"

/* A private directory for the socket when --run names no address, or
 * --unix is "-" (nbdkit's -U -). */
static int private_socket(struct serve_run *r, struct serve_opts *o) {
  const char *tmp = getenv("TMPDIR");
  snprintf(r->dir, sizeof r->dir, "%s/blockport-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(r->dir)) {
    cli_error("serve", NULL, "a private socket directory in %s: %s",
              tmp && *tmp ? tmp : "/tmp", strerror(errno));
    r->dir[0] = '\0';
    return -1;
  }
  snprintf(r->sock, sizeof r->sock, "%s/socket", r->dir);
  o->unix_path = r->sock;
  return 0;
}

int serve_run_prepare(struct serve_run *r, struct serve_opts *o) {
  r->child = -1;
  r->notify_fd = -1;
  atomic_init(&r->reaped, false);
  bool dash = o->unix_path && !strcmp(o->unix_path, "-");
  if ((dash || (r->cmd && !o->unix_path && !o->port && !o->single &&
                !getenv("LISTEN_FDS"))) &&
      private_socket(r, o) < 0)
    return -1;
  if (r->fork)
    r->notify_fd = cli_daemonize(); /* returns in the child */
  return 0;
}

/* 'S' quoted for /bin/sh, appended to the buffer at *P (at most END). */
static void sh_quote(char **p, char *end, const char *s) {
  char *q = *p;
  if (q < end)
    *q++ = '\'';
  for (; *s && q + 4 < end; s++) {
    if (*s == '\'') {
      memcpy(q, "'\\''", 4);
      q += 4;
    } else {
      *q++ = *s;
    }
  }
  if (q < end)
    *q++ = '\'';
  *p = q;
}

static void sh_var(char **p, char *end, const char *name, const char *value) {
  int n = snprintf(*p, (size_t)(end - *p), "%s=", name);
  *p += n > 0 && *p + n < end ? n : 0;
  sh_quote(p, end, value);
  if (*p < end)
    *(*p)++ = '\n';
}

/* NAME for a URI's path: RFC 3986's unreserved characters and '/' as
 * they are, the rest percent-encoded; cut short rather than overflow. */
static void uri_path(const char *name, char *out, size_t len) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                 (*p >= '0' && *p <= '9') || strchr("-._~/", *p);
    if (n + (plain ? 1 : 3) >= len)
      break;
    if (plain) {
      out[n++] = (char)*p;
    } else {
      out[n++] = '%';
      out[n++] = hex[*p >> 4];
      out[n++] = hex[*p & 15];
    }
  }
  out[n] = '\0';
}

/* The URI a client of this server uses: the Unix socket if there is one,
 * else the TCP port on the bound address (localhost when it binds every
 * address); the export -e names, if any. */
static void server_uri(const struct serve_opts *o, char *buf, size_t len) {
  const char *s = o->tls != HS_TLS_OFF ? "nbds" : "nbd";
  char name[3 * 4096 + 1];
  uri_path(o->export_name ? o->export_name : "", name, sizeof name);
  if (o->unix_path) {
    snprintf(buf, len, "%s+unix:///%s?socket=%s", s, name, o->unix_path);
    return;
  }
  const char *host = o->bind_addr;
  if (!host || !*host || !strcmp(host, "0.0.0.0") || !strcmp(host, "::"))
    host = "localhost";
  bool v6 = strchr(host, ':') != NULL;
  snprintf(buf, len, "%s://%s%s%s:%s/%s", s, v6 ? "[" : "", host, v6 ? "]" : "",
           o->port ? o->port : "10809", name);
}

/* The script /bin/sh runs: the variables nbdkit's --run sets, then CMD. */
static char *script(const struct serve_run *r, const struct serve_opts *o) {
  size_t len = strlen(r->cmd) + 65536;
  char *buf = malloc(len), *p = buf, *end = buf + len - 1;
  if (!buf)
    return NULL;
  char uri[16384];
  server_uri(o, uri, sizeof uri);
  const char *tls = o->tls == HS_TLS_REQUIRE ? "2"
                    : o->tls == HS_TLS_ON    ? "1"
                                             : "";
  sh_var(&p, end, "uri", uri);
  sh_var(&p, end, "nbd", uri);
  sh_var(&p, end, "unixsocket", o->unix_path ? o->unix_path : "");
  sh_var(&p, end, "port", o->port ? o->port : "");
  sh_var(&p, end, "exportname", o->export_name ? o->export_name : "");
  sh_var(&p, end, "tls", tls);
  size_t room = (size_t)(end - p);
  snprintf(p, room + 1, "%s", r->cmd);
  return buf;
}

/* Waits for the command; when it is done, asks the server to stop as a
 * SIGTERM would. */
static void *waiter(void *arg) {
  struct serve_run *r = arg;
  int status;
  pid_t p;
  while ((p = waitpid(r->child, &status, 0)) < 0 && errno == EINTR)
    ;
  r->status = p < 0 ? -1 : status;
  atomic_store(&r->reaped, true);
  log_info("--run: the command %s; stopping", p < 0 ? "is lost"
                                              : WIFEXITED(status)
                                                  ? "exited"
                                                  : "was killed");
  kill(getpid(), SIGTERM);
  return NULL;
}

static int start_command(struct serve_run *r, const struct serve_opts *o) {
  char *s = script(r, o);
  if (!s) {
    log_error("--run: out of memory");
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    /* The server blocks these for its signalfd and ignores SIGPIPE; the
     * command must get its signals as usual. */
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    execl("/bin/sh", "sh", "-c", s, (char *)NULL);
    _exit(127);
  }
  free(s);
  if (pid < 0) {
    log_error("--run: fork: %s", strerror(errno));
    return -1;
  }
  r->child = pid;
  if (pthread_create(&r->waiter, NULL, waiter, r) != 0) {
    log_error("--run: cannot start a thread");
    kill(pid, SIGTERM);
    return -1;
  }
  r->waiting = true;
  return 0;
}

int serve_run_ready(struct serve_run *r, const struct serve_opts *o) {
  if (r->pid_file && cli_write_pid_file(r->pid_file) < 0)
    return -1;
  if (r->cmd && start_command(r, o) < 0)
    return -1;
  if (r->notify_fd >= 0) {
    cli_detach_stdio(NULL);
    cli_daemon_ready(r->notify_fd);
    r->notify_fd = -1;
  }
  return 0;
}

int serve_run_finish(struct serve_run *r, int server_status) {
  int ret = server_status;
  if (r->waiting) {
    /* The server stopped first (a signal): the command goes too. */
    if (!atomic_load(&r->reaped))
      kill(r->child, SIGTERM);
    pthread_join(r->waiter, NULL);
    int st = r->status;
    int cmd = st < 0            ? 1
              : WIFEXITED(st)   ? WEXITSTATUS(st)
              : WIFSIGNALED(st) ? 128 + WTERMSIG(st)
                                : 1;
    /* The command's status, unless it succeeded and the server did not
     * (say, the final flush failed). */
    ret = cmd ? cmd : server_status;
  }
  if (r->dir[0])
    rmdir(r->dir);
  return ret;
}
