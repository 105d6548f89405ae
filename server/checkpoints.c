/* SPDX-License-Identifier: BSD-3-Clause */
/* The checkpoint verbs of `serve --control`: checkpoint, release, list.
 *
 * A checkpoint of export E is taken on E's live device (core/checkpoint.h,
 * which wraps every writable image when the server has a control socket);
 * its view becomes the read-only export "E@NAME" of every set built from
 * then on (exports_add_view()), and the current set is rebuilt at once so
 * that the next client finds it.  Release breaks the view at once (its
 * fleece is freed, writes stop copying for it) and drops the export; a
 * client still connected to it then reads EIO. */
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

/* The export NAME means in S ("" the default export), or -1. */
static int find_export(const struct export_set *s, const char *name) {
  int i = exports_find(s, name);
  if (i < 0 && !*name && s->n && !s->catalog.no_default)
    i = 0; /* the default export under its own name */
  return i;
}

static char *view_name(const char *export, const char *ckpt) {
  char *v = NULL;
  return asprintf(&v, "%s@%s", export, ckpt) < 0 ? NULL : v;
}

/* The live device of export NAME in the current set, with a reference to
 * the set in *SP; or a failed answer. */
static int live_device(struct server *srv, const char *name,
                       struct ctl_answer *a, struct export_set **sp,
                       struct export **ep) {
  struct export_set *s = exports_get(srv);
  int i = s ? find_export(s, name) : -1;
  *sp = s;
  if (i < 0)
    return ctl_fail(a, ENOENT, "no export '%s'", name);
  struct export *e = &s->v[i];
  *ep = e;
  if (e->dev->base)
    return ctl_fail(a, EINVAL, "'%s' is a checkpoint's view", e->name);
  if (e->readonly || e->dev->bd->caps.readonly)
    return ctl_fail(a, EROFS,
                    "export '%s' is read-only: a checkpoint freezes a "
                    "writable export",
                    e->name);
  if (!ckpt_is_live(e->dev->bd))
    return ctl_fail(a, ENOTSUP, "export '%s' takes no checkpoints", e->name);
  return 0;
}

/* checkpoint NAME [EXPORT] */
static int do_checkpoint(const struct ctl_request *req, struct ctl_answer *a) {
  struct server *srv = req->opaque;
  const char *ckpt = req->args[0];
  struct export_set *s = NULL;
  struct export *e = NULL;
  int r = live_device(srv, req->nargs > 1 ? req->args[1] : "", a, &s, &e);
  CLEANUP_FREE char *vname = r == 0 ? view_name(e->name, ckpt) : NULL;
  if (r == 0 && !vname)
    r = ctl_fail(a, ENOMEM, "out of memory");
  if (r == 0 && find_export(s, vname) >= 0)
    r = ctl_fail(a, EEXIST, "an export named '%s' exists", vname);
  struct bd *view = NULL;
  if (r == 0 && (r = ckpt_take(e->dev->bd, ckpt, &view)) < 0)
    r = ctl_fail(a, -r, "%s", bd_errmsg());
  if (r == 0) {
    r = exports_add_view(srv, vname, view, e->dev,
                         (const char *const *)view->contexts, view->ncontexts);
    if (r < 0)
      r = ctl_fail(a, ENOMEM, "out of memory");
  }
  if (r == 0 && server_rebuild(srv) < 0) {
    ckpt_view_release(view);
    exports_remove_view(srv, vname);
    r = ctl_fail(a, EIO, "the exports could not be rebuilt (see the log)");
  }
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
  exports_put(srv, s);
  return r;
}

/* The view NAME names: "EXPORT@CKPT" for checkpoint CKPT of EXPORT, or
 * the only view of a checkpoint CKPT.  Under srv->lock. */
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
  struct server *srv = req->opaque;
  const char *ckpt = req->args[0];
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
  exports_remove_view(srv, vname);
  if (server_rebuild(srv) < 0)
    log_warn("release '%s': the exports could not be rebuilt; the view "
             "stays listed until the next change",
             vname);
  log_info("released view '%s'", vname);
  ctl_add_str(a, "view", vname);
  return 0;
}

/* One export's checkpoints, as list shows them. */
static void list_export(struct server *srv, const struct export *e,
                        struct ctl_answer *a, uint64_t *fleece) {
  struct ckpt_info *v = NULL;
  size_t n = 0;
  uint64_t used = 0;
  if (ckpt_list(e->dev->bd, &v, &n, &used) < 0)
    return;
  *fleece += used;
  for (size_t i = 0; i < n; i++) {
    ctl_object_begin(a);
    ctl_add_str(a, "export", e->name);
    ctl_add_str(a, "name", v[i].name);
    if (v[i].prev)
      ctl_add_str(a, "previous", v[i].prev);
    CLEANUP_FREE char *vname = view_name(e->name, v[i].name);
    pthread_mutex_lock(&srv->lock);
    bool listed = vname && exports_view_find(srv, vname);
    pthread_mutex_unlock(&srv->lock);
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
  struct server *srv = req->opaque;
  struct export_set *s = exports_get(srv);
  uint64_t fleece = 0;
  ctl_array_begin(a, "checkpoints");
  for (size_t i = 0; s && i < s->n; i++) {
    const struct export *e = &s->v[i];
    bool first = true; /* an image of several exports: listed once */
    for (size_t j = 0; j < i; j++)
      first = first && s->v[j].dev != e->dev;
    if (first && !e->dev->base && ckpt_is_live(e->dev->bd))
      list_export(srv, e, a, &fleece);
  }
  ctl_array_end(a);
  ctl_add_u64(a, "fleece-bytes", fleece);
  if (srv->ckpt.fleece_limit)
    ctl_add_u64(a, "fleece-limit", srv->ckpt.fleece_limit);
  ctl_add_str(a, "fleece-dir",
              srv->ckpt.fleece_dir ? srv->ckpt.fleece_dir
                                   : CKPT_DEFAULT_FLEECE_DIR);
  exports_put(srv, s);
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

struct ctl_server *checkpoints_start(struct server *srv, const char *path) {
  return ctl_start(path, verbs, sizeof verbs / sizeof verbs[0], srv);
}
