/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD server running: exports, listening sockets, the accept loop,
 * reloads on SIGHUP and an orderly shutdown on SIGTERM/SIGINT.  The
 * command line is cli/serve.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "access.h"
#include "checkpoints.h"
#include "config.h"
#include "core/blockdev.h"
#include "core/control.h"
#include "core/listen.h"
#include "core/log.h"
#include "core/notify.h"
#include "core/pool.h"
#include "core/unix-socket.h"
#include "exports.h"
#include "metrics.h"
#include "nbd-protocol.h"
#include "server.h"
#include "tls.h"

#define MAX_LISTENERS 16
/* How long a connection may stay after shutdown begins: its client sees
 * ESHUTDOWN on its next request and disconnects; an idle one is closed. */
#define SHUTDOWN_GRACE_MS 2000

/* ---- exports ---- */

/* Whether --readonly-export NAME means export E: its name, or "" for the
 * default export (whatever its own name). */
static bool ro_name_means(const char *name, const struct export_conf *e) {
  return !strcmp(name, e->name) || (!*name && e->is_default);
}

/* Whether export E must refuse writes. */
static bool export_readonly(const struct serve_opts *o,
                            const struct export_conf *e) {
  for (size_t i = 0; i < o->n_ro_exports; i++)
    if (ro_name_means(o->ro_exports[i], e))
      return true;
  return o->readonly;
}

/* Every --readonly-export must name an export: ignoring one would leave
 * writable what the user meant to protect.  Checked before any image is
 * opened.  A plugin's exports are known only once it is loaded: exports.c
 * checks those names. */
static int check_ro_names(const struct serve_opts *o, const struct config *cf) {
  for (size_t k = 0; k < o->n_ro_exports && !o->plugin; k++) {
    const char *name = o->ro_exports[k];
    size_t i = 0;
    while (i < cf->n && !ro_name_means(name, &cf->v[i]))
      i++;
    if (i == cf->n) {
      log_error("--readonly-export '%s': no %s %s%s", name,
                *name ? "such export" : "default export",
                o->config ? "in " : "on the command line",
                o->config ? o->config : "");
      return -1;
    }
  }
  return 0;
}

/* -B NAME...: the bitmaps every command-line export offers. */
static int copy_bitmaps(const struct serve_opts *o, struct export_conf *e) {
  if (!o->n_bitmaps)
    return 0;
  e->bitmaps = calloc(o->n_bitmaps, sizeof *e->bitmaps);
  for (size_t i = 0; e->bitmaps && i < o->n_bitmaps; i++) {
    if (!(e->bitmaps[i] = strdup(o->bitmaps[i])))
      return -1;
    e->nbitmaps = i + 1;
  }
  return e->bitmaps ? 0 : -1;
}

/* The command line's IMAGE... as a configuration: NAME=PATH or PATH, the
 * first also the default export. */
static int config_from_args(char **images, int n, const struct serve_opts *o,
                            struct config *cf) {
  cf->v = calloc((size_t)n, sizeof *cf->v);
  if (!cf->v)
    return -1;
  for (int i = 0; i < n; i++) {
    const char *img = images[i], *eq = strchr(img, '=');
    /* NAME=PATH, unless the '=' is part of a path (after a '/'). */
    const char *slash = strchr(img, '/');
    bool named = !o->plugin && eq && (!slash || eq < slash);
    struct export_conf *e = &cf->v[i];
    cf->n = (size_t)i + 1; /* so config_free() frees it on error */
    /* Unnamed images after the first are named after their path. */
    const char *first = o->export_name && !o->plugin ? o->export_name : "";
    e->name =
        named ? strndup(img, (size_t)(eq - img)) : strdup(i > 0 ? img : first);
    e->path = strdup(named ? eq + 1 : img);
    e->is_default = i == 0;
    e->description = o->description ? strdup(o->description) : NULL;
    if (!e->name || !e->path || (o->description && !e->description))
      return -1;
    /* A plugin's device serves its listed exports too: it stays writable
     * and exports.c makes the named exports read-only. */
    e->readonly = o->plugin ? o->readonly : export_readonly(o, e);
    if (copy_bitmaps(o, e) < 0)
      return -1;
    for (int j = 0; j < i; j++) {
      if (strcmp(cf->v[j].name, e->name) == 0) {
        log_error("export name '%s' is used twice", e->name);
        return -1;
      }
    }
  }
  return check_ro_names(o, cf);
}

