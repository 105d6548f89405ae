/* SPDX-License-Identifier: BSD-3-Clause */
/* blockport map: where an image's bytes live, as `qemu-img map` prints it
 * (human table, or --json with the same fields). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "formats/map.h"

#include "cli.h"
#include "commands.h"

static const char map_usage[] =
    "Usage: blockport map [--output human|json] [-f FMT] [-U] "
    "[--start-offset OFFSET] [--max-length LENGTH] IMAGE\n"
    "Print where each range of IMAGE lives: which layer of its backing chain\n"
    "(depth), whether it is allocated (present), reads as zeroes, holds data,\n"
    "and at which offset of which file.  --output=json (or --json) prints\n"
    "the fields of `qemu-img map --output=json`; --output=human (the\n"
    "default) its table.  -U/--force-share maps a qcow2 image that\n"
    "another process writes (without it, such an image is refused; a raw\n"
    "file is mapped beside a writer, as qemu-img map maps it).\n"
    "--start-offset and --max-length map only that range (sizes with the\n"
    "suffixes k, M, G, T, P, E).\n"
    "IMAGE may be an NBD URI or rbd:POOL/IMAGE[@SNAP] (with fast-diff, an\n"
    "RBD image maps by whole objects, as qemu-img map shows it).\n"
    "Exit status: 0 success, 1 bad usage or the image cannot be read.\n";

static bool mergeable(const struct map_entry *a, const struct map_entry *b) {
  return a->depth == b->depth && a->present == b->present &&
         a->zero == b->zero && a->data == b->data &&
         a->has_offset == b->has_offset && a->file == b->file &&
         (!a->has_offset || a->offset + a->length == b->offset);
}

/* 0, or -1 when the human form cannot show E (said). */
static int print_entry(const struct map_entry *e, bool json, bool first) {
  if (!json && e->data && !e->has_offset) {
    cli_error("map", NULL,
              "File contains external, encrypted or compressed clusters.");
    return -1;
  }
  if (json) {
    printf("%s{ \"start\": %llu, \"length\": %llu, \"depth\": %u, "
           "\"present\": %s, \"zero\": %s, \"data\": %s",
           first ? "[" : ",\n", (unsigned long long)e->start,
           (unsigned long long)e->length, e->depth,
           e->present ? "true" : "false", e->zero ? "true" : "false",
           e->data ? "true" : "false");
    if (e->has_offset)
      printf(", \"offset\": %llu", (unsigned long long)e->offset);
    printf("}");
  } else if (e->data && !e->zero) { /* qemu-img leaves zeroes out */
    printf("%-#15llx %-#15llx %-#15llx %s\n", (unsigned long long)e->start,
           (unsigned long long)e->length, (unsigned long long)e->offset,
           e->file);
  }
  return 0;
}

/* The runs of [START, END), merged; as qemu-img, the last one is printed
 * even when the range is empty (a run of length 0 at START). */
static int walk(struct bd *bd, bool json, uint64_t start, uint64_t end) {
  struct map_entry cur = {.start = start}, next;
  bool first = true;
  if (!json)
    printf("%-15s %-15s %-15s %s\n", "Offset", "Length", "Mapped to", "File");
  for (uint64_t off = start; off < end; off += next.length) {
    if (map_first(bd, 0, off, end - off, &next) < 0 || !next.length) {
      cli_error("map", NULL, "at offset %llu: %s", (unsigned long long)off,
                bd_errmsg());
      return 1;
    }
    if (mergeable(&cur, &next)) {
      cur.length += next.length;
      continue;
    }
    if (cur.length > 0) {
      if (print_entry(&cur, json, first) < 0)
        return 1;
      first = false;
    }
    cur = next;
  }
  if (print_entry(&cur, json, first) < 0)
    return 1;
  if (json)
    printf("]\n");
  return 0;
}

/* --start-offset and --max-length: a size, as qemu-img reads one. */
static int range_option(const char *what, const char *arg, uint64_t *out) {
  if (cli_parse_qemu_size(arg, out) < 0) {
    cli_usage_error("map", "invalid %s '%s'", what, arg);
    return -1;
  }
  return 0;
}

int map_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"output", required_argument, NULL, 'o'},
      {"format", required_argument, NULL, 'f'},
      {"force-share", no_argument, NULL, 'U'},
      {"start-offset", required_argument, NULL, 's'},
      {"max-length", required_argument, NULL, 'l'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0}};
  bool json = false, share = false, has_max = false;
  uint64_t start = 0, max_len = 0;
  const char *fmt = NULL;
  int ch;
  while ((ch = getopt_long(argc, argv, "jf:Uh", longopts, NULL)) != -1) {
    switch (ch) {
    case 'j': json = true; break;
    case 'o':
      if (strcmp(optarg, "json") && strcmp(optarg, "human")) {
        cli_usage_error("map", "--output must be human or json");
        return 1;
      }
      json = !strcmp(optarg, "json");
      break;
    case 'f': fmt = optarg; break;
    case 'U': share = true; break;
    case 's':
      if (range_option("start offset", optarg, &start) < 0)
        return 1;
      break;
    case 'l':
      if (range_option("max length", optarg, &max_len) < 0)
        return 1;
      has_max = true;
      break;
    case 'h': fputs(map_usage, stdout); return 0;
    default: cli_usage_error("map", NULL); return 1;
    }
  }
  if (optind + 1 != argc) {
    cli_usage_error("map", "%s",
                    optind >= argc ? "no image given"
                                   : "more than one image given");
    return 1;
  }
  struct bd *bd = bd_open_flags(argv[optind], fmt,
                                share ? BD_OPEN_SHARE : BD_OPEN_READONLY);
  if (!bd) {
    cli_error("map", NULL, "%s", bd_errmsg());
    return 1;
  }
  uint64_t end = bd->size;
  if (has_max && max_len < end && start <= end - max_len)
    end = start + max_len;
  int r = walk(bd, json, start, end);
  bd_close(bd);
  return r;
}
