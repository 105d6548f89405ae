/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport ctl: one command to a running serve, vhost or mount through
 * its control socket (--control PATH; docs/CONTROL.md).  It reads the
 * greeting, sends {"verb":VERB,"args":[ARG...]}, prints the answer line
 * on stdout and exits 0 when it says "ok":true; otherwise it also names
 * the error on stderr and exits 1. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/control.h"
#include "core/unix-socket.h"

#include "cli.h"
#include "commands.h"

#define MAX_ANSWER (16u << 20) /* bytes in an answer line */

static const char ctl_usage[] =
    "Usage: blockport ctl [OPTIONS] PATH VERB [ARG...]\n"
    "Send one command to a running blockport serve, vhost or mount through\n"
    "its control socket PATH (their --control PATH), and print the answer,\n"
    "one JSON line, on stdout.  Exit 0 when it says \"ok\":true; otherwise\n"
    "the error is also named on stderr, and the exit status is 1.\n"
    "\n"
    "VERB is one of those the process offers: help lists them with their\n"
    "arguments; version; and those of the command (docs/CONTROL.md).\n"
    "\n"
    "  -t, --timeout SECONDS     give up when no answer came for this long,\n"
    "                            0-86400 (default 60; 0: wait forever)\n"
    "  -h, --help                show this help\n";