/* Read the config file.  Returns 0, or -1 with the reason logged. */
static int config_read(const struct serve_opts *o, struct config *cf) {
  if (config_load(o->config, cf) < 0) {
    log_error("%s", bd_errmsg());
    return -1;
  }
  for (size_t i = 0; i < cf->n; i++)
    cf->v[i].readonly |= export_readonly(o, &cf->v[i]);
  if (check_ro_names(o, cf) < 0) {
    config_free(cf);
    return -1;
  }
  return 0;
}

/* Open what CF declares and make it current. */
static int exports_open(struct server *srv, const struct config *cf,
                        const struct serve_opts *o) {
  struct exports_opts eo = {.format = o->open ? o->open->format : NULL,
                            .readonly = o->readonly,
                            .share = o->force_share,
                            .ro_names = o->ro_exports,
                            .n_ro_names = o->n_ro_exports,
                            .plugin = o->plugin,
                            .file = o->config};
  char err[1024];
  struct export_set *s = exports_build(srv, cf, &eo, err, sizeof err, o->open);
  if (!s) {
    log_error("%s", err);
    return -1;
  }
  exports_install(srv, s);
  return 0;
}

/* Exports with TLS required need TLS on: checked at every load. */
static int check_config_tls(const struct server *srv, const struct config *cf,
                            const char *file) {
  for (size_t i = 0; srv->tls == HS_TLS_OFF && i < cf->n; i++) {
    if (cf->v[i].tls_required) {
      log_error("%s:%u: export '%s' requires TLS, but the server runs "
                "without it (--tls on and credentials)",
                file, cf->v[i].line, cf->v[i].name);
      return -1;
    }
  }
  return 0;
}

/* Names in A that are not in B, for the reload's log line. */
static void names_missing(const struct export_set *a,
                          const struct export_set *b, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < a->n && used + 1 < len; i++) {
    if (exports_find(b, a->v[i].name) >= 0)
      continue;
    int w = snprintf(out + used, len - used, " '%.100s'", a->v[i].name);
    if (w < 0)
      break;
    used += (size_t)w;
  }
}

/* SIGHUP, the exports: read the file again; keep serving the old exports
 * unless all of the new ones could be opened. */
static bool reload_exports(struct server *srv, const struct serve_opts *o) {
  struct config cf = {0};
  pthread_mutex_lock(&srv->rebuild_lock);
  struct export_set *old = exports_get(srv);
  bool ok = config_read(o, &cf) == 0 &&
            check_config_tls(srv, &cf, o->config) == 0 &&
            exports_open(srv, &cf, o) == 0;
  if (ok) {
    struct config keep = *srv->cf; /* the new one is current from now */
    *srv->cf = cf;
    cf = keep;
  }
  pthread_mutex_unlock(&srv->rebuild_lock);
  if (ok) {
    struct export_set *now = exports_get(srv);
    char added[512], removed[512];
    names_missing(now, old, added, sizeof added);
    names_missing(old, now, removed, sizeof removed);
    log_info("reloaded %s: %zu export%s; added:%s; removed:%s", o->config,
             now->n, now->n == 1 ? "" : "s", *added ? added : " none",
             *removed ? removed : " none");
    exports_put(srv, now);
  }
  exports_put(srv, old);
  config_free(&cf);
  return ok;
}

/* SIGHUP: the TLS credentials (renewed certificates, a new CRL) and the
 * config file, all or nothing.  New clients get what was loaded; clients
 * already connected keep what they negotiated with. */
