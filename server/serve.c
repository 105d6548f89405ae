/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport serve: command line, exports, listening sockets, the accept
 * loop and an orderly shutdown on SIGTERM/SIGINT. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "access.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "config.h"
#include "core/blockdev.h"
#include "core/log.h"
#include "core/notify.h"
#include "core/pool.h"
#include "exports.h"
#include "formats/formats.h"
#include "metrics.h"
#include "nbd-protocol.h"
#include "server.h"
#include "tls.h"

#define MAX_LISTENERS 16
/* How long a connection may stay after shutdown begins: its client sees
 * ESHUTDOWN on its next request and disconnects; an idle one is closed. */
#define SHUTDOWN_GRACE_MS 2000

struct serve_opts {
  const char *unix_path;
  const char *port;
  const char *bind_addr;
  const char *pid_file;
  const char *format;
  const char *plugin; /* --plugin: the arguments are its parameters */
  bool readonly;
  bool force_share;  /* -U: with --readonly, share images with writers */
  char **ro_exports; /* --readonly-export NAME */
  size_t n_ro_exports;
  unsigned workers;
  const char *tls_certs; /* --tls-certs DIR */
  const char *tls_psk;   /* --tls-psk FILE */
  bool tls_verify_peer;
  int unix_mode;       /* --unix-mode, -1: as the umask makes it */
  const char *metrics; /* --metrics ADDR:PORT */
  const char *config;  /* --config FILE */
  bool check_config;   /* --check-config: check the exports, then exit */
};

/* Long options without a short form. */
enum {
  OPT_TLS = 1000,
  OPT_TLS_CERTS,
  OPT_TLS_PSK,
  OPT_TLS_VERIFY,
  OPT_ALLOW,
  OPT_UNIX_MODE,
  OPT_HANDSHAKE_TIMEOUT,
  OPT_IDLE_TIMEOUT,
  OPT_RO_EXPORT,
  OPT_METRICS,
  OPT_CONFIG,
  OPT_CHECK_CONFIG
};

