/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport: the block-device interface at the centre of the program.
 *
 * Three headers make the seam: this one is for users of an opened device
 * (front ends and tools: requests, connections, events); core/open.h opens
 * one by name; core/source.h is what a source implements.
 *
 * Every source (raw and qcow2 files, null, memory, an NBD URI, a Ceph RBD
 * image, an nbdkit plugin; formats/) is a struct bd, opened through the
 * format table a program installs (bd_formats_install()); every front end
 * (the NBD server, FUSE, vhost-user-blk, the image tools) talks only to
 * struct bd.  A front end never knows which format it reads; a source never
 * knows who asked.
 *
 * Contract
 * --------
 * - bd_submit() is asynchronous: the request's done() callback is called
 *   exactly once, either before bd_submit() returns (sources that complete
 *   inline, such as null and memory, and page-cache hits of try_nowait())
 *   or later on whatever thread finishes it: a pool worker, an io_uring
 *   reaper or the submitting poller thread (bd_poller_run()), the NBD
 *   source's own thread.  done() may run on any thread and must not block
 *   for long.
 * - Many threads may call bd_submit() on the same bd at once.  The core
 *   serialises requests only as much as the source's concurrency asks.
 * - Requests are validated by the core (range inside the device, flags
 *   supported, writes on a read-only device); a front end should still
 *   validate first to give its protocol's precise error.
 * - Errors travel with the request: done() receives a negative errno, and
 *   the request's own message is in bd_req.errmsg (whichever thread
 *   completed it, and however many other requests failed at the same
 *   time).  Calls that do not take a request (opening, bd_run() and the
 *   synchronous conveniences) leave their message in the calling thread's
 *   bd_errmsg() (core/error.h): one convention per kind of call.
 * - Offsets and lengths are 64-bit everywhere.
 * - Writes that completed (done() called with 0) before a BD_FLUSH is
 *   submitted are durable when that flush completes, whichever thread or
 *   connection submitted them.
 */
#ifndef BLOCKPORT_BLOCKDEV_H
#define BLOCKPORT_BLOCKDEV_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

enum bd_cmd {
  BD_READ,
  BD_WRITE,
  BD_FLUSH,
  BD_TRIM,
  BD_ZERO,
  BD_CACHE,
  BD_BLOCK_STATUS,
};

/* Request flags. */
#define BD_F_FUA 0x1u       /* write/trim/zero: durable before completion */
#define BD_F_MAY_TRIM 0x2u  /* zero: may deallocate the range */
#define BD_F_FAST_ZERO 0x4u /* zero: fail with -ENOTSUP unless fast */
#define BD_F_REQ_ONE 0x8u   /* block status: one extent is enough */
#define BD_F_COMPRESS 0x10u /* write: store compressed where the format can */
/* Read/write: the submitting thread may copy a large request between its
 * buffer and the page cache itself (a front end with threads to spare, as
 * FUSE's receive threads); without it a source does only small writes in
 * the caller's thread and hands large ones off. */
#define BD_F_INLINE_BIG 0x20u
/* Set by core/disk.c on the requests it makes: aligned to the minimum
 * block, and (writes) under its range lock. */
#define BD_F_ALIGNED 0x80000000u

/* Extent flags (the same meaning as NBD base:allocation). */
#define BD_EXT_HOLE 0x1u /* not allocated in any layer */
#define BD_EXT_ZERO 0x2u /* reads as zeroes */

struct bd_extent {
  uint64_t length;
  uint32_t flags; /* BD_EXT_* */
  uint32_t
      depth; /* allocation depth: 0 unallocated, 1 this layer, 2+ backing */
};

/* A growing list of extents describing [start, start + sum of lengths). */
struct bd_extents {
  struct bd_extent *v;
  size_t n, cap;
  size_t max; /* stop accepting extents after this many (0 = unbounded) */
  uint64_t start;
  uint64_t end; /* covered so far: start + sum of lengths */
};

void bd_extents_init(struct bd_extents *e, uint64_t start, size_t max);
void bd_extents_reset(struct bd_extents *e, uint64_t start, size_t max);
void bd_extents_free(struct bd_extents *e);
/* Append an extent, merging with the previous one when flags and depth
 * match.  Returns 0, 1 when the list is full (caller should stop), or
 * -ENOMEM. */
