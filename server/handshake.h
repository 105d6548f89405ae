/* SPDX-License-Identifier: BSD-3-Clause */
/* The NBD fixed-newstyle option haggling as a pure state machine: one call
 * per option, replies appended to a byte buffer.  The socket loop in
 * conn.c feeds it; the unit tests and the fuzzer feed it directly. */
#ifndef BLOCKPORT_HANDSHAKE_H
#define BLOCKPORT_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the handshake may tell a client about one export. */
struct hs_export {
  const char *name;
  const char *description;
  uint64_t size;
  uint16_t tflags; /* without the flags that depend on negotiation */
  uint32_t min_block, pref_block, max_block;
  /* More meta contexts it offers, by full name ("qemu:dirty-bitmap:x"),
   * at most HS_MAX_EXTRA: context i has id HS_CTX_EXTRA + i. */
  const char *const *contexts;
  size_t ncontexts;
  bool unlisted;     /* reachable, but left out of NBD_OPT_LIST */
  bool tls_required; /* usable only after STARTTLS (not listed before) */
};

/* The exports on offer.  Zero-initialised fields keep the defaults: v[0]
 * is also the default export "", and every client may use every export. */
struct hs_catalog {
  const struct hs_export *v;
  size_t n;
  /* No default export: "" names only an export literally called "". */
  bool no_default;
  /* Whether this client may use export IDX (NULL: everyone may).  A client
   * that may not is not shown the export in NBD_OPT_LIST and is refused
   * with NBD_REP_ERR_POLICY (EXPORT_NAME: the connection is closed). */
  bool (*admits)(const void *ctx, size_t idx);
  const void *admits_ctx;
};

/* Meta context ids as sent to clients. */
#define HS_CTX_BASE_ALLOCATION 1
#define HS_CTX_ALLOCATION_DEPTH 2
#define HS_CTX_EXTRA 3 /* the first of an export's own contexts */
#define HS_MAX_EXTRA 16

/* The server's TLS policy (--tls). */
enum hs_tls {
  HS_TLS_OFF,     /* STARTTLS is refused */
  HS_TLS_ON,      /* plain and TLS clients alike */
  HS_TLS_REQUIRE, /* nothing but ABORT and STARTTLS before TLS */
};

struct hs_state {
  enum hs_tls tls; /* set by the caller before the first option */
  bool tls_active; /* the connection is encrypted now */
  bool fixed;      /* client sent NBD_FLAG_C_FIXED_NEWSTYLE */
  bool no_zeroes;  /* client sent NBD_FLAG_C_NO_ZEROES */
  bool structured; /* structured replies negotiated */
  bool extended;   /* extended headers negotiated */
  /* Meta contexts selected by SET_META_CONTEXT, and for which export. */
  bool ctx_base, ctx_depth;
  uint32_t ctx_extra; /* bit i: the export's context i */
  int ctx_export;
  /* Result once HS_GO is returned. */
  int export_index;
  uint16_t tflags;
};

struct hs_out {
  uint8_t *buf;
  size_t len, cap;
  bool oom;
};

enum hs_result {
  HS_CONTINUE, /* send the output, read the next option */
  HS_GO,       /* send the output, enter transmission */
  HS_CLOSE,    /* send the output (if any), then close the connection */
  HS_STARTTLS, /* send the output (an ACK), run the TLS handshake as the
                  server, then call hs_tls_started() */
};

/* Greeting: NBDMAGIC, IHAVEOPT, handshake flags. */
void hs_greeting(struct hs_out *out);
/* Check the client's 32-bit flags. Returns false if the client must be
 * disconnected. */
bool hs_client_flags(struct hs_state *hs, uint32_t flags);
/* Handle one option whose data is DATA[0..LEN). */
enum hs_result hs_option(struct hs_state *hs, const struct hs_catalog *cat,
                         uint32_t opt, const uint8_t *data, uint32_t len,
                         struct hs_out *out);
/* The TLS handshake after HS_STARTTLS succeeded: option haggling starts
 * over, encrypted, and nothing negotiated in the clear carries over. */
void hs_tls_started(struct hs_state *hs);
/* Reply to an option whose data was too large to read (it was discarded). */
void hs_option_too_big(struct hs_state *hs, uint32_t opt, struct hs_out *out);

/* After HS_GO for OPT (NBD_OPT_GO), when the export cannot be opened for
 * this client after all: replace the output with an error reply to OPT;
 * the client may try again. */
void hs_refuse_go(struct hs_state *hs, uint32_t opt, const char *msg,
                  struct hs_out *out);

/* Transmission flags for export E given what was negotiated. */
uint16_t hs_tflags(const struct hs_state *hs, const struct hs_export *e);

void hs_out_free(struct hs_out *out);

/* Largest option payload we read; longer ones get NBD_REP_ERR_TOO_BIG. */
#define HS_MAX_OPTION_DATA (64u * 1024)

#endif
