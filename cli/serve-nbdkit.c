/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit's habits on blockport serve.  See serve-nbdkit.h. */
#include "serve-nbdkit.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "core/features.h"
#include "core/version.h"
#include "formats/formats.h"

#include "cli.h"

const char serve_nbdkit_force_share_hint[] =
    " (for a Unix socket, as nbdkit's -U SOCKET, use -u/--unix SOCKET)";

/* Whether PATH plainly names a socket rather than an image. */
static bool names_socket(const char *path) {
  struct stat st;
  size_t n = strlen(path);
  if (stat(path, &st) == 0)
    return S_ISSOCK(st.st_mode);
  return (n > 5 && !strcmp(path + n - 5, ".sock")) ||
         (n > 7 && !strcmp(path + n - 7, ".socket"));
}

int serve_nbdkit_argv(int argc, char **argv) {
  for (int i = 1; i + 1 < argc && strcmp(argv[i], "--"); i++) {
    if (strcmp(argv[i], "-U"))
      continue;
    if (!strcmp(argv[i + 1], "-")) {
      argv[i] = "--unix"; /* nbdkit's "-U -": a private socket */
      continue;
    }
    if (names_socket(argv[i + 1])) {
      cli_usage_error("serve",
                      "-U %s: -U is --force-share here (qemu-img's -U); "
                      "for a Unix socket, as nbdkit's -U SOCKET, use "
                      "-u/--unix %s",
                      argv[i + 1], argv[i + 1]);
      return -1;
    }
  }
  return 0;
}

int serve_nbdkit_exit_with_parent(void) {
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0) {
    cli_error("serve", NULL, "--exit-with-parent: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static int by_key(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

void serve_nbdkit_dump_config(FILE *f) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  unsigned major = 0, minor = 0;
  sscanf(BLOCKPORT_VERSION, "%u.%u", &major, &minor);
  struct utsname u;
  if (uname(&u) < 0)
    strcpy(u.machine, "unknown");
  /* KEY=VALUE lines in nbdkit's order: by key. */
  char lines[32][PATH_MAX + 32];
  char *v[32];
  int k = 0;
#define LINE(...) snprintf(v[k] = lines[k], sizeof lines[k], __VA_ARGS__), k++
  LINE("binary=%s", exe);
  LINE("exit_with_parent=yes");
  LINE("host_cpu=%s", u.machine);
  LINE("host_os=linux-gnu");
  LINE("name=blockport");
  if (plugin_dir())
    LINE("plugindir=%s", plugin_dir());
  for (int i = 0; i < FEATURE_COUNT; i++)
    LINE("%s=%s", feature_id((enum feature)i),
         feature_built((enum feature)i) ? "yes" : "no");
  LINE("version=%s", BLOCKPORT_VERSION);
  LINE("version_major=%u", major);
  LINE("version_minor=%u", minor);
  LINE("zstd=yes");
#undef LINE
  qsort(v, (size_t)k, sizeof *v, by_key);
  for (int i = 0; i < k; i++)
    fprintf(f, "%s\n", v[i]);
}
