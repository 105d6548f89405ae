/* SPDX-License-Identifier: BSD-3-Clause */
/* A main() for a libFuzzer target, for builds without libFuzzer: calls
 * LLVMFuzzerInitialize (when the target has one) and then
 * LLVMFuzzerTestOneInput once per input, as `fuzzer -runs=1 INPUT...`
 * would.  Arguments are files or directories (whose files are replayed in
 * name order).  A broken invariant aborts in the target; ASan and UBSan,
 * when built in, catch the rest.
 *
 *   replay-NAME PATH...   exit 0 all replayed, 1 unreadable input, 77 none
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* The input in a buffer of exactly its size, so that a read past its end
 * is caught by ASan as libFuzzer's would be. */
static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) < 0) {
    perror(path);
    fclose(f);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *data = malloc(size ? size : 1);
  if (!data || fread(data, 1, size, f) != size) {
    fprintf(stderr, "%s: cannot read\n", path);
    free(data);
    fclose(f);
    return -1;
  }
  fclose(f);
  fprintf(stderr, "replaying %s (%zu bytes)\n", path, size);
  LLVMFuzzerTestOneInput(data, size);
  free(data);
  return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

/* Returns the number of inputs replayed, or -1. */
static int replay_dir(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, by_name);
  if (n < 0) {
    perror(dir);
    return -1;
  }
  int count = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    if (count >= 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      int r = replay_file(path);
      count = r < 0 ? -1 : count + r;
    }
    free(names[i]);
  }
  free(names);
  return count;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  int total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    int r = stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)
                ? replay_dir(argv[i])
                : replay_file(argv[i]);
    if (r < 0)
      return 1;
    total += r;
  }
  printf("%d input(s) replayed\n", total);
  return total ? 0 : 77;
}
