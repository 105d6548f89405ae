/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport: what a source implements.
 *
 * A source (formats/: raw, qcow2, nbd, rbd, plugin, null, memory)
 * allocates its struct bd with bd_new(), fills its size and capabilities,
 * and implements struct bd_ops.  A source that wraps another and acts on
 * some of its requests (copy-before-write of checkpoint views,
 * copy-on-read) is a filter: core/filter.h builds it, and it implements
 * only what it intercepts.  The synchronous operations run where the core
 * chooses (enum bd_exec): the submitting thread, the worker pool, or the
 * source's own submit().  A failing operation returns -errno and records
 * a message with bd_set_error() (core/error.h).  Users of a device see
 * core/blockdev.h; opening one by name is core/open.h.
 */
#ifndef BLOCKPORT_SOURCE_H
#define BLOCKPORT_SOURCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "blockdev.h"
#include "open.h"

/* Per-connection state.  A source with conn_open() (an nbdkit plugin opens
 * a handle per client connection) keeps state per connection of a front
 * end: the NBD server opens one per client connection when transmission
 * starts, FUSE and vhost one at start.  Requests name their connection in
 * bd_req.conn; a request with conn == NULL uses a default connection the
 * core opens on first use (for tools like convert).  A front end uses
 * either its own connections or the default one, not both.  What a device
 * advertises (size, caps) is fixed when it is opened, from the source's
 * first handle, even if a source could answer differently per connection.
 * Sources without conn_open() ignore all this. */
struct bd_conn_params {
  const char *export_name; /* as the client asked for it ("" by default) */
  bool readonly;           /* the front end forces read-only */
  int peer_fd;             /* the client's socket, or -1 */
};

struct bd_conn {
  struct bd *bd;
  void *priv;           /* the source's state: conn_open()'s result */
  pthread_mutex_t lock; /* serialises BD_CONC_SERIALIZE_CONN requests */
  char *export_name;    /* bd_conn_prepare()'s, for conn_open() */
  bool readonly;
  int peer_fd;
  bool started; /* conn_open() done, holding a slot (bd_conn_start()) */
  atomic_bool cancelled; /* bd_conn_cancel(): the client is gone */
};

/* Operations of a source.  The synchronous ones return 0 or -errno and may
 * record a message with bd_set_error().  Unsupported operations are NULL. */
