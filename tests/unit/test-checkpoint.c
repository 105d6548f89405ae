/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for core/checkpoint.c: the live filter, checkpoint views by
 * copy-before-write, their dirty-bitmap context, the fleece limit, and
 * the races (writers against ckpt_take, view readers against copies). */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/checkpoint.h"
#include "core/disk.h"
#include "core/fault.h"
#include "core/source.h"
#include "formats/registry.h"

__attribute__((constructor)) static void install_formats(void) {
  bd_formats_install(formats_registry);
}

#define G 4096u /* the granularity most tests use */

static struct bd *mem(const char *spec) {
  struct bd *bd = bd_open(spec, NULL, false);
  cr_assert_not_null(bd, "%s: %s", spec, bd_errmsg());
  return bd;
}

static struct bd *live_over(struct bd *inner, uint32_t gran, uint64_t limit) {
  struct ckpt_opts o = {.granularity = gran, .fleece_limit = limit};
  struct bd *l = ckpt_live_open(inner, &o);
  cr_assert_not_null(l, "%s", bd_errmsg());
  return l;
}

static struct bd *take(struct bd *live, const char *name) {
  struct bd *v = NULL;
  int r = ckpt_take(live, name, &v);
  cr_assert_eq(r, 0, "take %s: %d %s", name, r, bd_errmsg());
  cr_assert_not_null(v);
  return v;
}

static int run(struct bd *bd, enum bd_cmd cmd, uint32_t flags, uint64_t off,
               uint64_t len) {
  struct bd_req r = {.cmd = cmd, .flags = flags, .offset = off, .length = len};
  return bd_run(bd, &r);
}

static uint8_t *image(struct bd *bd) {
  uint8_t *b = malloc(bd->size);
  cr_assert_not_null(b);
  for (uint64_t off = 0; off < bd->size; off += BD_MAX_IO) {
    uint64_t n = bd->size - off < BD_MAX_IO ? bd->size - off : BD_MAX_IO;
    int r = bd_pread(bd, b + off, n, off);
    cr_assert_eq(r, 0, "read at %llu: %d %s", (unsigned long long)off, r,
                 bd_errmsg());
  }
  return b;
}

static void same_image(struct bd *bd, const uint8_t *want, const char *what) {
  uint8_t *got = image(bd);
  for (uint64_t i = 0; i < bd->size; i++)
    if (got[i] != want[i])
      cr_assert_fail("%s: byte %llu is %u, not %u", what, (unsigned long long)i,
                     got[i], want[i]);
  free(got);
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rnd_state ^= rnd_state << 13;
  rnd_state ^= rnd_state >> 7;
  rnd_state ^= rnd_state << 17;
  return rnd_state;
}

static void fill(uint8_t *b, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    b[i] = (uint8_t)((seed * 131 + i * 7 + (i >> 9)) | 1);
}

/* Block status of [off, off+len), context CTX, into E. */
static int status(struct bd *bd, unsigned ctx, struct bd_extents *e,
                  uint64_t off, uint64_t len, size_t max, uint32_t flags) {
  bd_extents_init(e, off, max);
  struct bd_req r = {.cmd = BD_BLOCK_STATUS,
                     .flags = flags,
                     .offset = off,
                     .length = len,
                     .extents = e,
                     .context = ctx};
  return bd_run(bd, &r);
}

/* The dirty granules a view's context 1 reports, as a 0/1 array. */
static uint8_t *dirty_of(struct bd *view, uint32_t gran) {
  uint64_t ng = (view->size + gran - 1) / gran;
  uint8_t *d = calloc(ng, 1);
  struct bd_extents e;
  cr_assert_eq(status(view, 1, &e, 0, view->size, 0, 0), 0, "%s", bd_errmsg());
  cr_assert_eq(e.end, view->size);
  uint64_t pos = 0;
  for (size_t i = 0; i < e.n; i++) {
    cr_assert(e.v[i].flags == 0 || e.v[i].flags == BD_CTX_DIRTY);
    cr_assert_eq(pos % gran, 0, "extent at %llu not on a granule",
                 (unsigned long long)pos);
    for (uint64_t p = pos; p < pos + e.v[i].length; p += gran)
      d[p / gran] = e.v[i].flags == BD_CTX_DIRTY;
    pos += e.v[i].length;
  }
  bd_extents_free(&e);
  return d;
}

static void mark(uint8_t *d, uint64_t off, uint64_t len, uint32_t gran) {
  if (len)
    for (uint64_t g = off / gran; g <= (off + len - 1) / gran; g++)
      d[g] = 1;
}

/* One random write, zero or trim on LIVE; marks DIRTY. */
static void random_op(struct bd *live, uint8_t *dirty) {
  static uint8_t buf[70000];
  uint64_t off = rnd() % live->size;
  uint64_t len = 1 + rnd() % 65536;
  if (len > live->size - off)
    len = live->size - off;
  int r;
  switch (rnd() % 4) {
  case 0:
  case 1:
    fill(buf, len, rnd());
    r = bd_pwrite(live, buf, len, off, rnd() % 2 ? BD_F_FUA : 0);
    break;
  case 2:
    r = run(live, BD_ZERO, rnd() % 2 ? BD_F_MAY_TRIM : 0, off, len);
    break;
  default: r = run(live, BD_TRIM, 0, off, len); break;
  }
  cr_assert_eq(r, 0, "%s", bd_errmsg());
  if (dirty)
    mark(dirty, off, len, G);
}

