/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit plugins as a source: what formats/plugin.c (the source, part of
 * blockport_core) shares with formats/plugin-host.c (the nbdkit_* functions
 * plugins import from their host, linked only into the blockport
 * executable, so that blockport's own nbdkit plugin never carries them). */
#ifndef BLOCKPORT_PLUGIN_H
#define BLOCKPORT_PLUGIN_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bd_export_list;

/* One extent as nbdkit_add_extent() received it (the layout of struct
 * nbdkit_extent in nbdkit-filter.h). */
struct pl_extent {
  uint64_t offset;
  uint64_t length;
  uint32_t type;
};

/* The list behind struct nbdkit_extents: extents of [start, end). */
struct nbdkit_extents {
  uint64_t start, end;
  uint64_t next; /* where the next extent must begin */
  bool any;      /* an extent was added (next is meaningful) */
  struct pl_extent *v;
  size_t n, cap;
};

/* The list behind struct nbdkit_exports. */
struct nbdkit_exports {
  struct bd_export_list *list;
  bool use_default; /* nbdkit_use_default_export() was called */
};

/* Per-connection state: the plugin's handle and what the nbdkit_*
 * functions may ask about the connection. */
struct pl_conn {
  void *handle;
  char *export_name;
  int peer_fd;
  pthread_mutex_t lock; /* guards interns */
  char **interns;       /* nbdkit_strdup_intern() copies, freed at close */
  size_t ninterns;
};

/* What the thread running a plugin callback is doing. */
struct pl_thread {
  struct pl_conn *conn; /* the connection of the callback, or NULL */
  int err;              /* from nbdkit_set_error(), 0 if none */
  bool in_data;         /* serving a request: errors go to the reply */
  bool msg_set;         /* nbdkit_error() was called */
};
extern _Thread_local struct pl_thread pl_thread;

/* For plugin-host.c. */
const char *pl_name(void);
void pl_report_error(const char *msg);
void pl_report_debug(const char *msg);
int pl_extents_init(struct nbdkit_extents *e, uint64_t start, uint64_t end);
int pl_extents_add(struct nbdkit_extents *e, uint64_t offset, uint64_t length,
                   uint32_t type);
void pl_extents_fini(struct nbdkit_extents *e);
int pl_exports_add(struct nbdkit_exports *x, const char *name,
                   const char *description);
/* A copy of STR living as long as the current connection (or the plugin,
 * outside one).  NULL when out of memory. */
const char *pl_intern(const char *str, size_t n);

#endif
