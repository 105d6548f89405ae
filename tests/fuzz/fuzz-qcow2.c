/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: qcow2 images (formats/qcow2/).
 *
 * The input is a whole image file.  First the pure functions: the header
 * is parsed with qcow2_parse_header(), and when accepted, the metadata is
 * walked as the reader does (L1 entries, then every entry of the L2 tables
 * found inside the input, decoded with qcow2_decode_l2() at several
 * in-cluster offsets, compressed clusters inflated with qcow2_decompress()),
 * checking the invariants of what comes back.
 *
 * Then the real source: the input is written to img.qcow2 in a private
 * directory, next to base.raw and data.raw (the backing and external data
 * file names of the seeds), opened with bd_open(..., "qcow2", true), and
 * read and block-status queried over a few ranges.  A reference reader
 * built on the pure functions says what those reads must return (or that
 * they must fail), and every extent reported as zero must read as zeroes,
 * and the image is checked (check.c) without repairs.  Last, it is opened
 * for writing and written once.
 *
 * Inputs over 1 MiB are skipped, and the walks are capped, so that one
 * execution stays in the milliseconds. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "core/open.h"
#include "formats/qcow2/check.h"
#include "formats/qcow2/qcow2-internal.h"
#include "formats/qcow2/qcow2.h"
#include "formats/registry.h"
#include "fuzz-check.h"

#define MAX_INPUT (1u << 20)
#define MAX_L1_WALK 16
#define MAX_L2_WALK 512
#define MAX_INFLATE 8
#define MAX_READ (256u << 10)
#define BASE_SIZE (64u << 10)
#define DATA_SIZE (256u << 10)

static uint64_t be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

/* The big-endian word at OFF of a SIZE-byte file, bytes past its end
 * reading as zeroes (as the reader's pread_zero()). */
static uint64_t word_at(const uint8_t *d, size_t size, uint64_t off) {
  uint64_t v = 0;
  for (uint64_t i = 0; i < 8; i++)
    v = v << 8 | (off + i < size ? d[off + i] : 0);
  return v;
}

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

/* ---- the files next to the image ---- */

static char dir[64], img_path[96];
static int img_fd = -1;
static uint8_t base[BASE_SIZE], datafile[DATA_SIZE];
static uint8_t *cluster_buf; /* one cluster of up to 2 MiB */
static bool verbose;         /* FUZZ_QCOW2_VERBOSE=1: say what happens */

static void write_file(const char *name, const uint8_t *p, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CHECK(fd >= 0);
  CHECK(write(fd, p, n) == (ssize_t)n);
  close(fd);
}

