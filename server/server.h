/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD server: exports, connections, and the settings they share. */
#ifndef BLOCKPORT_SERVER_H
#define BLOCKPORT_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/blockdev.h"
#include "core/checkpoint.h"
#include "core/open.h"
#include "handshake.h"

struct acl_rule;
struct bd;
struct config;
struct conn;
struct ctl_verb;
struct device;
struct export_set;
struct metrics;

struct server_limits {
  unsigned max_connections;
  unsigned max_requests; /* in flight per connection */
  uint64_t max_bytes;    /* payload bytes in flight per connection */
  unsigned handshake_ms; /* the whole handshake, 0: no limit */
  unsigned idle_ms;      /* nothing in flight and nothing received, 0: no
                          * limit */
};

struct server {
  struct server_limits limits;
  struct acl_rule *allow; /* --allow: TCP clients admitted, none: all */
  size_t nallow;
  enum hs_tls tls;         /* --tls */
  struct metrics *metrics; /* --metrics, NULL: not collected */

  pthread_mutex_t lock;
  struct tls_creds *tls_creds; /* when tls is not HS_TLS_OFF; a reload
                                * swaps them (tls.h) */
  struct export_set *current;  /* what new clients get (exports.h) */
  unsigned generation;         /* of current: one more per reload */
  struct device *devices;      /* images some set uses */
  struct view *views;          /* checkpoint views (exports.h) */
  /* The configuration current is built from, for building it again with
   * a view more or less (server_rebuild()); replaced by a reload.  The
   * rebuild lock serialises builds (reloads, checkpoints). */
  struct config *cf;
  const struct serve_opts *opts;
  pthread_mutex_t rebuild_lock;
  /* --control: every writable image is opened behind a live device that
   * takes checkpoints (core/checkpoint.h), with these options. */
  bool checkpoints;
  struct ckpt_opts ckpt;
  /* A view server (view-server.h): no configured exports, only views. */
  bool views_only;
  pthread_cond_t cond; /* signalled when a connection ends */
  int idle_fd;         /* -s: an eventfd written when the last one ends,
                        * -1: none */
  struct conn *conns;  /* live connections */
  unsigned nconns;
  unsigned next_id;
  bool shutting_down;
  unsigned grace_ms; /* see conn_begin_shutdown() */
};

/* Take over FD (an accepted socket from ADDR) and serve it on a new
 * thread.  Returns false (and closes FD) if the connection could not be
 * started. */
bool conn_start(struct server *srv, int fd, const char *peer,
                const struct sockaddr_storage *addr);
/* Stop reading from every connection (HOW as for shutdown(2)). */
void conn_shutdown_all(struct server *srv, int how);
/* Server shutdown as the NBD spec asks: connections still negotiating are
 * cut; in transmission, requests in flight finish, later ones are answered
 * NBD_ESHUTDOWN (the client then disconnects and may retry elsewhere), and
 * each connection closes when its client leaves or after GRACE_MS. */
void conn_begin_shutdown(struct server *srv, unsigned grace_ms);

/* Build the current set again from the current configuration (and the
 * views as they are now) and make it current.  Returns 0, or -1 with the
 * reason logged; the current set then stays. */
int server_rebuild(struct server *srv);
/* Add view NAME (exports_add_view(): VIEW_BD, taken, keeping BASE open,
 * NULL for nothing) and rebuild the current set so that the next client
 * finds it.  0, or -ENOMEM, or -EIO when the rebuild failed (logged; the
 * view is dropped again). */
int server_add_view(struct server *srv, const char *name, struct bd *view_bd,
                    struct device *base, const char *const *ctx, size_t nctx);
/* Drop view NAME and rebuild; 0 or -ENOENT.  A failed rebuild is logged:
 * the view stays listed until the next change. */
int server_remove_view(struct server *srv, const char *name);

/* ---- running a server (server.c), as the command line asks ---- */

struct serve_opts {
  /* Where to listen.  Neither a socket nor sockets from systemd: TCP port
   * 10809. */
  const char *unix_path;
  const char *port;
  const char *bind_addr;
  int unix_mode; /* of the Unix socket, -1: as the umask makes it */
  /* The exports: a config file, or IMAGES (PATH or NAME=PATH, the first
   * also the default export ""), or with PLUGIN one nbdkit plugin spec. */
  const char *config;
  char **images;
  int n_images;
  bool plugin;
  /* -s: no listener; the one client is on standard input (a socket),
   * and the server stops when it leaves. */
  bool single;
  /* -e: the name of the first IMAGE when it is given without NAME=
   * (nbdkit's preferred export name), NULL: "". */
  const char *export_name;
  bool readonly;     /* every export */
  bool force_share;  /* with readonly: share images with writers */
  char **ro_exports; /* --readonly-export NAME */
  size_t n_ro_exports;
  char **bitmaps; /* -B NAME: exported from every IMAGE */
  size_t n_bitmaps;
  const char *description; /* --description: of every IMAGE, NULL: none */
  const struct bd_open_opts *open; /* how images are opened, NULL: the
                                    * defaults */
  unsigned workers;
  enum hs_tls tls;
  const char *tls_certs; /* directory of X.509 files */
  const char *tls_psk;   /* pre-shared keys file */
  bool tls_verify_peer;
  struct server_limits limits;
  struct acl_rule *allow; /* TCP clients admitted, none: all */
  size_t nallow;
  const char *metrics; /* ADDR:PORT, NULL: no metrics */
  /* --control PATH: the control socket (checkpoint, release, list), NULL:
   * none; its checkpoints' fleece files and bitmaps as CKPT says. */
  const char *control;
  struct ckpt_opts ckpt;
  /* Called once clients can connect (say, to write a pid file); nonzero
   * stops the server. */
  int (*ready)(void *opaque);
  void *opaque;
};

/* Serve until SIGTERM or SIGINT; SIGHUP reloads the TLS credentials and
 * the config file.  Returns the exit status; errors are logged. */
int server_run(const struct serve_opts *o);
/* What a start (or a reload) would check about the exports, without
 * listening: the file, the TLS settings, every image opened read-only.
 * SHOW gets the configuration and the exports as opened.  Returns the
 * exit status. */
typedef void server_show_fn(const struct config *cf, const struct export_set *s,
                            void *opaque);
int server_check(const struct serve_opts *o, server_show_fn *show,
                 void *opaque);

/* ---- the pieces of a running server, for server_run() and the view
 * server (view-server.c) ---- */

/* SRV as O and CF say, nothing opened yet. */
void server_init(struct server *srv, const struct serve_opts *o,
                 struct config *cf);
/* A Unix socket listening at PATH (MODE, -1: the umask's); a stale socket
 * there is replaced, anything else refused.  The fd, or -1 (logged,
 * naming option OPT, if not NULL, before the path). */
int server_listen_unix(const char *opt, const char *path, int mode);
/* Accept clients on LFDS (NL of them) until EVENT(OPAQUE), called when EVFD
 * is readable, returns true.  0, or -1 when poll failed (logged). */
typedef bool server_event_fn(void *opaque);
int server_accept_loop(struct server *srv, const int *lfds, int nl, int evfd,
                       server_event_fn *event, void *opaque);
/* With the listeners closed: end every connection as the NBD spec asks
 * (conn_begin_shutdown()), forcing those still busy after 30 s. */
void server_drain(struct server *srv);
/* Drop the views and the current set, closing (flushing) the images
 * unless a stuck connection holds them.  0, or -1 when a flush failed. */
int server_release(struct server *srv);

#endif
