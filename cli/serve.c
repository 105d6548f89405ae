/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport serve: the command line of the NBD server (server/serve.c
 * runs it), --check-config's listing and the pid file. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "formats/formats.h"
#include "server/access.h"
#include "server/config.h"
#include "server/exports.h"
#include "server/metrics.h"
#include "server/server.h"

#include "cli.h"
#include "commands.h"
#include "options.h"
#include "serve-nbdkit.h"
#include "serve-run.h"

static const char serve_head[] =
    "Usage: blockport serve [OPTIONS] IMAGE...\n"
    "       blockport serve [OPTIONS] --plugin PLUGIN [KEY=VALUE...]\n"
    "       blockport serve [OPTIONS] --config FILE\n"
    "Serve disk images over NBD (fixed newstyle).\n"
    "\n"
    "IMAGE is PATH or NAME=PATH; the first image is also the default export "
    "\"\".\n"
    "PATH is an image file (format probed from its content), null:SIZE\n"
    "(reads zeroes, discards writes), memory:SIZE (a sparse RAM disk) or\n"
    "an NBD URI.  With --plugin, the export is an nbdkit plugin and its\n"
    "exports those it lists.\n"
    "\n"
    "  -u, --unix PATH           listen on a Unix socket (-: a private one,\n"
    "                            as nbdkit's -U -)\n"
    "  -p, --port N              listen on TCP port N (default 10809 when no "
    "--unix)\n"
    "  -b, --bind ADDR           TCP address to bind (IPv4 or IPv6; default "
    "all)\n"
    "  -r, --readonly            refuse writes on every export\n"
    "  -U, --force-share         with --readonly: open images that another\n"
    "                            process writes (qemu-img's -U; nbdkit's\n"
    "                            -U SOCKET is -u here, -U - is --unix -)\n"
    "      --readonly-export NAME  refuse writes on export NAME (repeat for\n"
    "                            more; \"\" is the default export)\n"
    "      --description TEXT    what clients see of every IMAGE (nbdinfo;\n"
    "                            default none: the path stays private)\n"
    "  -B, --bitmap NAME         offer the persistent dirty bitmap NAME of\n"
    "                            every IMAGE (qcow2, or an NBD URI whose\n"
    "                            server has it) as the meta context\n"
    "                            qemu:dirty-bitmap:NAME (repeat for more:\n"
    "                            listed last first, as qemu-nbd lists them)\n"
    "  -c, --max-connections N   refuse clients beyond N (default 128)\n"
    "      --max-requests N      requests in flight per connection (default "
    "256)\n"
    "      --max-inflight-bytes SIZE  payload in flight per connection "
    "(default 64M)\n"
    "      --config FILE         serve the exports FILE declares, with their\n"
    "                            own read-only, TLS and allow settings; "
    "SIGHUP\n"
    "                            reads it again (format: docs/CONFIG.md)\n"
    "      --check-config        check the exports as a start would (the "
    "file,\n"
    "                            TLS settings, every image opened "
    "read-only),\n"
    "                            print them and exit: 0 good, 1 a bad file\n"
    "                            or option, or an image that cannot be opened\n"
    "      --tls off|on|require  TLS (STARTTLS): off (default), on (plain "
    "and\n"
    "                            TLS clients) or require (no option but "
    "ABORT\n"
    "                            and STARTTLS answered before TLS)\n"
    "      --tls-certs DIR       X.509: DIR/server-cert.pem, "
    "server-key.pem,\n"
    "                            ca-cert.pem, ca-crl.pem (as QEMU and nbdkit\n"
    "                            lay them out); SIGHUP loads them again\n"
    "      --tls-verify-peer     require client certificates signed by "
    "ca-cert.pem\n"
    "      --tls-psk FILE        pre-shared keys: username:hexkey lines "
    "(psktool)\n"
    "      --allow CIDR          admit TCP clients from CIDR only (repeat for\n"
    "                            more; IPv4 or IPv6; default: everyone)\n"
    "      --unix-mode MODE      permissions of the Unix socket (octal)\n"
    "      --handshake-timeout SECONDS  close a client whose handshake, TLS\n"
    "                            included, takes longer (default 10; 0: no\n"
    "                            limit)\n"
    "      --idle-timeout SECONDS  close a client with nothing in flight\n"
    "                            that sends nothing for this long (default 0:\n"
    "                            never)\n"
    "      --run CMD             once ready, run CMD with /bin/sh, with\n"
    "                            $uri (also $nbd), $unixsocket, $port,\n"
    "                            $exportname and $tls set as nbdkit's --run\n"
    "                            sets them; stop when it exits and exit with\n"
    "                            its status.  Without --unix or --port: on a\n"
    "                            Unix socket in a private directory\n"
    "      --fork                go into the background once clients can\n"
    "                            connect (the pid file written then); the\n"
    "                            log then goes nowhere unless --syslog\n"
    "      --foreground          stay in the foreground: the default (also\n"
    "                            --no-fork, as nbdkit spells it)\n"
    "      --exit-with-parent    stop, as SIGTERM stops it, when the parent\n"
    "                            process exits (nbdkit's); no --fork with it\n"
    "  -s, --single              serve one client on standard input, a\n"
    "                            socket (inetd, libnbd's connect_command),\n"
    "                            then exit: no listener (nbdkit's -s)\n"
    "  -e, --export-name NAME    name the first IMAGE given without NAME=\n"
    "                            (still the default export too); --run's\n"
    "                            $exportname and $uri name it (nbdkit's -e)\n"
    "  -t, --threads N           the same as --workers (nbdkit's -t)\n"
    "      --dump-config         print this build's configuration as\n"
    "                            KEY=VALUE lines (nbdkit's keys) and exit\n";

