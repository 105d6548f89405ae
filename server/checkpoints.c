/* SPDX-License-Identifier: BSD-3-Clause */
/* The checkpoint verbs of a control socket: checkpoint, release, list.
 *
 * A checkpoint of export E is taken on E's live device (core/checkpoint.h:
 * serve wraps every writable image in one when it has a control socket,
 * vhost and mount their disk when they serve views); its view becomes the
 * read-only export "E@NAME" of every set the host's view server builds
 * from then on (exports_add_view()), and its current set is rebuilt at
 * once so that the next client finds it.  For serve that server is
 * itself; for vhost and mount a view server (view-server.h).  Release
 * breaks the view at once (its fleece is freed, writes stop copying for
 * it) and drops the export; a client still connected to it then reads
 * EIO. */
#include "checkpoints.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/cleanup.h"
#include "core/control.h"
#include "core/log.h"
#include "exports.h"
#include "server.h"

struct checkpoints {
  struct ckpt_host host;
  struct ctl_server *ctl;
};

/* ---- the exports of a host ---- */

struct found {
  struct ckpt_export *v;
  size_t n;
  void *hold;
};

static int host_get(const struct ckpt_host *h, struct found *f) {
  if (h->get)
    return h->get(h, &f->v, &f->n, &f->hold);
  f->v = (struct ckpt_export *)&h->disk;
  f->n = 1;
  return 0;
}

static void host_put(const struct ckpt_host *h, struct found *f) {
  if (h->put)
    h->put(h, f->v, f->hold);
}

/* The export NAME means ("" the default export), or NULL. */
static struct ckpt_export *find_export(const struct found *f,
                                       const char *name) {
  for (size_t i = 0; i < f->n; i++)
    if (!strcmp(f->v[i].name, name))
      return &f->v[i];
  for (size_t i = 0; !*name && i < f->n; i++)
    if (f->v[i].is_default)
      return &f->v[i];
  return NULL;
}

static char *view_name(const char *export, const char *ckpt) {
  char *v = NULL;
  return asprintf(&v, "%s@%s", export, ckpt) < 0 ? NULL : v;
}

/* Whether the view server of H has an export named NAME. */
static bool export_exists(const struct ckpt_host *h, const char *name) {
  struct export_set *s = exports_get(h->views);
  bool found = s && exports_find(s, name) >= 0;
  exports_put(h->views, s);
  return found;
}

/* The export NAME of F that takes a checkpoint now, in *EP; or a failed
 * answer. */
static int live_device(const struct ckpt_host *h, const struct found *f,
                       const char *name, struct ctl_answer *a,
                       struct ckpt_export **ep) {
  struct ckpt_export *e = find_export(f, name);
  *ep = e;
  if (!e && !*name)
    return ctl_fail(a, ENOENT,
                    "no default export: name the export (checkpoint NAME "
                    "EXPORT)");
  if (!e)
    return ctl_fail(a, ENOENT, "no export '%s'", name);
  if (e->is_view)
    return ctl_fail(a, EINVAL, "'%s' is a checkpoint's view", e->name);
  if (e->readonly || e->bd->caps.readonly)
    return ctl_fail(a, EROFS,
                    "export '%s' is read-only: a checkpoint freezes a "
                    "writable export",
                    e->name);
  if (!ckpt_is_live(e->bd) || !h->views)
    return ctl_fail(a, ENOTSUP, "export '%s' takes no checkpoints%s%s", e->name,
                    h->hint ? ": " : "", h->hint ? h->hint : "");
  return 0;
}

