/* SPDX-License-Identifier: BSD-3-Clause */
/* qcow2 consistency: compare the references refs.c counts with the stored
 * refcounts, check the COPIED flags against the refcounts, and repair as
 * qemu-img check -r does (block/qcow2-refcount.c, qcow2_check_refcounts()):
 *   - a referenced cluster with refcount 0, or a refcount table entry that
 *     is malformed, means the whole refcount structure is rebuilt from the
 *     references (rebuild.c), which only a repair of errors may do;
 *   - otherwise each wrong refcount is set to its count of references
 *     (leaks with --repair leaks, both kinds with --repair all);
 *   - COPIED flags are then set from the refcounts (with --repair leaks
 *     only when nothing else is left wrong);
 *   - an image left with no corruption loses its dirty and corrupt bits.
 * Runs single-threaded, on an image nobody else is writing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/blockdev.h"
#include "core/byteorder.h"
#include "core/io.h"
#include "core/open.h"
#include "guard.h"
#include "qcow2-internal.h"
#include "refs.h"

static unsigned long long ull(uint64_t v) {
  return (unsigned long long)v;
}

/* Compare each cluster's refcount with its references, fixing what FIX
 * asks; *HIGHEST is the last cluster with either. */
static void compare(struct refs *r, enum qcow2_repair fix, uint64_t *highest) {
  struct qcow2_check_result *res = r->res;
  *highest = 0;
  for (uint64_t c = 0; c < r->used; c++) {
    uint64_t rc, refs = r->n[c];
    int e = qcow2_rc_get(r->q, c, &rc);
    if (e < 0) {
      qcow2_say(r, "Can't get refcount for cluster %llu: %s", ull(c),
                strerror(-e));
      res->check_errors++;
      continue;
    }
    if (rc || refs)
      *highest = c;
    if (rc == refs)
      continue;
    uint64_t *fixed = NULL;
    if (rc == 0)
      r->rebuild = true;
    else if (rc > refs && (fix & QCOW2_REPAIR_LEAKS))
      fixed = &res->leaks_fixed;
    else if (rc < refs && (fix & QCOW2_REPAIR_ERRORS))
      fixed = &res->corruptions_fixed;
    qcow2_say(r, "%s cluster %llu refcount=%llu reference=%llu",
              fixed       ? "Repairing"
              : rc < refs ? "ERROR"
                          : "Leaked",
              ull(c), ull(rc), ull(refs));
    if (fixed && qcow2_rc_update(r->q, c, (int64_t)(refs - rc)) == 0) {
      (*fixed)++;
      continue;
    }
    if (rc < refs)
      res->corruptions++;
    else
      res->leaks++;
  }
}

/* ---- COPIED ---- */

/* Whether COPIED in ENTRY disagrees with the refcount of the cluster at
 * OFF (in *RC, 1 for a cluster of an external data file, which has none);
 * false when the refcount cannot be read. */
static bool copied_wrong(struct qcow2dev *q, uint64_t entry, uint64_t off,
                         bool in_data_file, uint64_t *rc) {
  if (in_data_file)
    *rc = 1;
  else if (qcow2_rc_get(q, off >> q->h.cluster_bits, rc) < 0)
    return false;
  return (*rc == 1) != !!(entry & QCOW2_L2_COPIED);
}

static uint64_t with_copied(uint64_t entry, uint64_t rc) {
  return rc == 1 ? entry | QCOW2_L2_COPIED : entry & ~QCOW2_L2_COPIED;
}