static void reload(struct server *srv, const struct serve_opts *o) {
  if (!o->config && srv->tls == HS_TLS_OFF) {
    log_info("SIGHUP: nothing to reload (no --config, no TLS)");
    return;
  }
  notify_send("RELOADING=1\nSTATUS=Reloading the configuration");
  struct tls_creds *cr = NULL;
  if (srv->tls != HS_TLS_OFF &&
      !(cr = tls_creds_load(o->tls_certs, o->tls_verify_peer, o->tls_psk))) {
    log_error("%s", bd_errmsg());
    log_error("reload: TLS credentials cannot be loaded; keeping the "
              "current ones%s",
              o->config ? " and the current exports" : "");
  } else if (o->config && !reload_exports(srv, o))
    log_error("reload of %s failed; keeping the current configuration%s",
              o->config, cr ? " and TLS credentials" : "");
  else if (cr) {
    pthread_mutex_lock(&srv->lock);
    struct tls_creds *old = srv->tls_creds;
    srv->tls_creds = tls_creds_ref(cr);
    pthread_mutex_unlock(&srv->lock);
    tls_creds_put(old);
    log_info("reloaded the TLS credentials");
  }
  tls_creds_put(cr);
  char msg[200];
  snprintf(msg, sizeof msg, "READY=1\nSTATUS=Serving %zu export%s",
           srv->current->n, srv->current->n == 1 ? "" : "s");
  notify_send(msg);
}

/* Reloads run on their own thread: opening a new export can take a while
 * (an nbd:// server that is slow to answer), and the accept loop must not
 * wait for it.  Signals that arrive during a reload ask for one more. */
struct reloader {
  struct server *srv;
  const struct serve_opts *o;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool pending, stop;
  pthread_t thread;
};

static void *reload_thread(void *arg) {
  struct reloader *r = arg;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->pending && !r->stop)
      pthread_cond_wait(&r->cond, &r->lock);
    if (r->stop)
      break;
    r->pending = false;
    pthread_mutex_unlock(&r->lock);
    reload(r->srv, r->o);
    pthread_mutex_lock(&r->lock);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