static const char serve_tail[] =
    "  -h, --help                show this help\n"
    "\n"
    "Started by systemd socket activation (LISTEN_PID, LISTEN_FDS), it serves\n"
    "on the sockets it was given; --unix, --port, --bind and --unix-mode are\n"
    "then refused.  With NOTIFY_SOCKET set (systemd Type=notify), it sends\n"
    "READY=1 once clients can connect and STOPPING=1 when shutting down.\n";

#define SERVE_SHARED                                                           \
  (CO_FORMAT | CO_SOURCE_OPT | CO_WORKERS | CO_PLUGIN | CO_CACHE | CO_AIO |    \
   CO_L2_CACHE | CO_NBD | CO_RBD | CO_LOG | CO_PID_FILE | CO_CONTROL |         \
   CO_METRICS | CO_FLEECE)

struct serve_cli {
  struct cli_common co; /* format, workers, plugin, NBD, pid file, ... */
  struct serve_opts so;
  bool check_config;     /* --check-config: check the exports, then exit */
  bool exit_with_parent; /* --exit-with-parent */
  bool foreground;       /* --foreground: the default, said out loud */
  struct serve_run run;  /* --run, --fork */
  char *plugin_spec;     /* built from --plugin, owned */
};

/* Long options without a short form. */
enum {
  OPT_TLS = 1000,
  OPT_TLS_CERTS,
  OPT_TLS_PSK,
  OPT_TLS_VERIFY,
  OPT_ALLOW,
  OPT_UNIX_MODE,
  OPT_HANDSHAKE_TIMEOUT,
  OPT_IDLE_TIMEOUT,
  OPT_RO_EXPORT,
  OPT_CONFIG,
  OPT_CHECK_CONFIG,
  OPT_MAX_REQUESTS,
  OPT_MAX_BYTES,
  OPT_RUN,
  OPT_FORK,
  OPT_DESCRIPTION,
  OPT_EXIT_WITH_PARENT,
  OPT_FOREGROUND,
  OPT_DUMP_CONFIG,
};

static void usage(FILE *f, const struct serve_cli *c) {
  fputs(serve_head, f);
  cli_opts_usage(f, &c->co);
  fputs(serve_tail, f);
}

