/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for qcow2 image creation (formats/qcow2/create.c): the layout
 * computation (aligned, non-overlapping regions, refcounts covering every
 * cluster in use), the header it writes (parsed back with
 * qcow2_parse_header) and the refcount packing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/blockdev.h"
#include "formats/qcow2/create.h"
#include "formats/qcow2/qcow2.h"

static struct qcow2_create_opts defaults(uint64_t size) {
  return (struct qcow2_create_opts){
      .size = size, .version = 3, .cluster_bits = 16, .refcount_order = 4};
}

/* The invariants every layout must keep. */
static void check_layout(const struct qcow2_create_opts *o,
                         const struct qcow2_layout *l) {
  uint64_t cs = l->csize;
  cr_assert_eq(cs, 1ull << o->cluster_bits);
  struct {
    uint64_t off, n;
  } r[] = {{0, 1},
           {l->reftable_offset, l->reftable_clusters},
           {l->refblock_offset, l->refblocks},
           {l->l1_offset, l->l1_clusters},
           {l->l2_offset, l->l2_tables},
           {l->data_offset, l->data_clusters}};
  uint64_t end = 0;
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    if (r[i].n == 0)
      continue; /* an empty region has no place (no L1 for size 0) */
    cr_assert_eq(r[i].off % cs, 0, "region %zu unaligned", i);
    cr_assert_geq(r[i].off, end, "region %zu overlaps the one before", i);
    end = r[i].off + r[i].n * cs;
  }
  cr_assert_eq(end, l->clusters * cs, "regions do not end at the last cluster");
  cr_assert_eq(l->file_size, l->clusters * cs);
  cr_assert_geq(l->reftable_clusters, 1);
  cr_assert_geq(l->refblocks, 1);
  /* Refcount blocks cover every cluster; the table covers every block. */
  uint64_t rb_entries = (cs * 8) >> o->refcount_order;
  cr_assert_geq(l->refblocks * rb_entries, l->clusters);
  cr_assert_geq((uint64_t)l->reftable_clusters * cs / 8, l->refblocks);
  /* The L1 table covers the virtual size. */
  uint64_t per_l1 = 1ull << (o->cluster_bits + l->l2_bits);
  cr_assert_geq((uint64_t)l->l1_size * per_l1, o->size);
  cr_assert_geq(l->l1_clusters * cs, (uint64_t)l->l1_size * 8);
  if (o->prealloc != QCOW2_PREALLOC_OFF) {
    cr_assert_geq(l->data_clusters * cs, o->size);
    cr_assert_geq(l->l2_tables << l->l2_bits, l->data_clusters);
    cr_assert_leq(l->l2_tables, l->l1_size);
  }
  /* The header we write parses back to the same facts. */
  uint8_t *buf = malloc(cs);
  cr_assert_not_null(buf);
  qcow2_create_header(o, l, buf);
  struct qcow2_header h;
  int rc = qcow2_parse_header(buf, cs, l->file_size, &h);
  cr_assert_eq(rc, 0, "header does not parse: %s", bd_errmsg());
  cr_assert_eq(h.version, o->version);
  cr_assert_eq(h.cluster_bits, o->cluster_bits);
  cr_assert_eq(h.size, o->size);
  cr_assert_eq(h.refcount_order, o->refcount_order);
  cr_assert_eq(h.l1_offset, l->l1_offset);
  cr_assert_eq(h.reftable_offset, l->reftable_offset);
  cr_assert_eq(!!(h.incompatible & QCOW2_INCOMPAT_EXTL2), o->extended_l2);
  cr_assert_eq(!!(h.compatible & QCOW2_COMPAT_LAZY_REFCOUNTS),
               o->lazy_refcounts);
  cr_assert_eq(h.compression_type, o->compression_type);
  if (o->backing_fmt)
    cr_assert_str_eq(h.backing_format, o->backing_fmt);
  if (o->backing_file) {
    cr_assert_eq(h.backing_size, strlen(o->backing_file));
    cr_assert_eq(
        memcmp(buf + h.backing_offset, o->backing_file, h.backing_size), 0);
  }
  free(buf);
}

static void layout_ok(const struct qcow2_create_opts *o) {
  struct qcow2_layout l;
  int rc = qcow2_create_layout(o, &l);
  cr_assert_eq(rc, 0, "layout failed: %s", bd_errmsg());
  check_layout(o, &l);
}

Test(create, defaults) {
  struct qcow2_create_opts o = defaults(1ull << 30);
  struct qcow2_layout l;
  cr_assert_eq(qcow2_create_layout(&o, &l), 0);
  check_layout(&o, &l);
  cr_assert_eq(l.header_length, 112);
  cr_assert(l.feature_table);
  cr_assert_eq(l.reftable_offset, 65536);
  cr_assert_eq(l.l1_size, 2); /* 512 MiB per L2 table */
  cr_assert_eq(l.clusters, 4);
}

/* qemu-img's layout for a size of 0: header, refcount table and block,
 * and no L1 table (offset 0): a cluster for one would be leaked. */
Test(create, size_zero_has_no_l1_table) {
  struct qcow2_create_opts o = defaults(0);
  struct qcow2_layout l;
  cr_assert_eq(qcow2_create_layout(&o, &l), 0);
  check_layout(&o, &l);
  cr_assert_eq(l.l1_size, 0);
  cr_assert_eq(l.l1_clusters, 0);
  cr_assert_eq(l.l1_offset, 0);
  cr_assert_eq(l.clusters, 3);
}