static void reloader_poke(struct reloader *r, bool stop) {
  pthread_mutex_lock(&r->lock);
  r->pending |= !stop;
  r->stop |= stop;
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

/* ---- listening ---- */

/* Only a socket left by a server that is gone is replaced.  WHO names
 * the socket in messages ("--unix PATH"). */
static int clear_path(const char *who, const char *path,
                      const struct sockaddr_un *sa) {
  int r = unix_socket_remove_stale(path, sa);
  if (r == -ENOTSOCK)
    log_error("%s: exists and is not a socket; not replacing it", who);
  else if (r < 0)
    log_error("%s: another server is listening there", who);
  return r;
}

int server_listen_unix(const char *opt, const char *path, int mode) {
  char who[PATH_MAX + 32];
  snprintf(who, sizeof who, "%s%s%s", opt ? opt : "", opt ? " " : "", path);
  struct sockaddr_un sa;
  if (!unix_socket_addr(path, &sa)) {
    log_error("%s: socket path too long (at most %zu bytes)", who,
              sizeof sa.sun_path - 1);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (clear_path(who, path, &sa) < 0) {
    close(fd);
    return -1;
  }
  /* The mode is set before listen(): nobody connects in between. */
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      (mode >= 0 && chmod(path, (mode_t)mode) < 0) ||
      listen(fd, SOMAXCONN) < 0) {
    log_error("%s: %s", who,
              errno == ENOENT ? "no such directory" : strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* One listening TCP socket for AI, or -errno. */
static int listen_one(const struct addrinfo *ai) {
  int fd =
      socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0)
    return -errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* IPv4 and IPv6 wildcards on one port: each socket its own family. */
  if (ai->ai_family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* A host without IPv6 cannot listen on "::".  That is no reason to fail
 * when the user asked for no address: the IPv4 half serves. */
static bool no_ipv6_here(const struct addrinfo *ai, int err) {
  return ai->ai_family == AF_INET6 &&
         (err == EAFNOSUPPORT || err == EADDRNOTAVAIL ||
          err == EPROTONOSUPPORT);
}

/* Where the TCP sockets go, as the options said: ADDR (NULL: the IPv4
 * and IPv6 wildcards) and PORT, which may be the default. */
struct tcp_where {
  const char *addr, *port;
  bool port_default;
};

/* Why AI could not listen (ERR), naming the option to change: --bind
 * for an address this host does not have, else --port. */
static void log_listen_failure(const struct tcp_where *w,
                               const struct addrinfo *ai, int err) {
  bool v6 = ai->ai_family == AF_INET6;
  char host[NI_MAXHOST] = "?";
  getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof host, NULL, 0,
              NI_NUMERICHOST);
  if (w->addr && err != EADDRINUSE && err != EACCES)
    log_error("--bind %s: cannot listen on %s%s%s port %s: %s", w->addr,
              v6 ? "[" : "", host, v6 ? "]" : "", w->port, strerror(err));
  else
    log_error("--port %s%s: cannot listen on %s%s%s: %s", w->port,
              w->port_default ? " (the default)" : "", v6 ? "[" : "", host,
              v6 ? "]" : "", strerror(err));
}

/* Resolve W: its addresses in *RES, or -1 (logged, naming the option). */
static int resolve_tcp(const struct tcp_where *w, struct addrinfo **res) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_ADDRCONFIG};
  int r = getaddrinfo(w->addr, w->port, &hints, res);
  if (r == 0)
    return 0;
  if (w->addr)
    log_error("--bind %s: %s", w->addr, gai_strerror(r));
  else
    log_error("--port %s: %s", w->port, gai_strerror(r));
  return -1;
}

/* Listen on every address of W.  Every one must work: a server that says
 * "ready" while one of its addresses belongs to another program would
 * send that program's clients away.  Returns the number of sockets in
 * FDS, or -1 (logged). */
static int listen_tcp(const struct tcp_where *w, int *fds, int max) {
  struct addrinfo *res;
  if (resolve_tcp(w, &res) < 0)
    return -1;
  int n = 0;
  bool failed = false;
  for (struct addrinfo *ai = res; ai && !failed; ai = ai->ai_next) {
    int fd = n < max ? listen_one(ai) : -EMFILE;
    if (fd >= 0) {
      fds[n++] = fd;
    } else if (!w->addr && no_ipv6_here(ai, -fd)) {
      log_warn("cannot listen on [::] port %s: %s; IPv4 only", w->port,
               strerror(-fd));
    } else {
      log_listen_failure(w, ai, -fd);
      failed = true;
    }
  }
  freeaddrinfo(res);
  if (!failed && n == 0)
    log_error("--bind %s: no address to listen on", w->addr ? w->addr : "*");
  if (failed || n == 0) {
    for (int i = 0; i < n; i++)
      close(fds[i]);
    return -1;
  }
  return n;
}

static void describe_peer(int fd, const struct sockaddr_storage *ss, char *out,
                          size_t len) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (ss->ss_family == AF_UNIX) {
    snprintf(out, len, "unix:fd%d", fd);
  } else if (getnameinfo((const struct sockaddr *)ss, sizeof *ss, host,
                         sizeof host, serv, sizeof serv,
                         NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    snprintf(out, len, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host,
             serv);
  } else {
    snprintf(out, len, "?");
  }
}

/* Serve FD, a client from SS, unless the limits or --allow refuse it. */
static void admit(struct server *srv, int fd,
                  const struct sockaddr_storage *sp) {
  struct sockaddr_storage ss = *sp;
  char peer[80];
  describe_peer(fd, &ss, peer, sizeof peer);
  pthread_mutex_lock(&srv->lock);
  bool full = srv->nconns >= srv->limits.max_connections;
  pthread_mutex_unlock(&srv->lock);
  if (full) {
    log_warn("refusing %s: %u connections already", peer,
             srv->limits.max_connections);
    if (srv->metrics)
      metrics_conn_refused(srv->metrics, METRICS_REFUSED_MAX_CONNECTIONS);
    close(fd);
    return;
  }
  /* Refused here, before any thread or buffer is spent on it. */
  if (ss.ss_family != AF_UNIX &&
      !acl_allows(srv->allow, srv->nallow, (struct sockaddr *)&ss)) {
    log_info("refusing %s: not in --allow", peer);
    if (srv->metrics)
      metrics_conn_refused(srv->metrics, METRICS_REFUSED_ALLOW_LIST);
    close(fd);
    return;
  }
  if (ss.ss_family != AF_UNIX) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  conn_start(srv, fd, peer, &ss);
}

static void accept_one(struct server *srv, int lfd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      log_warn("accept: %s", strerror(errno));
    return;
  }
  admit(srv, fd, &ss);
}

/* Take the sockets systemd passed, if any.  Returns their number, or -1
 * (an error, or a usage error: options that conflict with them). */
static int take_activated(const struct serve_opts *o, int *lfds) {
  int n = listen_fds_take(lfds, MAX_LISTENERS);
  if (n < 0)
    log_error("%s", bd_errmsg());
  if (n <= 0)
    return n < 0 ? -1 : 0;
  const char *opt = o->unix_path        ? "--unix"
                    : o->single         ? "--single"
                    : o->port           ? "--port"
                    : o->bind_addr      ? "--bind"
                    : o->unix_mode >= 0 ? "--unix-mode"
                                        : NULL;
  if (opt) {
    log_error("%s cannot be used with socket activation (LISTEN_FDS=%d): "
              "the sockets come from systemd",
              opt, n);
    for (int i = 0; i < n; i++)
      close(lfds[i]);
    return -1;
  }
  return n;
}

/* "unix /run/b.sock, tcp [::]:10809" for the log and systemd's status. */
static void describe_listeners(const int *lfds, int nl, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < nl && used + 1 < len; i++) {
    char one[160];
    listen_fd_describe(lfds[i], one, sizeof one);
    int w = snprintf(out + used, len - used, "%s%s", i ? ", " : "", one);
    if (w < 0)
      break;
    used += (size_t)w;
  }
}

