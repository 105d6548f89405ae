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

#include "core/blockdev.h"
#include "core/log.h"
#include "core/pool.h"
#include "formats/formats.h"
#include "frontend/vhost-user.h"
#include "cli.h"
#include "commands.h"

static const char vhost_usage[] =
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
    "  -s, --socket PATH       the vhost-user socket to listen on\n"
    "  -q, --queues N          queues offered; QEMU's num-queues must not be\n"
    "                          larger (default 16, at most 64; a thread runs\n"
    "                          per queue the guest uses)\n"
    "  -r, --readonly          refuse writes\n"
    "  -f, --format FMT        image format instead of probing: raw, qcow2\n"
    "  -C, --connections N     NBD connections (default 4 when the server\n"
    "                          advertises multi-conn, otherwise 1)\n"
    "      --timeout SECONDS   NBD: fail requests with an I/O error after "
    "this\n"
    "                          long without the server (default 30; 0 waits)\n"
    "      --serial STRING     the disk's serial number (GET_ID, 20 bytes)\n"
    "      --plugin PLUGIN     the source is an nbdkit plugin: a .so path or\n"
    "                          a name in nbdkit's plugin directory, with\n"
    "                          its KEY=VALUE parameters\n"
    "  -D NAME.FLAG=N          set an nbdkit plugin's debug flag\n"
    "  -w, --workers N         worker threads for image files (default 16)\n"
    "      --l2-cache-size SIZE  qcow2 L2 cache (default 32M)\n"
    "      --once              exit when the first front end disconnects\n"
    "  -P, --pid-file FILE     write the pid once the socket listens\n"
    "  -v, --verbose           log every vhost-user message and "
    "request\n" LOG_USAGE "  -h, --help              show this help\n"
    "\n"
    "SIGTERM or SIGINT: finish the requests in flight, flush, exit 0.\n";

struct vhost_opts {
  struct vhu_options vhu;
  const char *source, *format, *pid_file, *plugin;
  char *plugin_source; /* built from --plugin, owned */
  unsigned workers;
};

static int bad_value(const char *opt, const char *v) {
  fprintf(stderr, "blockport vhost: invalid %s '%s'\n", opt, v);
  return -1;
}

static int parse_opts(int argc, char **argv, struct vhost_opts *o) {
  enum { OPT_TIMEOUT = 256, OPT_SERIAL, OPT_L2, OPT_ONCE, OPT_PLUGIN };
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"queues", required_argument, NULL, 'q'},
      {"readonly", no_argument, NULL, 'r'},
      {"format", required_argument, NULL, 'f'},
      {"connections", required_argument, NULL, 'C'},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"serial", required_argument, NULL, OPT_SERIAL},
      {"workers", required_argument, NULL, 'w'},
      {"l2-cache-size", required_argument, NULL, OPT_L2},
      {"once", no_argument, NULL, OPT_ONCE},
      {"plugin", required_argument, NULL, OPT_PLUGIN},
      {"pid-file", required_argument, NULL, 'P'},
      {"verbose", no_argument, NULL, 'v'},
      LOG_LONGOPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c;
  unsigned v;
  uint64_t size;
  while ((c = getopt_long(argc, argv, "s:q:rf:C:w:P:D:vh", longopts, NULL)) !=
         -1) {
    switch (c) {
    case 's': o->vhu.socket_path = optarg; break;
    case 'q':
      if (cli_parse_uint(optarg, 1, VHU_MAX_QUEUES, &o->vhu.queues) < 0)
        return bad_value("queue count", optarg);
      break;
    case 'r': o->vhu.readonly = true; break;
    case 'f': o->format = optarg; break;
    case 'C':
      if (cli_parse_uint(optarg, 1, 64, &v) < 0)
        return bad_value("connection count", optarg);
      nbd_source_connections = v;
      break;
    case OPT_TIMEOUT:
      if (cli_parse_uint(optarg, 0, 86400, &v) < 0)
        return bad_value("timeout", optarg);
      nbd_source_timeout = v;
      break;
    case OPT_SERIAL: o->vhu.serial = optarg; break;
    case 'w':
      if (cli_parse_uint(optarg, 1, BD_POOL_MAX_WORKERS, &o->workers) < 0)
        return bad_value("worker count", optarg);
      break;
    case OPT_L2:
      if (bd_parse_size(optarg, &size) < 0 || !size)
        return bad_value("L2 cache size", optarg);
      qcow2_l2_cache_bytes = size;
      break;
    case OPT_ONCE: o->vhu.once = true; break;
    case OPT_PLUGIN: o->plugin = optarg; break;
    case 'D':
      if (plugin_add_debug_flag(optarg) < 0)
        return bad_value("debug flag", optarg);
      break;
    case 'P': o->pid_file = optarg; break;
    case 'v': log_threshold = LOG_LEVEL_DEBUG; break;
    case LOG_OPT_LEVEL:
    case LOG_OPT_SYSLOG:
      if (log_handle_option(c, optarg) < 0)
        return bad_value("log level", optarg);
      break;
    case 'h': fputs(vhost_usage, stdout); exit(0);
    default: fputs(vhost_usage, stderr); return -1;
    }
  }
  if (!o->vhu.socket_path || (!o->plugin && optind + 1 != argc)) {
    fputs(vhost_usage, stderr);
    return -1;
  }
  if (o->plugin) {
    o->source = o->plugin_source =
        plugin_spec(o->plugin, argv + optind, argc - optind);
    if (!o->source) {
      fprintf(stderr, "blockport vhost: %s\n", bd_errmsg());
      return -1;
    }
  } else {
    o->source = argv[optind];
  }
  return 0;
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

static int vhost_run(struct vhost_opts *o) {
  int sfd = signal_fd();
  if (sfd < 0) {
    log_error("signalfd: %s", strerror(errno));
    return 1;
  }
  if (bd_pool_start(o->workers) < 0) {
    log_error("cannot start the worker pool");
    return 1;
  }
  struct bd *bd = bd_open(o->source, o->format, o->vhu.readonly);
  if (!bd) {
    log_error("%s: %s", o->source, bd_errmsg());
    bd_pool_stop();
    return 1;
  }
  int r = vhu_serve(bd, &o->vhu, sfd, write_pid_file, (void *)o->pid_file);
  if (r < 0)
    log_error("%s", bd_errmsg());
  int fr = bd_close(bd);
  if (fr < 0)
    log_error("%s: flush on close: %s", o->source, strerror(-fr));
  bd_pool_stop();
  if (o->pid_file)
    unlink(o->pid_file);
  close(sfd);
  return r < 0 || fr < 0 ? 1 : 0;
}

int vhost_main(int argc, char **argv) {
  struct vhost_opts o = {.vhu = {.queues = 16}};
  if (parse_opts(argc, argv, &o) < 0)
    return 1;
  int r = vhost_run(&o);
  free(o.plugin_source);
  return r;
}