int bd_extents_add(struct bd_extents *e, uint64_t length, uint32_t flags,
                   uint32_t depth);

/* Named block-status contexts.  Beside allocation (struct bd_extent's
 * flags and depth), a source may offer named contexts, each a 32-bit value
 * per byte range: an image's persistent dirty bitmap, a context the server
 * of an NBD source offers.  They are named as NBD meta contexts, which is
 * the common currency (a dirty bitmap is BD_CTX_BITMAP_PREFIX NAME, value
 * BD_CTX_DIRTY where dirty).  A user asks for them when it opens the source
 * (bd_open_opts.contexts); the source offers exactly those, in that order,
 * in bd.contexts, or fails to open saying why; a BD_BLOCK_STATUS request
 * with context I (1-based) then fills its extents' flags with context
 * I's values (depth 0).  Context 0 is allocation. */
#define BD_CTX_BITMAP_PREFIX "qemu:dirty-bitmap:"
#define BD_CTX_DIRTY 0x1u  /* a dirty bitmap's value where it is set */
#define BD_MAX_CONTEXTS 16 /* asked for at one opening */

struct bd_caps {
  bool readonly;
  bool can_trim;
  bool can_zero;      /* efficient zeroing (else the core writes zeroes) */
  bool can_fast_zero; /* honours BD_F_FAST_ZERO by failing when slow */
  bool can_fua;       /* FUA is supported (natively or by flush) */
  bool native_fua;    /* the source handles BD_F_FUA itself */
  bool can_flush;
  bool can_cache;
  bool can_extents; /* real block status (else: all data, depth 1) */
  bool multi_conn;  /* a flush covers writes from every user of this bd */
  /* An EIO may be gone on a second try (a remote source reconnecting):
   * worth retrying where a front end cannot report it (a mount's
   * partition table).  Off in bd_caps_full(): a local file's EIO stays. */
  bool transient_eio;
  /* Requests not aligned to min_block fail (a file opened with O_DIRECT):
   * the core aligns them (core/disk.c), so users may send any range. */
  bool aligned_only;
  /* context_extents() never blocks (answers from memory): the core runs
   * it in the submitting thread, with no hand-off to the pool.  Off in
   * bd_caps_full(). */
  bool contexts_nowait;
  uint32_t min_block, pref_block, max_block;
};

/* How much the core must serialise a source's operations: the four thread
 * models of nbdkit plugins, from the loosest. */
enum bd_concurrency {
  BD_CONC_PARALLEL,       /* any number of operations at once */
  BD_CONC_SERIALIZE_CONN, /* one operation at a time per connection */
  BD_CONC_SERIALIZE,      /* one operation (or connection open/close) at a
                             time on this device */
  BD_CONC_SERIALIZE_CONNS /* as SERIALIZE, and one connection open at a
                             time: bd_conn_open() waits for the last one to
                             close */
};

/* How a source's operations are executed. */
enum bd_exec {
  BD_EXEC_INLINE, /* cheap and non-blocking: run in the submitting thread */
  BD_EXEC_POOL,   /* may block: run on the shared worker pool */
  BD_EXEC_ASYNC,  /* the source implements submit() itself */
};

struct bd;
struct bd_req;
struct bd_ops;
struct bd_conn; /* opaque to users: see bd_conn_open() */
struct bd_export_list;

/* How bd_resize() fills the space it adds (qemu-img's --preallocation). */
enum bd_prealloc {
  BD_PREALLOC_OFF,      /* nothing: reads as zeroes, takes no space */
  BD_PREALLOC_METADATA, /* the format's mapping made (qcow2 only) */
  BD_PREALLOC_FALLOC,   /* space reserved in the file system */
  BD_PREALLOC_FULL,     /* zeroes written */
};
/* "off", "metadata", "falloc", "full".  Returns 0 or -EINVAL. */
int bd_prealloc_parse(const char *name, enum bd_prealloc *out);

