/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS in a build without it (BLOCKPORT_TLS=OFF), compiled instead of
 * tls.c: credentials never load ("built without TLS"), so no session is
 * ever started and the server refuses --tls before it listens. */
#include <errno.h>

#include "core/features.h"
#include "tls.h"

struct tls_creds *tls_creds_load(const char *certs_dir, bool verify_peer,
                                 const char *psk_file) {
  (void)certs_dir;
  (void)verify_peer;
  (void)psk_file;
  feature_missing(FEATURE_TLS);
  return NULL;
}

struct tls_creds *tls_creds_ref(struct tls_creds *cr) {
  return cr;
}

void tls_creds_put(struct tls_creds *cr) {
  (void)cr;
}

struct tls_session *tls_accept(struct tls_creds *cr, int fd, const char *who,
                               unsigned timeout_ms) {
  (void)cr;
  (void)fd;
  (void)who;
  (void)timeout_ms;
  errno = EPROTO;
  return NULL;
}

ssize_t tls_recv(struct tls_session *s, void *buf, size_t len) {
  (void)s;
  (void)buf;
  (void)len;
  errno = EIO;
  return -1;
}

ssize_t tls_send(struct tls_session *s, const void *buf, size_t len) {
  (void)s;
  (void)buf;
  (void)len;
  errno = EIO;
  return -1;
}

size_t tls_pending(struct tls_session *s) {
  (void)s;
  return 0;
}

void tls_close(struct tls_session *s) {
  (void)s;
}
