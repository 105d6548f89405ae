/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport: the block-device interface at the centre of the program.
 *
 * Every source (raw file, null, memory, and later qcow2, an NBD URI, an nbdkit
 * plugin) is a struct bd; every front end (NBD server, FUSE, vhost-user-blk,
 * the image tools) talks only to struct bd.  A front end never knows which
 * format it reads; a source never knows who asked.
 *
 * Contract
 * --------
 * - bd_submit() is asynchronous: the request's done() callback is called
 *   exactly once, either before bd_submit() returns (sources that complete
 *   inline, such as null and memory) or later on a worker thread.  done() may
 *   run on any thread and must not block for long.
 * - Many threads may call bd_submit() on the same bd at once.  The core
 *   serialises requests only as much as the source's concurrency asks.
 * - Requests are validated by the core (range inside the device, flags
 *   supported, writes on a read-only device); a front end should still
 *   validate first to give its protocol's precise error.
 * - Errors are negative errno values.  A human-readable message for the last
 *   failure on the calling thread is available from bd_errmsg(); done()
 *   receives the errno only.
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
struct bd_export_list;

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
};

/* Operations of a source.  The synchronous ones return 0 or -errno and may
 * record a message with bd_set_error().  Unsupported operations are NULL. */
/* How bd_resize() fills the space it adds (qemu-img's --preallocation). */
enum bd_prealloc {
  BD_PREALLOC_OFF,      /* nothing: reads as zeroes, takes no space */
  BD_PREALLOC_METADATA, /* the format's mapping made (qcow2 only) */
  BD_PREALLOC_FALLOC,   /* space reserved in the file system */
  BD_PREALLOC_FULL,     /* zeroes written */
};
/* "off", "metadata", "falloc", "full".  Returns 0 or -EINVAL. */
int bd_prealloc_parse(const char *name, enum bd_prealloc *out);

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
  char *format;                /* "raw", "null", ... */
  char *description;           /* human-readable, e.g. the path */
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
};

/* The format of the image at PATH by its content, as the installed
 * formats' probe finds it: "qcow2", "raw", or the name of a format
 * blockport does not support.  "raw" when the file cannot be read
 * (opening it then reports why) or no probe is installed. */
const char *bd_probe_format(const char *path);

/* How bd_open_flags() opens a source. */
enum {
  BD_OPEN_READONLY = 1u << 0,
  /* -U / force-share: read-only, and lock nobody out: the image may be in
   * use by a writer (core/filelock.h). */
  BD_OPEN_SHARE = 1u << 1,
  /* The format was guessed by probing: a writable raw image then refuses
   * writes that would make the next probe find another format. */
  BD_OPEN_PROBED = 1u << 2,
  /* qcow2 opened for writing with a backing file: a read of clusters the
   * image does not hold copies them whole into the image (QEMU's
   * copy-on-read), so the next read of them stays local. */
  BD_OPEN_COPY_ON_READ = 1u << 3,
  /* What a read-only user refuses to share, for the formats that lock
   * their file as their user asks (raw: QEMU's raw passes its user's
   * permissions to the file, where qcow2 always refuses writers for its
   * metadata).  Without them a raw reader shares everything, as
   * qemu-img map, qemu-img compare, qemu-io -r and QEMU's FUSE export
   * do.  UNSHARE_RESIZE: an NBD export (qemu-nbd -r); UNSHARE_WRITE:
   * convert's source (qemu-img convert), which wants both. */
  BD_OPEN_UNSHARE_RESIZE = 1u << 4,
  BD_OPEN_UNSHARE_WRITE = 1u << 5,
};

/* Opening.  SPEC is a path, or "null:SIZE" / "memory:SIZE", an NBD URI or
 * a plugin's spec.  FORMAT is NULL to probe by content.  Image files are
 * locked as QEMU locks them (a busy image is refused); formats blockport
 * does not support are refused by name.  Returns NULL with a message in
 * bd_errmsg().  bd_open_with() with the other options at their defaults. */
