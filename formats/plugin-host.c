/* SPDX-License-Identifier: BSD-3-Clause */
/* The nbdkit_* functions nbdkit plugins import from their host, as
 * nbdkit-plugin(3) documents them.  Linked only into the blockport
 * executable, which exports exactly these symbols (formats/plugin-host.syms)
 * so that plugins loaded with dlopen() find them; blockport's own nbdkit
 * plugin takes them from nbdkit instead. */
#define NBDKIT_API_VERSION 2
/* Makes the headers declare the printf-like functions with format
 * attributes (glibc's printf knows %m). */
#define HAVE_VFPRINTF_PERCENT_M 1
#include <nbdkit-filter.h>
#include <nbdkit-plugin.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "plugin.h"

#define MAX_EXPORT_NAME 4096

/* ---- messages ---- */

void nbdkit_verror(const char *fs, va_list args) {
  int saved = errno;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fs, args);
  pl_report_error(msg);
  errno = saved;
}

void nbdkit_error(const char *fs, ...) {
  va_list ap;
  va_start(ap, fs);
  nbdkit_verror(fs, ap);
  va_end(ap);
}

void nbdkit_vdebug(const char *fs, va_list args) {
  int saved = errno;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fs, args);
  pl_report_debug(msg);
  errno = saved;
}

void nbdkit_debug(const char *fs, ...) {
  va_list ap;
  va_start(ap, fs);
  nbdkit_vdebug(fs, ap);
  va_end(ap);
}

void nbdkit_set_error(int err) {
  pl_thread.err = err;
}

/* ---- parsing ---- */