/* checkpoint NAME [EXPORT] */
static int do_checkpoint(const struct ctl_request *req, struct ctl_answer *a) {
  const struct ckpt_host *h = req->opaque;
  const char *ckpt = req->args[0];
  struct found f = {0};
  if (host_get(h, &f) < 0)
    return ctl_fail(a, ENOMEM, "out of memory");
  struct ckpt_export *e = NULL;
  int r = live_device(h, &f, req->nargs > 1 ? req->args[1] : "", a, &e);
  CLEANUP_FREE char *vname = r == 0 ? view_name(e->name, ckpt) : NULL;
  if (r == 0 && !vname)
    r = ctl_fail(a, ENOMEM, "out of memory");
  if (r == 0 && export_exists(h, vname))
    r = ctl_fail(a, EEXIST, "an export named '%s' exists", vname);
  struct bd *view = NULL;
  if (r == 0 && (r = ckpt_take(e->bd, ckpt, &view)) < 0)
    r = ctl_fail(a, -r, "%s", bd_errmsg());
  if (r == 0) {
    r = server_add_view(h->views, vname, view, e->base,
                        (const char *const *)view->contexts, view->ncontexts);
    if (r < 0)
      r = ctl_fail(a, -r, "%s",
                   r == -ENOMEM ? "out of memory"
                                : "the exports could not be rebuilt (see the "
                                  "log)");
  }
  /* VIEW is the server's now, and stays open: only a release (a handler
   * too, so not now) drops it. */
  if (r == 0) {
    log_info("checkpoint '%s' of export '%s': view '%s'", ckpt, e->name, vname);
    ctl_add_str(a, "checkpoint", ckpt);
    ctl_add_str(a, "export", e->name);
    ctl_add_str(a, "view", vname);
    const char *ctx[1 + BD_MAX_CONTEXTS] = {"base:allocation"};
    for (size_t i = 0; i < view->ncontexts && i < BD_MAX_CONTEXTS; i++)
      ctx[i + 1] = view->contexts[i];
    ctl_add_strv(a, "contexts", ctx, 1 + view->ncontexts);
  }
  host_put(h, &f);
  return r;
}

/* The view NAME names in SRV: "EXPORT@CKPT" for checkpoint CKPT of
 * EXPORT, or the only view of a checkpoint CKPT.  Under srv->lock. */
static struct view *find_view(struct server *srv, const char *ckpt,
                              const char *export, struct ctl_answer *a) {
  if (export) {
    CLEANUP_FREE char *vname = view_name(export, ckpt);
    struct view *v = vname ? exports_view_find(srv, vname) : NULL;
    if (!v)
      ctl_fail(a, ENOENT, "no view of checkpoint '%s' of export '%s'", ckpt,
               export);
    return v;
  }
  struct view *found = NULL;
  size_t n = 0, len = strlen(ckpt);
  for (struct view *v = srv->views; v; v = v->next) {
    size_t vl = strlen(v->name);
    if (vl > len && v->name[vl - len - 1] == '@' &&
        !strcmp(v->name + vl - len, ckpt)) {
      found = v;
      n++;
    }
  }
  if (n == 0)
    ctl_fail(a, ENOENT, "no view of a checkpoint '%s'", ckpt);
  else if (n > 1)
    ctl_fail(a, EINVAL, "checkpoint '%s' has views of %zu exports: name one",
             ckpt, n);
  return n == 1 ? found : NULL;
}

/* release NAME [EXPORT] */
static int do_release(const struct ctl_request *req, struct ctl_answer *a) {
  const struct ckpt_host *h = req->opaque;
  struct server *srv = h->views;
  const char *ckpt = req->args[0];
  if (!srv)
    return ctl_fail(a, ENOENT, "no view of a checkpoint '%s'", ckpt);
  pthread_mutex_lock(&srv->lock);
  struct view *v =
      find_view(srv, ckpt, req->nargs > 1 ? req->args[1] : NULL, a);
  CLEANUP_FREE char *vname = v ? strdup(v->name) : NULL;
  struct bd *bd = v ? v->dev->bd : NULL;
  pthread_mutex_unlock(&srv->lock);
  if (!v)
    return -ENOENT;
  if (!vname)
    return ctl_fail(a, ENOMEM, "out of memory");
  /* Only the control thread removes views, so V is still listed. */
  ckpt_view_release(bd);
  server_remove_view(srv, vname);
  log_info("released view '%s'", vname);
  ctl_add_str(a, "view", vname);
  return 0;
}