static int bad(const char *opt, const char *arg, const char *expected) {
  cli_usage_error("serve", "%s %s: expected %s", opt, arg, expected);
  return -1;
}

/* A number for option OPT in [MIN, MAX]: 1, or -1 (said). */
static int number(const char *opt, const char *arg, unsigned min, unsigned max,
                  unsigned *out) {
  char range[64];
  if (cli_parse_uint(arg, min, max, out) == 0)
    return 1;
  snprintf(range, sizeof range, "a number in %u-%u", min, max);
  return bad(opt, arg, range);
}

static int unix_mode(const char *arg, int *out) {
  char *end;
  long m = strtol(arg, &end, 8);
  if (!*arg || *end || m < 0 || m > 0777)
    return bad("--unix-mode", arg, "an octal mode in 0-0777");
  *out = (int)m;
  return 1;
}

/* Where to listen: 1 handled, 0 not one of these, -1 a bad value. */
static int listen_option(struct serve_opts *o, int ch, const char *arg) {
  unsigned port;
  switch (ch) {
  case 'u': o->unix_path = arg; return 1;
  case 'p': o->port = arg; return number("--port", arg, 0, 65535, &port);
  case 'b': o->bind_addr = arg; return 1;
  case OPT_UNIX_MODE: return unix_mode(arg, &o->unix_mode);
  default: return 0;
  }
}

static int add_ro_export(struct serve_opts *o, const char *name) {
  char **n = realloc(o->ro_exports, (o->n_ro_exports + 1) * sizeof *n);
  if (!n)
    return -1;
  n[o->n_ro_exports++] = (char *)name;
  o->ro_exports = n;
  return 1;
}

/* -B NAME: one more bitmap, as the config file's bitmap key takes it. */
static int add_bitmap(struct serve_opts *o, const char *name) {
  if (!*name || strlen(name) > CONFIG_MAX_BITMAP_NAME)
    return bad("--bitmap", name, "a name of 1 to 1023 bytes");
  for (size_t i = 0; i < o->n_bitmaps; i++)
    if (!strcmp(o->bitmaps[i], name))
      return 1; /* once is enough */
  if (o->n_bitmaps >= CONFIG_MAX_BITMAPS)
    return bad("--bitmap", name, "at most 16 bitmaps");
  char **n = realloc(o->bitmaps, (o->n_bitmaps + 1) * sizeof *n);
  if (!n)
    return -1;
  /* The last first, as qemu-nbd keeps them (and answers LIST in). */
  memmove(n + 1, n, o->n_bitmaps++ * sizeof *n);
  n[0] = (char *)name;
  o->bitmaps = n;
  return 1;
}

/* What is served and how: 1 handled, 0 not one of these, -1 bad. */
static int export_option(struct serve_cli *c, int ch, const char *arg) {
  struct serve_opts *o = &c->so;
  switch (ch) {
  case 'r': o->readonly = true; return 1;
  case 'U': o->force_share = true; return 1;
  case OPT_RO_EXPORT: return add_ro_export(o, arg);
  case OPT_DESCRIPTION: o->description = arg; return 1;
  case 'B': return add_bitmap(o, arg);
  case OPT_CONFIG: o->config = arg; return 1;
  case OPT_CHECK_CONFIG: c->check_config = true; return 1;
  case OPT_RUN: c->run.cmd = arg; return 1;
  case OPT_FORK: c->run.fork = true; return 1;
  case OPT_FOREGROUND: c->foreground = true; return 1;
  case OPT_EXIT_WITH_PARENT: c->exit_with_parent = true; return 1;
  case 's': o->single = true; return 1;
  case 'e':
    if (strlen(arg) > 4096)
      return bad("--export-name", arg, "a name of at most 4096 bytes");
    o->export_name = arg;
    return 1;
  case 't': return number("--threads", arg, 1, 1024, &c->co.workers);
  default: return 0;
  }
}

static int seconds_ms(const char *opt, const char *arg, unsigned max,
                      unsigned *ms) {
  unsigned secs;
  if (number(opt, arg, 0, max, &secs) < 0)
    return -1;
  *ms = secs * 1000;
  return 1;
}

