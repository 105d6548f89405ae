/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket of a running serve, vhost or mount (`--control
 * PATH`, `blockport ctl PATH VERB [ARG...]`): a Unix stream socket that
 * takes one JSON request a line and answers one JSON line each.  The wire
 * format is docs/CONTROL.md; this is the library side:
 *
 *   - ctl_start() binds PATH (mode 0600) and runs a listener thread
 *     ("bp-control") and a thread per client ("bp-ctl-client", at most
 *     CTL_MAX_CLIENTS), never on an I/O path, so a handler may block
 *     (drain writes, flush) for as long as it needs;
 *   - a command hands it its own verbs (struct ctl_verb) beside the
 *     built-in "help" and "version"; the greeting lists them all;
 *   - a handler reads the parsed request (struct ctl_request) and writes
 *     its answer's fields through struct ctl_answer, or fails with an
 *     errno and a message.
 *
 * The request parser and the answer writer are pure (control-json.c) and
 * fuzzed (tests/fuzz/fuzz-control.c). */
#ifndef BLOCKPORT_CONTROL_H
#define BLOCKPORT_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_PROTOCOL 1
#define CTL_MAX_LINE 65536   /* bytes in a request, without its '\n' */
#define CTL_MAX_ARGS 64      /* entries of "args" */
#define CTL_MAX_CLIENTS 16   /* connected at once; more are refused */
#define CTL_STALL_MS 30000   /* a partial request that long: closed */
#define CTL_MAX_DEPTH 32     /* nesting of arrays and objects in a request */
#define CTL_MAX_VERB_NAME 32 /* bytes in a verb's name: [a-z0-9-]+ */

/* A request, as parsed from one line. */
struct ctl_request {
  char *verb;   /* NUL-terminated, valid UTF-8, no NUL inside */
  char **args;  /* NARGS strings, the same */
  size_t nargs; /* 0 when "args" was absent */
  char *id;     /* the "id" member's JSON text, echoed as it came; NULL
                 * when absent */
  void *opaque; /* set by the server: what ctl_start() was given */
};

/* An answer being written: the "ok", "id" (and on failure "error" and
 * "errno") members are the server's; a handler adds its own fields. */
struct ctl_answer;

/* One verb.  NAME: [a-z0-9-]+, at most CTL_MAX_VERB_NAME bytes, unique
 * (not "help" or "version").  A request with fewer than MIN_ARGS or more
 * than MAX_ARGS arguments is refused before the handler runs.  USAGE is
 * the synopsis ("checkpoint NAME [EXPORT]"), SUMMARY one line; both for
 * `help`.
 *
 * HANDLER returns 0 with the answer's fields added, or a negative errno,
 * with a message set by ctl_fail() (else strerror's); fields added before
 * a failure are dropped.  Handlers run one at a time (a mutex of the
 * server), on a control thread, so they may block; they must not call
 * ctl_stop(). */
typedef int ctl_handler(const struct ctl_request *req, struct ctl_answer *a);
struct ctl_verb {
  const char *name;
  unsigned min_args, max_args;
  const char *usage;
  const char *summary;
  ctl_handler *handler;
};

/* ---- the answer's fields (a handler's tools) ----
 *
 * Keys are ASCII names chosen by the program; string values may be
 * anything (escaped as JSON; bytes that are not UTF-8 become U+FFFD).
 * Fields go into the innermost open object.  An array of objects:
 *
 *   ctl_array_begin(a, "checkpoints");
 *   for (...) {
 *     ctl_object_begin(a);
 *     ctl_add_str(a, "name", n);
 *     ctl_add_u64(a, "bytes", b);
 *     ctl_object_end(a);
 *   }
 *   ctl_array_end(a);
 *
 * Misuse (an unbalanced end, nesting deeper than 8) or running out of
 * memory turns the whole answer into an error; the calls return nothing. */