/* Start the metrics page, or say in one line why not: on the port the
 * NBD server listens on it cannot bind (the kernel sees the overlap). */
static struct metrics_http *start_metrics(const struct serve_opts *o,
                                          struct metrics *m) {
  struct metrics_http *h = metrics_http_start(o->metrics, m);
  char host[256], mport[8];
  if (h)
    return h;
  if (o->port &&
      metrics_http_parse_addr(o->metrics, host, sizeof host, mport,
                              sizeof mport) &&
      atoi(mport) == atoi(o->port))
    log_error("--metrics %s: port %s is the NBD port (--port)", o->metrics,
              o->port);
  else
    log_error("%s", bd_errmsg());
  return NULL;
}

/* Tell systemd (Type=notify) that clients can connect now. */
static void notify_ready(const struct server *srv, const char *where) {
  char msg[1200];
  snprintf(msg, sizeof msg, "READY=1\nSTATUS=Serving %zu export%s on %s",
           srv->current->n, srv->current->n == 1 ? "" : "s", where);
  notify_send(msg);
}

/* Wait until every connection has ended, or the deadline passes. */
static bool wait_conns(struct server *srv, int seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += seconds;
  pthread_mutex_lock(&srv->lock);
  while (srv->nconns > 0 &&
         pthread_cond_timedwait(&srv->cond, &srv->lock, &ts) != ETIMEDOUT)
    ;
  bool done = srv->nconns == 0;
  pthread_mutex_unlock(&srv->lock);
  return done;
}

int server_accept_loop(struct server *srv, const int *lfds, int nl, int evfd,
                       server_event_fn *event, void *opaque) {
  struct pollfd p[MAX_LISTENERS + 1];
  for (int i = 0; i < nl; i++)
    p[i] = (struct pollfd){.fd = lfds[i], .events = POLLIN};
  p[nl] = (struct pollfd){.fd = evfd, .events = POLLIN};
  for (;;) {
    if (poll(p, (nfds_t)nl + 1, -1) < 0) {
      if (errno == EINTR)
        continue;
      log_error("poll: %s", strerror(errno));
      return -1;
    }
    if ((p[nl].revents & POLLIN) && event(opaque))
      return 0;
    for (int i = 0; i < nl; i++)
      if (p[i].revents & POLLIN)
        accept_one(srv, lfds[i]);
  }
}

/* server_run's signals: SIGHUP reloads, the others stop. */
struct signals {
  int sfd;
  struct reloader *rl;
};

static bool on_signal(void *opaque) {
  struct signals *sg = opaque;
  struct signalfd_siginfo si;
  if (read(sg->sfd, &si, sizeof si) != sizeof si)
    return false;
  if (si.ssi_signo == SIGHUP) {
    reloader_poke(sg->rl, false);
    return false;
  }
  /* --run's end is the server's own SIGTERM: no news to anyone. */
  if (si.ssi_pid == (uint32_t)getpid())
    log_debug("signal %u (our own): shutting down", si.ssi_signo);
  else
    log_info("signal %u: shutting down", si.ssi_signo);
  return true;
}

void server_drain(struct server *srv) {
  conn_begin_shutdown(srv, SHUTDOWN_GRACE_MS);
  if (!wait_conns(srv, 30)) {
    log_warn("connections still busy after 30 s; closing them");
    conn_shutdown_all(srv, SHUT_RDWR);
    wait_conns(srv, 30);
  }
}