/* Limits per server and per connection: 1, 0 not one of these, -1. */
static int limit_option(struct server_limits *l, int ch, const char *arg) {
  switch (ch) {
  case 'c':
    return number("--max-connections", arg, 1, 1000000, &l->max_connections);
  case OPT_MAX_REQUESTS:
    return number("--max-requests", arg, 1, 65536, &l->max_requests);
  case OPT_MAX_BYTES:
    if (bd_parse_size(arg, &l->max_bytes) < 0 || l->max_bytes == 0)
      return bad("--max-inflight-bytes", arg, "a size above 0");
    return 1;
  case OPT_HANDSHAKE_TIMEOUT:
    return seconds_ms("--handshake-timeout", arg, 86400, &l->handshake_ms);
  case OPT_IDLE_TIMEOUT:
    return seconds_ms("--idle-timeout", arg, 86400 * 7, &l->idle_ms);
  default: return 0;
  }
}

static int tls_mode(const char *s, enum hs_tls *mode) {
  if (!strcmp(s, "off"))
    *mode = HS_TLS_OFF;
  else if (!strcmp(s, "on"))
    *mode = HS_TLS_ON;
  else if (!strcmp(s, "require"))
    *mode = HS_TLS_REQUIRE;
  else
    return bad("--tls", s, "off, on or require");
  return 1;
}

/* One --allow CIDR, added to the list. */
static int add_allow(struct serve_opts *o, const char *text) {
  struct acl_rule r;
  if (acl_parse(text, &r) < 0) {
    cli_error("serve", NULL, "--allow %s", bd_errmsg());
    return -1;
  }
  struct acl_rule *n = realloc(o->allow, (o->nallow + 1) * sizeof *n);
  if (!n)
    return -1;
  n[o->nallow++] = r;
  o->allow = n;
  return 1;
}

/* Who may connect, and TLS: 1 handled, 0 not one of these, -1 bad. */
static int access_option(struct serve_opts *o, int ch, const char *arg) {
  switch (ch) {
  case OPT_TLS: return tls_mode(arg, &o->tls);
  case OPT_TLS_CERTS: o->tls_certs = arg; return 1;
  case OPT_TLS_PSK: o->tls_psk = arg; return 1;
  case OPT_TLS_VERIFY: o->tls_verify_peer = true; return 1;
  case OPT_ALLOW: return add_allow(o, arg);
  default: return 0;
  }
}

/* One option of any group: 1, or -1 for a bad or unknown one. */
static int one_option(struct serve_cli *c, int ch, const char *arg) {
  int r = listen_option(&c->so, ch, arg);
  if (!r)
    r = export_option(c, ch, arg);
  if (!r)
    r = limit_option(&c->so.limits, ch, arg);
  if (!r)
    r = access_option(&c->so, ch, arg);
  if (!r)
    r = cli_opts_handle(&c->co, ch, arg);
  if (!r)
    cli_usage_error("serve", NULL);
  return r ? r : -1;
}

/* TLS needs credentials, and credentials are no use without TLS. */
static const char *tls_conflict(const struct serve_opts *o) {
  bool creds = o->tls_certs || o->tls_psk;
  if (o->tls != HS_TLS_OFF && !creds)
    return "--tls on|require needs --tls-certs DIR or --tls-psk FILE";
  if (o->tls == HS_TLS_OFF && creds)
    return "--tls-certs and --tls-psk need --tls on or --tls require";
  if (o->tls_verify_peer && !o->tls_certs)
    return "--tls-verify-peer needs --tls-certs DIR";
  return NULL;
}