static int copied_l2(struct refs *r, uint64_t l2off, bool repair) {
  struct qcow2dev *q = r->q;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  uint64_t dirty = 0;
  int e = io_pread_zero(q->fd, r->tbl, q->csize, l2off);
  for (uint64_t j = 0; e == 0 && j < q->csize / esize; j++) {
    uint64_t entry = get_be64(r->tbl + j * esize), rc;
    enum qcow2_l2_type t = qcow2_l2_type(q, entry);
    if ((t != L2_NORMAL && t != L2_ZERO_ALLOC) ||
        !copied_wrong(q, entry, entry & QCOW2_OFFSET_MASK, q->g.data_file, &rc))
      continue;
    r->res->corruptions++;
    qcow2_say(r, "%s OFLAG_COPIED data cluster: l2_entry=%llx refcount=%llu",
              repair ? "Repairing" : "ERROR", ull(entry), ull(rc));
    if (repair) {
      put_be64(r->tbl + j * esize, with_copied(entry, rc));
      dirty++;
    }
  }
  if (e == 0 && dirty)
    e = io_pwrite_all(q->fd, r->tbl, q->csize, l2off);
  if (e < 0) {
    r->res->check_errors++;
    bd_set_error("qcow2 %s: L2 table at 0x%llx: %s", q->path, ull(l2off),
                 strerror(-e));
    return e;
  }
  r->res->corruptions -= dirty;
  r->res->corruptions_fixed += dirty;
  return 0;
}

/* COPIED must be set exactly on the active image's entries whose cluster
 * has refcount 1 (the stored refcount, once repaired). */
static int check_copied(struct refs *r, enum qcow2_repair fix) {
  struct qcow2dev *q = r->q;
  struct qcow2_check_result *res = r->res;
  bool repair = (fix & QCOW2_REPAIR_ERRORS) ||
                ((fix & QCOW2_REPAIR_LEAKS) && !res->check_errors &&
                 !res->corruptions && !res->leaks);
  int e = 0;
  for (uint32_t i = 0; e == 0 && i < q->h.l1_size; i++) {
    uint64_t l1e = q->l1[i], l2off = l1e & QCOW2_OFFSET_MASK, rc;
    if (!l2off)
      continue;
    if (copied_wrong(q, l1e, l2off, false, &rc)) {
      qcow2_say(r,
                "%s OFLAG_COPIED L2 cluster: l1_index=%u l1_entry=%llx "
                "refcount=%llu",
                repair ? "Repairing" : "ERROR", i, ull(l1e), ull(rc));
      res->corruptions++;
      if (repair) {
        q->l1[i] = with_copied(l1e, rc);
        uint8_t b[8];
        put_be64(b, q->l1[i]);
        e = io_pwrite_all(q->fd, b, 8, q->h.l1_offset + i * 8ull);
        res->corruptions--;
        res->corruptions_fixed++;
      }
    }
    if (e == 0)
      e = copied_l2(r, l2off, repair);
  }
  return e;
}

/* ---- whether the COPIED repairs can be written ---- */

/* Whether COPIED in ENTRY will be wrong for the cluster at OFF once the
 * refcounts are repaired (each one then its count of references). */
static bool copied_will_be_wrong(struct refs *r, uint64_t entry, uint64_t off,
                                 bool in_data_file) {
  uint64_t c = off >> r->q->h.cluster_bits, rc;
  if (in_data_file)
    rc = 1;
  else if (c < r->used)
    rc = r->n[c];
  else if (qcow2_rc_get(r->q, c, &rc) < 0)
    return false;
  return (rc == 1) != !!(entry & QCOW2_L2_COPIED);
}

/* Whether the repair will change a COPIED flag in the L2 table at L2OFF. */
static bool l2_will_change(struct refs *r, uint64_t l2off) {
  struct qcow2dev *q = r->q;
  unsigned esize = q->g.extended_l2 ? 16 : 8;
  if (io_pread_zero(q->fd, r->tbl, q->csize, l2off) < 0)
    return false; /* the repair will say it */
  for (uint64_t j = 0; j < q->csize / esize; j++) {
    uint64_t entry = get_be64(r->tbl + j * esize);
    enum qcow2_l2_type t = qcow2_l2_type(q, entry);
    if ((t == L2_NORMAL || t == L2_ZERO_ALLOC) &&
        copied_will_be_wrong(r, entry, entry & QCOW2_OFFSET_MASK,
                             q->g.data_file))
      return true;
  }
  return false;
}

/* The table the COPIED repair would write over other metadata (a snapshot's
 * L1 table in an active L2 table, ...): 0, or the kinds it overlaps with
 * *AT (and *WHAT) set. */