struct ctl_opts {
  const char *path, *verb;
  char **args;
  int nargs;
  unsigned timeout; /* seconds, 0: none */
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct conn {
  int fd;
  int64_t deadline; /* ms, 0: none */
  char *buf;
  size_t have, cap;
};

/* Wait for EVENTS until the deadline: 0, or -1 (ETIMEDOUT). */
static int wait_for(const struct conn *c, short events) {
  for (;;) {
    int ms = -1;
    if (c->deadline) {
      int64_t left = c->deadline - now_ms();
      if (left <= 0) {
        errno = ETIMEDOUT;
        return -1;
      }
      ms = (int)left;
    }
    struct pollfd p = {.fd = c->fd, .events = events};
    int r = poll(&p, 1, ms);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -1;
  }
}

/* The next line (without its '\n'), NUL-terminated in C->buf and
 * consumed by the next call: its length, or -1 with errno (0 when the
 * server closed the connection first). */
static ssize_t read_line(struct conn *c, size_t *consumed) {
  if (*consumed) {
    memmove(c->buf, c->buf + *consumed, c->have - *consumed);
    c->have -= *consumed;
    *consumed = 0;
  }
  for (size_t scan = 0;;) {
    char *nl =
        c->have > scan ? memchr(c->buf + scan, '\n', c->have - scan) : NULL;
    if (nl) {
      *nl = 0;
      *consumed = (size_t)(nl - c->buf) + 1;
      return nl - c->buf;
    }
    scan = c->have;
    if (c->have + 1 >= c->cap) {
      if (c->cap >= MAX_ANSWER) {
        errno = EMSGSIZE;
        return -1;
      }
      size_t cap = c->cap ? c->cap * 2 : 4096;
      char *n = realloc(c->buf, cap);
      if (!n)
        return -1;
      c->buf = n;
      c->cap = cap;
    }
    if (wait_for(c, POLLIN) < 0)
      return -1;
    ssize_t n = recv(c->fd, c->buf + c->have, c->cap - c->have - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = 0;
      return -1;
    }
    c->have += (size_t)n;
  }
}

static int send_all(struct conn *c, const char *buf, size_t len) {
  while (len) {
    if (wait_for(c, POLLOUT) < 0)
      return -1;
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n < 0)
      return -1;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

static int connect_to(const char *path) {
  struct sockaddr_un sa;
  if (!unix_socket_addr(path, &sa))
    return -1; /* errno ENAMETOOLONG */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* {"verb":VERB,"args":[ARG,...]}\n, or NULL. */
static char *request(const struct ctl_opts *o, size_t *len) {
  char *out = NULL, *s = NULL;
  size_t n = 0, sn = 0, scap = 0;
  FILE *f = open_memstream(&out, &n);
  if (!f)
    return NULL;
  bool good = ctl_json_str(&s, &sn, &scap, o->verb) == 0;
  if (good)
    fprintf(f, "{\"verb\":%s,\"args\":[", s);
  for (int i = 0; good && i < o->nargs; i++) {
    sn = 0;
    good = ctl_json_str(&s, &sn, &scap, o->args[i]) == 0;
    if (good)
      fprintf(f, "%s%s", i ? "," : "", s);
  }
  fputs("]}\n", f);
  free(s);
  if (fclose(f) != 0 || !good) {
    free(out);
    return NULL;
  }
  *len = n;
  return out;
}

/* The answer's "error" member, decoded, or a stand-in. */
static void say_error(const char *line, size_t len, const char *path) {
  char *raw = ctl_json_member(line, len, "error");
  char *msg = raw ? ctl_json_decode_str(raw) : NULL;
  cli_error("ctl", NULL, "%s: %s", path,
            msg ? msg : "the command failed (no message)");
  free(msg);
  free(raw);
}

/* Whether member "ok" of the answer is true. */
static bool answer_ok(const char *line, size_t len) {
  char *ok = ctl_json_member(line, len, "ok");
  bool yes = ok && !strcmp(ok, "true");
  free(ok);
  return yes;
}

static const char *io_error(void) {
  return errno ? strerror(errno) : "the connection was closed";
}

static int run(const struct ctl_opts *o) {
  struct conn c = {.fd = -1};
  if (o->timeout)
    c.deadline = now_ms() + (int64_t)o->timeout * 1000;
  int ret = 1;
  size_t consumed = 0, len;
  char *req = NULL;
  if ((c.fd = connect_to(o->path)) < 0) {
    cli_error("ctl", o->path, "%s", strerror(errno));
    goto out;
  }
  /* The greeting: {"blockport":VERSION,"protocol":N,"verbs":[...]}, or
   * an error answer when the server turns us away. */
  ssize_t n = read_line(&c, &consumed);
  if (n < 0) {
    cli_error("ctl", o->path, "no greeting: %s", io_error());
    goto out;
  }
  char *who = ctl_json_member(c.buf, (size_t)n, "blockport");
  free(who);
  if (!who) {
    char *ok = ctl_json_member(c.buf, (size_t)n, "ok");
    if (ok)
      say_error(c.buf, (size_t)n, o->path);
    else
      cli_error("ctl", o->path, "not a blockport control socket");
    free(ok);
    goto out;
  }
  if (!(req = request(o, &len))) {
    cli_error("ctl", NULL, "out of memory");
    goto out;
  }
  if (send_all(&c, req, len) < 0) {
    cli_error("ctl", o->path, "%s", strerror(errno));
    goto out;
  }
  if ((n = read_line(&c, &consumed)) < 0) {
    cli_error("ctl", o->path, "no answer: %s", io_error());
    goto out;
  }
  printf("%s\n", c.buf);
  fflush(stdout);
  if (answer_ok(c.buf, (size_t)n))
    ret = 0;
  else
    say_error(c.buf, (size_t)n, o->path);
out:
  free(req);
  free(c.buf);
  if (c.fd >= 0)
    close(c.fd);
  return ret;
}

int ctl_main(int argc, char **argv) {
  static const struct option lo[] = {{"timeout", required_argument, NULL, 't'},
                                     {"help", no_argument, NULL, 'h'},
                                     {0, 0, 0, 0}};
  struct ctl_opts o = {.timeout = 60};
  int ch;
  /* '+': options end at PATH, so that an ARG may start with '-'. */
  while ((ch = getopt_long(argc, argv, "+t:h", lo, NULL)) != -1) {
    switch (ch) {
    case 'h': fputs(ctl_usage, stdout); return 0;
    case 't':
      if (cli_parse_uint(optarg, 0, 86400, &o.timeout) < 0) {
        cli_usage_error("ctl", "--timeout %s: expected a number in 0-86400",
                        optarg);
        return 1;
      }
      break;
    default: cli_usage_error("ctl", NULL); return 1;
    }
  }
  if (argc - optind < 2) {
    cli_usage_error("ctl", "%s",
                    argc == optind ? "expected PATH and VERB"
                                   : "expected VERB");
    return 1;
  }
  o.path = argv[optind];
  o.verb = argv[optind + 1];
  o.args = argv + optind + 2;
  o.nargs = argc - optind - 2;
  for (int i = 1; i < argc - optind; i++)
    if (!ctl_utf8_valid(argv[optind + i])) {
      cli_usage_error("ctl", "argument %d is not valid UTF-8", i);
      return 1;
    }
  return run(&o);
}