struct bd_ops {
  const char *name;
  int (*pread)(struct bd *bd, void *buf, uint64_t len, uint64_t off);
  int (*pwrite)(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                uint32_t flags);
  int (*flush)(struct bd *bd);
  int (*trim)(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags);
  int (*zero)(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags);
  int (*cache)(struct bd *bd, uint64_t len, uint64_t off);
  int (*extents)(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags,
                 struct bd_extents *ext);
  /* Optional: block status of named context CTX (0-based index into
   * bd->contexts), as extents() with each extent's flags the value. */
  int (*context_extents)(struct bd *bd, size_t ctx, uint64_t len, uint64_t off,
                         uint32_t flags, struct bd_extents *ext);
  /* Optional, BD_EXEC_POOL sources: try a read or write in the submitting
   * thread when it needs no device I/O (say, from the page cache), taking
   * microseconds.  Returns -EAGAIN when it would wait for the device, and
   * the core queues the request to the pool. */
  int (*try_nowait)(struct bd *bd, struct bd_req *req);
  /* Optional, BD_EXEC_POOL sources: start REQ without the pool (io_uring,
   * core/uring.h) and complete it later with bd_complete().  Returns 0
   * when started, or -EAGAIN, and the core queues it to the pool. */
  int (*submit_async)(struct bd *bd, struct bd_req *req);
  /* BD_EXEC_ASYNC sources only: start the request, call bd_complete(). */
  void (*submit)(struct bd *bd, struct bd_req *req);
  void (*close)(struct bd *bd);
  /* Optional, per-connection state (see struct bd_conn).  conn_open()
   * returns the state or NULL with bd_set_error(); operations find it with
   * bd_conn_current(). */
  void *(*conn_open)(struct bd *bd, const struct bd_conn_params *p);
  void (*conn_close)(struct bd *bd, void *priv);
  /* Optional: CONN was cancelled (bd_conn_cancel(): its client is gone).
   * A source that holds requests of CONN waiting (for a lost server)
   * completes them now with -ECANCELED; those it already started finish
   * as they would.  A filter passes it on to its inner connection.  Any
   * thread; never blocks on I/O. */
  void (*cancel)(struct bd *bd, struct bd_conn *conn);
  /* Optional: the export names the source offers (NBD_OPT_LIST), with
   * descriptions (NULL for none).  Returns 0 or -errno. */
  int (*list_exports)(struct bd *bd, bool readonly, struct bd_export_list *l);
  /* Optional, sources on files: drop (HOLD false) or take back (HOLD true,
   * without testing others) the image locks of the files (see
   * bd_hold_locks()). */
  void (*hold_locks)(struct bd *bd, bool hold);
  /* Optional: where the bytes [off, off+len) lie in a host file as they
   * are, as far as they do contiguously: the descriptor, the offset there
   * and how many bytes (*n <= len).  -ENOTSUP where they do not (zeroes,
   * compressed, in a backing file, not a file).  For bd_copy_range(). */
  int (*host_range)(struct bd *bd, uint64_t off, uint64_t len, int *fd,
                    uint64_t *host, uint64_t *n);
  /* Optional, writable sources: change the virtual size to SIZE (see
   * bd_resize()). */
  int (*resize)(struct bd *bd, uint64_t size, enum bd_prealloc prealloc);
  /* Optional, persistent dirty bitmaps a writer starts and stops (a
   * checkpoint's, core/checkpoint.h); a source without them keeps none
   * and its user keeps bitmaps in memory.  Each returns 0 or -errno with
   * bd_set_error().
   *
   * bitmap_resume(): at a fresh opening, the bitmap a previous user
   * started last and that still records: the last enabled bitmap in the
   * source's order of creation, when it is consistent (stored by a clean
   * close), its name in *NAME (malloc'd).  -ENOENT when there is none
   * (none enabled, or the last one inconsistent: a crash); any other
   * error (-EROFS, -ENOTSUP: an image that cannot store bitmaps) means
   * this opening keeps none, and the other three must not be called.
   * The rule cannot tell a checkpoint's bitmap from a user's own enabled
   * one created after it: that one is taken for it.
   *
   * bitmap_start(): a new bitmap NAME of GRANULARITY bytes (a power of two,
   * 512 B to 2 GiB), empty, recording every write, zero and trim from now
   * on, on disk before it returns (marked in use, so that a crash leaves it
   * inconsistent, never silently wrong); its bits are stored at close.
   * -EEXIST when the source has a bitmap NAME; the source's limits (name
   * length, number of bitmaps) refuse others.  Only with no write, zero
   * or trim in flight.
   *
   * bitmap_enable(): NAME records writes (ON) or stops recording them (its
   * bits so far kept, and stored at close).  Only with no write in
   * flight.  -ENOENT when NAME is not a bitmap this opening keeps.
   *
   * bitmap_bits(): the bits of NAME, as stored and set since, reported as
   * byte ranges of the device [OFF, OFF+LEN) whose every byte a set bit
   * covers (at the bitmap's own granularity, clipped to the size), in
   * order, through DIRTY (which returns 0, or -errno to stop). */
  int (*bitmap_resume)(struct bd *bd, char **name);
  int (*bitmap_start)(struct bd *bd, const char *name, uint32_t granularity);
  int (*bitmap_enable)(struct bd *bd, const char *name, bool on);
  int (*bitmap_bits)(struct bd *bd, const char *name,
                     int (*dirty)(void *opaque, uint64_t off, uint64_t len),
                     void *opaque);
};

/* Allocation for sources: a bd with ops set and everything else default. */
struct bd *bd_new(const struct bd_ops *ops, const char *format,
                  const char *description);

/* For sources: add NAME to the contexts BD offers (0 or -ENOMEM). */
int bd_add_context(struct bd *bd, const char *name);

/* Every capability, 1-byte granularity, 4 KiB preferred and BD_MAX_IO
 * maximum block size: sources start from this and clear what they lack. */
struct bd_caps bd_caps_full(void); /* bd_new() starts from it */

/* Within an operation of a source: the state of the request's connection
 * (conn_open()'s result), NULL outside one. */
void *bd_conn_current(void);

/* Finishes REQ with ERR (0 or -errno): the one way a request completes,
 * for the core and for sources that complete requests themselves
 * (BD_EXEC_ASYNC, submit_async).  On failure REQ's message is the one set
 * with bd_req_set_error(), or else the calling thread's bd_errmsg() (a
 * synchronous operation that just failed here), or else strerror(). */
void bd_complete(struct bd_req *req, int err);
/* Sets REQ's message (before bd_complete()), from any thread: a source
 * that finishes a request away from where it failed says why here. */
void bd_req_set_error(struct bd_req *req, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