static int parse_signed(const char *what, const char *str, long long min,
                        long long max, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(str, &end, 0);
  if (errno == ERANGE || (errno == 0 && (v < min || v > max))) {
    nbdkit_error("%s: %s: out of range", what, str);
    return -1;
  }
  if (errno || end == str || *end) {
    nbdkit_error("%s: could not parse number: \"%s\"", what, str);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_unsigned(const char *what, const char *str,
                          unsigned long long max, unsigned long long *out) {
  const char *s = str;
  while (isspace((unsigned char)*s))
    s++;
  if (*s == '-') {
    nbdkit_error("%s: negative numbers are not allowed", what);
    return -1;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno == ERANGE || (errno == 0 && v > max)) {
    nbdkit_error("%s: %s: out of range", what, str);
    return -1;
  }
  if (errno || end == s || *end) {
    nbdkit_error("%s: could not parse number: \"%s\"", what, str);
    return -1;
  }
  *out = v;
  return 0;
}

#define PARSE_SIGNED(fn, type, min, max)                                       \
  int fn(const char *what, const char *str, type *r) {                         \
    long long v;                                                               \
    if (parse_signed(what, str, min, max, &v) < 0)                             \
      return -1;                                                               \
    if (r)                                                                     \
      *r = (type)v;                                                            \
    return 0;                                                                  \
  }
#define PARSE_UNSIGNED(fn, type, max)                                          \
  int fn(const char *what, const char *str, type *r) {                         \
    unsigned long long v;                                                      \
    if (parse_unsigned(what, str, max, &v) < 0)                                \
      return -1;                                                               \
    if (r)                                                                     \
      *r = (type)v;                                                            \
    return 0;                                                                  \
  }

PARSE_SIGNED(nbdkit_parse_int, int, INT_MIN, INT_MAX)
PARSE_SIGNED(nbdkit_parse_int8_t, int8_t, INT8_MIN, INT8_MAX)
PARSE_SIGNED(nbdkit_parse_int16_t, int16_t, INT16_MIN, INT16_MAX)
PARSE_SIGNED(nbdkit_parse_int32_t, int32_t, INT32_MIN, INT32_MAX)
PARSE_SIGNED(nbdkit_parse_int64_t, int64_t, INT64_MIN, INT64_MAX)
PARSE_UNSIGNED(nbdkit_parse_unsigned, unsigned, UINT_MAX)
PARSE_UNSIGNED(nbdkit_parse_uint8_t, uint8_t, UINT8_MAX)
PARSE_UNSIGNED(nbdkit_parse_uint16_t, uint16_t, UINT16_MAX)
PARSE_UNSIGNED(nbdkit_parse_uint32_t, uint32_t, UINT32_MAX)
PARSE_UNSIGNED(nbdkit_parse_uint64_t, uint64_t, UINT64_MAX)

/* NNN with an optional one-letter scale: b, s (512-byte sectors), or k, m,
 * g, t, p, e (powers of 1024), either case.  Returns the shift or -1. */
static int size_shift(const char *suffix) {
  static const char scales[] = "kmgtpe";
  char c = (char)tolower((unsigned char)*suffix);
  if (!c)
    return 0;
  if (suffix[1])
    return -1;
  if (c == 'b')
    return 0;
  if (c == 's')
    return 9;
  const char *p = strchr(scales, c);
  return p ? 10 * (int)(p - scales + 1) : -1;
}

int64_t nbdkit_parse_size(const char *str) {
  const char *s = str;
  while (isspace((unsigned char)*s))
    s++;
  if (*s == '-') {
    nbdkit_error("size cannot be negative (%s)", str);
    return -1;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) {
    nbdkit_error("could not parse size string (%s)", str);
    return -1;
  }
  if (errno == ERANGE || v > INT64_MAX) {
    nbdkit_error("size (%s) exceeds maximum value", str);
    return -1;
  }
  int shift = size_shift(end);
  if (shift < 0) {
    nbdkit_error("could not parse size: unknown suffix '%s'", end);
    return -1;
  }
  if (v > (unsigned long long)(INT64_MAX >> shift)) {
    nbdkit_error("overflow computing size (%s)", str);
    return -1;
  }
  return (int64_t)(v << shift);
}

int nbdkit_parse_bool(const char *str) {
  static const char *yes[] = {"1", "true", "t", "yes", "y", "on"};
  static const char *no[] = {"0", "false", "f", "no", "n", "off"};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    if (!strcasecmp(str, yes[i]))
      return 1;
    if (!strcasecmp(str, no[i]))
      return 0;
  }
  nbdkit_error("could not decipher boolean (%s)", str);
  return -1;
}

/* ---- files and passwords ---- */

char *nbdkit_absolute_path(const char *path) {
  if (!path || !*path) {
    nbdkit_error("cannot convert null or empty path to an absolute path");
    return NULL;
  }
  if (*path == '/') {
    char *r = strdup(path);
    if (!r)
      nbdkit_error("strdup: %m");
    return r;
  }
  char *cwd = getcwd(NULL, 0), *r = NULL;
  if (!cwd || asprintf(&r, "%s/%s", cwd, path) < 0) {
    nbdkit_error("cannot make %s absolute: %m", path);
    r = NULL;
  }
  free(cwd);
  return r;
}

char *nbdkit_realpath(const char *path) {
  if (!path || !*path) {
    nbdkit_error("cannot resolve a null or empty path");
    return NULL;
  }
  char *r = realpath(path, NULL);
  if (!r)
    nbdkit_error("realpath: %s: %m", path);
  return r;
}

int nbdkit_stdio_safe(void) {
  return 1;
}

/* Up to the first newline (or end of file) from FD. */
static int read_line_fd(int fd, char **out) {
  size_t cap = 64, n = 0;
  char *buf = malloc(cap);
  if (!buf)
    return -1;
  for (;;) {
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      free(buf);
      return -1;
    }
    if (r == 0 || c == '\n')
      break;
    if (n + 1 == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        return -1;
      }
      buf = nb;
    }
    buf[n++] = c;
  }
  buf[n] = 0;
  *out = buf;
  return 0;
}

static int read_password_tty(char **password) {
  if (!isatty(STDIN_FILENO)) {
    nbdkit_error("stdin is not a tty, cannot read password interactively");
    return -1;
  }
  struct termios old, quiet;
  bool have_term = tcgetattr(STDIN_FILENO, &old) == 0;
  if (have_term) {
    quiet = old;
    quiet.c_lflag &= (tcflag_t)~ECHO;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
  }
  fputs("password: ", stdout);
  fflush(stdout);
  int r = read_line_fd(STDIN_FILENO, password);
  if (have_term)
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
  putchar('\n');
  if (r < 0)
    nbdkit_error("could not read password from stdin: %m");
  return r;
}

