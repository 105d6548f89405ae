/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport mount: a disk image or NBD export as a file (or a directory of
 * the disk and its partitions) through FUSE.  The command line, the daemon
 * that returns once the mount is live, signals, and the order of shutdown;
 * the file system itself is frontend/fuse-mount.c. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "core/blockdev.h"
#include "core/hex.h"
#include "core/io.h"
#include "core/log.h"
#include "core/open.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "frontend-metrics.h"
#include "frontend/fuse-mount.h"

#include "daemon.h"
#include "disk-ckpt.h"
#include "options.h"

static const char mount_head[] =
    "Usage: blockport mount [OPTIONS] SOURCE MOUNTPOINT\n"
    "       blockport mount [OPTIONS] --plugin PLUGIN [KEY=VALUE...] "
    "MOUNTPOINT\n"
    "Make a disk image or an NBD export an ordinary file, through FUSE.\n"
    "\n"
    "SOURCE is an image file (raw or qcow2, probed), an NBD URI (nbd://,\n"
    "nbd+unix://), null:SIZE or memory:SIZE.  MOUNTPOINT is a directory,\n"
    "which then holds the disk as NAME and each partition of an MBR or GPT\n"
    "as NAME-p1, NAME-p2, ...; or a regular file, which becomes the disk.\n"
    "\n"
    "  -r, --readonly            refuse writes\n"
    "  -n, --name NAME           the disk file's name (default: the image's\n"
    "                            name without its extension, or the export's\n"
    "                            name, or \"disk\")\n"
    "      --no-partitions       do not expose partition files\n"
    "      --cache MODE          the image's cache mode, as qemu-nbd's:\n"
    "                            writeback (default), none (O_DIRECT),\n"
    "                            writethrough, directsync or unsafe; the\n"
    "                            mounted files bypass the kernel's page cache\n"
    "                            in every one of them.  page: writeback, and\n"
    "                            the page cache keeps what the mounted files\n"
    "                            read (the disk file and partition files are\n"
    "                            then cached apart, as block devices)\n"
    "  -t, --threads N           threads receiving FUSE requests (default 4)\n"
    "      --allow-other         let other users open the files (as root, or\n"
    "                            with user_allow_other in /etc/fuse.conf)\n"
    "      --foreground          stay in the foreground, logging to stderr\n"
    "                            (default: return once the mount is live)\n"
    "      --log-file FILE       where a daemon logs (default: nowhere)\n";

static const char mount_tail[] =
    "  -h, --help                show this help\n"
    "\n"
    "Unmount with fusermount3 -u MOUNTPOINT, or SIGTERM/SIGINT: both flush\n"
    "first.\n";

#define MOUNT_SHARED                                                           \
  (CO_FORMAT | CO_SOURCE_OPT | CO_WORKERS | CO_PLUGIN | CO_AIO | CO_L2_CACHE | \
   CO_NBD | CO_RBD | CO_NBD_OLD | CO_LOG | CO_PID_FILE | CO_CONTROL |          \
   CO_VIEWS | CO_FLEECE | CO_METRICS)

struct mount_opts {
  struct cli_common co; /* format, workers, plugin, NBD, pid file, ... */
  const char *source, *mountpoint, *name, *log_file;
  char *plugin_source; /* the source built from --plugin, owned */
  bool readonly, foreground, allow_other, no_partitions, direct_io;
  unsigned threads;
};

/* Shared with the signal thread and the live callback. */
struct mount_state {
  const struct mount_opts *o;
  char *pid_path; /* absolute: the daemon leaves its directory */
  int notify_fd;  /* the daemon's pipe to its parent, or -1 */
  pthread_mutex_t lock;
  struct fm *fm;
  bool mounting, stop;
  struct cli_metrics metrics; /* --metrics */
};

/* ---- the disk file's name ---- */

/* The export name of an NBD URI: its path, percent-decoded, without the
 * leading '/'; slashes become '_'. */
static char *export_name(const char *uri) {
  const char *p = strstr(uri, "://");
  p = p ? strchr(p + 3, '/') : NULL;
  if (!p)
    return strdup("");
  p++;
  size_t n = strcspn(p, "?#");
  char *out = malloc(n + 1), *q = out;
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    int byte;
    if (p[i] == '%' && i + 2 < n && (byte = hex_byte(p + i + 1)) >= 0) {
      *q++ = (char)byte;
      i += 2;
    } else {
      *q++ = p[i];
    }
  }
  *q = 0;
  for (q = out; *q; q++)
    if (*q == '/')
      *q = '_';
  return out;
}

/* The image's base name without its extension ("vm.qcow2" -> "vm"). */
static char *image_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char *out = strdup(base);
  if (!out)
    return NULL;
  char *dot = strrchr(out, '.');
  if (dot && dot != out)
    *dot = 0;
  return out;
}

static char *default_name(const char *source) {
  char *name;
  if (nbdsrc_is_uri(source))
    name = export_name(source);
  else if (!strncmp(source, "null:", 5) || !strncmp(source, "memory:", 7))
    name = strdup("");
  else
    name = image_name(source);
  if (name && (!*name || !strcmp(name, ".") || !strcmp(name, ".."))) {
    free(name);
    name = strdup("disk");
  }
  return name;
}

