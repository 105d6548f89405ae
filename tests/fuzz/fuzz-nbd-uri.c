/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: NBD URIs made absolute (formats/nbd-uri.c), what the
 * NBD source does to every URI it is given before a daemon changes
 * directory.
 *
 * The input is a URI (up to its first NUL).  The current directory has
 * characters a URI must escape (' ', '%', '&', '?', '#').  The result
 * exists; everything before the query and everything from the fragment
 * on is the input's; it is the input with the directory, percent-encoded,
 * put in front of some file paths, so taking those out gives the input
 * back; and making it absolute again changes nothing. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/nbd-uri.h"
#include "fuzz-check.h"

static char *encoded_dir; /* the directory as the result carries it */
static char dir[] = "/tmp/blockport fuzz %&?#XXXXXX";
static int home = -1; /* where libFuzzer started: its paths are relative */

/* nbd_uri_absolute(URI) run in DIR. */
static char *absolute_in_dir(const char *uri) {
  CHECK(chdir(dir) == 0);
  char *out = nbd_uri_absolute(uri);
  CHECK(fchdir(home) == 0);
  return out;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  home = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(home >= 0 && mkdtemp(dir));
  /* What a relative path turns into tells the encoding. */
  char *probe = absolute_in_dir("nbd+unix:///?socket=s");
  CHECK(probe);
  const char *d = strstr(probe, "socket=") + strlen("socket=");
  encoded_dir = strndup(d, strlen(d) - 1);
  CHECK(encoded_dir && encoded_dir[0] == '/');
  CHECK(!strpbrk(encoded_dir, " &?#"));
  free(probe);
  return 0;
}

/* OUT with each "=" + encoded_dir cut back to "=": the input again. */
static char *strip_dir(const char *out) {
  char *s = strdup(out), *o = s;
  CHECK(s);
  size_t dl = strlen(encoded_dir);
  for (const char *p = out; *p;) {
    *o++ = *p;
    if (*p++ == '=' && strncmp(p, encoded_dir, dl) == 0)
      p += dl;
  }
  *o = 0;
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *uri = strndup((const char *)data, size);
  CHECK(uri);
  char *out = absolute_in_dir(uri);
  CHECK(out);
  const char *q = strchr(uri, '?');
  if (!q) {
    CHECK(!strcmp(out, uri));
  } else {
    size_t head = (size_t)(q - uri);
    CHECK(!strncmp(out, uri, head + 1));
    const char *frag = strchr(q, '#');
    if (frag) {
      size_t tail = strlen(frag);
      CHECK(strlen(out) >= tail && !strcmp(out + strlen(out) - tail, frag));
    }
    if (!strstr(uri, encoded_dir)) {
      char *back = strip_dir(out);
      CHECK(!strcmp(back, uri));
      free(back);
    }
  }
  char *again = absolute_in_dir(out);
  CHECK(again && !strcmp(again, out));
  free(again);
  free(out);
  free(uri);
  return 0;
}