/* A list of exports, from bd_list_exports(). */
struct bd_export_list {
  struct bd_export {
    char *name, *description;
  } * v;
  size_t n, cap;
};
int bd_export_list_add(struct bd_export_list *l, const char *name,
                       const char *description);
void bd_export_list_free(struct bd_export_list *l);

/* How a source uses the host's page cache and honours flushes: QEMU's
 * cache modes (qemu-nbd --cache, -drive cache=), with its meanings.
 *
 *   mode          page cache      every write   flush
 *   writeback     used            as asked      fdatasync  (the default)
 *   none          bypassed        as asked      fdatasync
 *   writethrough  used            FUA           fdatasync
 *   directsync    bypassed        FUA           fdatasync
 *   unsafe        used            as asked      ignored
 *
 * "Bypassed" is O_DIRECT for a local file and librbd's cache turned off
 * for RBD (as QEMU's rbd driver does); a source without a cache in this
 * process (NBD, a plugin, memory) has nothing to bypass.  The FUA and
 * flush columns apply to every source, in bd_submit(). */
enum bd_cache {
  BD_CACHE_WRITEBACK,
  BD_CACHE_NONE,
  BD_CACHE_WRITETHROUGH,
  BD_CACHE_DIRECTSYNC,
  BD_CACHE_UNSAFE,
};
/* How a source on a local file does its I/O (qemu-nbd --aio): io_uring
 * where the kernel allows it (the default), or blocking calls on the
 * worker pool ("threads"). */
enum bd_aio {
  BD_AIO_DEFAULT, /* io_uring if available, else threads */
  BD_AIO_IO_URING,
  BD_AIO_THREADS,
};
/* "io_uring", "threads" -> *OUT: 0, or -EINVAL. */
int bd_aio_parse(const char *name, enum bd_aio *out);
const char *bd_aio_name(enum bd_aio mode);

/* "none", ... -> *OUT: 0, or -EINVAL for a name that is not a mode. */
int bd_cache_parse(const char *name, enum bd_cache *out);
const char *bd_cache_name(enum bd_cache mode);
/* Does MODE bypass the page cache (O_DIRECT)? */
bool bd_cache_direct(enum bd_cache mode);

struct bd {
  const struct bd_ops *ops;
  void *priv;
  uint64_t size;
  struct bd_caps caps;
  enum bd_concurrency conc;
  enum bd_exec exec;
  char *format;      /* "raw", "null", ... */
  char *description; /* human-readable, e.g. the path */
  /* What the source itself tells clients about the disk (an nbdkit
   * plugin's export_description), NULL: nothing.  Never a path: the NBD
   * server sends it as the export's description. */
  char *export_description;
  pthread_mutex_t serial_lock; /* BD_CONC_SERIALIZE and _CONNS */
  /* Connections (sources with conn_open() only). */
  pthread_mutex_t conn_lock;
  pthread_cond_t conn_cond; /* signalled when a connection closes */
  unsigned nconns;
  struct bd_conn *default_conn; /* opened on first use by conn == NULL */
  enum bd_cache cache;          /* set by bd_open_with() */
  enum bd_aio aio;              /* as it was asked for, by bd_open_with() */
  struct disk *aligner;         /* caps.aligned_only: see core/disk.h */
  /* The named block-status contexts it offers (see BD_CTX_BITMAP_PREFIX):
   * those its opening asked for, in that order. */
  char **contexts;
  size_t ncontexts;
};

typedef void bd_done_fn(struct bd_req *req, int err);

/* Room for a request's message: a source's message names a file or URI
 * and an offset; longer ones are cut. */
#define BD_REQ_ERRMSG_MAX 256

/* One request.  The submitter owns the memory until done() is called. */
struct bd_req {
  enum bd_cmd cmd;
  uint32_t flags;
  uint64_t offset;
  uint64_t length;
  void *buf;                  /* READ: destination; WRITE: source */
  struct bd_extents *extents; /* BLOCK_STATUS: filled from offset on */
  unsigned context; /* BLOCK_STATUS: 0 allocation, I bd->contexts[I-1] */
  bd_done_fn *done;
  struct bd_conn *conn; /* from bd_conn_open(), or NULL: the default */
  struct bd *bd;        /* set by bd_submit */
  struct bd_req *next;  /* queue link, owned by the core while in flight */
  /* When done() gets an error: what went wrong, for this request only
   * (the core fills it; see the contract above). */
  char errmsg[BD_REQ_ERRMSG_MAX];
};