void ctl_add_str(struct ctl_answer *a, const char *key, const char *value);
void ctl_add_i64(struct ctl_answer *a, const char *key, int64_t value);
void ctl_add_u64(struct ctl_answer *a, const char *key, uint64_t value);
void ctl_add_bool(struct ctl_answer *a, const char *key, bool value);
/* An array of strings, in one go. */
void ctl_add_strv(struct ctl_answer *a, const char *key,
                  const char *const *values, size_t n);
void ctl_array_begin(struct ctl_answer *a, const char *key);
void ctl_object_begin(struct ctl_answer *a); /* an element of the array */
void ctl_object_end(struct ctl_answer *a);
void ctl_array_end(struct ctl_answer *a);
/* Fail with ERR (a positive errno: EINVAL, ENOENT, EBUSY...) and the
 * message FMT; returns -ERR, for `return ctl_fail(a, ENOENT, "no
 * checkpoint '%s'", name);`. */
int ctl_fail(struct ctl_answer *a, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- the server ---- */

struct ctl_server;

/* Bind PATH (a Unix stream socket, mode 0600; a stale socket there is
 * replaced, a live one or anything else refused) and serve VERBS (N of
 * them, copied by reference: they must outlive the server) beside help
 * and version, each handler getting OPAQUE as req->opaque.  Returns the
 * server, or NULL with bd_errmsg() saying why.  A relative PATH is made
 * absolute, so that a later chdir does not stop ctl_stop() removing it. */
struct ctl_server *ctl_start(const char *path, const struct ctl_verb *verbs,
                             size_t n, void *opaque);
/* Stop listening, close every client (a handler running is waited for),
 * join the threads and remove the socket.  NULL is a no-op. */
void ctl_stop(struct ctl_server *s);

/* ---- the pure parts (control-json.c), for the server, tests, fuzzers ----
 */

/* Parse one request line (LEN bytes, no '\n'; NULs and any bytes
 * allowed: they are refused, never read past).  0 and REQ filled (free
 * with ctl_request_free()), or -EINVAL with a message in ERR (ERRLEN
 * bytes); on failure REQ->id still holds the id when it could be read,
 * so the error answer can carry it. */
int ctl_parse_request(const char *line, size_t len, struct ctl_request *req,
                      char *err, size_t errlen);
void ctl_request_free(struct ctl_request *req);

/* An answer for ID (JSON text or NULL): ctl_answer_new() starts it,
 * ctl_answer_finish() ends it and returns the line (with its '\n', NUL
 * terminated, owned by A) and its length: {"ok":true,"id":ID,...fields}
 * or, after ctl_fail() or misuse, {"ok":false,"id":ID,"error":MESSAGE,
 * "errno":"ENAME"}.  NULL only when memory ran out. */
struct ctl_answer *ctl_answer_new(const char *id);
const char *ctl_answer_finish(struct ctl_answer *a, size_t *len);
void ctl_answer_free(struct ctl_answer *a);
/* Whether ctl_fail() was called (or the answer broke). */
bool ctl_answer_failed(const struct ctl_answer *a);

/* For clients (blockport ctl, tests): the JSON text of member KEY of the
 * object TEXT (LEN bytes), as a new string; NULL when TEXT is not a
 * well-formed object, has no KEY, or memory ran out. */
char *ctl_json_member(const char *text, size_t len, const char *key);
/* The JSON string TEXT (quotes included) decoded into a new string; NULL
 * when it is not one (or holds \u0000). */
char *ctl_json_decode_str(const char *text);
/* Whether S is valid UTF-8 (what a JSON string may carry as it is). */
bool ctl_utf8_valid(const char *s);

/* S as a JSON string (quotes included) appended to OUT, which holds
 * *LEN bytes of *CAP; 0 or -ENOMEM.  Exposed for the tests. */
int ctl_json_str(char **out, size_t *len, size_t *cap, const char *s);

#endif
