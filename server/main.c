/* blockport: one program, subcommands for each way to reach a disk. */
#include <stdio.h>
#include <string.h>

#include "server.h"

#define BLOCKPORT_VERSION "0.1.0"

static const char usage[] =
    "Usage: blockport COMMAND [OPTIONS] ...\n"
    "Serve and reach disk images: raw files today, over NBD.\n"
    "\n"
    "Commands:\n"
    "  serve     serve images over NBD (blockport serve --help)\n"
    "\n"
    "  blockport --version | --help\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
    printf("blockport %s\n", BLOCKPORT_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "serve"))
    return serve_main(argc - 1, argv + 1);
  fprintf(stderr, "blockport: unknown command '%s'\n%s", cmd, usage);
  return 2;
}