static int read_password_fd(const char *num, char **password) {
  int fd;
  if (nbdkit_parse_int("password file descriptor", num, &fd) < 0)
    return -1;
  if (fd <= STDERR_FILENO) {
    nbdkit_error("cannot use password -FD for stdin/stdout/stderr");
    return -1;
  }
  int r = read_line_fd(fd, password);
  if (r < 0)
    nbdkit_error("could not read password from file descriptor %d: %m", fd);
  close(fd);
  return r;
}

static int read_password_file(const char *path, char **password) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    nbdkit_error("open %s: %m", path);
    return -1;
  }
  int r = read_line_fd(fd, password);
  if (r < 0)
    nbdkit_error("read %s: %m", path);
  close(fd);
  return r;
}

int nbdkit_read_password(const char *value, char **password) {
  *password = NULL;
  if (!strcmp(value, "-"))
    return read_password_tty(password);
  if (value[0] == '-')
    return read_password_fd(value + 1, password);
  if (value[0] == '+')
    return read_password_file(value + 1, password);
  if (!(*password = strdup(value))) {
    nbdkit_error("strdup: %m");
    return -1;
  }
  return 0;
}

int nbdkit_nanosleep(unsigned sec, unsigned nsec) {
  if (sec > INT_MAX) {
    nbdkit_error("sleep request is too long");
    errno = EINVAL;
    return -1;
  }
  struct timespec ts = {.tv_sec = sec + nsec / 1000000000,
                        .tv_nsec = nsec % 1000000000};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
  return 0;
}

/* ---- the connection ---- */

const char *nbdkit_export_name(void) {
  if (!pl_thread.conn) {
    nbdkit_error("no connection in this thread");
    return NULL;
  }
  return pl_thread.conn->export_name;
}

int nbdkit_is_tls(void) {
  return 0; /* blockport serves plaintext only */
}

static int peer_fd(void) {
  if (!pl_thread.conn || pl_thread.conn->peer_fd < 0) {
    nbdkit_error("no client socket in this context");
    return -1;
  }
  return pl_thread.conn->peer_fd;
}

int nbdkit_peer_name(struct sockaddr *addr, socklen_t *addrlen) {
  int fd = peer_fd();
  if (fd < 0)
    return -1;
  if (getpeername(fd, addr, addrlen) < 0) {
    nbdkit_error("peername: %m");
    return -1;
  }
  return 0;
}

static int peer_cred(struct ucred *cred) {
  int fd = peer_fd();
  socklen_t len = sizeof *cred;
  if (fd < 0)
    return -1;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) < 0) {
    nbdkit_error("getsockopt: SO_PEERCRED: %m");
    return -1;
  }
  return 0;
}

int64_t nbdkit_peer_pid(void) {
  struct ucred c;
  return peer_cred(&c) < 0 ? -1 : c.pid;
}

int64_t nbdkit_peer_uid(void) {
  struct ucred c;
  return peer_cred(&c) < 0 ? -1 : (int64_t)c.uid;
}

int64_t nbdkit_peer_gid(void) {
  struct ucred c;
  return peer_cred(&c) < 0 ? -1 : (int64_t)c.gid;
}

/* The server's signal handling (a signalfd for SIGTERM) does the rest. */
void nbdkit_shutdown(void) {
  kill(getpid(), SIGTERM);
}

/* ---- strings ---- */

const char *nbdkit_strndup_intern(const char *str, size_t n) {
  const char *s = pl_intern(str, n);
  if (!s)
    nbdkit_error("strndup: %s", strerror(ENOMEM));
  return s;
}

const char *nbdkit_strdup_intern(const char *str) {
  return nbdkit_strndup_intern(str, SIZE_MAX);
}