/* ---- passthrough ---- */

Test(checkpoint, passthrough) {
  struct bd *inner = mem("memory:4M");
  struct bd *live = live_over(inner, 0, 0);
  cr_assert(ckpt_is_live(live));
  cr_assert_not(ckpt_is_live(inner));
  cr_assert_eq(ckpt_granularity(live), 65536);
  cr_assert_eq(live->size, inner->size);
  cr_assert_eq(live->caps.can_trim, inner->caps.can_trim);
  uint8_t *model = calloc(1, live->size);
  for (int i = 0; i < 300; i++) {
    uint64_t off = rnd() % live->size, len = 1 + rnd() % 100000;
    if (len > live->size - off)
      len = live->size - off;
    if (rnd() % 3) {
      fill(model + off, len, rnd());
      cr_assert_eq(bd_pwrite(live, model + off, len, off, 0), 0);
    } else {
      memset(model + off, 0, len);
      cr_assert_eq(run(live, BD_ZERO, 0, off, len), 0);
    }
  }
  same_image(live, model, "live");
  same_image(inner, model, "inner");
  cr_assert_eq(bd_flush(live), 0);
  cr_assert_eq(run(live, BD_CACHE, 0, 0, 4096), 0);
  /* Block status forwarded: the memory source's answer. */
  struct bd_extents a, b;
  cr_assert_eq(status(live, 0, &a, 0, live->size, 0, 0), 0);
  cr_assert_eq(status(inner, 0, &b, 0, live->size, 0, 0), 0);
  cr_assert_eq(a.n, b.n);
  cr_assert_eq(memcmp(a.v, b.v, a.n * sizeof *a.v), 0);
  bd_extents_free(&a);
  bd_extents_free(&b);
  /* Out of range: refused by the core. */
  cr_assert_lt(bd_pwrite(live, model, 1, live->size, 0), 0);
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert_eq(n, 0);
  ckpt_info_free(info, n);
  free(model);
  cr_assert_eq(bd_close(live), 0);
}

/* ---- views ---- */

Test(checkpoint, view_is_the_image_at_the_checkpoint) {
  struct bd *live = live_over(mem("memory:4M"), G, 0);
  uint8_t *dirty = calloc(live->size / G, 1);
  for (int i = 0; i < 200; i++)
    random_op(live, NULL);
  uint8_t *snap = image(live);
  struct bd *v1 = take(live, "one");
  cr_assert_eq(v1->ncontexts, 0, "no dirty context for the first");
  cr_assert(v1->caps.readonly);
  for (int i = 0; i < 2000; i++)
    random_op(live, dirty);
  same_image(v1, snap, "view one");
  /* Partial, unaligned reads. */
  uint8_t buf[20000];
  for (int i = 0; i < 300; i++) {
    uint64_t off = rnd() % v1->size, len = 1 + rnd() % sizeof buf;
    if (len > v1->size - off)
      len = v1->size - off;
    cr_assert_eq(bd_pread(v1, buf, len, off), 0);
    cr_assert_eq(memcmp(buf, snap + off, len), 0, "read [%llu, +%llu)",
                 (unsigned long long)off, (unsigned long long)len);
  }
  /* base:allocation of the view: whatever it calls zero reads as zero. */
  struct bd_extents e;
  cr_assert_eq(status(v1, 0, &e, 0, v1->size, 0, 0), 0, "%s", bd_errmsg());
  cr_assert_eq(e.end, v1->size);
  uint64_t pos = 0;
  for (size_t i = 0; i < e.n; i++) {
    if (e.v[i].flags & BD_EXT_ZERO)
      for (uint64_t p = pos; p < pos + e.v[i].length; p++)
        cr_assert_eq(snap[p], 0, "zero extent holds data at %llu",
                     (unsigned long long)p);
    pos += e.v[i].length;
  }
  bd_extents_free(&e);
  /* REQ_ONE and a bounded list stay bounded. */
  cr_assert_eq(status(v1, 0, &e, 0, v1->size, 0, BD_F_REQ_ONE), 0);
  cr_assert_eq(e.n, 1);
  bd_extents_free(&e);
  cr_assert_eq(status(v1, 0, &e, 0, v1->size, 3, 0), 0);
  cr_assert_leq(e.n, 3);
  bd_extents_free(&e);
  /* Checkpoint two: the dirty context is exactly what was written. */
  struct bd *v2 = take(live, "two");
  cr_assert_eq(v2->ncontexts, 1);
  cr_assert_str_eq(v2->contexts[0], "qemu:dirty-bitmap:one");
  uint8_t *got = dirty_of(v2, G);
  for (uint64_t g = 0; g < live->size / G; g++)
    cr_assert_eq(got[g], dirty[g], "granule %llu: %u, want %u",
                 (unsigned long long)g, got[g], dirty[g]);
  cr_assert_eq(status(v2, 1, &e, 0, v2->size, 0, BD_F_REQ_ONE), 0);
  cr_assert_eq(e.n, 1);
  bd_extents_free(&e);
  uint64_t ndirty = 0;
  for (uint64_t g = 0; g < live->size / G; g++)
    ndirty += dirty[g];
  size_t n;
  uint64_t used;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(info[0].name, "one");
  cr_assert_null(info[0].prev);
  cr_assert_str_eq(info[1].name, "two");
  cr_assert_str_eq(info[1].prev, "one");
  cr_assert(info[0].view_open && info[1].view_open);
  cr_assert(info[0].has_bitmap && !info[0].recording);
  cr_assert(info[1].has_bitmap && info[1].recording);
  cr_assert_eq(info[0].dirty, ndirty * G);
  cr_assert_eq(info[1].dirty, 0);
  cr_assert_gt(info[0].fleece, 0);
  /* Granules that were zeroes take no fleece. */
  cr_assert_leq(info[0].fleece, info[0].granules * G);
  cr_assert_eq(info[0].fleece % G, 0);
  cr_assert_eq(used, info[0].fleece + info[1].fleece);
  ckpt_info_free(info, n);
  /* The view of two is the image now. */
  uint8_t *now = image(live);
  same_image(v2, now, "view two");
  /* Closing view two drops bitmap one (only it offered it), and one is
   * forgotten once its own view closes too. */
  cr_assert_eq(bd_close(v2), 0);
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert_eq(n, 2);
  cr_assert_not(info[0].has_bitmap);
  cr_assert_not(info[1].view_open);
  ckpt_info_free(info, n);
  cr_assert_eq(bd_close(v1), 0);
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(info[0].name, "two");
  cr_assert_eq(used, 0);
  ckpt_info_free(info, n);
  /* "one" is free again. */
  struct bd *v3 = take(live, "one");
  cr_assert_str_eq(v3->contexts[0], "qemu:dirty-bitmap:two");
  bd_close(v3);
  free(snap);
  free(now);
  free(got);
  free(dirty);
  bd_close(live);
}