static unsigned copied_overlap(struct refs *r, uint64_t *at,
                               const char **what) {
  struct qcow2dev *q = r->q;
  for (uint32_t i = 0; i < q->h.l1_size; i++) {
    uint64_t l1e = q->l1[i], l2off = l1e & QCOW2_OFFSET_MASK;
    if (!l2off)
      continue;
    *at = q->h.l1_offset + i * 8ull;
    *what = "L1 table";
    unsigned k = qcow2_ol_check(r->ol, *at, 8, QCOW2_OL_ACTIVE_L1);
    if (k && copied_will_be_wrong(r, l1e, l2off, false))
      return k;
    *at = l2off;
    *what = "L2 table";
    k = qcow2_ol_check(r->ol, l2off, q->csize,
                       QCOW2_OL_ACTIVE_L2 | QCOW2_OL_INACTIVE_L2);
    if (k && l2_will_change(r, l2off))
      return k;
  }
  return 0;
}

/* QEMU writes the COPIED repairs through its overlap checks: one that
 * would land on other metadata fails, and so does its check (1), having
 * repaired the refcounts (its failure loses them) and marked the image
 * corrupt.  Known before anything is written here: nothing is, and the
 * check fails alike.  0, or -EIO. */
static int copied_writable(struct refs *r) {
  uint64_t at = 0;
  const char *what = NULL;
  unsigned k = copied_overlap(r, &at, &what);
  if (!k)
    return 0;
  qcow2_say(r,
            "ERROR: Could not write %s at 0x%llx: it overlaps with the %s; "
            "nothing repaired",
            what, ull(at), qcow2_ol_name(k));
  r->res->check_errors++;
  bd_set_error("qcow2 %s: the COPIED flags of the %s at 0x%llx cannot be "
               "repaired: it overlaps with the %s",
               r->q->path, what, ull(at), qcow2_ol_name(k));
  return -EIO;
}

/* ---- repairs ---- */

/* Clear the dirty and corrupt bits, after everything else is durable. */
static int mark_clean(struct qcow2dev *q) {
  uint64_t bits = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT;
  if (!(q->h.incompatible & bits))
    return 0;
  int e = io_fdatasync(q->fd);
  uint8_t b[8];
  put_be64(b, q->h.incompatible & ~bits);
  if (e == 0)
    e = io_pwrite_all(q->fd, b, 8, 72);
  if (e == 0)
    e = io_fdatasync(q->fd);
  if (e == 0)
    q->h.incompatible &= ~bits;
  return e;
}

/* Free R's counts for counting again. */
static void reset(struct refs *r, enum qcow2_repair fix) {
  FILE *report = r->report;
  struct qcow2_check_result *res = r->res;
  qcow2_refs_free(r);
  *r = (struct refs){.report = report, .res = res, .fix = fix};
}

/* Load the refcount table as it is, and count the references. */
static int count(struct qcow2dev *q, struct refs *r) {
  int e = qcow2_rc_init_check(q);
  if (e < 0) {
    r->res->check_errors++;
    return e;
  }
  return qcow2_count_refs(q, r, true);
}

/* Rebuild the refcount structure from the references, then count again;
 * what the rebuild mended is counted as fixed. */
static int rebuild(struct qcow2dev *q, struct refs *r, uint64_t *highest) {
  struct qcow2_check_result old = *r->res;
  qcow2_say(r, "Rebuilding refcount structure");
  struct refs fresh = {.report = r->report, .res = r->res};
  int e = qcow2_count_refs(q, &fresh, false);
  if (e == 0)
    e = qcow2_write_refcounts(q, &fresh.n, fresh.used);
  qcow2_refs_free(&fresh);
  if (e < 0) {
    r->res->check_errors++;
    bd_set_error("qcow2 %s: rebuilding the refcounts: %s", q->path,
                 strerror(-e));
    return e;
  }
  struct qcow2_check_result *res = r->res;
  enum qcow2_repair fix = r->fix;
  reset(r, QCOW2_REPAIR_NONE);
  *res = (struct qcow2_check_result){.check_errors = old.check_errors};
  e = count(q, r);
  if (e == 0)
    compare(r, fix & QCOW2_REPAIR_LEAKS, highest);
  res->corruptions_fixed =
      old.corruptions_fixed + (old.corruptions > res->corruptions
                                   ? old.corruptions - res->corruptions
                                   : 0);
  res->leaks_fixed = old.leaks_fixed + res->leaks_fixed +
                     (old.leaks > res->leaks ? old.leaks - res->leaks : 0);
  return e;
}