/* Options that do not go together. */
static int check_conflicts(struct serve_cli *c, int nargs) {
  const struct serve_opts *o = &c->so;
  const char *err = tls_conflict(o);
  if (o->config && (nargs > 0 || c->co.plugin))
    err = "--config replaces IMAGE arguments and --plugin";
  else if (o->config && o->n_bitmaps)
    err = "--bitmap is for IMAGE arguments: with --config, say bitmap = NAME "
          "in the export";
  else if (o->force_share && !o->readonly) {
    cli_usage_error("serve",
                    "--force-share needs --readonly (a writer cannot share "
                    "the image)%s",
                    serve_nbdkit_force_share_hint);
    return -1;
  } else if (o->single && (o->unix_path || o->port || o->bind_addr ||
                           o->unix_mode >= 0 || c->run.cmd || c->run.fork))
    err = "--single serves standard input: no --unix, --port, --bind, "
          "--unix-mode, --run or --fork with it";
  else if (c->run.fork && (c->exit_with_parent || c->foreground))
    err = c->foreground ? "--foreground and --fork contradict each other"
                        : "--exit-with-parent keeps the server in the "
                          "foreground: no --fork with it";
  else if (c->run.cmd && c->run.fork)
    err = "--run keeps the server in the foreground: no --fork with it";
  else if (c->check_config && (c->run.cmd || c->run.fork || c->co.control))
    err = "--check-config starts no server: no --run, --fork or --control "
          "with it";
  else if (nargs == 0 && !c->co.plugin && !o->config) {
    cli_usage_error("serve", "no image given");
    return -1;
  }
  if (err)
    cli_usage_error("serve", "%s", err);
  return err ? -1 : 0;
}

/* The exports: IMAGE..., or the plugin with the arguments as its
 * parameters. */
static int take_images(struct serve_cli *c, int argc, char **argv) {
  struct serve_opts *o = &c->so;
  if (!c->co.plugin) {
    o->images = argv + optind;
    o->n_images = argc - optind;
    return 0;
  }
  c->plugin_spec = plugin_spec(c->co.plugin, argv + optind, argc - optind);
  if (!c->plugin_spec) {
    cli_error("serve", NULL, "out of memory");
    return -1;
  }
  o->images = &c->plugin_spec;
  o->n_images = 1;
  o->plugin = true;
  return 0;
}