const char *nbdkit_vprintf_intern(const char *fmt, va_list ap) {
  char *s;
  if (vasprintf(&s, fmt, ap) < 0) {
    nbdkit_error("vasprintf: %m");
    return NULL;
  }
  const char *r = nbdkit_strdup_intern(s);
  free(s);
  return r;
}

const char *nbdkit_printf_intern(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *r = nbdkit_vprintf_intern(fmt, ap);
  va_end(ap);
  return r;
}

/* ---- extents ---- */

int nbdkit_add_extent(struct nbdkit_extents *e, uint64_t offset,
                      uint64_t length, uint32_t type) {
  int r = pl_extents_add(e, offset, length, type);
  if (r == -ERANGE)
    nbdkit_error("nbdkit_add_extent: extents must be added in ascending "
                 "order and must be contiguous");
  else if (r == -EINVAL)
    nbdkit_error("nbdkit_add_extent: first extent must not be > start "
                 "(%" PRIu64 ")",
                 e->start);
  else if (r == -EOVERFLOW)
    nbdkit_error("nbdkit_add_extent: extent is too long");
  else if (r < 0)
    nbdkit_error("nbdkit_add_extent: %s", strerror(-r));
  if (r < 0) {
    errno = -r;
    return -1;
  }
  return 0;
}

struct nbdkit_extents *nbdkit_extents_new(uint64_t start, uint64_t end) {
  if (start > end || end > INT64_MAX) {
    nbdkit_error("nbdkit_extents_new: invalid range [%" PRIu64 ", %" PRIu64 ")",
                 start, end);
    errno = ERANGE;
    return NULL;
  }
  struct nbdkit_extents *e = malloc(sizeof *e);
  if (!e) {
    nbdkit_error("nbdkit_extents_new: %m");
    return NULL;
  }
  pl_extents_init(e, start, end);
  return e;
}

void nbdkit_extents_free(struct nbdkit_extents *e) {
  if (e) {
    pl_extents_fini(e);
    free(e);
  }
}

size_t nbdkit_extents_count(const struct nbdkit_extents *e) {
  return e->n;
}

struct nbdkit_extent nbdkit_get_extent(const struct nbdkit_extents *e,
                                       size_t i) {
  const struct pl_extent *x = &e->v[i];
  return (struct nbdkit_extent){x->offset, x->length, x->type};
}

/* ---- exports ---- */

/* nbdkit_exports_new() lists own their storage here. */
struct owned_exports {
  struct nbdkit_exports x; /* first: the pointer handed out */
  struct bd_export_list list;
};

int nbdkit_add_export(struct nbdkit_exports *x, const char *name,
                      const char *description) {
  if (strlen(name) > MAX_EXPORT_NAME ||
      (description && strlen(description) > MAX_EXPORT_NAME)) {
    nbdkit_error("nbdkit_add_export: name or description too long");
    errno = EINVAL;
    return -1;
  }
  int r = pl_exports_add(x, name, description);
  if (r < 0) {
    nbdkit_error("nbdkit_add_export: %s",
                 r == -EINVAL ? "too many exports" : strerror(-r));
    errno = -r;
    return -1;
  }
  return 0;
}

int nbdkit_use_default_export(struct nbdkit_exports *x) {
  x->use_default = true;
  return 0;
}

struct nbdkit_exports *nbdkit_exports_new(void) {
  struct owned_exports *o = calloc(1, sizeof *o);
  if (!o) {
    nbdkit_error("nbdkit_exports_new: %m");
    return NULL;
  }
  o->x.list = &o->list;
  return &o->x;
}

void nbdkit_exports_free(struct nbdkit_exports *x) {
  if (!x)
    return;
  struct owned_exports *o = (struct owned_exports *)x;
  bd_export_list_free(&o->list);
  free(o);
}

size_t nbdkit_exports_count(const struct nbdkit_exports *x) {
  return x->list->n;
}

/* The header's signature, const return type and all. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-qualifiers"
const struct nbdkit_export nbdkit_get_export(const struct nbdkit_exports *x,
                                             size_t i) {
  return (struct nbdkit_export){x->list->v[i].name, x->list->v[i].description};
}
#pragma GCC diagnostic pop