Test(checkpoint, two_views_open_at_once) {
  struct bd *live = live_over(mem("memory:2M"), G, 0);
  for (int i = 0; i < 100; i++)
    random_op(live, NULL);
  uint8_t *s1 = image(live);
  struct bd *v1 = take(live, "a");
  for (int i = 0; i < 500; i++)
    random_op(live, NULL);
  uint8_t *s2 = image(live);
  struct bd *v2 = take(live, "b");
  for (int i = 0; i < 500; i++)
    random_op(live, NULL);
  uint8_t *s3 = image(live);
  struct bd *v3 = take(live, "c");
  for (int i = 0; i < 500; i++)
    random_op(live, NULL);
  same_image(v1, s1, "view a");
  same_image(v2, s2, "view b");
  same_image(v3, s3, "view c");
  /* The live device closed first: the views stay readable. */
  cr_assert_eq(bd_close(live), 0);
  same_image(v2, s2, "view b after the live device closed");
  bd_close(v2);
  same_image(v1, s1, "view a");
  bd_close(v1);
  same_image(v3, s3, "view c");
  bd_close(v3);
  free(s1);
  free(s2);
  free(s3);
}

/* ---- names ---- */

Test(checkpoint, names) {
  struct bd *live = live_over(mem("memory:1M"), G, 0);
  struct bd *v = NULL;
  cr_assert_eq(ckpt_take(live, "", &v), -EINVAL);
  cr_assert_eq(ckpt_take(live, "a@b", &v), -EINVAL);
  cr_assert_eq(ckpt_take(live, "a\nb", &v), -EINVAL);
  cr_assert_eq(ckpt_take(live, "tab\there", &v), -EINVAL);
  cr_assert_eq(ckpt_take(live, "del\x7f", &v), -EINVAL);
  char *longest = malloc(CKPT_NAME_MAX + 2);
  memset(longest, 'x', CKPT_NAME_MAX + 1);
  longest[CKPT_NAME_MAX + 1] = 0;
  cr_assert_eq(ckpt_take(live, longest, &v), -EINVAL);
  cr_assert_null(v);
  longest[CKPT_NAME_MAX] = 0;
  struct bd *v1 = take(live, longest);
  cr_assert_eq(ckpt_take(live, longest, &v), -EEXIST);
  struct bd *v2 = take(live, "ünïcode name ok");
  cr_assert_eq(ckpt_take(live, "ünïcode name ok", &v), -EEXIST);
  cr_assert_null(v);
  /* The previous checkpoint's name can be 1023 bytes in the context. */
  cr_assert_eq(strlen(v2->contexts[0]),
               strlen(BD_CTX_BITMAP_PREFIX) + CKPT_NAME_MAX);
  bd_close(v1);
  bd_close(v2);
  /* Not a live device. */
  struct bd *plain = mem("memory:1M");
  cr_assert_eq(ckpt_take(plain, "x", &v), -EINVAL);
  bd_close(plain);
  free(longest);
  bd_close(live);
}

Test(checkpoint, read_only_and_bad_options) {
  struct bd *ro = bd_open("memory:1M", NULL, true);
  struct bd *live = live_over(ro, G, 0);
  struct bd *v = NULL;
  cr_assert_eq(ckpt_take(live, "x", &v), -EROFS);
  bd_close(live);
  struct bd *inner = mem("memory:1M");
  struct ckpt_opts o = {.granularity = 1000};
  cr_assert_null(ckpt_live_open(inner, &o));
  o.granularity = 256;
  cr_assert_null(ckpt_live_open(inner, &o));
  o = (struct ckpt_opts){.fleece_dir = "/nonexistent/dir"};
  live = ckpt_live_open(inner, &o);
  cr_assert_not_null(live);
  cr_assert_lt(ckpt_take(live, "x", &v), 0);
  cr_assert_null(v);
  cr_assert(strstr(bd_errmsg(), "/nonexistent/dir"), "%s", bd_errmsg());
  /* A failed take leaves nothing behind. */
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert_eq(n, 0);
  cr_assert_null(info);
  bd_close(live);
}

