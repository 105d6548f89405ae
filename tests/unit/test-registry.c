/* SPDX-License-Identifier: BSD-3-Clause */
/* Opening through the format table (struct bd_format, core/blockdev.h):
 * dispatch by spec, by format name and by probe, the options each open
 * sees, the messages for unknown names, and a program that installed no
 * table.  Then the real table (formats/registry.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/open.h"
#include "core/source.h"
#include "formats/qcow2/backing-path.h"
#include "formats/registry.h"

static const struct bd_ops fake_ops = {.name = "fake"};
/* What the last open was given. */
static struct bd_open_opts seen;
static const char *probe_answer;
static int probe_result;

static struct bd *fake(const char *format, const struct bd_open_opts *o) {
  seen = *o;
  return bd_new(&fake_ops, format, NULL);
}

static bool is_a(const char *spec) {
  return strncmp(spec, "a:", 2) == 0;
}
static bool is_b(const char *spec) {
  return strncmp(spec, "b:", 2) == 0;
}
static struct bd *open_a(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  return fake("a", o);
}
static struct bd *open_b(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  return fake("b", o);
}
static struct bd *open_img(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  return fake("img", o);
}
static struct bd *open_other(const char *spec, const struct bd_open_opts *o) {
  (void)spec;
  return fake("other", o);
}
static int probe(const char *path, const char **format) {
  (void)path;
  *format = probe_answer;
  if (probe_result < 0)
    bd_set_error("probe said no");
  return probe_result;
}

static const struct bd_format fmt_a = {
    .name = "a", .matches = is_a, .usage = "a letter: use a:X", .open = open_a};
static const struct bd_format fmt_b = {
    .name = "b", .matches = is_b, .open = open_b};
static const struct bd_format fmt_img = {
    .name = "img",
    .option_keys = (const char *const[]){"size", "mode", NULL},
    .probe = probe,
    .open = open_img};
static const struct bd_format fmt_other = {
    .name = "other", .probe_fallback = true, .open = open_other};
static const struct bd_format *const table[] = {&fmt_a, &fmt_b, &fmt_img,
                                                &fmt_other, NULL};

static void install(void) {
  bd_formats_install(table);
  memset(&seen, 0, sizeof seen);
  probe_answer = "other";
  probe_result = 0;
}

TestSuite(registry, .init = install);

/* Opens SPEC with FORMAT and returns the format of what opened, or NULL. */
static const char *opened(const char *spec, const char *format,
                          unsigned flags) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.format = format;
  o.flags = flags;
  struct bd *bd = bd_open_with(spec, &o);
  if (!bd)
    return NULL;
  static char name[32];
  snprintf(name, sizeof name, "%s", bd->format);
  bd_close(bd);
  return name;
}

Test(registry, spec_matchers_win_over_the_format_name) {
  cr_assert_str_eq(opened("a:1", NULL, 0), "a");
  cr_assert_str_eq(opened("b:1", "img", 0), "b");
  cr_assert_not(seen.flags & BD_OPEN_PROBED);
}

Test(registry, format_name_picks_the_entry) {
  cr_assert_str_eq(opened("disk", "img", 0), "img");
  cr_assert_str_eq(opened("disk", "other", 0), "other");
  cr_assert_not(seen.flags & BD_OPEN_PROBED);
}

Test(registry, probe_picks_the_entry_and_marks_it) {
  cr_assert_str_eq(opened("disk", NULL, 0), "other");
  cr_assert(seen.flags & BD_OPEN_PROBED);
  probe_answer = "img";
  cr_assert_str_eq(opened("disk", NULL, 0), "img");
  cr_assert_str_eq(bd_probe_format("disk"), "img");
}