/* One export's checkpoints, as list shows them. */
static void list_export(const struct ckpt_host *h, const struct ckpt_export *e,
                        struct ctl_answer *a, uint64_t *fleece) {
  struct ckpt_info *v = NULL;
  size_t n = 0;
  uint64_t used = 0;
  if (ckpt_list(e->bd, &v, &n, &used) < 0)
    return;
  *fleece += used;
  for (size_t i = 0; i < n; i++) {
    ctl_object_begin(a);
    ctl_add_str(a, "export", e->name);
    ctl_add_str(a, "name", v[i].name);
    if (v[i].prev)
      ctl_add_str(a, "previous", v[i].prev);
    CLEANUP_FREE char *vname = view_name(e->name, v[i].name);
    bool listed = false;
    if (vname && h->views) {
      pthread_mutex_lock(&h->views->lock);
      listed = exports_view_find(h->views, vname) != NULL;
      pthread_mutex_unlock(&h->views->lock);
    }
    if (listed && v[i].view_open)
      ctl_add_str(a, "view", vname);
    ctl_add_bool(a, "broken", v[i].broken);
    if (v[i].reason)
      ctl_add_str(a, "reason", v[i].reason);
    ctl_add_u64(a, "fleece-bytes", v[i].fleece);
    ctl_add_bool(a, "recording", v[i].recording);
    if (v[i].has_bitmap)
      ctl_add_u64(a, "dirty-bytes", v[i].dirty);
    ctl_object_end(a);
  }
  ckpt_info_free(v, n);
}

/* list */
static int do_list(const struct ctl_request *req, struct ctl_answer *a) {
  const struct ckpt_host *h = req->opaque;
  struct found f = {0};
  if (host_get(h, &f) < 0)
    return ctl_fail(a, ENOMEM, "out of memory");
  uint64_t fleece = 0;
  ctl_array_begin(a, "checkpoints");
  for (size_t i = 0; i < f.n; i++) {
    const struct ckpt_export *e = &f.v[i];
    bool first = true; /* an image of several exports: listed once */
    for (size_t j = 0; j < i; j++)
      first = first && f.v[j].bd != e->bd;
    if (first && !e->is_view && ckpt_is_live(e->bd))
      list_export(h, e, a, &fleece);
  }
  ctl_array_end(a);
  ctl_add_u64(a, "fleece-bytes", fleece);
  if (h->ckpt.fleece_limit)
    ctl_add_u64(a, "fleece-limit", h->ckpt.fleece_limit);
  ctl_add_str(a, "fleece-dir",
              h->ckpt.fleece_dir ? h->ckpt.fleece_dir
                                 : CKPT_DEFAULT_FLEECE_DIR);
  host_put(h, &f);
  return 0;
}

static const struct ctl_verb verbs[] = {
    {"checkpoint", 1, 2, "checkpoint NAME [EXPORT]",
     "freeze EXPORT (default: the default export) as read-only export "
     "EXPORT@NAME; start bitmap NAME",
     do_checkpoint},
    {"release", 1, 2, "release NAME [EXPORT]",
     "drop checkpoint NAME's view and its fleece", do_release},
    {"list", 0, 0, "list", "checkpoints, their views and fleece use", do_list},
};

struct checkpoints *checkpoints_start(const struct ckpt_host *h,
                                      const char *path) {
  struct checkpoints *c = calloc(1, sizeof *c);
  if (!c) {
    bd_set_error("out of memory");
    return NULL;
  }
  c->host = *h;
  c->ctl = ctl_start(path, verbs, sizeof verbs / sizeof verbs[0], &c->host);
  if (!c->ctl) {
    free(c);
    return NULL;
  }
  return c;
}

void checkpoints_stop(struct checkpoints *c) {
  if (!c)
    return;
  ctl_stop(c->ctl);
  free(c);
}

/* ---- serve's host: the exports of its current set ---- */

static int serve_get(const struct ckpt_host *h, struct ckpt_export **out,
                     size_t *n, void **hold) {
  struct server *srv = h->views;
  struct export_set *s = exports_get(srv);
  struct ckpt_export *v = calloc(s && s->n ? s->n : 1, sizeof *v);
  if (!v) {
    exports_put(srv, s);
    return -ENOMEM;
  }
  for (size_t i = 0; s && i < s->n; i++) {
    const struct export *e = &s->v[i];
    v[i] = (struct ckpt_export){.name = e->name,
                                .bd = e->dev->bd,
                                .base = e->dev,
                                .readonly = e->readonly,
                                .is_view = e->dev->base != NULL,
                                .is_default = i == 0 && !s->catalog.no_default};
  }
  *out = v;
  *n = s ? s->n : 0;
  *hold = s;
  return 0;
}

static void serve_put(const struct ckpt_host *h, struct ckpt_export *v,
                      void *hold) {
  free(v);
  exports_put(h->views, hold);
}

struct ckpt_host checkpoints_serve_host(struct server *srv) {
  return (struct ckpt_host){
      .views = srv, .ckpt = srv->ckpt, .get = serve_get, .put = serve_put};
}
