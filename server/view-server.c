/* SPDX-License-Identifier: BSD-3-Clause */
/* The view server (view-server.h): server_run()'s pieces (server.c) on a
 * configuration without exports, its accept loop on a thread stopped
 * through an eventfd. */
#include "view-server.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "core/blockdev.h"
#include "core/log.h"
#include "exports.h"
#include "server.h"

struct view_server {
  struct server srv;
  struct config cf; /* empty: views only */
  struct serve_opts so;
  char *path;
  int lfd, evfd;
  pthread_t thread;
};

static bool on_stop(void *opaque) {
  struct view_server *vs = opaque;
  uint64_t v;
  return read(vs->evfd, &v, sizeof v) == sizeof v;
}

static void *accept_thread(void *arg) {
  struct view_server *vs = arg;
  int lfd = vs->lfd;
  server_accept_loop(&vs->srv, &lfd, 1, vs->evfd, on_stop, vs);
  return NULL;
}

static void vs_free(struct view_server *vs) {
  if (vs->lfd >= 0) {
    close(vs->lfd);
    unlink(vs->path);
  }
  if (vs->evfd >= 0)
    close(vs->evfd);
  free(vs->path);
  free(vs);
}

/* PATH made absolute: a daemon that leaves its directory still removes
 * it. */
static char *absolute(const char *path) {
  char cwd[4096], *out = NULL;
  if (path[0] == '/')
    return strdup(path);
  if (!getcwd(cwd, sizeof cwd))
    return NULL;
  return asprintf(&out, "%s/%s", cwd, path) < 0 ? NULL : out;
}

struct view_server *view_server_start(const char *unix_path) {
  struct view_server *vs = calloc(1, sizeof *vs);
  if (!vs || !(vs->path = absolute(unix_path))) {
    free(vs);
    bd_set_error("out of memory");
    return NULL;
  }
  vs->lfd = vs->evfd = -1;
  /* serve's limits; no TLS, no metrics. */
  vs->so = (struct serve_opts){.unix_path = vs->path,
                               .unix_mode = 0600,
                               .limits = {.max_connections = 128,
                                          .max_requests = 256,
                                          .max_bytes = 64ull * 1024 * 1024,
                                          .handshake_ms = 10000}};
  server_init(&vs->srv, &vs->so, &vs->cf);
  vs->srv.views_only = true;
  if (server_rebuild(&vs->srv) < 0) {
    bd_set_error("%s: the view server's exports could not be built", unix_path);
    vs_free(vs);
    return NULL;
  }
  vs->evfd = eventfd(0, EFD_CLOEXEC);
  if (vs->evfd < 0 ||
      (vs->lfd = server_listen_unix(NULL, vs->path, 0600)) < 0) {
    bd_set_error("%s: %s", unix_path,
                 vs->evfd < 0 ? strerror(errno)
                              : "cannot listen (see the log)");
    server_release(&vs->srv);
    vs_free(vs);
    return NULL;
  }
  if (pthread_create(&vs->thread, NULL, accept_thread, vs) != 0) {
    bd_set_error("cannot start the view server's thread");
    server_release(&vs->srv);
    vs_free(vs);
    return NULL;
  }
  pthread_setname_np(vs->thread, "bp-views");
  log_info("checkpoint views served on unix %s", vs->path);
  return vs;
}

int view_server_add(struct view_server *vs, const char *name, struct bd *view,
                    const char *const *ctx, size_t n) {
  return server_add_view(&vs->srv, name, view, NULL, ctx, n);
}

int view_server_remove(struct view_server *vs, const char *name) {
  return server_remove_view(&vs->srv, name);
}

struct server *view_server_srv(struct view_server *vs) {
  return vs ? &vs->srv : NULL;
}

void view_server_stop(struct view_server *vs) {
  if (!vs)
    return;
  uint64_t one = 1;
  if (write(vs->evfd, &one, sizeof one) != sizeof one)
    log_warn("view server: %s", strerror(errno));
  pthread_join(vs->thread, NULL);
  close(vs->lfd);
  unlink(vs->path);
  vs->lfd = -1;
  server_drain(&vs->srv);
  server_release(&vs->srv);
  vs_free(vs);
}
