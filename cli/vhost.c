/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport vhost: a disk image or NBD export as a vhost-user-blk device
 * for QEMU.  The command line, signals and the order of shutdown; the
 * protocol is frontend/vhost-user.c, the device frontend/virtio-blk.c. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "frontend-metrics.h"
#include "frontend/vhost-user.h"

#include "disk-ckpt.h"
#include "options.h"

static const char vhost_head[] =
    "Usage: blockport vhost --socket PATH [OPTIONS] SOURCE\n"
    "       blockport vhost --socket PATH [OPTIONS] --plugin PLUGIN "
    "[KEY=VALUE...]\n"
    "Serve a disk to QEMU as a vhost-user-blk device.\n"
    "\n"
    "SOURCE is an NBD URI (nbd://, nbd+unix://), an image file (raw or\n"
    "qcow2, probed), null:SIZE or memory:SIZE.  blockport listens on PATH;\n"
    "QEMU connects with\n"
    "  -object memory-backend-memfd,id=mem,size=SIZE,share=on -numa "
    "node,memdev=mem\n"
    "  -chardev socket,id=c0,path=PATH,reconnect=1\n"
    "  -device vhost-user-blk-pci,chardev=c0\n"
    "When QEMU goes away, blockport waits for the next one on PATH.  A\n"
    "stale socket file is replaced; one a running back end answers on is\n"
    "refused.\n"
    "\n"
    "  -s, --socket PATH         the vhost-user socket to listen on\n"
    "  -q, --queues N            queues offered; QEMU's num-queues must not "
    "be\n"
    "                            larger (default 16, at most 64; a thread "
    "runs\n"
    "                            per queue the guest uses)\n"
    "  -r, --readonly            refuse writes\n"
    "      --serial STRING       the disk's serial number (GET_ID, 20 bytes)\n"
    "      --once                exit when the first front end disconnects\n";

static const char vhost_tail[] =
    "  -h, --help                show this help\n"
    "\n"
    "SIGTERM or SIGINT: finish the requests in flight, flush, exit 0.\n";

#define VHOST_SHARED                                                           \
  (CO_FORMAT | CO_SOURCE_OPT | CO_WORKERS | CO_PLUGIN | CO_CACHE | CO_AIO |    \
   CO_L2_CACHE | CO_NBD | CO_RBD | CO_NBD_OLD | CO_LOG | CO_PID_FILE |         \
   CO_CONTROL | CO_VIEWS | CO_FLEECE | CO_METRICS)

struct vhost_opts {
  struct cli_common co; /* format, workers, plugin, NBD, pid file, ... */
  struct vhu_options vhu;
  const char *source;
  char *plugin_source; /* built from --plugin, owned */
};

static void usage(FILE *f, const struct vhost_opts *o) {
  fputs(vhost_head, f);
  cli_opts_usage(f, &o->co);
  fputs(vhost_tail, f);
}

enum { OPT_SERIAL = 256, OPT_ONCE };

/* vhost's own options: 1 handled, 0 unknown, -1 a bad value. */
static int own_option(struct vhost_opts *o, int ch, const char *arg) {
  switch (ch) {
  case 's': o->vhu.socket_path = arg; break;
  case 'q':
    if (cli_parse_uint(arg, 1, VHU_MAX_QUEUES, &o->vhu.queues) < 0) {
      cli_usage_error("vhost", "--queues %s: expected a number in 1-%u", arg,
                      (unsigned)VHU_MAX_QUEUES);
      return -1;
    }
    break;
  case 'r': o->vhu.readonly = true; break;
  case OPT_SERIAL: o->vhu.serial = arg; break;
  case OPT_ONCE: o->vhu.once = true; break;
  default: return 0;
  }
  return 1;
}

/* The source: SOURCE, or the plugin with the arguments as parameters. */
static int take_source(int argc, char **argv, struct vhost_opts *o) {
  if (!o->vhu.socket_path || (!o->co.plugin && optind + 1 != argc)) {
    cli_usage_error("vhost", "%s",
                    !o->vhu.socket_path ? "no --socket PATH given"
                    : optind >= argc    ? "no SOURCE given"
                                        : "more than one SOURCE given");
    return -1;
  }
  if (!o->co.plugin) {
    o->source = argv[optind];
    return 0;
  }
  o->source = o->plugin_source =
      plugin_spec(o->co.plugin, argv + optind, argc - optind);
  if (!o->source) {
    cli_error("vhost", NULL, "%s", bd_errmsg());
    return -1;
  }
  return 0;
}