/* Flushes (when writable) and closes. Returns the flush result. */
int bd_close(struct bd *bd);
/* A process replacing an idle BD by another opening of the same image
 * (say, read-only by writable, on a server's reload) drops BD's image
 * locks first, which would refuse the new opening, and takes them back if
 * the replacement fails.  Sources without files ignore it. */
void bd_hold_locks(struct bd *bd, bool hold);

/* The 1-based number of context NAME for bd_req.context, or 0 when BD
 * does not offer it. */
unsigned bd_context_find(const struct bd *bd, const char *name);

/* Connections.  Some sources keep state per client (an nbdkit plugin's
 * handle): the NBD server opens a connection per client when transmission
 * starts, FUSE and vhost one at start, and each request names its
 * connection in bd_req.conn; NULL uses a default one the core opens on
 * first use (tools like convert).  A front end uses either its own
 * connections or the default one, not both.  What a device advertises
 * (size, caps) is fixed at open, whatever a connection could say.
 * bd_conn_open() returns NULL with bd_errmsg() set when the source
 * refuses; close a connection once its requests have completed. */
struct bd_conn *bd_conn_open(struct bd *bd, const char *export_name,
                             bool readonly);
/* The same, naming the client's socket for sources that ask about their
 * peer (nbdkit_peer_name); for a filter opening its inner connection. */
struct bd_conn *bd_conn_open_peer(struct bd *bd, const char *export_name,
                                  bool readonly, int peer_fd);
/* A front end whose client can leave (the NBD server) opens in two steps,
 * so that it can give up.  bd_conn_prepare() makes the handle and never
 * waits (NULL: out of memory).  bd_conn_start() opens it in the source; a
 * source that takes one connection at a time (nbdkit's
 * serialize_connections) waits for the one before to close: at most
 * WAIT_MS, then -ETIMEDOUT (the front end looks at its client and calls
 * again), or until bd_conn_cancel(), then -ECANCELED.  0, or -errno with
 * bd_errmsg() when the source refuses. */
struct bd_conn *bd_conn_prepare(struct bd *bd, const char *export_name,
                                bool readonly, int peer_fd);
int bd_conn_start(struct bd *bd, struct bd_conn *conn, unsigned wait_ms);
/* The front end lost CONN's client, from any thread: a wait in
 * bd_conn_start() ends, CONN's requests that have not started and those
 * submitted from now on complete with -ECANCELED, and the source drops
 * the ones it holds waiting (struct bd_ops' cancel); requests already
 * running finish as they would.  The core never watches a front end's
 * client: the front end says when it is gone. */
void bd_conn_cancel(struct bd *bd, struct bd_conn *conn);
/* Whether REQ's connection was cancelled (bd_conn_cancel()).  A source
 * about to hold REQ waiting checks this under the lock its cancel() takes,
 * so that a request is never held after its cancellation; a front end
 * tells a cancelled request from a failed one. */
bool bd_req_cancelled(const struct bd_req *req);
/* Closes CONN (prepared, started or cancelled) once its requests have
 * completed. */
void bd_conn_close(struct bd *bd, struct bd_conn *conn);
/* The export names BD offers, for sources that list them.  Returns 0 with
 * the list filled, -ENOTSUP for sources that do not, or -errno. */
int bd_list_exports(struct bd *bd, bool readonly, struct bd_export_list *l);

/* Submit a request; see the contract above. */
void bd_submit(struct bd *bd, struct bd_req *req);
/* Run a request to completion in the calling thread. Returns 0 or -errno. */
int bd_run(struct bd *bd, struct bd_req *req);

/* Completion batches.  A source that finishes many requests in a row (a
 * poll of completion events) brackets them with bd_batch_begin() and
 * bd_batch_end().  A front end whose done() would otherwise do costly
 * work per request, such as a socket send that wakes the peer, may hand
 * that work to bd_batch_defer(): the hook then runs once, in the same
 * thread, at bd_batch_end(), after the whole batch.  Outside a batch
 * bd_batch_defer() returns false and the caller does the work now.
 * Batches nest; hooks run at the outermost end. */
