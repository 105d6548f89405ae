/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's server (core/control.h, docs/CONTROL.md): the
 * listener thread, a thread per client, the built-in verbs.
 *
 * Clients are served by threads of their own, not by the I/O threads, and
 * a client's next line is read only once its request is answered, so a
 * handler may block (drain, flush) without stalling I/O or other
 * clients' reading.  Handlers themselves run one at a time.  Every
 * socket is non-blocking and every wait also watches one eventfd that
 * ctl_stop() sets, so a client that stops reading or writing can hold
 * nothing up for long. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "control.h"
#include "error.h"
#include "io.h"
#include "log.h"
#include "unix-socket.h"
#include "version.h"

struct client {
  struct ctl_server *s;
  int fd;
  pthread_t thread;
  bool used; /* the thread exists (joined at the next accept or stop) */
  bool done; /* the thread has finished */
};

struct ctl_server {
  char *path; /* absolute, for the unlink */
  int lfd, stopfd;
  pthread_t listener;
  const struct ctl_verb *verbs;
  size_t n;
  void *opaque;
  pthread_mutex_t lock; /* clients[] */
  pthread_mutex_t run;  /* handlers one at a time */
  struct client clients[CTL_MAX_CLIENTS];
  char *greeting;
  size_t greeting_len;
  int stall_ms; /* CTL_STALL_MS, or BLOCKPORT_CONTROL_STALL_MS (tests) */
};

/* ---- built-in verbs ---- */

static int help_verb(const struct ctl_request *req, struct ctl_answer *a);
static int version_verb(const struct ctl_request *req, struct ctl_answer *a);

static const struct ctl_verb builtins[] = {
    {"help", 0, 0, "help", "the verbs, with their arguments", help_verb},
    {"version", 0, 0, "version", "the program's version and protocol",
     version_verb},
};
#define NBUILTINS (sizeof builtins / sizeof builtins[0])

static const struct ctl_verb *verb_at(const struct ctl_server *s, size_t i) {
  return i < NBUILTINS ? &builtins[i] : &s->verbs[i - NBUILTINS];
}

static int help_verb(const struct ctl_request *req, struct ctl_answer *a) {
  const struct ctl_server *s = req->opaque;
  ctl_array_begin(a, "verbs");
  for (size_t i = 0; i < NBUILTINS + s->n; i++) {
    const struct ctl_verb *v = verb_at(s, i);
    ctl_object_begin(a);
    ctl_add_str(a, "verb", v->name);
    ctl_add_str(a, "usage", v->usage ? v->usage : v->name);
    ctl_add_str(a, "summary", v->summary ? v->summary : "");
    ctl_add_u64(a, "min_args", v->min_args);
    ctl_add_u64(a, "max_args", v->max_args);
    ctl_object_end(a);
  }
  ctl_array_end(a);
  return 0;
}

static int version_verb(const struct ctl_request *req, struct ctl_answer *a) {
  (void)req;
  ctl_add_str(a, "version", BLOCKPORT_VERSION);
  ctl_add_i64(a, "protocol", CTL_PROTOCOL);
  return 0;
}

static bool good_name(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (!n || n > CTL_MAX_VERB_NAME)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') ||
          (name[i] >= '0' && name[i] <= '9') || name[i] == '-'))
      return false;
  return true;
}

static const struct ctl_verb *find_verb(const struct ctl_server *s,
                                        const char *name) {
  for (size_t i = 0; i < NBUILTINS + s->n; i++)
    if (!strcmp(verb_at(s, i)->name, name))
      return verb_at(s, i);
  return NULL;
}

/* ---- time and sockets ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for EVENTS on FD for at most MS (-1: no limit), or for the stop:
 * 1 ready, 0 timed out, -1 stopping or an error. */
static int wait_fd(const struct ctl_server *s, int fd, short events, int ms) {
  struct pollfd p[2] = {{.fd = fd, .events = events},
                        {.fd = s->stopfd, .events = POLLIN}};
  for (;;) {
    int r = poll(p, 2, ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 || p[1].revents)
      return -1;
    return r > 0 ? 1 : 0;
  }
}

/* Send all of BUF, waiting at most CTL_STALL_MS in all for a client that
 * does not read.  0, or -1 (the client is to be dropped). */
static int send_all(const struct ctl_server *s, int fd, const char *buf,
                    size_t len) {
  int64_t deadline = now_ms() + s->stall_ms;
  while (len) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      buf += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      return -1;
    int64_t left = deadline - now_ms();
    if (left <= 0 || wait_fd(s, fd, POLLOUT, (int)left) <= 0)
      return -1;
  }
  return 0;
}