struct bd *bd_open_flags(const char *spec, const char *format, unsigned flags);
/* bd_open_flags() with BD_OPEN_READONLY when READONLY. */
struct bd *bd_open(const char *spec, const char *format, bool readonly);

/* Everything a command line or a config file can say about how to open a
 * source.  Start from BD_OPEN_OPTS_INIT; unset fields keep the defaults. */
struct bd_open_opts {
  const char *format; /* NULL: probe a file's content */
  unsigned flags;     /* BD_OPEN_* */
  /* L2 cache of a qcow2 image, bytes; 0: the default (32 MiB). */
  uint64_t qcow2_l2_cache;
  enum bd_cache cache; /* see enum bd_cache; 0: writeback */
  enum bd_aio aio;     /* how local files are read and written */
  /* Connections of an NBD source: 0 means 4 when the server advertises
   * multi-conn, otherwise 1 (at most 16). */
  unsigned nbd_connections;
  /* Seconds a request to an NBD source may wait for a lost server before
   * failing with EIO; 0 waits forever. */
  unsigned nbd_timeout;
  /* Bytes of acknowledged writes (and trims, zeroes) an NBD source keeps
   * until a flush covers them, to send them again to a server that
   * restarted (formats/nbd.c); 0 keeps none. */
  uint64_t nbd_replay_limit;
  /* Seconds an RBD source's cluster operations (monitor, OSD) may take
   * before failing with EIO; 0 waits forever. */
  unsigned rbd_timeout;
  /* What opening an RBD image for writing does when another client holds
   * its exclusive lock: fail, wait for it, or take no lock at all (as
   * QEMU: writers then pass the lock back and forth). */
  enum bd_rbd_lock {
    BD_RBD_LOCK_FAIL,
    BD_RBD_LOCK_WAIT,
    BD_RBD_LOCK_NONE
  } rbd_lock;
  /* -D NAME.FLAG=N settings for an nbdkit plugin; the strings must outlive
   * the source. */
  const char *const *plugin_debug;
  size_t n_plugin_debug;
  /* Named block-status contexts the source must offer (at most
   * BD_MAX_CONTEXTS; see BD_CTX_BITMAP_PREFIX).  Not passed on to a
   * backing file. */
  const char *const *contexts;
  size_t ncontexts;
};
#define BD_NBD_TIMEOUT_DEFAULT 30
#define BD_NBD_REPLAY_LIMIT_DEFAULT (64ull << 20)
#define BD_RBD_TIMEOUT_DEFAULT 30
#define BD_OPEN_OPTS_INIT                                                      \
  {                                                                            \
    .nbd_timeout = BD_NBD_TIMEOUT_DEFAULT,                                     \
    .nbd_replay_limit = BD_NBD_REPLAY_LIMIT_DEFAULT,                           \
    .rbd_timeout = BD_RBD_TIMEOUT_DEFAULT                                      \
  }
/* Opens SPEC as O says (O NULL: the defaults), through the installed
 * formats (below).  NULL with a message in bd_errmsg(). */
struct bd *bd_open_with(const char *spec, const struct bd_open_opts *o);

/* A kind of source.  The core knows none: formats/ lists them
 * (formats/registry.h), and every program installs that table once,
 * before it opens anything.  bd_open_with() tries, in table order, the
 * entries whose spec matcher accepts SPEC; otherwise the format named by
 * O->format, or the one the probe finds in the file. */