Test(registry, probe_refusal_keeps_its_message) {
  probe_result = -ENOTSUP;
  probe_answer = "exotic";
  cr_assert_null(opened("disk", NULL, 0));
  cr_assert_str_eq(bd_errmsg(), "probe said no");
  /* bd_probe_format still names the refused format. */
  cr_assert_str_eq(bd_probe_format("disk"), "exotic");
  probe_result = -EIO; /* unreadable: the fallback entry */
  cr_assert_str_eq(bd_probe_format("disk"), "other");
}

Test(registry, options_reach_the_open) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  static const char *const opts[] = {"mode=fast"};
  static const char *const defs[] = {"img.size=3", "b.zzz=1"};
  o.format = "img";
  o.flags = BD_OPEN_SHARE;
  o.options = opts;
  o.noptions = 1;
  o.defaults = defs;
  o.ndefaults = 2;
  struct bd *bd = bd_open_with("disk", &o);
  cr_assert_not_null(bd);
  cr_assert(bd->caps.readonly);
  bd_close(bd);
  cr_assert_eq(seen.flags, BD_OPEN_SHARE | BD_OPEN_READONLY);
  cr_assert_str_eq(bd_opt_get(&seen, "img", "mode"), "fast");
  cr_assert_str_eq(bd_opt_get(&seen, "img", "size"), "3");
  /* NULL options: the defaults. */
  cr_assert_str_eq(opened("a:", NULL, 0), "a");
  bd = bd_open_with("a:", NULL);
  cr_assert_not_null(bd);
  bd_close(bd);
  cr_assert_eq(seen.noptions, 0);
  cr_assert_eq(seen.flags, 0);
}

/* An option the opened format does not take fails the opening, naming
 * the format; a default it does not take is ignored. */
Test(registry, options_the_format_does_not_take) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  static const char *const opts[] = {"size=1", "timeout=5"};
  o.format = "img";
  o.options = opts;
  o.noptions = 2;
  cr_assert_null(bd_open_with("disk", &o));
  cr_assert_str_eq(bd_errmsg(),
                   "img: unknown option 'timeout' (known: size, mode)");
  o.format = "other";
  o.noptions = 1;
  cr_assert_null(bd_open_with("disk", &o));
  cr_assert_str_eq(bd_errmsg(),
                   "other: unknown option 'size' (other takes none)");
  /* A backing file's (lenient) options: what it does not know is dropped. */
  o.flags = BD_OPEN_LENIENT_OPTIONS;
  struct bd *bd = bd_open_with("disk", &o);
  cr_assert_not_null(bd);
  bd_close(bd);
  o.flags = 0;
  o.noptions = 0;
  static const char *const defs[] = {"timeout=5", "nbd.connections=2"};
  o.defaults = defs;
  o.ndefaults = 2;
  bd = bd_open_with("disk", &o);
  cr_assert_not_null(bd);
  bd_close(bd);
  static const char *const bad[] = {"=1"};
  o.options = bad;
  o.noptions = 1;
  cr_assert_null(bd_open_with("disk", &o));
  cr_assert_str_eq(bd_errmsg(), "other: option '=1': expected KEY=VALUE");
}

Test(registry, unknown_names) {
  cr_assert_null(opened("disk", "vmdk", 0));
  cr_assert_str_eq(bd_errmsg(), "unknown format 'vmdk' (known: img, other)");
  /* A spec-named source by name: its usage, or unknown without one. */
  cr_assert_null(opened("disk", "a", 0));
  cr_assert_str_eq(bd_errmsg(), "format 'a' takes a letter: use a:X");
  cr_assert_null(opened("disk", "b", 0));
  cr_assert_str_eq(bd_errmsg(), "unknown format 'b' (known: img, other)");
}

Test(registry, a_table_without_probe_needs_a_format) {
  static const struct bd_format *const no_probe[] = {&fmt_a, &fmt_other, NULL};
  bd_formats_install(no_probe);
  cr_assert_null(opened("disk", NULL, 0));
  cr_assert_str_eq(bd_errmsg(), "disk: no format given, and none can probe it");
  cr_assert_str_eq(bd_probe_format("disk"), "other");
  cr_assert_str_eq(opened("disk", "other", 0), "other");
}