/* ---- fleece ---- */

Test(checkpoint, fleece_limit_breaks_the_view) {
  struct bd *live = live_over(mem("memory:1M"), G, 3 * G);
  uint8_t buf[2 * G];
  fill(buf, G, 1);
  for (unsigned g = 0; g < 8; g++)
    cr_assert_eq(bd_pwrite(live, buf, G, g * G, 0), 0);
  struct bd *v = take(live, "c");
  fill(buf, G, 2);
  for (unsigned g = 0; g < 3; g++)
    cr_assert_eq(bd_pwrite(live, buf, G, g * G, 0), 0);
  uint64_t used;
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(used, 3 * G);
  cr_assert_not(info[0].broken);
  ckpt_info_free(info, n);
  cr_assert_eq(bd_pread(v, buf, G, 0), 0);
  uint8_t want[G];
  fill(want, G, 1);
  cr_assert_eq(memcmp(buf, want, G), 0);
  /* The fourth granule passes the limit: the write goes on. */
  fill(buf, 2 * G, 3);
  cr_assert_eq(bd_pwrite(live, buf, 2 * G - 100, 3 * G, 0), 0);
  cr_assert_eq(run(live, BD_TRIM, 0, 5 * G, G), 0);
  uint8_t back[G];
  cr_assert_eq(bd_pread(live, back, G, 3 * G), 0);
  cr_assert_eq(memcmp(back, buf, G), 0);
  cr_assert_eq(bd_pread(v, back, G, 6 * G), -EIO);
  cr_assert(strstr(bd_errmsg(), "fleece limit of 12288 bytes reached"), "%s",
            bd_errmsg());
  struct bd_extents e;
  cr_assert_eq(status(v, 0, &e, 0, v->size, 0, 0), -EIO);
  bd_extents_free(&e);
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(n, 1);
  cr_assert(info[0].broken);
  cr_assert(info[0].view_open);
  cr_assert_str_eq(info[0].reason, "fleece limit of 12288 bytes reached");
  cr_assert_eq(info[0].fleece, 0);
  cr_assert_eq(used, 0);
  ckpt_info_free(info, n);
  /* A new checkpoint has room again. */
  struct bd *v2 = take(live, "d");
  uint8_t *snap = image(live);
  fill(buf, G, 4);
  for (unsigned g = 0; g < 3; g++)
    cr_assert_eq(bd_pwrite(live, buf, G, g * G, 0), 0);
  same_image(v2, snap, "view d");
  bd_close(v);
  bd_close(v2);
  free(snap);
  bd_close(live);
}

Test(checkpoint, zeroes_take_no_fleece) {
  /* Room for one granule: trimming and zeroing an empty disk, or writing
   * where it reads as zeroes, copies nothing. */
  struct bd *live = live_over(mem("memory:1M"), G, G);
  uint8_t buf[G];
  fill(buf, G, 9);
  cr_assert_eq(bd_pwrite(live, buf, G, 10 * G, 0), 0);
  struct bd *v = take(live, "c");
  cr_assert_eq(run(live, BD_TRIM, 0, 0, live->size), 0);
  cr_assert_eq(run(live, BD_ZERO, BD_F_MAY_TRIM, 0, 9 * G), 0);
  for (unsigned g = 12; g < 40; g++)
    cr_assert_eq(bd_pwrite(live, buf, G, g * G, 0), 0);
  size_t n;
  uint64_t used;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_not(info[0].broken, "%s", info[0].reason);
  cr_assert_eq(used, G);
  cr_assert_eq(info[0].fleece, G);
  ckpt_info_free(info, n);
  uint8_t *img = image(v);
  for (uint64_t i = 0; i < live->size; i++)
    cr_assert_eq(img[i], i / G == 10 ? buf[i % G] : 0, "byte %llu",
                 (unsigned long long)i);
  free(img);
  bd_close(v);
  bd_close(live);
}

Test(checkpoint, fleece_write_failure_breaks_the_view) {
  struct bd *live = live_over(mem("memory:1M"), G, 0);
  uint8_t buf[G];
  fill(buf, G, 4);
  cr_assert_eq(bd_pwrite(live, buf, G, 0, 0), 0);
  struct bd *v = take(live, "c");
  /* The memory source does no file I/O: only the fleece fails. */
  cr_assert_eq(fault_configure("op=write,err=ENOSPC"), 0);
  fill(buf, G, 5);
  cr_assert_eq(bd_pwrite(live, buf, G, 0, 0), 0);
  cr_assert_eq(bd_pread(v, buf, G, G), -EIO);
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert(info[0].broken);
  cr_assert(strstr(info[0].reason, "No space left on device"), "%s",
            info[0].reason);
  ckpt_info_free(info, n);
  cr_assert_eq(fault_configure(""), 0);
  bd_close(v);
  bd_close(live);
}