static const char serve_usage[] =
    "Usage: blockport serve [OPTIONS] IMAGE...\n"
    "       blockport serve [OPTIONS] --plugin PLUGIN [KEY=VALUE...]\n"
    "       blockport serve [OPTIONS] --config FILE\n"
    "Serve disk images over NBD (fixed newstyle).\n"
    "\n"
    "IMAGE is PATH or NAME=PATH; the first image is also the default export "
    "\"\".\n"
    "PATH is an image file (format probed from its content), null:SIZE\n"
    "(reads zeroes, discards writes) or memory:SIZE (a sparse RAM disk).\n"
    "With --plugin, the export is an nbdkit plugin: PLUGIN is a .so path or\n"
    "a name in nbdkit's plugin directory (memory, pattern, file, ...), the\n"
    "arguments its KEY=VALUE parameters, and its exports those it lists.\n"
    "\n"
    "  -u, --unix PATH           listen on a Unix socket\n"
    "  -p, --port N              listen on TCP port N (default 10809 when no "
    "--unix)\n"
    "  -b, --bind ADDR           TCP address to bind (IPv4 or IPv6; default "
    "all)\n"
    "  -r, --readonly            refuse writes on every export\n"
    "  -U, --force-share         with --readonly: open images that another\n"
    "                            process writes (qemu-img's -U)\n"
    "      --readonly-export NAME  refuse writes on export NAME (repeat for\n"
    "                            more; \"\" is the default export)\n"
    "  -f, --format FMT          image format instead of probing: raw, qcow2\n"
    "  -w, --workers N           worker threads for blocking I/O (default "
    "16)\n"
    "  -c, --max-connections N   refuse clients beyond N (default 128)\n"
    "      --max-requests N      requests in flight per connection (default "
    "256)\n"
    "      --max-inflight-bytes SIZE  payload in flight per connection "
    "(default 64M)\n"
    "      --l2-cache-size SIZE  qcow2 L2 cache per image (default 32M: maps "
    "256G\n"
    "                            of 64k clusters)\n"
    "      --nbd-connections N   connections to each nbd:// source, 1-16\n"
    "                            (default 0: 4 when its server allows "
    "multi-conn,\n"
    "                            else 1)\n"
    "      --nbd-timeout SECONDS how long a request waits for a lost nbd://\n"
    "                            server to come back, and how long a server "
    "may\n"
    "                            leave requests unanswered, before they "
    "fail\n"
    "                            with EIO (default 30; 0: forever)\n"
    "      --plugin PLUGIN       serve an nbdkit plugin (see above)\n"
    "      --config FILE         serve the exports FILE declares, with their\n"
    "                            own read-only, TLS and allow settings; "
    "SIGHUP\n"
    "                            reads it again (format: docs/CONFIG.md)\n"
    "      --check-config        check the exports as a start would (the "
    "file,\n"
    "                            TLS settings, every image opened "
    "read-only),\n"
    "                            print them and exit: 0 good, 1 a bad file\n"
    "                            or option, or an image that cannot be opened\n"
    "      --tls off|on|require  TLS (STARTTLS): off (default), on (plain "
    "and\n"
    "                            TLS clients) or require (no option but "
    "ABORT\n"
    "                            and STARTTLS answered before TLS)\n"
    "      --tls-certs DIR       X.509: DIR/server-cert.pem, "
    "server-key.pem,\n"
    "                            ca-cert.pem, ca-crl.pem (as QEMU and nbdkit\n"
    "                            lay them out); SIGHUP loads them again\n"
    "      --tls-verify-peer     require client certificates signed by "
    "ca-cert.pem\n"
    "      --tls-psk FILE        pre-shared keys: username:hexkey lines "
    "(psktool)\n"
    "  -D NAME.FLAG=N            set an nbdkit plugin's debug flag "
    "NAME_debug_FLAG\n"
    "      --allow CIDR          admit TCP clients from CIDR only (repeat for\n"
    "                            more; IPv4 or IPv6; default: everyone)\n"
    "      --unix-mode MODE      permissions of the Unix socket (octal)\n"
    "      --handshake-timeout SECONDS  close a client whose handshake takes\n"
    "                            longer (default 10; 0: no limit)\n"
    "      --idle-timeout SECONDS  close a client with nothing in flight\n"
    "                            that sends nothing for this long (default 0:\n"
    "                            never)\n"
    "      --metrics ADDR:PORT   serve Prometheus metrics at\n"
    "                            http://ADDR:PORT/metrics ([ADDR] for IPv6)\n"
    "  -P, --pid-file FILE       write the pid once connections are accepted\n"
    "  -v, --verbose             log every connection and option\n" LOG_USAGE
    "  -h, --help                show this help\n"
    "\n"
    "Started by systemd socket activation (LISTEN_PID, LISTEN_FDS), it serves\n"
    "on the sockets it was given; --unix, --port, --bind and --unix-mode are\n"
    "then refused.  With NOTIFY_SOCKET set (systemd Type=notify), it sends\n"
    "READY=1 once clients can connect and STOPPING=1 when shutting down.\n";

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
    e->name =
        named ? strndup(img, (size_t)(eq - img)) : strdup(i > 0 ? img : "");
    e->path = strdup(named ? eq + 1 : img);
    e->is_default = i == 0;
    if (!e->name || !e->path)
      return -1;
    /* A plugin's device serves its listed exports too: it stays writable
     * and exports.c makes the named exports read-only. */
    e->readonly = o->plugin ? o->readonly : export_readonly(o, e);
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
  struct exports_opts eo = {.format = o->format,
                            .readonly = o->readonly,
                            .share = o->force_share,
                            .ro_names = o->ro_exports,
                            .n_ro_names = o->n_ro_exports,
                            .plugin = o->plugin != NULL,
                            .file = o->config};
  char err[1024];
  struct export_set *s = exports_build(srv, cf, &eo, err, sizeof err);
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
  struct export_set *old = exports_get(srv);
  bool ok = config_read(o, &cf) == 0 &&
            check_config_tls(srv, &cf, o->config) == 0 &&
            exports_open(srv, &cf, o) == 0;
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

