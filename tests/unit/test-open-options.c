/* SPDX-License-Identifier: BSD-3-Clause */
/* The KEY=VALUE options of struct bd_open_opts as a format reads them
 * (core/open-options.c): which value wins, the defaults that apply to a
 * format, the parsers' messages, and the check of unknown keys. */
#include <criterion/criterion.h>
#include <errno.h>

#include "core/blockdev.h"
#include "core/open.h"

static struct bd_open_opts with(const char *const *opts, size_t n,
                                const char *const *defs, size_t nd) {
  struct bd_open_opts o = BD_OPEN_OPTS_INIT;
  o.options = opts;
  o.noptions = n;
  o.defaults = defs;
  o.ndefaults = nd;
  return o;
}

Test(open_options, options_win_over_defaults_and_the_last_wins) {
  static const char *const defs[] = {"timeout=1", "fmt.timeout=2",
                                     "other.timeout=3"};
  static const char *const opts[] = {"timeout=4", "timeout=5"};
  struct bd_open_opts o = with(opts, 2, defs, 3);
  cr_assert_str_eq(bd_opt_get(&o, "fmt", "timeout"), "5");
  o.noptions = 0;
  cr_assert_str_eq(bd_opt_get(&o, "fmt", "timeout"), "2");
  cr_assert_str_eq(bd_opt_get(&o, "other", "timeout"), "3");
  cr_assert_str_eq(bd_opt_get(&o, "third", "timeout"), "1");
  cr_assert_null(bd_opt_get(&o, "fmt", "time"));
  /* A format whose name is a prefix of another's is not that one. */
  cr_assert_str_eq(bd_opt_get(&o, "othe", "timeout"), "1");
}

Test(open_options, every_value_in_turn) {
  static const char *const defs[] = {"p.debug=a.b=1", "q.debug=x.y=0"};
  static const char *const opts[] = {"debug=c.d=2", "other=1"};
  struct bd_open_opts o = with(opts, 2, defs, 2);
  size_t pos = 0;
  cr_assert_str_eq(bd_opt_next(&o, "p", "debug", &pos), "a.b=1");
  cr_assert_str_eq(bd_opt_next(&o, "p", "debug", &pos), "c.d=2");
  cr_assert_null(bd_opt_next(&o, "p", "debug", &pos));
}

Test(open_options, numbers) {
  static const char *const opts[] = {"n=16", "big=17", "neg=-1", "word=x",
                                     "empty="};
  struct bd_open_opts o = with(opts, 5, NULL, 0);
  unsigned v = 99;
  cr_assert_eq(bd_opt_uint(&o, "f", "missing", 0, 16, &v), 0);
  cr_assert_eq(v, 99);
  cr_assert_eq(bd_opt_uint(&o, "f", "n", 0, 16, &v), 0);
  cr_assert_eq(v, 16);
  cr_assert_eq(bd_opt_uint(&o, "f", "big", 0, 16, &v), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "f: big=17: expected a number in 0-16");
  cr_assert_eq(bd_opt_uint(&o, "f", "neg", 0, 16, &v), -EINVAL);
  cr_assert_eq(bd_opt_uint(&o, "f", "word", 0, 16, &v), -EINVAL);
  cr_assert_eq(bd_opt_uint(&o, "f", "empty", 0, 16, &v), -EINVAL);
  cr_assert_eq(v, 16);
  /* Digits enough to overflow are out of range, not wrapped. */
  static const char *const huge[] = {"n=99999999999999999999999"};
  o = with(huge, 1, NULL, 0);
  cr_assert_eq(bd_opt_uint(&o, "f", "n", 0, 86400, &v), -EINVAL);
}

Test(open_options, sizes) {
  static const char *const opts[] = {"a=1M", "b=4k", "c=lots"};
  struct bd_open_opts o = with(opts, 3, NULL, 0);
  uint64_t v = 7;
  cr_assert_eq(bd_opt_size(&o, "f", "a", 65536, &v), 0);
  cr_assert_eq(v, 1u << 20);
  cr_assert_eq(bd_opt_size(&o, "f", "b", 65536, &v), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "f: b=4k: expected a size of at least 65536");
  cr_assert_eq(bd_opt_size(&o, "f", "c", 0, &v), -EINVAL);
  cr_assert_str_eq(bd_errmsg(),
                   "f: c=lots: expected a size (4096, 512K, 64M, ...)");
  cr_assert_eq(v, 1u << 20);
}

Test(open_options, choices) {
  static const char *const modes[] = {"fail", "wait", "none", NULL};
  static const char *const opts[] = {"lock=wait", "bad=maybe"};
  struct bd_open_opts o = with(opts, 2, NULL, 0);
  unsigned v = 9;
  cr_assert_eq(bd_opt_choice(&o, "r", "lock", modes, &v), 0);
  cr_assert_eq(v, 1);
  cr_assert_eq(bd_opt_choice(&o, "r", "bad", modes, &v), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "r: bad=maybe: expected fail, wait or none");
}

static const struct bd_format f = {
    .name = "fmt", .option_keys = (const char *const[]){"a", "bb", NULL}};
static const struct bd_format none = {.name = "plain"};

Test(open_options, check_names_the_format_and_its_keys) {
  static const char *const good[] = {"a=1", "bb=", "a=x=y"};
  struct bd_open_opts o = with(good, 3, NULL, 0);
  cr_assert_eq(bd_opt_check(&o, &f), 0);
  static const char *const prefix[] = {"b=1"};
  o = with(prefix, 1, NULL, 0);
  cr_assert_eq(bd_opt_check(&o, &f), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "fmt: unknown option 'b' (known: a, bb)");
  static const char *const noeq[] = {"a"};
  o = with(noeq, 1, NULL, 0);
  cr_assert_eq(bd_opt_check(&o, &f), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "fmt: option 'a': expected KEY=VALUE");
  o = with(good, 1, NULL, 0);
  cr_assert_eq(bd_opt_check(&o, &none), -EINVAL);
  cr_assert_str_eq(bd_errmsg(), "plain: unknown option 'a' (plain takes none)");
  /* Defaults are never checked: they apply where a format knows them. */
  static const char *const defs[] = {"zzz=1", "other.q=2", "junk"};
  o = with(NULL, 0, defs, 3);
  cr_assert_eq(bd_opt_check(&o, &none), 0);
}