static int check_refcounts(struct qcow2dev *q, struct refs *r,
                           enum qcow2_repair fix) {
  struct qcow2_check_result *res = r->res;
  uint64_t highest = 0;
  int e = count(q, r);
  if (e < 0)
    return e;
  /* Compare, and if it finds what FIX may mend, compare again, mending. */
  struct qcow2_check_result counted = *res;
  compare(r, QCOW2_REPAIR_NONE, &highest);
  /* The COPIED flags are repaired by --repair all, and by --repair leaks
   * when the leaks are all that is wrong. */
  if ((fix & QCOW2_REPAIR_ERRORS) ||
      (fix && !res->corruptions && !res->check_errors)) {
    e = copied_writable(r);
    if (e < 0)
      return e;
  }
  if (r->rebuild && (fix & QCOW2_REPAIR_ERRORS)) {
    e = rebuild(q, r, &highest);
  } else if (fix && r->rebuild) {
    qcow2_say(r, "ERROR need to rebuild refcount structures");
    res->check_errors++;
    bd_set_error("qcow2 %s: the refcount structure needs rebuilding "
                 "(--repair all)",
                 q->path);
    return -EIO;
  } else if (fix && (res->leaks || res->corruptions)) {
    *res = counted;
    compare(r, fix, &highest);
  }
  res->image_end = (highest + 1) << q->h.cluster_bits;
  return e;
}

int qcow2_check(struct qcow2dev *q, enum qcow2_repair fix, FILE *report,
                struct qcow2_check_result *res) {
  *res = (struct qcow2_check_result){0};
  struct refs r = {.report = report, .res = res, .fix = fix};
  int e = check_refcounts(q, &r, fix);
  if (e == 0)
    e = check_copied(&r, fix);
  qcow2_refs_free(&r);
  res->total = (q->h.size + q->csize - 1) >> q->h.cluster_bits;
  if (e == 0 && fix && !res->check_errors && !res->corruptions)
    e = mark_clean(q);
  if (e == 0 && fix)
    e = io_fdatasync(q->fd);
  if (e < 0 && !res->check_errors) {
    res->check_errors++;
    bd_set_error("qcow2 %s: repair: %s", q->path, strerror(-e));
  }
  return e;
}

/* What qemu-img prints on stdout between the repair and the check of the
 * repaired image. */
static void print_summary(FILE *f, const struct qcow2_check_result *res) {
  fprintf(f,
          "The following inconsistencies were found and repaired:\n\n"
          "    %llu leaked clusters\n    %llu corruptions\n\n"
          "Double checking the fixed image now...\n",
          ull(res->leaks_fixed), ull(res->corruptions_fixed));
  fflush(f);
}

int qcow2_check_path(const char *path, enum qcow2_repair repair, bool share,
                     FILE *report, FILE *summary,
                     struct qcow2_check_result *res) {
  unsigned flags = BD_OPEN_READONLY | (share ? BD_OPEN_SHARE : 0);
  struct bd *bd = qcow2_open_check(path, repair ? 0 : flags);
  if (!bd)
    return -EINVAL;
  struct qcow2dev *q = bd->priv;
  int e = qcow2_check(q, repair, report, res);
  if (e == 0 && (res->corruptions_fixed || res->leaks_fixed)) {
    struct qcow2_check_result repaired = *res;
    if (summary)
      print_summary(summary, res);
    e = qcow2_check(q, QCOW2_REPAIR_NONE, report, res);
    /* The verdict is the second check's; what was fixed, the first's. */
    res->leaks_fixed = repaired.leaks_fixed;
    res->corruptions_fixed = repaired.corruptions_fixed;
  }
  int c = bd_close(bd);
  return e < 0 ? e : c;
}