/* ---- daemon, pid file, signals ---- */

/* The kernel has initialised the mount (a FUSE thread calls this). */
static void on_live(void *opaque) {
  struct mount_state *s = opaque;
  if (s->pid_path)
    cli_write_pid_file(s->pid_path);
  if (s->notify_fd >= 0)
    cli_detach_stdio(s->o->log_file);
  log_info("mounted %s on %s", s->o->source, s->o->mountpoint);
  if (s->notify_fd >= 0) {
    if (chdir("/") < 0)
      log_warn("chdir /: %s", strerror(errno));
    cli_daemon_ready(s->notify_fd);
    s->notify_fd = -1;
  }
}

static void block_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, set, NULL);
  signal(SIGPIPE, SIG_IGN);
}

/* SIGINT, SIGTERM, SIGHUP: before the mount exists, just exit; while it
 * is being made, note it; once it runs, stop it (the main thread then
 * flushes and unmounts). */
static void *signal_thread(void *arg) {
  struct mount_state *s = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  for (;;) {
    int sig;
    if (sigwait(&set, &sig) != 0)
      continue;
    pthread_mutex_lock(&s->lock);
    bool first = !s->stop;
    s->stop = true;
    struct fm *fm = s->fm;
    bool mounting = s->mounting;
    pthread_mutex_unlock(&s->lock);
    if (!first)
      continue;
    log_info("signal %d: unmounting", sig);
    if (fm)
      fm_stop(fm);
    else if (!mounting)
      _exit(1); /* nothing mounted, nothing to flush */
  }
  return NULL;
}

/* ---- the mount ---- */

static int run_mount(struct mount_state *s, struct bd *bd) {
  const struct mount_opts *o = s->o;
  char *name = o->name ? strdup(o->name) : default_name(o->source);
  if (!name)
    return 1;
  struct fm_config cfg = {.mountpoint = o->mountpoint,
                          .name = name,
                          .allow_other = o->allow_other,
                          .direct_io = o->direct_io,
                          .partitions = !o->no_partitions,
                          .threads = o->threads,
                          .table_retry_s = cli_nbd_timeout(&o->co),
                          .live = on_live,
                          .opaque = s,
                          .reqs = cli_metrics_disk(&s->metrics, bd->size)};
  pthread_mutex_lock(&s->lock);
  s->mounting = true;
  pthread_mutex_unlock(&s->lock);
  struct fm *fm = fm_create(bd, &cfg);
  free(name);
  pthread_mutex_lock(&s->lock);
  s->fm = fm;
  bool stop = s->stop;
  pthread_mutex_unlock(&s->lock);
  if (!fm) {
    log_error("%s", bd_errmsg());
    return 1;
  }
  if (stop)
    fm_stop(fm);
  int ret = 0;
  if (fm_run(fm) < 0) {
    log_error("%s", bd_errmsg());
    ret = 1;
  }
  pthread_mutex_lock(&s->lock);
  s->fm = NULL;
  pthread_mutex_unlock(&s->lock);
  int r = fm_destroy(fm);
  if (r == -2)
    return -2;
  return r < 0 ? 1 : ret;
}

static int mount_run(const struct mount_opts *o) {
  struct mount_state s = {.o = o, .notify_fd = -1};
  pthread_mutex_init(&s.lock, NULL);
  if (o->co.pid_file && !(s.pid_path = io_absolute_path(o->co.pid_file))) {
    log_error("pid file %s: %s", o->co.pid_file, strerror(errno));
    return 1;
  }
  if (!o->foreground)
    s.notify_fd = cli_daemonize();
  /* Signals go to one thread; every thread made from here inherits the
   * mask. */
  sigset_t set;
  block_signals(&set);
  pthread_t st;
  if (pthread_create(&st, NULL, signal_thread, &s) != 0) {
    log_error("cannot start the signal thread");
    return 1;
  }
  int ret = 1;
  struct bd *bd = NULL;
  struct disk_ckpt dc = {0};
  if (bd_pool_start(o->co.workers) < 0) {
    log_error("cannot start the worker pool");
    goto out;
  }
  struct bd_open_opts open = o->co.open;
  if (cli_metrics_start(&s.metrics, o->co.metrics, METRICS_MOUNT,
                        o->mountpoint) < 0)
    goto out;
  open.stats = s.metrics.sources;
  bd = bd_open_with(o->source, &open);
  if (!bd) {
    log_error("%s", bd_errmsg());
    goto out;
  }
  /* The control socket (with --views-unix, the disk behind a live device
   * and the views' NBD socket), before the mount says it is live. */
  if (disk_ckpt_start(&dc, &o->co, &bd, o->readonly) < 0)
    goto out;
  ret = run_mount(&s, bd);
  /* No more commands; the views' clients end, their views close. */
  disk_ckpt_stop(&dc);
  if (ret == -2) {
    /* Requests still out: closing the device would pull it from under
     * them.  The mount is gone; leave now. */
    if (s.pid_path)
      unlink(s.pid_path);
    _exit(1);
  }
out:
  disk_ckpt_stop(&dc);
  pthread_cancel(st);
  pthread_join(st, NULL);
  if (bd && bd_close(bd) < 0)
    ret = 1;
  cli_metrics_stop(&s.metrics);
  bd_pool_stop();
  if (s.pid_path)
    unlink(s.pid_path);
  free(s.pid_path);
  pthread_mutex_destroy(&s.lock);
  return ret;
}