/* Remove a socket left by a server that is gone; refuse to touch anything
 * else at PATH, and a socket somebody still listens on. */
static int remove_stale_socket(const char *path, const struct sockaddr_un *sa) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return 0;
  if (!S_ISSOCK(st.st_mode)) {
    log_error("%s exists and is not a socket; not replacing it", path);
    return -1;
  }
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool live = probe >= 0 &&
              connect(probe, (const struct sockaddr *)sa, sizeof *sa) == 0;
  if (probe >= 0)
    close(probe);
  if (live) {
    log_error("%s: another server is listening there", path);
    return -1;
  }
  unlink(path);
  return 0;
}

static int listen_unix(const char *path, int mode) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    log_error("socket path too long: %s", path);
    return -1;
  }
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (remove_stale_socket(path, &sa) < 0) {
    close(fd);
    return -1;
  }
  /* The mode is set before listen(): nobody connects in between. */
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      (mode >= 0 && chmod(path, (mode_t)mode) < 0) ||
      listen(fd, SOMAXCONN) < 0) {
    log_error("%s: %s", path, strerror(errno));
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

/* Listen on every address ADDR (NULL: the IPv4 and IPv6 wildcards) has
 * for PORT.  Every one must work: a server that says "ready" while one of
 * its addresses belongs to another program would send that program's
 * clients away.  Returns the number of sockets in FDS, or -1 (logged). */
static int listen_tcp(const char *addr, const char *port, int *fds, int max) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_ADDRCONFIG};
  struct addrinfo *res;
  int r = getaddrinfo(addr, port, &hints, &res);
  if (r != 0) {
    log_error("%s port %s: %s", addr ? addr : "*", port, gai_strerror(r));
    return -1;
  }
  int n = 0;
  bool failed = false;
  for (struct addrinfo *ai = res; ai && !failed; ai = ai->ai_next) {
    int fd = n < max ? listen_one(ai) : -EMFILE;
    if (fd >= 0) {
      fds[n++] = fd;
      continue;
    }
    bool v6 = ai->ai_family == AF_INET6;
    char host[NI_MAXHOST] = "?";
    getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof host, NULL, 0,
                NI_NUMERICHOST);
    if (!addr && no_ipv6_here(ai, -fd)) {
      log_warn("cannot listen on [%s] port %s: %s; IPv4 only", host, port,
               strerror(-fd));
      continue;
    }
    log_error("cannot listen on %s%s%s port %s: %s", v6 ? "[" : "", host,
              v6 ? "]" : "", port, strerror(-fd));
    failed = true;
  }
  freeaddrinfo(res);
  if (!failed && n == 0)
    log_error("%s port %s: no address to listen on", addr ? addr : "*", port);
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

static void accept_one(struct server *srv, int lfd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      log_warn("accept: %s", strerror(errno));
    return;
  }
  char peer[80];
  describe_peer(fd, &ss, peer, sizeof peer);
  pthread_mutex_lock(&srv->lock);
  bool full = srv->nconns >= srv->limits.max_connections;
  pthread_mutex_unlock(&srv->lock);
  if (full) {
    log_warn("refusing %s: %u connections already", peer,
             srv->limits.max_connections);
    close(fd);
    return;
  }
  /* Refused here, before any thread or buffer is spent on it. */
  if (ss.ss_family != AF_UNIX &&
      !acl_allows(srv->allow, srv->nallow, (struct sockaddr *)&ss)) {
    log_info("refusing %s: not in --allow", peer);
    close(fd);
    return;
  }
  if (ss.ss_family != AF_UNIX) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  conn_start(srv, fd, peer, &ss);
}