int server_release(struct server *srv) {
  /* The last reference, unless a connection is stuck: closing an image
   * under it would be worse than not flushing it.  Views first: each
   * holds its image open. */
  exports_remove_views(srv);
  int ret = exports_put(srv, srv->current) < 0 ? -1 : 0;
  srv->current = NULL;
  if (srv->devices)
    log_warn("images still in use by stuck connections are left unflushed");
  else
    metrics_free(srv->metrics);
  return ret;
}

/* Load what the exports need before opening them: TLS credentials (an
 * export may require TLS), and the configuration, from --config or from
 * the command line's images or plugin.  Returns 0, or 1 (logged). */
static int read_exports(struct server *srv, const struct serve_opts *o,
                        struct config *cf) {
  if (srv->tls != HS_TLS_OFF &&
      !(srv->tls_creds =
            tls_creds_load(o->tls_certs, o->tls_verify_peer, o->tls_psk))) {
    log_error("%s", bd_errmsg());
    return 1;
  }
  if (o->config
          ? config_read(o, cf) < 0 || check_config_tls(srv, cf, o->config) < 0
          : config_from_args(o->images, o->n_images, o, cf) < 0)
    return 1;
  return 0;
}

void server_init(struct server *srv, const struct serve_opts *o,
                 struct config *cf) {
  *srv = (struct server){.limits = o->limits,
                         .allow = o->allow,
                         .nallow = o->nallow,
                         .tls = o->tls,
                         .cf = cf,
                         .opts = o,
                         .checkpoints = o->control != NULL,
                         .ckpt = o->ckpt,
                         .lock = PTHREAD_MUTEX_INITIALIZER,
                         .rebuild_lock = PTHREAD_MUTEX_INITIALIZER,
                         .cond = PTHREAD_COND_INITIALIZER,
                         .idle_fd = -1};
}

int server_rebuild(struct server *srv) {
  pthread_mutex_lock(&srv->rebuild_lock);
  int r = exports_open(srv, srv->cf, srv->opts);
  pthread_mutex_unlock(&srv->rebuild_lock);
  return r;
}

int server_add_view(struct server *srv, const char *name, struct bd *view_bd,
                    struct device *base, const char *const *ctx, size_t nctx) {
  int r = exports_add_view(srv, name, view_bd, base, ctx, nctx);
  if (r < 0)
    return r;
  if (server_rebuild(srv) < 0) {
    exports_remove_view(srv, name);
    return -EIO;
  }
  return 0;
}

int server_remove_view(struct server *srv, const char *name) {
  int r = exports_remove_view(srv, name);
  if (r == 0 && server_rebuild(srv) < 0)
    log_warn("release '%s': the exports could not be rebuilt; the view "
             "stays listed until the next change",
             name);
  return r;
}

/* Every image opened read-only and sharing: a check must never be a
 * second writer of an image the running server has open. */
static int open_for_check(struct server *srv, const struct config *cf,
                          const struct serve_opts *o) {
  enum log_level level = log_threshold;
  if (log_threshold > LOG_LEVEL_WARN)
    log_threshold = LOG_LEVEL_WARN; /* not the forced read-only opens */
  struct serve_opts ro = *o;
  ro.readonly = ro.force_share = true;
  int ret = exports_open(srv, cf, &ro) < 0 ? 1 : 0;
  log_threshold = level;
  return ret;
}

int server_check(const struct serve_opts *o, server_show_fn *show,
                 void *opaque) {
  struct server srv;
  struct config cf = {0};
  server_init(&srv, o, &cf);
  int ret = read_exports(&srv, o, &cf);
  if (ret == 0)
    ret = open_for_check(&srv, &cf, o);
  if (ret == 0) {
    show(&cf, srv.current, opaque);
    if (exports_put(&srv, srv.current) < 0)
      ret = 1;
  }
  config_free(&cf);
  tls_creds_put(srv.tls_creds);
  return ret;
}

/* What server_run() sets up, in order, and run_close() takes down. */
struct run {
  struct serve_opts o; /* the port may default */
  struct server srv;
  struct config cf;
  int lfds[MAX_LISTENERS], nl;
  int activated; /* listeners from systemd, at the front of lfds */
  bool bound_unix;
  bool port_default; /* no --port, no --unix, no systemd: 10809 */
  int sfd;           /* signals */
  int single_fd;     /* -s: the client's socket until it is served, or -1 */
  struct metrics_http *mhttp;
  struct checkpoints *ctl;
};