static void usage(FILE *f, const struct mount_opts *o) {
  fputs(mount_head, f);
  cli_opts_usage(f, &o->co);
  fputs(mount_tail, f);
}

/* --plugin PLUGIN [KEY=VALUE...] MOUNTPOINT: the last argument is the
 * mount point, the others the plugin's parameters. */
static int plugin_source(int argc, char **argv, struct mount_opts *o) {
  const char *plugin = o->co.plugin;
  if (argc - optind < 1) {
    cli_usage_error("mount", "expected MOUNTPOINT");
    return -1;
  }
  o->mountpoint = argv[argc - 1];
  o->source = o->plugin_source =
      plugin_spec(plugin, argv + optind, argc - optind - 1);
  if (!o->name)
    o->name = strchr(plugin, '/') || strchr(plugin, '.') ? "disk" : plugin;
  return o->source ? 0 : -1;
}

enum {
  OPT_CACHE = 256,
  OPT_ALLOW_OTHER,
  OPT_FOREGROUND,
  OPT_LOG_FILE,
  OPT_NO_PARTITIONS,
};

/* Mount's own options: 1 handled, 0 unknown, -1 a bad value. */
static int own_option(struct mount_opts *o, int ch, const char *arg) {
  switch (ch) {
  case 'r': o->readonly = true; break;
  case 'n': o->name = arg; break;
  case OPT_NO_PARTITIONS: o->no_partitions = true; break;
  case OPT_CACHE:
    /* "page" is the FUSE side's cache; the others are the image's. */
    o->direct_io = strcmp(arg, "page") != 0;
    o->co.open.cache = BD_CACHE_WRITEBACK;
    if (o->direct_io && bd_cache_parse(arg, &o->co.open.cache) < 0) {
      cli_usage_error("mount",
                      "--cache %s: expected none, writeback, writethrough, "
                      "directsync, unsafe or page",
                      arg);
      return -1;
    }
    break;
  case 't':
    if (cli_parse_uint(arg, 1, 1024, &o->threads) < 0) {
      cli_usage_error("mount", "--threads %s: expected a number in 1-1024",
                      arg);
      return -1;
    }
    break;
  case OPT_ALLOW_OTHER: o->allow_other = true; break;
  case OPT_FOREGROUND: o->foreground = true; break;
  case OPT_LOG_FILE: o->log_file = arg; break;
  default: return 0;
  }
  return 1;
}

static int option_cb(void *o, int ch, const char *arg) {
  return own_option(o, ch, arg);
}

static void usage_cb(FILE *f, const void *o) {
  usage(f, o);
}

static int parse_opts(int argc, char **argv, struct mount_opts *o) {
  static const struct option own[] = {
      {"readonly", no_argument, NULL, 'r'},
      {"name", required_argument, NULL, 'n'},
      {"no-partitions", no_argument, NULL, OPT_NO_PARTITIONS},
      {"cache", required_argument, NULL, OPT_CACHE},
      {"threads", required_argument, NULL, 't'},
      {"allow-other", no_argument, NULL, OPT_ALLOW_OTHER},
      {"foreground", no_argument, NULL, OPT_FOREGROUND},
      {"log-file", required_argument, NULL, OPT_LOG_FILE},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  if (cli_getopt(argc, argv, &o->co, own, "rn:t:h", option_cb, usage_cb, o) <
          0 ||
      cli_ckpt_check(&o->co) < 0)
    return -1;
  if (o->readonly)
    o->co.open.flags |= BD_OPEN_READONLY;
  if (o->co.plugin)
    return plugin_source(argc, argv, o);
  if (argc - optind != 2) {
    cli_usage_error("mount", "expected SOURCE and MOUNTPOINT");
    return -1;
  }
  o->source = argv[optind];
  o->mountpoint = argv[optind + 1];
  return 0;
}

int mount_main(int argc, char **argv) {
  /* Four workers: more contend for the image's inode lock (buffered
   * writes to one file serialise in the kernel): 1 MiB writes to a raw
   * file ran at 3 GB/s with 16 and 5 GB/s with 4.  Direct I/O: see
   * docs/ARCHITECTURE.md. */
  struct mount_opts o = {.threads = 4, .direct_io = true};
  cli_opts_init(&o.co, "mount", MOUNT_SHARED, 4);
  if (parse_opts(argc, argv, &o) < 0)
    return 1;
  int r = mount_run(&o);
  free(o.plugin_source);
  return r;
}