static void cleanup(void) {
  const char *names[] = {"img.qcow2", "base.raw", "data.raw"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  bd_formats_install(formats_files);
  verbose = getenv("FUZZ_QCOW2_VERBOSE") != NULL;
  if (!verbose)
    log_threshold = LOG_LEVEL_ERROR; /* corrupt images log warnings */
  const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(dir, sizeof dir, "%s/fuzz-qcow2.XXXXXX", tmp);
  CHECK(mkdtemp(dir));
  atexit(cleanup);
  snprintf(img_path, sizeof img_path, "%s/img.qcow2", dir);
  /* Recognisable bytes, no zeroes (a zero extent must read as zeroes). */
  for (size_t i = 0; i < BASE_SIZE; i++)
    base[i] = (uint8_t)(0x80 | (i * 7 >> 9));
  for (size_t i = 0; i < DATA_SIZE; i++)
    datafile[i] = (uint8_t)(1 + (i * 13 >> 9) % 255);
  write_file("base.raw", base, sizeof base);
  write_file("data.raw", datafile, sizeof datafile);
  img_fd = open(img_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CHECK(img_fd >= 0);
  cluster_buf = malloc(2u << 20);
  CHECK(cluster_buf);
  return 0;
}

/* ---- the pure functions ---- */

static void check_header(const struct qcow2_header *h, size_t size) {
  CHECK(h->version == 2 || h->version == 3);
  CHECK(h->cluster_bits >= 9 && h->cluster_bits <= 21);
  CHECK(h->crypt_method == 0);
  CHECK(h->refcount_order <= 6);
  CHECK(h->compression_type <= 1);
  CHECK((h->incompatible & ~QCOW2_INCOMPAT_KNOWN) == 0);
  CHECK(h->header_length >= 72 && h->header_length <= size);
  uint64_t cs = 1ull << h->cluster_bits;
  CHECK((uint64_t)h->l1_size * 8 <= QCOW2_MAX_L1_BYTES);
  if (h->l1_size) {
    CHECK(h->l1_offset % cs == 0);
    CHECK(h->l1_offset + (uint64_t)h->l1_size * 8 <= size);
  }
  /* The refcount table may be empty or past the end (check reports it). */
  CHECK(h->reftable_offset % cs == 0);
  CHECK(((uint64_t)h->reftable_clusters << h->cluster_bits) <=
        QCOW2_MAX_REFTABLE_BYTES);
  if (h->bitmaps_nb) {
    CHECK(h->bitmaps_nb <= QCOW2_MAX_BITMAPS);
    CHECK(h->bitmaps_dir_size <= QCOW2_MAX_BITMAP_DIR);
    CHECK(h->bitmaps_dir_offset % cs == 0);
  }
  if (h->backing_offset) {
    CHECK(h->backing_size > 0 && h->backing_size <= QCOW2_MAX_BACKING_NAME);
    CHECK(h->backing_offset + h->backing_size <= size);
  }
  CHECK(memchr(h->backing_format, 0, sizeof h->backing_format));
  CHECK(memchr(h->data_file, 0, sizeof h->data_file));
}

static struct qcow2_geom geom_of(const struct qcow2_header *h) {
  return (struct qcow2_geom){
      .cluster_bits = h->cluster_bits,
      .extended_l2 = h->incompatible & QCOW2_INCOMPAT_EXTL2,
      .v3 = h->version >= 3,
      .data_file = h->incompatible & QCOW2_INCOMPAT_DATA_FILE};
}

/* Decode one entry at IN, up to MAX, and check what comes back. */
static int decode_checked(const struct qcow2_geom *g, uint64_t entry,
                          uint64_t bitmap, uint32_t in, uint32_t max,
                          struct qcow2_run *run) {
  uint32_t cs = 1u << g->cluster_bits;
  int r = qcow2_decode_l2(g, entry, bitmap, in, max, run);
  if (in >= cs || max == 0) {
    CHECK(r == -EINVAL);
    return r;
  }
  CHECK(r == 0 || r == -EIO);
  if (r < 0)
    return r;
  uint32_t lim = max < cs - in ? max : cs - in;
  CHECK(run->length >= 1 && run->length <= lim);
  switch (run->kind) {
  case QCOW2_DATA:
    CHECK(run->host >= in);
    CHECK(((run->host - in) & (cs - 1)) == 0);
    CHECK(run->host - in <= QCOW2_OFFSET_MASK);
    CHECK(run->host != in || g->data_file);
    break;
  case QCOW2_COMPRESSED:
    CHECK(entry & QCOW2_L2_COMPRESSED);
    CHECK(run->length == lim);
    CHECK(run->coffset < (1ull << 56));
    CHECK(run->csize >= 1 && run->csize <= (1ull << 22));
    break;
  case QCOW2_ZERO:
  case QCOW2_UNALLOCATED: break;
  default: CHECK(!"unknown kind");
  }
  if (!g->extended_l2 && run->kind != QCOW2_COMPRESSED)
    CHECK(run->length == lim); /* whole clusters only */
  /* The run is of one kind to its last byte, and maximal. */
  if (run->length > 1) {
    struct qcow2_run last;
    CHECK(qcow2_decode_l2(g, entry, bitmap, in + (uint32_t)run->length - 1, 1,
                          &last) == 0);
    CHECK(last.kind == run->kind);
    if (run->kind == QCOW2_DATA)
      CHECK(last.host == run->host + run->length - 1);
  }
  if (run->length < lim) {
    struct qcow2_run next;
    CHECK(qcow2_decode_l2(g, entry, bitmap, in + (uint32_t)run->length, 1,
                          &next) == 0);
    CHECK(next.kind != run->kind);
  }
  return 0;
}

static void inflate_run(const struct qcow2_header *h, const uint8_t *d,
                        size_t size, const struct qcow2_run *run, int *budget) {
  if (*budget <= 0 || run->coffset >= size)
    return;
  (*budget)--;
  uint64_t n =
      run->csize < size - run->coffset ? run->csize : size - run->coffset;
  uint64_t cs = 1ull << h->cluster_bits;
  int r = qcow2_decompress(h->compression_type, d + run->coffset, n,
                           cluster_buf, cs);
  CHECK(r == 0 || r == -EIO);
}

static void walk(const struct qcow2_header *h, const uint8_t *d, size_t size) {
  struct qcow2_geom g = geom_of(h);
  uint32_t cs = 1u << h->cluster_bits;
  unsigned l2_bits = h->cluster_bits - (g.extended_l2 ? 4 : 3);
  unsigned esize = g.extended_l2 ? 16 : 8;
  uint32_t sc = g.extended_l2 ? cs / 32 : cs;
  const uint32_t ins[] = {0,      1,          sc - 1,  sc,
                          sc + 1, cs / 2 + 3, cs - sc, cs - 1};
  const uint32_t maxes[] = {cs, 1, 4096, 3 * sc + 7, 0xffffffffu};
  int l2_budget = MAX_L2_WALK, inflate_budget = MAX_INFLATE;
  uint32_t l1n = h->l1_size < MAX_L1_WALK ? h->l1_size : MAX_L1_WALK;
  for (uint32_t i = 0; i < l1n; i++) {
    uint64_t l1e = be64(d + h->l1_offset + 8ull * i); /* inside: checked */
    uint64_t l2off = l1e & QCOW2_OFFSET_MASK;
    if (!l2off || (l2off & (cs - 1)) || l2off >= size)
      continue;
    for (uint64_t j = 0; j < (1ull << l2_bits) && l2_budget > 0; j++) {
      uint64_t pos = l2off + j * esize;
      if (pos >= size)
        break;
      l2_budget--;
      uint64_t entry = word_at(d, size, pos);
      uint64_t bitmap = g.extended_l2 ? word_at(d, size, pos + 8) : 0;
      if (!entry && !bitmap && j > 8)
        continue;
      for (size_t a = 0; a < sizeof ins / sizeof *ins; a++) {
        struct qcow2_run run;
        uint32_t max = maxes[(a + j) % (sizeof maxes / sizeof *maxes)];
        if (decode_checked(&g, entry, bitmap, ins[a], max, &run) == 0 &&
            run.kind == QCOW2_COMPRESSED && a == 0)
          inflate_run(h, d, size, &run, &inflate_budget);
      }
      struct qcow2_run run;
      CHECK(qcow2_decode_l2(&g, entry, bitmap, cs, 1, &run) == -EINVAL);
      CHECK(qcow2_decode_l2(&g, entry, bitmap, 0, 0, &run) == -EINVAL);
    }
  }
}

/* ---- the real source against a reference reader ---- */

struct ref {
  const struct qcow2_header *h;
  struct qcow2_geom g;
  const uint8_t *d;
  size_t size;
  unsigned l2_bits;
  const uint8_t *data; /* where DATA runs read from */
  size_t data_size;
  const uint8_t *backing; /* NULL: unallocated reads zeroes */
  size_t backing_size;
};

static void copy_or_zero(uint8_t *out, const uint8_t *src, size_t srclen,
                         uint64_t off, uint64_t n) {
  uint64_t have = off >= srclen ? 0 : srclen - off < n ? srclen - off : n;
  if (have)
    memcpy(out, src + off, have);
  memset(out + have, 0, n - have);
}

/* What the image reads as: 0, or -EIO where the reader must fail. */
static int ref_read(const struct ref *q, uint8_t *out, uint64_t len,
                    uint64_t off) {
  uint64_t cs = 1ull << q->h->cluster_bits;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  while (len > 0) {
    uint64_t cluster = off >> q->h->cluster_bits;
    uint64_t l1i = cluster >> q->l2_bits;
    uint32_t in = (uint32_t)(off & (cs - 1));
    uint64_t n = cs - in < len ? cs - in : len;
    uint64_t l1e =
        l1i < q->h->l1_size ? be64(q->d + q->h->l1_offset + 8 * l1i) : 0;
    uint64_t l2off = l1e & QCOW2_OFFSET_MASK;
    struct qcow2_run run = {QCOW2_UNALLOCATED, 0, n, 0, 0};
    if (l2off) {
      if ((l2off & (cs - 1)) || l2off >= q->size)
        return -EIO;
      uint64_t pos = l2off + (cluster & ((1ull << q->l2_bits) - 1)) * esize;
      uint64_t entry = word_at(q->d, q->size, pos);
      uint64_t bitmap = q->g.extended_l2 ? word_at(q->d, q->size, pos + 8) : 0;
      if (qcow2_decode_l2(&q->g, entry, bitmap, in, (uint32_t)n, &run) < 0)
        return -EIO;
      /* An external data file holds each cluster at its guest offset: an
       * entry naming another one (allocated or not, as QEMU checks) is
       * corrupt. */
      uint64_t host = entry & QCOW2_OFFSET_MASK;
      bool allocated = host || (entry & QCOW2_L2_COPIED);
      if (q->g.data_file && allocated && host != cluster << q->h->cluster_bits)
        return -EIO;
    }
    switch (run.kind) {
    case QCOW2_DATA:
      /* A data cluster past the end of the image file reads as zeroes,
       * as QEMU's file layer pads it (copy_or_zero). */
      copy_or_zero(out, q->data, q->data_size, run.host, run.length);
      break;
    case QCOW2_COMPRESSED: {
      /* Never with an external data file: qcow2_decode_l2 says -EIO. */
      if (run.coffset >= q->size)
        return -EIO;
      uint64_t c =
          run.csize < q->size - run.coffset ? run.csize : q->size - run.coffset;
      if (qcow2_decompress(q->h->compression_type, q->d + run.coffset, c,
                           cluster_buf, cs))
        return -EIO;
      memcpy(out, cluster_buf + in, run.length);
      break;
    }
    case QCOW2_ZERO: memset(out, 0, run.length); break;
    case QCOW2_UNALLOCATED:
      copy_or_zero(out, q->backing, q->backing ? q->backing_size : 0, off,
                   run.length);
      break;
    }
    out += run.length;
    off += run.length;
    len -= run.length;
  }
  return 0;
}

static bool same_name(const uint8_t *p, uint32_t n, const char *name) {
  return n == strlen(name) && memcmp(p, name, n) == 0;
}

/* Names that stay inside our directory: no '/' (absolute paths or
 * "../x" could reach devices or FIFOs that block). */
static bool local_name(const uint8_t *p, uint32_t n) {
  return memchr(p, '/', n) == NULL;
}

static uint8_t got[MAX_READ], want[MAX_READ];

static void check_read(struct bd *bd, const struct ref *q, bool comparable,
                       uint64_t off, uint64_t len) {
  if (off >= bd->size)
    return;
  if (len > bd->size - off)
    len = bd->size - off;
  if (len > MAX_READ)
    len = MAX_READ;
  if (len == 0)
    return;
  int r = bd_pread(bd, got, len, off);
  CHECK(r == 0 || r == -EIO || r == -EINVAL);
  if (!comparable)
    return;
  int rr = ref_read(q, want, len, off);
  if ((r == 0) != (rr == 0)) {
    fprintf(stderr, "read of %llu at 0x%llx: blockport %d, reference %d (%s)\n",
            (unsigned long long)len, (unsigned long long)off, r, rr,
            bd_errmsg());
    abort();
  }
  if (r == 0 && memcmp(got, want, len) != 0) {
    size_t i = 0;
    while (got[i] == want[i])
      i++;
    fprintf(
        stderr, "read of %llu at 0x%llx differs at +%zu: 0x%02x, want 0x%02x\n",
        (unsigned long long)len, (unsigned long long)off, i, got[i], want[i]);
    abort();
  }
}

static void check_extents(struct bd *bd, uint64_t off, uint64_t len,
                          uint32_t flags) {
  if (off >= bd->size)
    return;
  if (len > bd->size - off)
    len = bd->size - off;
  struct bd_extents ext;
  bd_extents_init(&ext, off, 64);
  struct bd_req req = {.cmd = BD_BLOCK_STATUS,
                       .offset = off,
                       .length = len,
                       .flags = flags,
                       .extents = &ext};
  int r = bd_run(bd, &req);
  CHECK(r == 0 || r == -EIO || r == -EINVAL);
  if (r == 0) {
    CHECK(ext.n >= 1);
    CHECK(ext.end > off && ext.end - off <= len);
    uint64_t pos = off;
    for (size_t i = 0; i < ext.n; i++) {
      CHECK(ext.v[i].length > 0);
      if (ext.v[i].flags & BD_EXT_HOLE)
        CHECK(ext.v[i].flags & BD_EXT_ZERO);
      /* A zero extent reads as zeroes. */
      uint64_t n = ext.v[i].length < MAX_READ ? ext.v[i].length : MAX_READ;
      if ((ext.v[i].flags & BD_EXT_ZERO) && bd_pread(bd, got, n, pos) == 0 &&
          !all_zero(got, n)) {
        fprintf(stderr, "extent %zu (0x%llx+%llu, flags %u) is not zero\n", i,
                (unsigned long long)pos, (unsigned long long)ext.v[i].length,
                ext.v[i].flags);
        abort();
      }
      pos += ext.v[i].length;
    }
    CHECK(pos == ext.end);
  }
  bd_extents_free(&ext);
}

static void open_real(const struct qcow2_header *h, const uint8_t *d,
                      size_t size) {
  if (h->backing_offset && !local_name(d + h->backing_offset, h->backing_size))
    return;
  if (strchr(h->data_file, '/'))
    return;
  CHECK(ftruncate(img_fd, 0) == 0);
  CHECK(pwrite(img_fd, d, size, 0) == (ssize_t)size);

  struct ref q = {.h = h,
                  .g = geom_of(h),
                  .d = d,
                  .size = size,
                  .data = d,
                  .data_size = size};
  q.l2_bits = h->cluster_bits - (q.g.extended_l2 ? 4 : 3);
  /* The reference knows the files we put next to the image. */
  bool comparable = true;
  if (h->incompatible & QCOW2_INCOMPAT_DATA_FILE) {
    if (!strcmp(h->data_file, "data.raw")) {
      q.data = datafile;
      q.data_size = sizeof datafile;
    } else {
      comparable = false;
    }
  }
  if (h->backing_offset) {
    if (same_name(d + h->backing_offset, h->backing_size, "base.raw") &&
        (!h->backing_format[0] || !strcmp(h->backing_format, "raw"))) {
      q.backing = base;
      q.backing_size = sizeof base;
    } else {
      comparable = false;
    }
  }

  struct bd *bd = bd_open(img_path, "qcow2", true);
  if (verbose)
    fprintf(stderr, "open: %s%s\n", bd ? "ok" : "failed: ",
            bd ? (comparable ? ", comparable" : "") : bd_errmsg());
  if (!bd)
    return;
  CHECK(bd->size == h->size);
  uint64_t cs = 1ull << h->cluster_bits;
  check_read(bd, &q, comparable, 0, 64u << 10);
  check_read(bd, &q, comparable, cs - 100, 200);
  check_read(bd, &q, comparable, bd->size > 4096 ? bd->size - 4096 : 0, 4096);
  /* Where the first L1 entries and their first allocated L2 entries lead. */
  unsigned l2_bits = q.l2_bits, esize = q.g.extended_l2 ? 16 : 8;
  uint32_t l1n = h->l1_size < 4 ? h->l1_size : 4;
  int reads = 0;
  for (uint32_t i = 0; i < l1n && reads < 8; i++) {
    uint64_t l1e = be64(d + h->l1_offset + 8ull * i);
    uint64_t l2off = l1e & QCOW2_OFFSET_MASK;
    uint64_t guest = (uint64_t)i << (l2_bits + h->cluster_bits);
    if (!l2off)
      continue;
    check_read(bd, &q, comparable, guest, 2 * cs);
    check_extents(bd, guest, 64 * cs, 0);
    reads++;
    for (uint64_t j = 0; j < (1ull << l2_bits) && j < 256 && reads < 8; j++) {
      if (!word_at(d, size, l2off + j * esize))
        continue;
      check_read(bd, &q, comparable, guest + (j << h->cluster_bits) + 1,
                 cs + 511);
      reads++;
    }
  }
  /* An offset chosen by the input. */
  uint64_t pick = size >= 8 ? be64(d + size - 8) : 0;
  if (bd->size) {
    check_read(bd, &q, comparable, pick % bd->size, (pick >> 40) % 70000 + 1);
    check_extents(bd, pick % bd->size, 16 * cs, BD_F_REQ_ONE);
  }
  check_extents(bd, 0, 128 * cs, 0);
  /* check walks all the metadata: any verdict, but it must finish. */
  struct qcow2_check_result res;
  qcow2_check(bd->priv, QCOW2_REPAIR_NONE, NULL, &res);
  bd_close(bd);
}

/* The image opened for writing and written once where the input says:
 * the metadata walk of the overlap guard (formats/qcow2/guard.c) and the
 * write path on hostile metadata.  Anything but a crash will do.  Images
 * with an external data file are left out: data.raw must stay as the
 * reference reader knows it. */
static void write_real(const struct qcow2_header *h, const uint8_t *d,
                       size_t size) {
  if ((h->backing_offset &&
       !local_name(d + h->backing_offset, h->backing_size)) ||
      (h->incompatible & QCOW2_INCOMPAT_DATA_FILE))
    return;
  CHECK(ftruncate(img_fd, 0) == 0);
  CHECK(pwrite(img_fd, d, size, 0) == (ssize_t)size);
  struct bd *bd = bd_open(img_path, "qcow2", false);
  if (!bd)
    return;
  uint64_t pick = size >= 16 ? be64(d + size - 16) : 0;
  static uint8_t buf[8192];
  memset(buf, 0x5a, sizeof buf);
  if (bd->size >= sizeof buf) {
    struct bd_req req = {.cmd = BD_WRITE,
                         .offset = pick % (bd->size - sizeof buf + 1),
                         .length = (pick >> 48) % sizeof buf + 1,
                         .buf = buf};
    int r = bd_run(bd, &req);
    CHECK(r == 0 || r == -EIO || r == -EROFS || r == -ENOSPC);
  }
  bd_close(bd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_INPUT)
    return 0;
  struct qcow2_header h;
  bd_set_error("%s", "");
  int r = qcow2_parse_header(data, size, size, &h);
  if (verbose)
    fprintf(stderr, "header: %d %s\n", r, bd_errmsg());
  if (r < 0) {
    CHECK(r == -EINVAL || r == -ENOTSUP);
    CHECK(strcmp(bd_errmsg(), "unknown error") != 0);
    return 0;
  }
  CHECK(r == 0);
  check_header(&h, size);
  walk(&h, data, size);
  open_real(&h, data, size);
  write_real(&h, data, size);
  return 0;
}