Test(checkpoint, closing_a_view_frees_its_fleece) {
  struct bd *live = live_over(mem("memory:1M"), G, 0);
  uint8_t *data = malloc(live->size);
  fill(data, live->size, 3);
  cr_assert_eq(bd_pwrite(live, data, live->size, 0, 0), 0);
  free(data);
  struct bd *v = take(live, "c");
  for (int i = 0; i < 200; i++)
    random_op(live, NULL);
  uint64_t used;
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_gt(used, 0);
  cr_assert_eq(info[0].fleece, used);
  ckpt_info_free(info, n);
  bd_close(v);
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(used, 0);
  cr_assert_eq(n, 1); /* still recording */
  cr_assert_not(info[0].view_open);
  cr_assert(info[0].recording);
  cr_assert_eq(info[0].fleece, 0);
  ckpt_info_free(info, n);
  /* Writes with no view open: no copy, nothing used. */
  for (int i = 0; i < 50; i++)
    random_op(live, NULL);
  cr_assert_eq(ckpt_list(live, &info, &n, &used), 0);
  cr_assert_eq(used, 0);
  ckpt_info_free(info, n);
  bd_close(live);
}

/* ---- an aligned-only source: INNER's aligner does the work ---- */

struct strict {
  uint8_t *data;
  uint64_t size;
  atomic_int violations;
};

static int s_check(struct bd *bd, uint64_t off, uint64_t len) {
  struct strict *s = bd->priv;
  if (off % 4096 || (len % 4096 && off + len != s->size)) {
    atomic_fetch_add(&s->violations, 1);
    return -EINVAL;
  }
  return 0;
}

static int s_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  struct strict *s = bd->priv;
  int r = s_check(bd, off, len);
  if (r == 0)
    memcpy(buf, s->data + off, len);
  return r;
}

static int s_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                    uint32_t flags) {
  (void)flags;
  struct strict *s = bd->priv;
  int r = s_check(bd, off, len);
  if (r == 0)
    memcpy(s->data + off, buf, len);
  return r;
}

static int s_zero(struct bd *bd, uint64_t len, uint64_t off, uint32_t flags) {
  (void)flags;
  struct strict *s = bd->priv;
  int r = s_check(bd, off, len);
  if (r == 0)
    memset(s->data + off, 0, len);
  return r;
}

static const struct bd_ops strict_ops = {
    .name = "strict", .pread = s_pread, .pwrite = s_pwrite, .zero = s_zero};

Test(checkpoint, aligned_only_source) {
  struct strict s = {.size = 1024 * 1024};
  s.data = calloc(1, s.size);
  struct bd *inner = bd_new(&strict_ops, "strict", "strict");
  inner->priv = &s;
  inner->size = s.size;
  inner->caps.aligned_only = true;
  inner->caps.min_block = 4096;
  inner->caps.can_trim = false;
  inner->aligner = malloc(sizeof *inner->aligner);
  cr_assert_eq(disk_init(inner->aligner, inner), 0);
  struct bd *live = live_over(inner, 512, 0);
  cr_assert_eq(ckpt_granularity(live), 4096, "raised to the minimum block");
  cr_assert(live->caps.aligned_only);
  for (int i = 0; i < 100; i++)
    random_op(live, NULL);
  uint8_t *snap = image(live);
  struct bd *v = take(live, "c");
  for (int i = 0; i < 500; i++)
    random_op(live, NULL);
  same_image(v, snap, "view over an aligned-only source");
  uint8_t buf[10000];
  for (int i = 0; i < 100; i++) {
    uint64_t off = rnd() % (v->size - sizeof buf), len = 1 + rnd() % 9999;
    cr_assert_eq(bd_pread(v, buf, len, off), 0, "%s", bd_errmsg());
    cr_assert_eq(memcmp(buf, snap + off, len), 0);
  }
  cr_assert_eq(atomic_load(&s.violations), 0);
  bd_close(v);
  bd_close(live);
  free(snap);
  free(s.data);
}

/* A raw file as INNER (an image on disk), if the file system allows one. */
Test(checkpoint, raw_file_source) {
  char path[] = "/var/tmp/blockport-ckpt-test-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, 2 * 1024 * 1024), 0);
  close(fd);
  struct bd *inner = bd_open(path, "raw", false);
  unlink(path);
  cr_assert_not_null(inner, "%s", bd_errmsg());
  struct bd *live = live_over(inner, G, 0);
  for (int i = 0; i < 100; i++)
    random_op(live, NULL);
  uint8_t *snap = image(live);
  struct bd *v = take(live, "c");
  for (int i = 0; i < 500; i++)
    random_op(live, NULL);
  same_image(v, snap, "view over a raw file");
  bd_close(v);
  bd_close(live);
  free(snap);
}

/* ---- races ---- */

/* Writers on their own granules, each write a whole granule of one value
 * (thread, sequence number), against ckpt_take.  The view must hold, per
 * granule, a value written at or after the last write completed before
 * ckpt_take was called, and before the first one submitted after it
 * returned. */
#define RT 4      /* writer threads */
#define RG 64     /* granules per thread */
#define RW 200000 /* writes per thread at most */
#define RSIZE ((uint64_t)RT * RG * G)

struct rwrite {
  uint32_t g, seq;
  bool done_before, started_after;
};

struct racer {
  struct bd *live;
  unsigned id;
  struct rwrite log[RW];
  unsigned n;
  atomic_bool *stop;
  atomic_uint n_before, n_after; /* writes done before, started after */
  atomic_bool finished;
};

static atomic_int phase;  /* 0 before ckpt_take, 1 during, 2 after */
static unsigned round_no; /* in every value, told apart from older rounds' */

static void pattern(uint8_t *b, unsigned id, uint32_t seq) {
  for (unsigned i = 0; i < G; i += 8) {
    uint32_t w[2] = {round_no << 8 | (id + 1), seq};
    memcpy(b + i, w, 8);
  }
}