static int option_cb(void *o, int ch, const char *arg) {
  return own_option(o, ch, arg);
}

static void usage_cb(FILE *f, const void *o) {
  usage(f, o);
}

static int parse_opts(int argc, char **argv, struct vhost_opts *o) {
  static const struct option own[] = {
      {"socket", required_argument, NULL, 's'},
      {"queues", required_argument, NULL, 'q'},
      {"readonly", no_argument, NULL, 'r'},
      {"serial", required_argument, NULL, OPT_SERIAL},
      {"once", no_argument, NULL, OPT_ONCE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  if (cli_getopt(argc, argv, &o->co, own, "s:q:rh", option_cb, usage_cb, o) <
          0 ||
      cli_ckpt_check(&o->co) < 0)
    return -1;
  if (o->vhu.readonly)
    o->co.open.flags |= BD_OPEN_READONLY;
  return take_source(argc, argv, o);
}

static void write_pid_file(void *opaque) {
  if (opaque)
    cli_write_pid_file(opaque);
}

/* SIGINT and SIGTERM arrive through a signalfd that the vhost loop
 * watches; every thread started later inherits the blocked mask. */
static int signal_fd(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  return signalfd(-1, &set, SFD_CLOEXEC);
}

/* Serve the open BD on LSOCK (taken) until a signal on SFD.  Returns
 * the exit status. */
static int vhost_serve(struct vhost_opts *o, struct bd **bd, int lsock,
                       int sfd) {
  /* The control socket (with --views-unix, the disk behind a live device
   * and the views' NBD socket), before the pid file says we are ready. */
  struct disk_ckpt dc;
  int r = -1;
  if (disk_ckpt_start(&dc, &o->co, bd, o->vhu.readonly) < 0)
    vhu_unlisten(lsock, o->vhu.socket_path);
  else if ((r = vhu_serve(*bd, &o->vhu, lsock, sfd, write_pid_file,
                          (void *)o->co.pid_file)) < 0)
    log_error("%s", bd_errmsg());
  disk_ckpt_stop(&dc);
  int fr = bd_close(*bd);
  if (fr < 0)
    log_error("%s: flush on close: %s", o->source, strerror(-fr));
  if (o->co.pid_file)
    unlink(o->co.pid_file);
  return r < 0 || fr < 0 ? 1 : 0;
}

static int vhost_run(struct vhost_opts *o) {
  int sfd = signal_fd();
  if (sfd < 0) {
    log_error("signalfd: %s", strerror(errno));
    return 1;
  }
  /* The socket first: a mistyped --socket fails before the image is
   * opened (or locked). */
  int lsock = vhu_listen(o->vhu.socket_path);
  if (lsock < 0) {
    log_error("%s", bd_errmsg());
    close(sfd);
    return 1;
  }
  if (bd_pool_start(o->co.workers) < 0) {
    log_error("cannot start the worker pool");
    vhu_unlisten(lsock, o->vhu.socket_path);
    close(sfd);
    return 1;
  }
  int ret = 1;
  struct cli_metrics cm;
  struct bd *bd = NULL;
  struct bd_open_opts open = o->co.open;
  if (cli_metrics_start(&cm, o->co.metrics, METRICS_VHOST,
                        o->vhu.socket_path) == 0) {
    open.stats = cm.sources;
    if (!(bd = bd_open_with(o->source, &open)))
      log_error("%s", bd_errmsg()); /* it names the source */
  }
  if (!bd) {
    vhu_unlisten(lsock, o->vhu.socket_path);
  } else {
    o->vhu.reqs = cli_metrics_disk(&cm, bd->size);
    ret = vhost_serve(o, &bd, lsock, sfd);
  }
  cli_metrics_stop(&cm);
  bd_pool_stop();
  close(sfd);
  return ret;
}

int vhost_main(int argc, char **argv) {
  struct vhost_opts o = {.vhu = {.queues = 16}};
  cli_opts_init(&o.co, "vhost", VHOST_SHARED, 16);
  if (parse_opts(argc, argv, &o) < 0)
    return 1;
  int r = vhost_run(&o);
  free(o.plugin_source);
  return r;
}