struct bd_batch_hook {
  void (*run)(struct bd_batch_hook *h);
  struct bd_batch_hook *next; /* owned by the batch while deferred */
};
void bd_batch_begin(void);
bool bd_batch_defer(struct bd_batch_hook *h);
void bd_batch_end(void);

/* Submission plugs, the other direction.  A front end that submits many
 * requests in a row (every request a read of its socket brought)
 * brackets them with bd_plug_begin() and bd_plug_end(); a source with a
 * submission queue (io_uring) may then hold the requests back and start
 * them together at bd_plug_end(), through bd_plug_defer() (as
 * bd_batch_defer()).  The thread must not wait for a request it submitted
 * while plugged.  Plugs nest. */
void bd_plug_begin(void);
bool bd_plug_defer(struct bd_batch_hook *h);
void bd_plug_end(void);
/* Whether the calling thread's plug holds anything back: worth waiting
 * for more requests to join it. */
bool bd_plug_pending(void);

/* Pollers.  An event-loop thread of a front end that can wait on one more
 * descriptor calls bd_poller_begin() first: requests it submits to a
 * source with a completion queue (--aio io_uring) then complete in this
 * thread, with no hand-off to another.  Each turn of the loop it polls
 * bd_poller_fd() (when >= 0) for POLLIN and calls bd_poller_run(), which
 * completes what has finished (as one bd_batch) and returns whether
 * anything did; it costs no system call when nothing has.  Requests stay
 * in flight only while the loop turns: it must keep turning until its
 * requests have completed, then call bd_poller_end(). */
void bd_poller_begin(void);
int bd_poller_fd(void);
bool bd_poller_run(void);
void bd_poller_end(void);

/* Synchronous conveniences built on bd_run(). */
int bd_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off);
int bd_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
              uint32_t flags);
int bd_flush(struct bd *bd);
/* Change BD's virtual size to SIZE, growing or shrinking it (data past a
 * smaller SIZE is gone), what it adds read as zeroes.  Only with no
 * request in flight: image tools, not a served export.  Returns 0, or
 * -errno with a message in bd_errmsg() (-ENOTSUP: the source cannot). */
int bd_resize(struct bd *bd, uint64_t size, enum bd_prealloc prealloc);

/* Copy [OFF, OFF+LEN) of SRC to the same place in DST inside the kernel
 * (copy_file_range), where both keep those bytes in host files.  *DONE
 * says how much was copied; -ENOTSUP (or the kernel's -EXDEV, -EINVAL...)
 * when the rest cannot be copied that way: the caller copies it through
 * memory.  Only with no request in flight on DST's range. */
int bd_copy_range(struct bd *src, struct bd *dst, uint64_t off, uint64_t len,
                  uint64_t *done);

/* The one splitter, for every way out that cuts a request into pieces
 * the device takes (core/disk.c, virtio-blk): [OFF, OFF + LEN) in pieces
 * of at most MAX bytes (0: no limit), in order.  bd_split_count() is how
 * many (0 for an empty range), bd_split_piece() the I-th of them. */
struct bd_split {
  uint64_t offset, length; /* the piece */
  uint64_t skip;           /* how far it starts into the range */
};
size_t bd_split_count(uint64_t len, uint64_t max);
struct bd_split bd_split_piece(uint64_t off, uint64_t len, uint64_t max,
                               size_t i);

/* Parse "1G", "512k", "4096" (binary suffixes). Returns 0 or -EINVAL. */
int bd_parse_size(const char *s, uint64_t *out);
/* Why bd_parse_size() refused S (not NULL), for a message, in BUF ("unknown
 * suffix 'Q' (use k, M, G, T, P or E)").  Returns BUF. */
const char *bd_size_problem(const char *s, char *buf, size_t len);

/* Largest request the core accepts for READ/WRITE. */
#define BD_MAX_IO (32u * 1024 * 1024)

#endif