static void *racer_main(void *arg) {
  struct racer *r = arg;
  uint8_t buf[G];
  uint32_t seq = 0;
  uint64_t x = r->id * 2654435761u + 1;
  while (!atomic_load(r->stop) && r->n < RW) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t g = (uint32_t)(r->id * RG + ((x >> 33) % RG));
    struct rwrite *w = &r->log[r->n++];
    w->g = g;
    w->seq = ++seq;
    w->started_after = atomic_load(&phase) == 2;
    pattern(buf, r->id, seq);
    cr_assert_eq(bd_pwrite(r->live, buf, G, (uint64_t)g * G, 0), 0);
    w->done_before = atomic_load(&phase) == 0;
    if (w->done_before)
      atomic_fetch_add(&r->n_before, 1);
    if (w->started_after)
      atomic_fetch_add(&r->n_after, 1);
  }
  atomic_store(&r->finished, true);
  return NULL;
}

/* Waits, with a deadline, until every racer has done a write before the
 * checkpoint (or, with AFTER, one started after it): a loaded machine
 * (ASan, CI) may not run the racers within a fixed sleep. */
static void wait_racers(struct racer *rs, bool after) {
  for (unsigned tries = 0; tries < 20000; tries++) {
    unsigned ready = 0;
    for (unsigned i = 0; i < RT; i++)
      ready += atomic_load(after ? &rs[i].n_after : &rs[i].n_before) > 0 ||
               atomic_load(&rs[i].finished);
    if (ready == RT)
      return;
    usleep(1000);
  }
  cr_assert_fail("the writer threads did not run within 20 s");
}

static void race_once(struct bd *live, const char *name) {
  static struct racer rs[RT];
  atomic_bool stop = false;
  pthread_t t[RT];
  atomic_store(&phase, 0);
  round_no++;
  for (unsigned i = 0; i < RT; i++) {
    rs[i] = (struct racer){.live = live, .id = i, .stop = &stop};
    pthread_create(&t[i], NULL, racer_main, &rs[i]);
  }
  wait_racers(rs, false);
  atomic_store(&phase, 1);
  struct bd *v = take(live, name);
  atomic_store(&phase, 2);
  wait_racers(rs, true);
  atomic_store(&stop, true);
  for (unsigned i = 0; i < RT; i++)
    pthread_join(t[i], NULL);
  uint8_t *img = image(v);
  unsigned before = 0, after = 0;
  for (unsigned i = 0; i < RT; i++) {
    for (unsigned gi = 0; gi < RG; gi++) {
      uint32_t g = i * RG + gi;
      uint32_t lo = 0, hi = UINT32_MAX; /* allowed sequence numbers */
      bool any = false;
      for (unsigned k = 0; k < rs[i].n; k++) {
        const struct rwrite *w = &rs[i].log[k];
        if (w->g != g)
          continue;
        if (w->done_before)
          lo = w->seq, before++;
        if (w->started_after && hi == UINT32_MAX)
          hi = w->seq, after++;
        any = true;
      }
      const uint8_t *b = img + (uint64_t)g * G;
      uint32_t w0[2];
      memcpy(w0, b, 8);
      for (unsigned off = 8; off < G; off += 8)
        cr_assert_eq(memcmp(b, b + off, 8), 0, "granule %u torn", g);
      uint32_t seq = w0[1];
      if (w0[0] >> 8 != round_no) {
        /* Not written this round before the checkpoint. */
        cr_assert_eq(lo, 0, "%s: granule %u: lost write %u", name, g, lo);
        continue;
      }
      cr_assert(any);
      cr_assert_eq(w0[0] & 0xff, i + 1, "granule %u: written by %u", g, w0[0]);
      cr_assert_geq(seq, lo, "granule %u: %u older than completed %u", g, seq,
                    lo);
      cr_assert_lt(seq, hi, "%s: granule %u: %u not older than later %u", name,
                   g, seq, hi);
    }
  }
  cr_assert_gt(before, 0);
  cr_assert_gt(after, 0);
  free(img);
  bd_close(v);
}

Test(checkpoint, writers_racing_ckpt_take, .timeout = 60) {
  struct bd *live = live_over(mem("memory:1M"), G, 0);
  cr_assert_eq(live->size, RSIZE);
  race_once(live, "first"); /* no view open */
  struct bd *keep = take(live, "kept");
  race_once(live, "second"); /* copies for an open view under way */
  race_once(live, "third");
  bd_close(keep);
  bd_close(live);
}

/* View readers against copy-before-write writers on the same granules:
 * every view read returns checkpoint data. */
struct vreader {
  struct bd *view;
  uint8_t expect;
  atomic_bool *stop;
  atomic_uint reads;
};

static void *vreader_main(void *arg) {
  struct vreader *r = arg;
  uint8_t buf[3 * G];
  uint64_t x = (uint64_t)(uintptr_t)arg;
  while (!atomic_load(r->stop)) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t len = 1 + (x >> 33) % sizeof buf;
    uint64_t off = (x >> 13) % (r->view->size - len);
    int e = bd_pread(r->view, buf, len, off);
    cr_assert_eq(e, 0, "%s", bd_errmsg());
    for (uint64_t i = 0; i < len; i++)
      if (buf[i] != r->expect)
        cr_assert_fail("view read %u at %llu, want %u", buf[i],
                       (unsigned long long)(off + i), r->expect);
    atomic_fetch_add(&r->reads, 1);
  }
  return NULL;
}

struct vwriter {
  struct bd *live;
  uint8_t value;
  unsigned id;
};