static int parse_opts(int argc, char **argv, struct serve_cli *c) {
  static const struct option own[] = {
      {"unix", required_argument, NULL, 'u'},
      {"port", required_argument, NULL, 'p'},
      {"bind", required_argument, NULL, 'b'},
      {"readonly", no_argument, NULL, 'r'},
      {"force-share", no_argument, NULL, 'U'},
      {"max-connections", required_argument, NULL, 'c'},
      {"max-requests", required_argument, NULL, OPT_MAX_REQUESTS},
      {"max-inflight-bytes", required_argument, NULL, OPT_MAX_BYTES},
      {"tls", required_argument, NULL, OPT_TLS},
      {"tls-certs", required_argument, NULL, OPT_TLS_CERTS},
      {"tls-psk", required_argument, NULL, OPT_TLS_PSK},
      {"tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY},
      {"allow", required_argument, NULL, OPT_ALLOW},
      {"readonly-export", required_argument, NULL, OPT_RO_EXPORT},
      {"description", required_argument, NULL, OPT_DESCRIPTION},
      {"bitmap", required_argument, NULL, 'B'},
      {"unix-mode", required_argument, NULL, OPT_UNIX_MODE},
      {"handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT},
      {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
      {"config", required_argument, NULL, OPT_CONFIG},
      {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
      {"run", required_argument, NULL, OPT_RUN},
      {"fork", no_argument, NULL, OPT_FORK},
      {"foreground", no_argument, NULL, OPT_FOREGROUND},
      {"no-fork", no_argument, NULL, OPT_FOREGROUND},
      {"exit-with-parent", no_argument, NULL, OPT_EXIT_WITH_PARENT},
      {"single", no_argument, NULL, 's'},
      {"stdin", no_argument, NULL, 's'},
      {"export-name", required_argument, NULL, 'e'},
      {"export", required_argument, NULL, 'e'},
      {"exportname", required_argument, NULL, 'e'},
      {"threads", required_argument, NULL, 't'},
      {"dump-config", no_argument, NULL, OPT_DUMP_CONFIG},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  struct option lo[CLI_MAX_LONGOPTS];
  char so[64];
  cli_opts_tables(&c->co, own, "u:p:b:rUc:B:se:t:h", lo, so);
  if (serve_nbdkit_argv(argc, argv) < 0)
    return -1;
  int ch;
  while ((ch = getopt_long(argc, argv, so, lo, NULL)) != -1) {
    if (ch == 'h' || ch == OPT_DUMP_CONFIG) {
      if (ch == 'h')
        usage(stdout, c);
      else
        serve_nbdkit_dump_config(stdout);
      exit(0);
    }
    if (one_option(c, ch, optarg) < 0)
      return -1;
  }
  if (check_conflicts(c, argc - optind) < 0 || cli_ckpt_check(&c->co) < 0)
    return -1;
  return take_images(c, argc, argv);
}

/* One line of --check-config's listing: the export as configured (the
 * check itself opened every image read-only). */
static void print_export(const struct export_conf *c,
                         const struct export_set *s, bool plugin) {
  int i = exports_find(s, c->name);
  const struct bd *bd = i >= 0 ? s->v[i].dev->bd : NULL;
  printf("  export '%s': %s %s, %" PRIu64 " bytes, %s%s%s", c->name,
         bd ? bd->format : "?", plugin ? "plugin" : c->path, bd ? bd->size : 0,
         c->readonly ? "read-only" : "writable",
         c->is_default ? ", default" : "",
         c->tls_required ? ", TLS required" : "");
  if (c->nallow)
    printf(", %zu allow rule%s", c->nallow, c->nallow == 1 ? "" : "s");
  for (size_t k = 0; k < c->nbitmaps; k++)
    printf("%s%s", k ? ", " : ", bitmaps ", c->bitmaps[k]);
  printf("\n");
}

static void show_exports(const struct config *cf, const struct export_set *s,
                         void *opaque) {
  const struct serve_opts *o = opaque;
  const char *what = o->config ? o->config : "command line";
  printf("%s: ok, %zu export%s\n", what, cf->n, cf->n == 1 ? "" : "s");
  for (size_t i = 0; i < cf->n; i++)
    print_export(&cf->v[i], s, o->plugin);
}

static int on_ready(void *opaque) {
  struct serve_cli *c = opaque;
  return serve_run_ready(&c->run, &c->so);
}

int serve_main(int argc, char **argv) {
  struct serve_cli c = {.so = {.unix_mode = -1,
                               .limits = {.max_connections = 128,
                                          .max_requests = 256,
                                          .max_bytes = 64ull * 1024 * 1024,
                                          .handshake_ms = 10000}}};
  cli_opts_init(&c.co, "serve", SERVE_SHARED, 16);
  int ret = 1; /* usage errors exit 1, as qemu-img's do */
  if (parse_opts(argc, argv, &c) < 0)
    goto out;
  if (c.exit_with_parent && serve_nbdkit_exit_with_parent() < 0)
    goto out;
  /* Captive, the server is quiet as nbdkit's: the command's output is
   * what the user reads. */
  if (c.run.cmd && !c.co.log_chosen)
    log_threshold = LOG_LEVEL_WARN;
  c.so.open = &c.co.open;
  c.so.workers = c.co.workers;
  /* The control socket, with the checkpoint verbs (server/). */
  c.so.control = c.co.control;
  c.so.metrics = c.co.metrics;
  c.so.ckpt = c.co.ckpt;
  if (c.check_config) {
    ret = server_check(&c.so, show_exports, &c.so);
    goto out;
  }
  c.run.pid_file = c.co.pid_file;
  if (serve_run_prepare(&c.run, &c.so) < 0)
    goto out;
  c.so.ready = on_ready;
  c.so.opaque = &c;
  ret = serve_run_finish(&c.run, server_run(&c.so));
  if (c.co.pid_file)
    unlink(c.co.pid_file);
out:
  free(c.plugin_spec);
  free(c.so.allow);
  free(c.so.ro_exports);
  free(c.so.bitmaps);
  return ret;
}