struct bd_format {
  const char *name; /* what --format names it */
  /* Sources a spec names by itself (null:SIZE, nbd://..., a plugin):
   * whether SPEC is one.  Such a spec opens with this entry whatever
   * --format says.  NULL for image file formats. */
  bool (*matches)(const char *spec);
  /* For an entry with a matcher named by --format on a spec it does not
   * match: "format 'NAME' takes USAGE".  NULL: no format has that name. */
  const char *usage;
  /* The format of the image file at PATH by its content: 0 with *FORMAT
   * set; -ENOTSUP with *FORMAT set and a message for a format blockport
   * does not open; other -errno with a message.  The first entry of the
   * table that has one probes. */
  int (*probe)(const char *path, const char **format);
  /* Opens SPEC as O says (never NULL; O->flags has BD_OPEN_PROBED when
   * the probe chose the format).  NULL with a message in bd_errmsg(). */
  struct bd *(*open)(const char *spec, const struct bd_open_opts *o);
  /* Whether an image file may name a spec this entry matches as its
   * backing file (an NBD URI).  Never for a source that loads code (a
   * plugin) or would make no sense there: the image file is not trusted. */
  bool backing;
};
/* TABLE: NULL-terminated, and outliving every opening. */
void bd_formats_install(const struct bd_format *const *table);
/* Whether SPEC, as an image's backing file name, names a source rather
 * than a file: the installed entry whose matcher accepts it allows that
 * (struct bd_format's backing: an NBD URI). */
bool bd_spec_is_backing_source(const char *spec);

/* Flushes (when writable) and closes. Returns the flush result. */
int bd_close(struct bd *bd);
/* A process replacing an idle BD by another opening of the same image
 * (say, read-only by writable, on a server's reload) drops BD's image
 * locks first, which would refuse the new opening, and takes them back if
 * the replacement fails.  Sources without files ignore it. */
void bd_hold_locks(struct bd *bd, bool hold);

/* Allocation for sources: a bd with ops set and everything else default. */
struct bd *bd_new(const struct bd_ops *ops, const char *format,
                  const char *description);

/* For sources: add NAME to the contexts BD offers (0 or -ENOMEM). */
int bd_add_context(struct bd *bd, const char *name);
/* The 1-based number of context NAME for bd_req.context, or 0 when BD
 * does not offer it. */
unsigned bd_context_find(const struct bd *bd, const char *name);

/* Every capability, 1-byte granularity, 4 KiB preferred and BD_MAX_IO
 * maximum block size: sources start from this and clear what they lack. */
struct bd_caps bd_caps_full(void); /* bd_new() starts from it */

/* Open a connection (see struct bd_conn): the source's state, or a
 * placeholder for sources without any.  Returns NULL with bd_errmsg() set
 * when the source refuses.  Close it once its requests have completed. */
struct bd_conn *bd_conn_open(struct bd *bd, const char *export_name,
                             bool readonly);
/* The same, naming the client's socket for sources that ask about their
 * peer (nbdkit_peer_name). */
struct bd_conn *bd_conn_open_peer(struct bd *bd, const char *export_name,
                                  bool readonly, int peer_fd);
void bd_conn_close(struct bd *bd, struct bd_conn *conn);
/* Within an operation of a source: the state of the request's connection
 * (conn_open()'s result), NULL outside one. */
void *bd_conn_current(void);
/* The export names BD offers, for sources that list them.  Returns 0 with
 * the list filled, -ENOTSUP for sources that do not, or -errno. */
int bd_list_exports(struct bd *bd, bool readonly, struct bd_export_list *l);

/* Submit a request; see the contract above. */
void bd_submit(struct bd *bd, struct bd_req *req);
/* Run a request to completion in the calling thread. Returns 0 or -errno. */
int bd_run(struct bd *bd, struct bd_req *req);
/* Called by BD_EXEC_ASYNC sources when a request finishes. */
void bd_complete(struct bd_req *req, int err);

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

/* Parse "1G", "512k", "4096" (binary suffixes). Returns 0 or -EINVAL. */
int bd_parse_size(const char *s, uint64_t *out);

/* Largest request the core accepts for READ/WRITE. */
#define BD_MAX_IO (32u * 1024 * 1024)

#endif