/* Signals are taken through a signalfd; blocked before any thread exists
 * so every thread inherits the mask. */
static int take_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP); /* reload */
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  return signalfd(-1, &set, SFD_CLOEXEC);
}

/* -s: standard input, a socket, becomes the one client's connection
 * (R->single_fd, served once ready); standard input and output then
 * read and write /dev/null, so that nothing else reaches the client. */
static int take_stdin(struct run *r) {
  struct stat st;
  if (fstat(0, &st) < 0 || !S_ISSOCK(st.st_mode)) {
    log_error("--single: standard input is not a socket (the client is "
              "served on it, as by nbdkit -s)");
    return -1;
  }
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  r->single_fd = fcntl(0, F_DUPFD_CLOEXEC, 3);
  r->srv.idle_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  bool ok = null >= 0 && r->single_fd >= 0 && r->srv.idle_fd >= 0 &&
            dup2(null, 0) == 0 && dup2(null, 1) == 1;
  if (null >= 0)
    close(null);
  if (!ok)
    log_error("--single: standard input: %s", strerror(errno));
  return ok ? 0 : -1;
}

/* The Unix socket and the TCP addresses the options name, after those
 * systemd passed. */
static int run_listen(struct run *r) {
  const struct serve_opts *o = &r->o;
  if (o->single)
    return take_stdin(r);
  if (o->unix_path) {
    r->lfds[r->nl] = server_listen_unix("--unix", o->unix_path, o->unix_mode);
    if (r->lfds[r->nl] < 0)
      return -1;
    r->nl++;
    r->bound_unix = true;
  }
  if (o->port) {
    struct tcp_where w = {o->bind_addr, o->port, r->port_default};
    int n = listen_tcp(&w, r->lfds + r->nl, MAX_LISTENERS - r->nl);
    if (n < 0)
      return -1;
    r->nl += n;
  }
  return 0;
}

static void log_tls(const struct server *srv, const struct serve_opts *o) {
  if (srv->tls == HS_TLS_OFF)
    return;
  log_info("TLS %s: %s%s%s%s", srv->tls == HS_TLS_REQUIRE ? "required" : "on",
           o->tls_certs ? "X.509 certificates" : "",
           o->tls_verify_peer ? " (client certificates required)" : "",
           o->tls_certs && o->tls_psk ? ", " : "",
           o->tls_psk ? "pre-shared keys" : "");
}

/* Addresses, metrics, exports, workers, the control socket: everything
 * before "ready".  Returns 0, or -1 (logged). */
static int run_start(struct run *r) {
  struct server *srv = &r->srv;
  const struct serve_opts *o = &r->o;
  if (read_exports(srv, o, &r->cf) != 0)
    return -1;
  if (o->metrics && !(srv->metrics = metrics_create(0, NULL, NULL))) {
    log_error("--metrics: out of memory");
    return -1;
  }
  /* Every address first, so a mistyped --bind or --unix fails before any
   * image is opened (or locked); nothing is accepted before "ready", and
   * nothing is served unless all of them could be bound. */
  if (run_listen(r) < 0 ||
      (o->metrics && !(r->mhttp = start_metrics(o, srv->metrics))) ||
      exports_open(srv, &r->cf, o) < 0)
    return -1;
  if (bd_pool_start(o->workers) < 0) {
    log_error("cannot start the worker pool");
    return -1;
  }
  log_tls(srv, o);
  struct ckpt_host host = checkpoints_serve_host(srv);
  if (o->control && !(r->ctl = checkpoints_start(&host, o->control))) {
    log_error("%s", bd_errmsg());
    return -1;
  }
  return 0;
}

/* Stop accepting, let requests in flight finish (later ones get
 * ESHUTDOWN, so clients know they were not executed), then flush. */
static void run_stop(struct run *r, struct reloader *rl) {
  /* No command starts during the shutdown; one under way ends first. */
  checkpoints_stop(r->ctl);
  r->ctl = NULL;
  notify_send("STOPPING=1\nSTATUS=Shutting down: finishing requests in flight");
  /* A reload under way finishes first (opening images is bounded). */
  reloader_poke(rl, true);
  pthread_join(rl->thread, NULL);
  for (int i = 0; i < r->nl; i++)
    close(r->lfds[i]);
  r->nl = 0;
  server_drain(&r->srv);
  bd_pool_stop();
}