Test(create, matrix) {
  static const uint64_t sizes[] = {
      0, 512, 65536, 1000ull * 512, 1ull << 30, 100ull << 30};
  for (unsigned cb = 9; cb <= 21; cb++)
    for (unsigned ro = 0; ro <= 6; ro++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ext = 0; ext < 2; ext++)
          for (int pre = 0; pre < 2; pre++) {
            if (ext && cb < 14)
              continue;
            struct qcow2_create_opts o = defaults(sizes[s]);
            o.cluster_bits = cb;
            o.refcount_order = ro;
            o.extended_l2 = ext;
            o.prealloc = pre ? QCOW2_PREALLOC_METADATA : QCOW2_PREALLOC_OFF;
            struct qcow2_layout l;
            if (qcow2_create_layout(&o, &l) == 0)
              check_layout(&o, &l);
            else
              /* Only big images with small clusters may be refused. */
              cr_assert(cb < 16 && sizes[s] >= (1ull << 30),
                        "cb %u ro %u size "
                        "%llu: %s",
                        cb, ro, (unsigned long long)sizes[s], bd_errmsg());
          }
}

Test(create, backing_and_v2) {
  struct qcow2_create_opts o = defaults(1 << 20);
  o.backing_file = "some/dir/base.qcow2";
  o.backing_fmt = "qcow2";
  layout_ok(&o);
  o.version = 2;
  layout_ok(&o);
  o.cluster_bits = 9; /* 512-byte clusters: the feature table is dropped */
  o.version = 3;
  layout_ok(&o);
}

Test(create, preallocation_many_refblocks) {
  /* 1-bit refcounts with 512-byte clusters: 4096 clusters per block. */
  struct qcow2_create_opts o = defaults(64ull << 20);
  o.cluster_bits = 9;
  o.refcount_order = 0;
  o.prealloc = QCOW2_PREALLOC_FULL;
  struct qcow2_layout l;
  cr_assert_eq(qcow2_create_layout(&o, &l), 0, "%s", bd_errmsg());
  check_layout(&o, &l);
  cr_assert_gt(l.refblocks, 30);
  /* 1 TiB with 64k clusters: 2048 L2 tables. */
  o = defaults(1ull << 40);
  o.prealloc = QCOW2_PREALLOC_METADATA;
  cr_assert_eq(qcow2_create_layout(&o, &l), 0, "%s", bd_errmsg());
  check_layout(&o, &l);
  cr_assert_eq(l.l2_tables, 2048);
}

static void refused(struct qcow2_create_opts o, int code) {
  struct qcow2_layout l;
  bd_set_error("%s", "");
  int rc = qcow2_create_layout(&o, &l);
  cr_assert_eq(rc, code, "rc %d (%s)", rc, bd_errmsg());
  cr_assert_str_neq(bd_errmsg(), "unknown error", "no message");
}

Test(create, refused) {
  struct qcow2_create_opts o = defaults(1 << 20);
  o.cluster_bits = 8;
  refused(o, -EINVAL);
  o = defaults(1000); /* not a multiple of 512 */
  refused(o, -EINVAL);
  o = defaults(1 << 20);
  o.extended_l2 = true;
  o.cluster_bits = 13;
  refused(o, -EINVAL);
  o = defaults(1 << 20);
  o.version = 2;
  o.lazy_refcounts = true;
  refused(o, -EINVAL);
  o = defaults(1 << 20);
  o.version = 2;
  o.compression_type = 1;
  refused(o, -EINVAL);
  o = defaults(1 << 20);
  o.version = 2;
  o.refcount_order = 3;
  refused(o, -EINVAL);
  o = defaults(1ull << 50); /* 512-byte clusters cannot address 1 PiB */
  o.cluster_bits = 9;
  refused(o, -EFBIG);
  o = defaults(1ull << 50); /* absurd preallocation */
  o.prealloc = QCOW2_PREALLOC_METADATA;
  refused(o, -EFBIG);
  o = defaults((1ull << 56) + 512);
  refused(o, -EFBIG);
  o = defaults(1 << 20);
  char name[1100];
  memset(name, 'a', sizeof name - 1);
  name[sizeof name - 1] = 0;
  o.backing_file = name;
  refused(o, -EINVAL);
  o.backing_file = name + 200; /* 899 bytes: too long for a 512-byte cluster */
  o.cluster_bits = 9;
  refused(o, -EINVAL);
}

Test(create, refcount_packing) {
  uint8_t b[16];
  memset(b, 0, sizeof b);
  qcow2_set_refcount(b, 0, 0, 1);
  qcow2_set_refcount(b, 0, 9, 1);
  cr_assert_eq(b[0], 0x01);
  cr_assert_eq(b[1], 0x02);
  memset(b, 0, sizeof b);
  qcow2_set_refcount(b, 1, 1, 3);
  cr_assert_eq(b[0], 0x0c);
  memset(b, 0, sizeof b);
  qcow2_set_refcount(b, 2, 1, 1);
  cr_assert_eq(b[0], 0x10);
  memset(b, 0, sizeof b);
  qcow2_set_refcount(b, 4, 1, 1);
  cr_assert_eq(b[2], 0);
  cr_assert_eq(b[3], 1);
  memset(b, 0, sizeof b);
  qcow2_set_refcount(b, 6, 1, 0x0102);
  cr_assert_eq(b[14], 1);
  cr_assert_eq(b[15], 2);
}