/* Take the sockets systemd passed, if any.  Returns their number, or -1
 * (an error, or a usage error: options that conflict with them). */
static int take_activated(struct serve_opts *o, int *lfds) {
  int n = listen_fds_take(lfds, MAX_LISTENERS);
  if (n < 0)
    log_error("%s", bd_errmsg());
  if (n <= 0)
    return n < 0 ? -1 : 0;
  const char *opt = o->unix_path        ? "--unix"
                    : o->port           ? "--port"
                    : o->bind_addr      ? "--bind"
                    : o->unix_mode >= 0 ? "--unix-mode"
                                        : NULL;
  if (opt) {
    fprintf(stderr,
            "blockport serve: %s cannot be used with socket activation "
            "(LISTEN_FDS=%d): the sockets come from systemd\n",
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

/* --metrics on the port the NBD server listens on cannot bind (the
 * kernel sees the overlap); say so plainly. */
static void explain_metrics_failure(const struct serve_opts *o) {
  char host[256], mport[8];
  if (o->port &&
      metrics_parse_addr(o->metrics, host, sizeof host, mport, sizeof mport) &&
      atoi(mport) == atoi(o->port))
    log_error("--metrics %s: port %s is the NBD port", o->metrics, o->port);
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

static int run(struct server *srv, struct reloader *rl, int *lfds, int nl,
               int sfd) {
  struct pollfd p[MAX_LISTENERS + 1];
  for (int i = 0; i < nl; i++)
    p[i] = (struct pollfd){.fd = lfds[i], .events = POLLIN};
  p[nl] = (struct pollfd){.fd = sfd, .events = POLLIN};
  for (;;) {
    if (poll(p, (nfds_t)nl + 1, -1) < 0) {
      if (errno == EINTR)
        continue;
      log_error("poll: %s", strerror(errno));
      return -1;
    }
    if (p[nl].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) != sizeof si)
        continue;
      if (si.ssi_signo == SIGHUP) {
        reloader_poke(rl, false);
        continue;
      }
      log_info("signal %u: shutting down", si.ssi_signo);
      return 0;
    }
    for (int i = 0; i < nl; i++)
      if (p[i].revents & POLLIN)
        accept_one(srv, lfds[i]);
  }
}

static int parse_tls_mode(const char *s, enum hs_tls *mode) {
  if (!strcmp(s, "off"))
    *mode = HS_TLS_OFF;
  else if (!strcmp(s, "on"))
    *mode = HS_TLS_ON;
  else if (!strcmp(s, "require"))
    *mode = HS_TLS_REQUIRE;
  else
    return -1;
  return 0;
}

/* TLS needs credentials, and credentials are no use without TLS. */
static int check_tls_opts(const struct serve_opts *o, enum hs_tls mode) {
  bool creds = o->tls_certs || o->tls_psk;
  const char *err = NULL;
  if (mode != HS_TLS_OFF && !creds)
    err = "--tls on|require needs --tls-certs DIR or --tls-psk FILE";
  else if (mode == HS_TLS_OFF && creds)
    err = "--tls-certs and --tls-psk need --tls on or --tls require";
  else if (o->tls_verify_peer && !o->tls_certs)
    err = "--tls-verify-peer needs --tls-certs DIR";
  if (err)
    fprintf(stderr, "blockport serve: %s\n", err);
  return err ? -1 : 0;
}

/* One --allow CIDR, added to the server's list. */
static int add_allow(struct server *srv, const char *text) {
  struct acl_rule r;
  if (acl_parse(text, &r) < 0) {
    fprintf(stderr, "blockport serve: --allow %s\n", bd_errmsg());
    return -1;
  }
  struct acl_rule *n = realloc(srv->allow, (srv->nallow + 1) * sizeof *n);
  if (!n)
    return -1;
  n[srv->nallow++] = r;
  srv->allow = n;
  return 0;
}

static int parse_opts(int argc, char **argv, struct serve_opts *o,
                      struct server *srv) {
  struct server_limits *lim = &srv->limits;
  enum hs_tls *tls = &srv->tls;
  static const struct option longopts[] = {
      {"unix", required_argument, NULL, 'u'},
      {"port", required_argument, NULL, 'p'},
      {"bind", required_argument, NULL, 'b'},
      {"readonly", no_argument, NULL, 'r'},
      {"force-share", no_argument, NULL, 'U'},
      {"format", required_argument, NULL, 'f'},
      {"workers", required_argument, NULL, 'w'},
      {"max-connections", required_argument, NULL, 'c'},
      {"max-requests", required_argument, NULL, 'R'},
      {"max-inflight-bytes", required_argument, NULL, 'B'},
      {"l2-cache-size", required_argument, NULL, 'L'},
      {"nbd-connections", required_argument, NULL, 'N'},
      {"nbd-timeout", required_argument, NULL, 'T'},
      {"plugin", required_argument, NULL, 'G'},
      {"tls", required_argument, NULL, OPT_TLS},
      {"tls-certs", required_argument, NULL, OPT_TLS_CERTS},
      {"tls-psk", required_argument, NULL, OPT_TLS_PSK},
      {"tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY},
      {"allow", required_argument, NULL, OPT_ALLOW},
      {"readonly-export", required_argument, NULL, OPT_RO_EXPORT},
      {"unix-mode", required_argument, NULL, OPT_UNIX_MODE},
      {"handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT},
      {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
      {"metrics", required_argument, NULL, OPT_METRICS},
      {"config", required_argument, NULL, OPT_CONFIG},
      {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
      {"pid-file", required_argument, NULL, 'P'},
      {"verbose", no_argument, NULL, 'v'},
      LOG_LONGOPTS,
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  int ch;
  unsigned port, secs;
  while ((ch = getopt_long(argc, argv, "u:p:b:rUf:w:c:D:P:vh", longopts,
                           NULL)) != -1) {
    switch (ch) {
    case 'u': o->unix_path = optarg; break;
    case 'p':
      if (cli_parse_uint(optarg, 0, 65535, &port) < 0)
        goto bad;
      o->port = optarg;
      break;
    case 'b': o->bind_addr = optarg; break;
    case 'r': o->readonly = true; break;
    case 'U': o->force_share = true; break;
    case 'f': o->format = optarg; break;
    case 'w':
      if (cli_parse_uint(optarg, 1, BD_POOL_MAX_WORKERS, &o->workers) < 0)
        goto bad;
      break;
    case 'c':
      if (cli_parse_uint(optarg, 1, 1000000, &lim->max_connections) < 0)
        goto bad;
      break;
    case 'R':
      if (cli_parse_uint(optarg, 1, 65536, &lim->max_requests) < 0)
        goto bad;
      break;
    case 'B':
      if (bd_parse_size(optarg, &lim->max_bytes) < 0 || lim->max_bytes == 0)
        goto bad;
      break;
    case 'L':
      if (bd_parse_size(optarg, &qcow2_l2_cache_bytes) < 0 ||
          qcow2_l2_cache_bytes < 65536)
        goto bad;
      break;
    case 'N':
      if (cli_parse_uint(optarg, 0, 16, &nbd_source_connections) < 0)
        goto bad;
      break;
    case 'T':
      if (cli_parse_uint(optarg, 0, 86400, &nbd_source_timeout) < 0)
        goto bad;
      break;
    case 'G': o->plugin = optarg; break;
    case OPT_TLS:
      if (parse_tls_mode(optarg, tls) < 0)
        goto bad;
      break;
    case OPT_TLS_CERTS: o->tls_certs = optarg; break;
    case OPT_TLS_PSK: o->tls_psk = optarg; break;
    case OPT_TLS_VERIFY: o->tls_verify_peer = true; break;
    case OPT_RO_EXPORT: {
      char **n = realloc(o->ro_exports, (o->n_ro_exports + 1) * sizeof *n);
      if (!n)
        return -1;
      n[o->n_ro_exports++] = optarg;
      o->ro_exports = n;
      break;
    }
    case OPT_ALLOW:
      if (add_allow(srv, optarg) < 0)
        return -1;
      break;
    case OPT_UNIX_MODE: {
      char *end;
      long m = strtol(optarg, &end, 8);
      if (!*optarg || *end || m < 0 || m > 0777)
        goto bad;
      o->unix_mode = (int)m;
      break;
    }
    case OPT_HANDSHAKE_TIMEOUT:
      if (cli_parse_uint(optarg, 0, 86400, &secs) < 0)
        goto bad;
      lim->handshake_ms = secs * 1000;
      break;
    case OPT_IDLE_TIMEOUT:
      if (cli_parse_uint(optarg, 0, 86400 * 7, &secs) < 0)
        goto bad;
      lim->idle_ms = secs * 1000;
      break;
    case 'D':
      if (plugin_add_debug_flag(optarg) < 0) {
        fprintf(stderr, "blockport serve: %s\n", bd_errmsg());
        return -1;
      }
      break;
    case OPT_METRICS: {
      char host[256], mport[8];
      if (!metrics_parse_addr(optarg, host, sizeof host, mport, sizeof mport))
        goto bad;
      o->metrics = optarg;
      break;
    }
    case OPT_CONFIG: o->config = optarg; break;
    case OPT_CHECK_CONFIG: o->check_config = true; break;
    case 'P': o->pid_file = optarg; break;
    case 'v': log_threshold = LOG_LEVEL_DEBUG; break;
    case LOG_OPT_LEVEL:
    case LOG_OPT_SYSLOG:
      if (log_handle_option(ch, optarg) < 0)
        goto bad;
      break;
    case 'h': fputs(serve_usage, stdout); exit(0);
    default: fputs(serve_usage, stderr); return -1;
    }
  }
  if (o->config && (optind < argc || o->plugin)) {
    fprintf(stderr, "blockport serve: --config replaces IMAGE arguments and "
                    "--plugin\n");
    return -1;
  }
  if (o->force_share && !o->readonly) {
    fprintf(stderr, "blockport serve: --force-share needs --readonly (a "
                    "writer cannot share the image)\n");
    return -1;
  }
  if (optind >= argc && !o->plugin && !o->config) {
    fprintf(stderr, "blockport serve: no image given\n%s", serve_usage);
    return -1;
  }
  return check_tls_opts(o, *tls);
bad:
  fprintf(stderr, "blockport serve: invalid value for option: %s\n", optarg);
  return -1;
}

/* One line of --check-config's listing: the export as configured (the
 * check itself opened every image read-only). */
static void print_export(const struct export_conf *c,
                         const struct export_set *s, bool plugin) {
  int i = exports_find(s, c->name);
  const struct bd *bd = i >= 0 ? s->v[i].dev->bd : NULL;
  printf("  export '%s': %s %s, %" PRIu64 " bytes, %s%s%s", c->name,
         bd ? bd->format : "?", plugin ? "plugin" : c->path, bd ? bd->size : 0,
         c->readonly ? "read-only" : "writable",
         c->is_default ? ", default" : "",
         c->tls_required ? ", TLS required" : "");
  if (c->nallow)
    printf(", %zu allow rule%s", c->nallow, c->nallow == 1 ? "" : "s");
  printf("\n");
}

/* Load what the exports need before opening them: TLS credentials (an
 * export may require TLS), and the configuration, from --config or from
 * the command line's images or plugin.  *PLUGIN is the caller's to free.
 * Returns 0, or --check-config's exit status: 2 for a bad file (or
 * options that do not fit it), 1 otherwise. */
static int read_exports(struct server *srv, struct serve_opts *o, int argc,
                        char **argv, struct config *cf, char **plugin) {
  /* --plugin: one image, the plugin with the arguments as parameters. */
  if (o->plugin &&
      !(*plugin = plugin_spec(o->plugin, argv + optind, argc - optind)))
    return 1;
  if (srv->tls != HS_TLS_OFF &&
      !(srv->tls_creds =
            tls_creds_load(o->tls_certs, o->tls_verify_peer, o->tls_psk))) {
    log_error("%s", bd_errmsg());
    return 1;
  }
  if (o->config
          ? config_read(o, cf) < 0 || check_config_tls(srv, cf, o->config) < 0
          : config_from_args(o->plugin ? plugin : argv + optind,
                             o->plugin ? 1 : argc - optind, o, cf) < 0)
    return 1;
  return 0;
}

/* --check-config: what a start (or a reload) would check about the
 * exports, without listening: the file, the TLS settings, and every image
 * opened read-only (a check must never be a second writer of an image the
 * running server has open).  Prints the exports on stdout.  The exit
 * status lets `systemctl reload` fail before the server is signalled. */
static int check_exports(struct server *srv, struct serve_opts *o, int argc,
                         char **argv) {
  struct config cf = {0};
  char *plugin = NULL;
  int ret = read_exports(srv, o, argc, argv, &cf, &plugin);
  if (ret == 0) {
    enum log_level level = log_threshold;
    if (log_threshold > LOG_LEVEL_WARN)
      log_threshold = LOG_LEVEL_WARN; /* not the forced read-only opens */
    bool all_ro = o->readonly, share = o->force_share;
    o->readonly = o->force_share = true; /* never in the server's way */
    ret = exports_open(srv, &cf, o) < 0 ? 1 : 0;
    o->readonly = all_ro;
    o->force_share = share;
    log_threshold = level;
  }
  if (ret == 0) {
    const char *what = o->config ? o->config : "command line";
    printf("%s: ok, %zu export%s\n", what, cf.n, cf.n == 1 ? "" : "s");
    for (size_t i = 0; i < cf.n; i++)
      print_export(&cf.v[i], srv->current, o->plugin != NULL);
    if (exports_put(srv, srv->current) < 0)
      ret = 1;
  }
  config_free(&cf);
  tls_creds_put(srv->tls_creds);
  free(plugin);
  free(srv->allow);
  free(o->ro_exports);
  return ret;
}

int serve_main(int argc, char **argv) {
  struct serve_opts o = {.unix_mode = -1};
  struct server srv = {
      .limits = {.max_connections = 128,
                 .max_requests = 256,
                 .max_bytes = 64ull * 1024 * 1024,
                 .handshake_ms = 10000},
      .lock = PTHREAD_MUTEX_INITIALIZER,
      .cond = PTHREAD_COND_INITIALIZER,
  };
  /* Usage errors exit 1, as qemu-img's do. */
  if (parse_opts(argc, argv, &o, &srv) < 0)
    return 1;
  if (o.check_config)
    return check_exports(&srv, &o, argc, argv);
  int ret = 1, nl = 0, lfds[MAX_LISTENERS];
  /* Before any thread or plugin exists: children must not inherit
   * LISTEN_*. */
  int activated = take_activated(&o, lfds);
  if (activated < 0)
    return 1;
  nl = activated;
  if (notify_init() < 0)
    log_warn("%s; not notifying systemd", bd_errmsg());
  if (!activated && !o.unix_path && !o.port)
    o.port = "10809";

  /* Signals are taken through a signalfd; block them before any thread
   * exists so every thread inherits the mask. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP); /* reload */
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC);

  bool bound_unix = false;
  struct config cf = {0};
  struct metrics_http *mhttp = NULL;
  char *plugin = NULL;
  if (read_exports(&srv, &o, argc, argv, &cf, &plugin) != 0)
    goto out;
  if (o.metrics && !(srv.metrics = metrics_create(0, NULL, NULL))) {
    log_error("--metrics: out of memory");
    goto out;
  }
  if (exports_open(&srv, &cf, &o) < 0)
    goto out;
  config_free(&cf);
  /* Every address first, metrics last: nothing is served unless all of
   * them could be bound. */
  if (o.unix_path) {
    if ((lfds[nl] = listen_unix(o.unix_path, o.unix_mode)) < 0)
      goto out;
    nl++;
    bound_unix = true;
  }
  if (o.port) {
    int n = listen_tcp(o.bind_addr, o.port, lfds + nl, MAX_LISTENERS - nl);
    if (n < 0)
      goto out;
    nl += n;
  }
  if (o.metrics && !(mhttp = metrics_http_start(o.metrics, srv.metrics))) {
    log_error("%s", bd_errmsg());
    explain_metrics_failure(&o);
    goto out;
  }
  if (bd_pool_start(o.workers) < 0) {
    log_error("cannot start the worker pool");
    goto out;
  }
  if (srv.tls != HS_TLS_OFF)
    log_info("TLS %s: %s%s%s%s", srv.tls == HS_TLS_REQUIRE ? "required" : "on",
             o.tls_certs ? "X.509 certificates" : "",
             o.tls_verify_peer ? " (client certificates required)" : "",
             o.tls_certs && o.tls_psk ? ", " : "",
             o.tls_psk ? "pre-shared keys" : "");
  if (o.pid_file && cli_write_pid_file(o.pid_file) < 0)
    goto out;
  char where[1024];
  describe_listeners(lfds, nl, where, sizeof where);
  log_info("ready%s: %s", activated ? " (socket-activated)" : "", where);
  notify_ready(&srv, where);

  struct reloader rl = {.srv = &srv,
                        .o = &o,
                        .lock = PTHREAD_MUTEX_INITIALIZER,
                        .cond = PTHREAD_COND_INITIALIZER};
  if (pthread_create(&rl.thread, NULL, reload_thread, &rl) != 0) {
    log_error("cannot start the reload thread");
    goto out;
  }
  pthread_setname_np(rl.thread, "bp-reload");
  ret = run(&srv, &rl, lfds, nl, sfd) < 0 ? 1 : 0;
  notify_send("STOPPING=1\nSTATUS=Shutting down: finishing requests in flight");
  /* A reload under way finishes first (opening images is bounded). */
  reloader_poke(&rl, true);
  pthread_join(rl.thread, NULL);

  /* Stop accepting, let requests in flight finish (later ones get
   * ESHUTDOWN, so clients know they were not executed), then flush. */
  for (int i = 0; i < nl; i++)
    close(lfds[i]);
  nl = 0;
  conn_begin_shutdown(&srv, SHUTDOWN_GRACE_MS);
  if (!wait_conns(&srv, 30)) {
    log_warn("connections still busy after 30 s; closing them");
    conn_shutdown_all(&srv, SHUT_RDWR);
    wait_conns(&srv, 30);
  }
  bd_pool_stop();
out:
  for (int i = 0; i < nl; i++)
    close(lfds[i]);
  if (bound_unix)
    unlink(o.unix_path);
  metrics_http_stop(mhttp);
  /* The last reference, unless a connection is stuck: closing an image
   * under it would be worse than not flushing it. */
  if (exports_put(&srv, srv.current) < 0)
    ret = 1;
  if (srv.devices)
    log_warn("images still in use by stuck connections are left unflushed");
  else
    metrics_free(srv.metrics);
  config_free(&cf);
  if (o.pid_file)
    unlink(o.pid_file);
  if (sfd >= 0)
    close(sfd);
  tls_creds_put(srv.tls_creds);
  free(plugin);
  free(srv.allow);
  free(o.ro_exports);
  return ret;
}