/* -s: serve the one client, until it leaves or a signal stops the
 * server.  0, or -1 (logged). */
static int serve_single(struct run *r, struct signals *sg) {
  struct server *srv = &r->srv;
  struct sockaddr_storage ss = {.ss_family = AF_UNIX};
  socklen_t sl = sizeof ss;
  if (getpeername(r->single_fd, (struct sockaddr *)&ss, &sl) < 0)
    ss.ss_family = AF_UNIX;      /* a socketpair's end has no address */
  admit(srv, r->single_fd, &ss); /* takes the fd */
  r->single_fd = -1;
  struct pollfd p[2] = {{.fd = r->sfd, .events = POLLIN},
                        {.fd = srv->idle_fd, .events = POLLIN}};
  for (;;) {
    pthread_mutex_lock(&srv->lock);
    bool gone = srv->nconns == 0;
    pthread_mutex_unlock(&srv->lock);
    if (gone)
      return 0;
    if (poll(p, 2, -1) < 0 && errno != EINTR) {
      log_error("poll: %s", strerror(errno));
      return -1;
    }
    if ((p[0].revents & POLLIN) && on_signal(sg))
      return 0;
    eventfd_t v;
    if (p[1].revents & POLLIN)
      eventfd_read(srv->idle_fd, &v);
  }
}

/* Say "ready", then accept connections until a signal stops the server.
 * Returns the exit status. */
static int run_serve(struct run *r) {
  if (r->o.ready && r->o.ready(r->o.opaque) != 0)
    return 1;
  char where[1024];
  describe_listeners(r->lfds, r->nl, where, sizeof where);
  if (r->o.single)
    snprintf(where, sizeof where, "one client on standard input");
  log_info("ready%s: %s", r->activated ? " (socket-activated)" : "", where);
  notify_ready(&r->srv, where);

  struct reloader rl = {.srv = &r->srv,
                        .o = &r->o,
                        .lock = PTHREAD_MUTEX_INITIALIZER,
                        .cond = PTHREAD_COND_INITIALIZER};
  if (pthread_create(&rl.thread, NULL, reload_thread, &rl) != 0) {
    log_error("cannot start the reload thread");
    return 1;
  }
  pthread_setname_np(rl.thread, "bp-reload");
  struct signals sg = {.sfd = r->sfd, .rl = &rl};
  int ret = r->o.single ? serve_single(r, &sg)
                        : server_accept_loop(&r->srv, r->lfds, r->nl, r->sfd,
                                             on_signal, &sg);
  ret = ret < 0 ? 1 : 0;
  run_stop(r, &rl);
  return ret;
}

/* What is left of R, whether or not it served.  Returns -1 when an image
 * could not be flushed. */
static int run_close(struct run *r) {
  for (int i = 0; i < r->nl; i++)
    close(r->lfds[i]);
  if (r->bound_unix)
    unlink(r->o.unix_path);
  metrics_http_stop(r->mhttp);
  checkpoints_stop(r->ctl);
  int ret = server_release(&r->srv);
  config_free(&r->cf);
  if (r->sfd >= 0)
    close(r->sfd);
  if (r->single_fd >= 0)
    close(r->single_fd);
  if (r->srv.idle_fd >= 0)
    close(r->srv.idle_fd);
  tls_creds_put(r->srv.tls_creds);
  return ret;
}

int server_run(const struct serve_opts *opts) {
  struct run r = {.o = *opts, .single_fd = -1};
  server_init(&r.srv, &r.o, &r.cf);
  /* Before any thread or plugin exists: children must not inherit
   * LISTEN_*. */
  r.activated = take_activated(&r.o, r.lfds);
  if (r.activated < 0)
    return 1;
  r.nl = r.activated;
  if (notify_init() < 0)
    log_warn("%s; not notifying systemd", bd_errmsg());
  r.port_default = !r.activated && !r.o.unix_path && !r.o.port && !r.o.single;
  if (r.port_default)
    r.o.port = "10809";
  r.sfd = take_signals();
  int ret = run_start(&r) < 0 ? 1 : run_serve(&r);
  if (run_close(&r) < 0)
    ret = 1;
  return ret;
}