static void *vwriter_main(void *arg) {
  struct vwriter *w = arg;
  uint8_t buf[2 * G];
  memset(buf, w->value, sizeof buf);
  uint64_t x = w->id + 1;
  for (int i = 0; i < 1000; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t len = 1 + (x >> 33) % sizeof buf;
    uint64_t off = (x >> 13) % (w->live->size - len);
    int e = (x >> 7) % 5 == 0 ? run(w->live, BD_ZERO, 0, off, len)
                              : bd_pwrite(w->live, buf, len, off, 0);
    cr_assert_eq(e, 0);
  }
  return NULL;
}

Test(checkpoint, view_reads_racing_copies, .timeout = 60) {
  struct bd *live = live_over(mem("memory:256K"), G, 0);
  uint8_t *buf = malloc(live->size);
  for (int round = 0; round < 8; round++) {
    uint8_t val = (uint8_t)(0x10 + round);
    memset(buf, val, live->size);
    cr_assert_eq(bd_pwrite(live, buf, live->size, 0, 0), 0);
    char name[16];
    snprintf(name, sizeof name, "r%d", round);
    struct bd *v = take(live, name);
    atomic_bool stop = false;
    struct vreader rd[3];
    struct vwriter wr[3];
    pthread_t rt[3], wt[3];
    for (int i = 0; i < 3; i++) {
      rd[i] = (struct vreader){.view = v, .expect = val, .stop = &stop};
      pthread_create(&rt[i], NULL, vreader_main, &rd[i]);
    }
    for (int i = 0; i < 3; i++) /* readers under way before the writers */
      while (atomic_load(&rd[i].reads) == 0)
        usleep(100);
    for (int i = 0; i < 3; i++) {
      wr[i] = (struct vwriter){
          .live = live, .value = (uint8_t)(0x80 + round), .id = round * 3 + i};
      pthread_create(&wt[i], NULL, vwriter_main, &wr[i]);
    }
    for (int i = 0; i < 3; i++)
      pthread_join(wt[i], NULL);
    atomic_store(&stop, true);
    for (int i = 0; i < 3; i++) {
      pthread_join(rt[i], NULL);
      cr_assert_gt(atomic_load(&rd[i].reads), 0);
    }
    bd_close(v);
  }
  free(buf);
  bd_close(live);
}

Test(checkpoint, list_reports_dirty_bytes_and_last_granule) {
  /* A size that is not a multiple of the granule: the last is short. */
  struct bd *live = live_over(mem("memory:1000K"), 65536, 0);
  struct bd *v1 = take(live, "a");
  uint8_t buf[100];
  memset(buf, 7, sizeof buf);
  cr_assert_eq(bd_pwrite(live, buf, sizeof buf, live->size - 10, 0), -ENOSPC);
  cr_assert_eq(bd_pwrite(live, buf, 10, live->size - 10, 0), 0);
  cr_assert_eq(bd_pwrite(live, buf, 10, 0, 0), 0);
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert_eq(info[0].dirty, 65536 + (1000 * 1024) % 65536);
  cr_assert_eq(info[0].granules, 2);
  cr_assert_eq(info[0].fleece, 0); /* they were zeroes */
  ckpt_info_free(info, n);
  struct bd *v2 = take(live, "b");
  uint8_t *d = dirty_of(v2, 65536);
  uint64_t ng = (live->size + 65535) / 65536;
  for (uint64_t g = 0; g < ng; g++)
    cr_assert_eq(d[g], g == 0 || g == ng - 1);
  free(d);
  uint8_t back[10];
  cr_assert_eq(bd_pread(v1, back, 10, live->size - 10), 0);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(back[i], 0);
  cr_assert_eq(bd_pread(v2, back, 10, live->size - 10), 0);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(back[i], 7);
  bd_close(v1);
  bd_close(v2);
  bd_close(live);
}

/* ---- an INNER that keeps bitmaps (the bd_ops bitmap_*) ---- */

struct keeper {
  uint8_t data[1 << 20];
  const char *resume;  /* bitmap_resume's answer, NULL: -ENOENT */
  int resume_err;      /* other than 0: bitmap_resume fails so */
  uint64_t bits[4][2]; /* bitmap_bits' ranges of RESUME */
  int nbits;
  int start_err;       /* bitmap_start fails so */
  char started[4][16]; /* what bitmap_start was asked, in order */
  int nstarted;
  char enabled[16]; /* the bitmap enabled last (stop clears it) */
  uint32_t gran;
};

static int k_pread(struct bd *bd, void *buf, uint64_t len, uint64_t off) {
  memcpy(buf, ((struct keeper *)bd->priv)->data + off, len);
  return 0;
}

static int k_pwrite(struct bd *bd, const void *buf, uint64_t len, uint64_t off,
                    uint32_t flags) {
  (void)flags;
  memcpy(((struct keeper *)bd->priv)->data + off, buf, len);
  return 0;
}

static int k_resume(struct bd *bd, char **name) {
  struct keeper *k = bd->priv;
  if (k->resume_err) {
    bd_set_error("keeps none");
    return k->resume_err;
  }
  if (!k->resume)
    return -ENOENT;
  snprintf(k->enabled, sizeof k->enabled, "%s", k->resume);
  *name = strdup(k->resume);
  return 0;
}