/* An error answer that no request asked for (ID NULL) or one that could
 * not be parsed. */
static int send_error(const struct ctl_server *s, int fd, const char *id,
                      int err, const char *msg) {
  struct ctl_answer *a = ctl_answer_new(id);
  if (!a)
    return -1;
  ctl_fail(a, err, "%s", msg);
  size_t len;
  const char *line = ctl_answer_finish(a, &len);
  int r = line ? send_all(s, fd, line, len) : -1;
  ctl_answer_free(a);
  return r;
}

/* ---- one request ---- */

/* Answer the request LINE (LEN bytes, no '\n').  0, or -1 to drop the
 * client (it does not read its answers). */
static int handle_line(struct ctl_server *s, int fd, char *line, size_t len) {
  if (len && line[len - 1] == '\r')
    len--;
  size_t blank = 0;
  while (blank < len && (line[blank] == ' ' || line[blank] == '\t'))
    blank++;
  if (blank == len)
    return 0; /* an empty line: nothing asked */
  struct ctl_request req;
  char err[256];
  if (ctl_parse_request(line, len, &req, err, sizeof err) < 0) {
    int r = send_error(s, fd, req.id, EINVAL, err);
    ctl_request_free(&req);
    return r;
  }
  const struct ctl_verb *v = find_verb(s, req.verb);
  char msg[256];
  int r;
  if (!v) {
    snprintf(msg, sizeof msg, "unknown verb '%.64s' (try help)", req.verb);
    r = send_error(s, fd, req.id, ENOSYS, msg);
  } else if (req.nargs < v->min_args || req.nargs > v->max_args) {
    snprintf(msg, sizeof msg, "%s takes %u to %u arguments, not %zu; usage: %s",
             v->name, v->min_args, v->max_args, req.nargs,
             v->usage ? v->usage : v->name);
    if (v->min_args == v->max_args)
      snprintf(msg, sizeof msg, "%s takes %u argument%s, not %zu; usage: %s",
               v->name, v->min_args, v->min_args == 1 ? "" : "s", req.nargs,
               v->usage ? v->usage : v->name);
    r = send_error(s, fd, req.id, EINVAL, msg);
  } else {
    struct ctl_answer *a = ctl_answer_new(req.id);
    if (!a) {
      ctl_request_free(&req);
      return send_error(s, fd, NULL, ENOMEM, "out of memory");
    }
    bool builtin = v >= builtins && v < builtins + NBUILTINS;
    req.opaque = builtin ? (void *)s : s->opaque;
    pthread_mutex_lock(&s->run);
    int hr = v->handler(&req, a);
    pthread_mutex_unlock(&s->run);
    if (hr < 0 && !ctl_answer_failed(a))
      ctl_fail(a, -hr, "%s", strerror(-hr));
    if (hr < 0 || ctl_answer_failed(a))
      log_debug("control: %s: failed", v->name);
    size_t alen;
    const char *out = ctl_answer_finish(a, &alen);
    r = out ? send_all(s, fd, out, alen) : -1;
    ctl_answer_free(a);
  }
  ctl_request_free(&req);
  return r;
}

/* ---- a client ---- */

/* Serve FD until it leaves, stalls mid-request, stops reading, or the
 * server stops. */