Test(registry, no_table_is_an_error_not_a_crash) {
  bd_formats_install(NULL);
  cr_assert_null(opened("memory:1M", NULL, 0));
  cr_assert_str_eq(bd_errmsg(),
                   "memory:1M: no formats installed (bd_formats_install)");
  cr_assert_null(bd_open("disk", "raw", true));
  cr_assert_null(bd_probe_format("/dev/null"));
}

/* ---- the real table ---- */

TestSuite(formats);

Test(formats, specs_and_names) {
  bd_formats_install(formats_registry);
  cr_assert_str_eq(opened("memory:1M", "qcow2", 0), "memory");
  cr_assert_str_eq(opened("null:1M", NULL, 0), "null");
  cr_assert_null(opened("./null:1M", "null", 0));
  cr_assert_str_eq(bd_errmsg(), "format 'null' takes a size: use null:SIZE");
  cr_assert_null(opened("x", "memory", 0));
  cr_assert_str_eq(bd_errmsg(),
                   "format 'memory' takes a size: use memory:SIZE");
  cr_assert_null(opened("x", "nbd", 0));
  cr_assert_str_eq(bd_errmsg(), "unknown format 'nbd' (known: raw, qcow2)");
}

Test(formats, files_by_probe) {
  bd_formats_install(formats_registry);
  char path[] = "/tmp/test-registry-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  char head[512] = "KDMV";
  cr_assert_eq(write(fd, head, sizeof head), (ssize_t)sizeof head);
  close(fd);
  cr_assert_str_eq(bd_probe_format(path), "vmdk");
  cr_assert_null(opened(path, NULL, BD_OPEN_READONLY));
  char want[256];
  snprintf(want, sizeof want,
           "%s: vmdk image: not supported; convert it with qemu-img convert",
           path);
  cr_assert_str_eq(bd_errmsg(), want);
  /* Given a format, the content does not matter. */
  cr_assert_str_eq(opened(path, "raw", BD_OPEN_READONLY), "raw");
  memset(head, 0, 4);
  fd = open(path, O_WRONLY);
  cr_assert_eq(pwrite(fd, head, 4, 0), 4);
  close(fd);
  cr_assert_str_eq(opened(path, NULL, BD_OPEN_READONLY), "raw");
  unlink(path);
}

/* Backing file names (formats/qcow2/backing-path.c): a name the table
 * matches is a source, kept as it is; anything else is a file, relative
 * to the image's directory. */
Test(formats, backing_names_the_table_matches_stay_as_they_are) {
  bd_formats_install(formats_registry);
  cr_assert(bd_spec_is_backing_source("nbd+unix:///?socket=s.sock"));
  cr_assert(bd_spec_is_backing_source("nbds://h/x"));
  cr_assert_not(bd_spec_is_backing_source("http://h/x"));
  cr_assert_not(bd_spec_is_backing_source("base.raw"));
  /* An image file is not trusted: no plugin (code) nor null/memory. */
  cr_assert_not(bd_spec_is_backing_source("nbdkit:/tmp/evil.so"));
  cr_assert_not(bd_spec_is_backing_source("null:1M"));
  cr_assert_not(bd_spec_is_backing_source("memory:1M"));
  const char *cases[][3] = {
      {"d/ov.qcow2", "nbd://h:10809/golden", "nbd://h:10809/golden"},
      {"d/ov.qcow2", "nbd+unix:///?socket=s.sock",
       "nbd+unix:///?socket=s.sock"},
      {"d/ov.qcow2", "base.raw", "d/base.raw"},
      {"d/ov.qcow2", "http://h/x", "d/http://h/x"},
      {"ov.qcow2", "base.raw", "base.raw"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *p = qcow2_backing_path(cases[i][0], cases[i][1]);
    cr_assert_str_eq(p, cases[i][2], "%s from %s", cases[i][1], cases[i][0]);
    free(p);
  }
}