static int k_start(struct bd *bd, const char *name, uint32_t gran) {
  struct keeper *k = bd->priv;
  if (k->start_err) {
    bd_set_error("refused '%s'", name);
    return k->start_err;
  }
  snprintf(k->started[k->nstarted++], 16, "%s", name);
  snprintf(k->enabled, sizeof k->enabled, "%s", name);
  k->gran = gran;
  return 0;
}

static int k_enable(struct bd *bd, const char *name, bool on) {
  struct keeper *k = bd->priv;
  cr_assert(on ? !k->enabled[0] : !strcmp(k->enabled, name), "enable %s %d",
            name, on);
  snprintf(k->enabled, sizeof k->enabled, "%s", on ? name : "");
  return 0;
}

static int k_bits(struct bd *bd, const char *name,
                  int (*dirty)(void *, uint64_t, uint64_t), void *opaque) {
  struct keeper *k = bd->priv;
  cr_assert_str_eq(name, k->resume);
  for (int i = 0; i < k->nbits; i++)
    dirty(opaque, k->bits[i][0], k->bits[i][1]);
  return 0;
}

static const struct bd_ops keeper_ops = {.name = "keeper",
                                         .pread = k_pread,
                                         .pwrite = k_pwrite,
                                         .bitmap_resume = k_resume,
                                         .bitmap_start = k_start,
                                         .bitmap_enable = k_enable,
                                         .bitmap_bits = k_bits};

static struct bd *keeper_bd(struct keeper *k) {
  struct bd *bd = bd_new(&keeper_ops, "keeper", "keeper");
  cr_assert_not_null(bd);
  bd->priv = k;
  bd->size = sizeof k->data;
  bd->caps.can_trim = bd->caps.can_zero = bd->caps.can_fast_zero = false;
  bd->caps.can_extents = bd->caps.can_cache = false;
  return bd;
}

Test(checkpoint, resumed_bitmap_seeds_the_next_checkpoint) {
  static struct keeper k = {
      .resume = "old", .bits = {{0, 16384}, {100 * 1024, 16384}}, .nbits = 2};
  struct bd *live = live_over(keeper_bd(&k), 65536, 0);
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(info[0].name, "old");
  cr_assert(info[0].recording && !info[0].view_open && !info[0].prev);
  cr_assert_eq(info[0].dirty, 2 * 65536, "granules 0 and 1 (16 KiB bits)");
  ckpt_info_free(info, n);
  uint8_t buf[10] = {1};
  cr_assert_eq(bd_pwrite(live, buf, sizeof buf, 200 * 1024, 0), 0);
  struct bd *v = take(live, "n1");
  cr_assert_str_eq(k.started[0], "n1");
  cr_assert_eq(k.gran, 65536);
  cr_assert_str_eq(k.enabled, "n1", "old stopped, n1 started");
  cr_assert_eq(v->ncontexts, 1);
  cr_assert_str_eq(v->contexts[0], "qemu:dirty-bitmap:old");
  uint8_t *d = dirty_of(v, 65536);
  for (uint64_t g = 0; g < 16; g++)
    cr_assert_eq(d[g], g <= 1 || g == 3, "granule %llu", (unsigned long long)g);
  free(d);
  cr_assert_eq(ckpt_take(live, "old", &v) == -EEXIST, true);
  bd_close(v);
  bd_close(live);
}

Test(checkpoint, refused_image_bitmap_changes_nothing) {
  static struct keeper k = {.resume = "old", .start_err = -EEXIST};
  struct bd *live = live_over(keeper_bd(&k), 65536, 0);
  struct bd *v = NULL;
  cr_assert_eq(ckpt_take(live, "n2", &v), -EEXIST);
  cr_assert_null(v);
  cr_assert(strstr(bd_errmsg(), "checkpoint 'n2': refused 'n2'"), "%s",
            bd_errmsg());
  cr_assert_str_eq(k.enabled, "old", "the stop was undone");
  uint8_t buf[10] = {1};
  cr_assert_eq(bd_pwrite(live, buf, sizeof buf, 300 * 1024, 0), 0);
  size_t n;
  struct ckpt_info *info;
  cr_assert_eq(ckpt_list(live, &info, &n, NULL), 0);
  cr_assert(n == 1 && info[0].recording && info[0].dirty == 65536);
  ckpt_info_free(info, n);
  k.start_err = 0;
  v = take(live, "n2");
  uint8_t *d = dirty_of(v, 65536);
  cr_assert(d[4] && !d[0], "the write after the refusal is in old's bitmap");
  free(d);
  bd_close(v);
  bd_close(live);
}

Test(checkpoint, inner_keeping_none_stays_in_memory) {
  static struct keeper k = {.resume_err = -ENOTSUP};
  struct bd *live = live_over(keeper_bd(&k), 65536, 0);
  struct bd *v1 = take(live, "a"), *v2 = take(live, "b");
  cr_assert_eq(k.nstarted, 0);
  cr_assert_str_eq(v2->contexts[0], "qemu:dirty-bitmap:a");
  bd_close(v1);
  bd_close(v2);
  bd_close(live);
}

Test(checkpoint, first_checkpoint_starts_an_image_bitmap) {
  static struct keeper k = {0}; /* none to resume */
  struct bd *live = live_over(keeper_bd(&k), 4096, 0);
  struct bd *v = take(live, "first");
  cr_assert_eq(v->ncontexts, 0);
  cr_assert_eq(k.nstarted, 1);
  cr_assert_str_eq(k.enabled, "first");
  cr_assert_eq(k.gran, 4096);
  bd_close(v);
  bd_close(live);
}