static void serve_client(struct ctl_server *s, int fd) {
  if (send_all(s, fd, s->greeting, s->greeting_len) < 0)
    return;
  /* One request and its '\n', or the part of a longer one that shows it
   * is too long. */
  char *buf = malloc(CTL_MAX_LINE + 1);
  if (!buf)
    return;
  size_t have = 0;
  bool discard = false; /* in a line that was too long: drop to its end */
  int64_t since = 0;    /* when the partial line began */
  for (;;) {
    int ms = -1;
    if (have || discard) {
      int64_t left = since + s->stall_ms - now_ms();
      ms = left > 0 ? (int)left : 0;
    }
    int w = wait_fd(s, fd, POLLIN, ms);
    if (w < 0)
      break;
    if (w == 0) {
      char msg[96];
      snprintf(msg, sizeof msg,
               "request incomplete for %d ms; closing the connection",
               s->stall_ms);
      send_error(s, fd, NULL, ETIMEDOUT, msg);
      break;
    }
    ssize_t n = recv(fd, buf + have, CTL_MAX_LINE + 1 - have, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (n <= 0)
      break; /* gone (a partial request is dropped, never executed) */
    if (!have && !discard)
      since = now_ms();
    size_t start = have;
    have += (size_t)n;
    size_t done = 0; /* bytes of BUF consumed */
    bool drop = false;
    for (size_t i = start; i < have && !drop; i++) {
      if (buf[i] != '\n')
        continue;
      if (discard)
        discard = false;
      else if (handle_line(s, fd, buf + done, i - done) < 0)
        drop = true;
      done = i + 1;
    }
    if (drop)
      break;
    memmove(buf, buf + done, have - done);
    have -= done;
    if (discard) {
      have = 0; /* still in the long line */
    } else if (have == CTL_MAX_LINE + 1) {
      char msg[96];
      snprintf(msg, sizeof msg,
               "request longer than %d bytes; discarded up to its newline",
               CTL_MAX_LINE);
      if (send_error(s, fd, NULL, EMSGSIZE, msg) < 0)
        break;
      discard = true;
      have = 0;
    }
    if (done)
      since = now_ms(); /* what is left began after the last line */
  }
  free(buf);
}

static void *client_thread(void *arg) {
  struct client *c = arg;
  struct ctl_server *s = c->s;
  serve_client(s, c->fd);
  close(c->fd);
  pthread_mutex_lock(&s->lock);
  c->done = true;
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Threads the control server makes take no signals: the program's own
 * threads (signalfd, sigwait) do. */
static int spawn(pthread_t *t, void *(*fn)(void *), void *arg,
                 const char *name) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = pthread_create(t, NULL, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r == 0)
    pthread_setname_np(*t, name);
  return r;
}

/* Join the clients that have finished (under s->lock), or with ALL every
 * one (after the listener has stopped, without the lock). */
static void reap(struct ctl_server *s, bool all) {
  for (size_t i = 0; i < CTL_MAX_CLIENTS; i++) {
    struct client *c = &s->clients[i];
    if (c->used && (c->done || all)) {
      pthread_join(c->thread, NULL);
      c->used = c->done = false;
    }
  }
}

static void accept_one(struct ctl_server *s) {
  int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE) {
      log_warn("control socket: %s", strerror(errno));
      wait_fd(s, -1, 0, 100); /* do not spin on it */
    }
    return;
  }
  pthread_mutex_lock(&s->lock);
  reap(s, false);
  struct client *c = NULL;
  for (size_t i = 0; i < CTL_MAX_CLIENTS && !c; i++)
    if (!s->clients[i].used)
      c = &s->clients[i];
  if (c) {
    *c = (struct client){.s = s, .fd = fd, .used = true};
    if (spawn(&c->thread, client_thread, c, "bp-ctl-client") != 0) {
      c->used = false;
      c = NULL;
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (!c) {
    char msg[96];
    snprintf(msg, sizeof msg, "too many control clients (at most %d)",
             CTL_MAX_CLIENTS);
    /* Best effort, without waiting (the listener must not): the line
     * fits any socket buffer. */
    struct ctl_answer *a = ctl_answer_new(NULL);
    size_t len;
    const char *line = NULL;
    if (a) {
      ctl_fail(a, EBUSY, "%s", msg);
      line = ctl_answer_finish(a, &len);
    }
    if (line && send(fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
      log_debug("control: %s", strerror(errno));
    ctl_answer_free(a);
    close(fd);
  }
}

static void *listener_thread(void *arg) {
  struct ctl_server *s = arg;
  while (wait_fd(s, s->lfd, POLLIN, -1) >= 0)
    accept_one(s);
  return NULL;
}

/* ---- start and stop ---- */

static int listen_at(const char *path) {
  struct sockaddr_un sa;
  if (!unix_socket_addr(path, &sa)) {
    bd_set_error("control socket path too long: %s", path);
    return -1;
  }
  /* Only a socket left by a process that is gone is replaced. */
  int r = unix_socket_remove_stale(path, &sa);
  if (r == -ENOTSOCK)
    bd_set_error("control socket %s: exists and is not a socket", path);
  else if (r < 0)
    bd_set_error("control socket %s: another process is listening there", path);
  if (r < 0)
    return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    bd_set_error("control socket: %s", strerror(errno));
    return -1;
  }
  /* 0600 before listen(): nobody connects in between. */
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    bd_set_error("control socket %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (chmod(path, 0600) < 0 || listen(fd, CTL_MAX_CLIENTS) < 0) {
    bd_set_error("control socket %s: %s", path, strerror(errno));
    unlink(path);
    close(fd);
    return -1;
  }
  return fd;
}

/* {"blockport":VERSION,"protocol":1,"verbs":[...]} */
static int make_greeting(struct ctl_server *s) {
  struct ctl_answer *a = ctl_answer_new(NULL);
  if (!a)
    return -1;
  const char **names = calloc(NBUILTINS + s->n, sizeof *names);
  for (size_t i = 0; names && i < NBUILTINS + s->n; i++)
    names[i] = verb_at(s, i)->name;
  ctl_add_str(a, "blockport", BLOCKPORT_VERSION);
  ctl_add_i64(a, "protocol", CTL_PROTOCOL);
  if (names)
    ctl_add_strv(a, "verbs", names, NBUILTINS + s->n);
  free(names);
  size_t len;
  const char *line =
      names && !ctl_answer_failed(a) ? ctl_answer_finish(a, &len) : NULL;
  /* The answer's '{"ok":true,' is not the greeting's: drop it. */
  static const char ok[] = "{\"ok\":true,";
  if (line && len > sizeof ok - 1 && !strncmp(line, ok, sizeof ok - 1) &&
      asprintf(&s->greeting, "{%s", line + sizeof ok - 1) >= 0)
    s->greeting_len = len - (sizeof ok - 1) + 1;
  ctl_answer_free(a);
  return s->greeting ? 0 : -1;
}

static int check_verbs(const struct ctl_verb *verbs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const struct ctl_verb *v = &verbs[i];
    if (!good_name(v->name) || !v->handler || v->min_args > v->max_args ||
        v->max_args > CTL_MAX_ARGS) {
      bd_set_error("control: bad verb '%s'", v->name ? v->name : "(null)");
      return -1;
    }
    bool dup = false;
    for (size_t j = 0; j < NBUILTINS; j++)
      dup |= !strcmp(builtins[j].name, v->name);
    for (size_t j = 0; j < i; j++)
      dup |= !strcmp(verbs[j].name, v->name);
    if (dup) {
      bd_set_error("control: verb '%s' given twice", v->name);
      return -1;
    }
  }
  return 0;
}

struct ctl_server *ctl_start(const char *path, const struct ctl_verb *verbs,
                             size_t n, void *opaque) {
  if (check_verbs(verbs, n) < 0)
    return NULL;
  struct ctl_server *s = calloc(1, sizeof *s);
  if (!s || !(s->path = io_absolute_path(path))) {
    free(s);
    bd_set_error("control socket: out of memory");
    return NULL;
  }
  s->verbs = verbs;
  s->n = n;
  s->opaque = opaque;
  s->lfd = s->stopfd = -1;
  /* The tests' way to see the stall time-out without waiting 30 s. */
  const char *stall = getenv("BLOCKPORT_CONTROL_STALL_MS");
  long ms = stall ? strtol(stall, NULL, 10) : 0;
  s->stall_ms = ms > 0 && ms <= CTL_STALL_MS ? (int)ms : CTL_STALL_MS;
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->run, NULL);
  if (make_greeting(s) < 0) {
    bd_set_error("control socket: out of memory");
    goto fail;
  }
  if ((s->stopfd = eventfd(0, EFD_CLOEXEC)) < 0) {
    bd_set_error("control socket: eventfd: %s", strerror(errno));
    goto fail;
  }
  if ((s->lfd = listen_at(path)) < 0)
    goto fail;
  if (spawn(&s->listener, listener_thread, s, "bp-control") != 0) {
    bd_set_error("control socket: cannot start its thread");
    unlink(path);
    goto fail;
  }
  log_info("control socket: %s", s->path);
  return s;
fail:
  if (s->lfd >= 0)
    close(s->lfd);
  if (s->stopfd >= 0)
    close(s->stopfd);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->run);
  free(s->greeting);
  free(s->path);
  free(s);
  return NULL;
}

void ctl_stop(struct ctl_server *s) {
  if (!s)
    return;
  uint64_t one = 1;
  if (write(s->stopfd, &one, sizeof one) < 0)
    log_warn("control socket: %s", strerror(errno));
  pthread_join(s->listener, NULL);
  close(s->lfd);
  unlink(s->path);
  /* The listener is gone: nobody else touches the slots now, and a
   * finishing client takes s->lock, so join without holding it. */
  reap(s, true);
  close(s->stopfd);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->run);
  free(s->greeting);
  free(s->path);
  free(s);
}
