/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS for the NBD server with GnuTLS: credentials loaded once at startup,
 * a session per connection after NBD_OPT_STARTTLS. */
#include "tls.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"

/* PSK ciphersuites are not in GnuTLS's NORMAL set. */
#define PRIORITY_PSK "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK"

struct tls_creds {
  gnutls_certificate_credentials_t x509;
  gnutls_psk_server_credentials_t psk;
  gnutls_priority_t prio;
  bool verify_peer;
  atomic_uint refs; /* the server's, and each session's */
};

struct tls_session {
  gnutls_session_t gs;
  struct tls_creds *cr; /* GnuTLS uses them for the session's life */
  char who[96];
};

struct tls_creds *tls_creds_ref(struct tls_creds *cr) {
  if (cr)
    atomic_fetch_add(&cr->refs, 1);
  return cr;
}

void tls_creds_put(struct tls_creds *cr) {
  if (!cr || atomic_fetch_sub(&cr->refs, 1) != 1)
    return;
  if (cr->x509)
    gnutls_certificate_free_credentials(cr->x509);
  if (cr->psk)
    gnutls_psk_free_server_credentials(cr->psk);
  if (cr->prio)
    gnutls_priority_deinit(cr->prio);
  free(cr);
}

static bool load_x509(struct tls_creds *cr, const char *dir) {
  char ca[PATH_MAX], cert[PATH_MAX], key[PATH_MAX], crl[PATH_MAX];
  snprintf(ca, sizeof ca, "%s/ca-cert.pem", dir);
  snprintf(cert, sizeof cert, "%s/server-cert.pem", dir);
  snprintf(key, sizeof key, "%s/server-key.pem", dir);
  snprintf(crl, sizeof crl, "%s/ca-crl.pem", dir);
  int r = gnutls_certificate_allocate_credentials(&cr->x509);
  if (r < 0) {
    bd_set_error("TLS: %s", gnutls_strerror(r));
    return false;
  }
  r = gnutls_certificate_set_x509_key_file(cr->x509, cert, key,
                                           GNUTLS_X509_FMT_PEM);
  if (r < 0) {
    bd_set_error("TLS: cannot load %s and %s: %s", cert, key,
                 gnutls_strerror(r));
    return false;
  }
  /* The CA is needed only to check clients' certificates. */
  if (cr->verify_peer || access(ca, F_OK) == 0) {
    r = gnutls_certificate_set_x509_trust_file(cr->x509, ca,
                                               GNUTLS_X509_FMT_PEM);
    if (r <= 0) {
      bd_set_error("TLS: cannot load a CA certificate from %s: %s", ca,
                   r < 0 ? gnutls_strerror(r) : "none found");
      return false;
    }
  }
  if (access(crl, F_OK) == 0 && (r = gnutls_certificate_set_x509_crl_file(
                                     cr->x509, crl, GNUTLS_X509_FMT_PEM)) < 0) {
    bd_set_error("TLS: cannot load %s: %s", crl, gnutls_strerror(r));
    return false;
  }
  gnutls_certificate_set_known_dh_params(cr->x509, GNUTLS_SEC_PARAM_MEDIUM);
  return true;
}

/* GnuTLS reads the key file at each handshake; check it once now so a
 * mistake shows at startup. */
static bool psk_file_usable(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    bd_set_error("TLS: cannot read PSK file %s: %s", path, strerror(errno));
    return false;
  }
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strchr(line, ':') != NULL;
  fclose(f);
  if (!found)
    bd_set_error("TLS: %s has no 'username:hexkey' line (psktool writes them)",
                 path);
  return found;
}

static bool load_psk(struct tls_creds *cr, const char *path) {
  if (!psk_file_usable(path))
    return false;
  int r = gnutls_psk_allocate_server_credentials(&cr->psk);
  if (r >= 0)
    r = gnutls_psk_set_server_credentials_file(cr->psk, path);
  if (r < 0) {
    bd_set_error("TLS: PSK file %s: %s", path, gnutls_strerror(r));
    return false;
  }
  gnutls_psk_set_server_known_dh_params(cr->psk, GNUTLS_SEC_PARAM_MEDIUM);
  return true;
}

struct tls_creds *tls_creds_load(const char *certs_dir, bool verify_peer,
                                 const char *psk_file) {
  struct tls_creds *cr = calloc(1, sizeof *cr);
  if (!cr) {
    bd_set_error("TLS: out of memory");
    return NULL;
  }
  cr->verify_peer = verify_peer;
  atomic_init(&cr->refs, 1);
  const char *err = NULL;
  if ((certs_dir && !load_x509(cr, certs_dir)) ||
      (psk_file && !load_psk(cr, psk_file)))
    goto fail;
  int r =
      gnutls_priority_init(&cr->prio, psk_file ? PRIORITY_PSK : "NORMAL", &err);
  if (r < 0) {
    bd_set_error("TLS: priority string: %s", gnutls_strerror(r));
    goto fail;
  }
  return cr;
fail:
  tls_creds_put(cr);
  return NULL;
}

static void log_handshake_failure(struct tls_session *s, int r) {
  if (r != GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
    log_info("%s: TLS handshake failed: %s", s->who, gnutls_strerror(r));
    return;
  }
  gnutls_datum_t text = {NULL, 0};
  unsigned status = gnutls_session_get_verify_cert_status(s->gs);
  gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text,
                                               0);
  log_info("%s: TLS handshake failed: client certificate rejected: %s", s->who,
           text.data ? (const char *)text.data : "not trusted");
  gnutls_free(text.data);
}

static void log_peer(struct tls_session *s) {
  if (log_threshold < LOG_LEVEL_DEBUG)
    return;
  const char *user = gnutls_psk_server_get_username(s->gs);
  log_debug("%s: TLS %s established%s%s", s->who,
            gnutls_protocol_get_name(gnutls_protocol_get_version(s->gs)),
            user ? ", PSK user " : "", user ? user : "");
}

static int setup(struct tls_creds *cr, struct tls_session *s, int fd,
                 unsigned timeout_ms) {
  int r = gnutls_init(&s->gs, GNUTLS_SERVER | GNUTLS_NO_SIGNAL);
  if (r < 0)
    return r;
  if ((r = gnutls_priority_set(s->gs, cr->prio)) < 0)
    return r;
  if (cr->x509 &&
      (r = gnutls_credentials_set(s->gs, GNUTLS_CRD_CERTIFICATE, cr->x509)) < 0)
    return r;
  if (cr->psk &&
      (r = gnutls_credentials_set(s->gs, GNUTLS_CRD_PSK, cr->psk)) < 0)
    return r;
  if (cr->x509 && cr->verify_peer) {
    gnutls_certificate_server_set_request(s->gs, GNUTLS_CERT_REQUIRE);
    gnutls_session_set_verify_cert(s->gs, NULL, 0);
  }
  gnutls_transport_set_int(s->gs, fd);
  /* GnuTLS waits for the client in poll() with what is left of this, not
   * in recv(): the socket's receive timeout alone would not bound it. */
  gnutls_handshake_set_timeout(
      s->gs, timeout_ms ? timeout_ms : GNUTLS_DEFAULT_HANDSHAKE_TIMEOUT);
  return 0;
}

/* The handshake, repeated after signals and warning alerts.  GNUTLS_E_AGAIN
 * on a blocking socket is a send that hit the caller's socket timeout:
 * the time is up, as it is at GNUTLS_E_TIMEDOUT. */
static int handshake(struct tls_session *s) {
  int r;
  do
    r = gnutls_handshake(s->gs);
  while (r < 0 && r != GNUTLS_E_AGAIN && !gnutls_error_is_fatal(r));
  return r == GNUTLS_E_AGAIN ? GNUTLS_E_TIMEDOUT : r;
}

struct tls_session *tls_accept(struct tls_creds *cr, int fd, const char *who,
                               unsigned timeout_ms) {
  struct tls_session *s = calloc(1, sizeof *s);
  if (!s) {
    log_error("%s: TLS: out of memory", who);
    errno = EPROTO;
    return NULL;
  }
  snprintf(s->who, sizeof s->who, "%s", who);
  s->cr = tls_creds_ref(cr);
  int r = setup(cr, s, fd, timeout_ms);
  if (r < 0) {
    log_error("%s: cannot set up a TLS session: %s", who, gnutls_strerror(r));
  } else {
    r = handshake(s);
    if (r == 0) {
      log_peer(s);
      return s;
    }
    if (r != GNUTLS_E_TIMEDOUT) /* the caller says that one */
      log_handshake_failure(s, r);
  }
  if (s->gs)
    gnutls_deinit(s->gs);
  tls_creds_put(s->cr);
  free(s);
  errno = r == GNUTLS_E_TIMEDOUT ? ETIMEDOUT : EPROTO;
  return NULL;
}

/* GnuTLS results as recv()/send() results with errno. */
static ssize_t io_result(struct tls_session *s, ssize_t r, const char *what) {
  if (r >= 0)
    return r;
  if (r == GNUTLS_E_AGAIN) {
    errno = EAGAIN;
    return -1;
  }
  if (r == GNUTLS_E_PREMATURE_TERMINATION)
    return 0; /* the client left without close_notify: plain EOF to us */
  if (r == GNUTLS_E_INTERRUPTED || !gnutls_error_is_fatal((int)r)) {
    errno = EINTR; /* warnings (an alert, a renegotiation request): retry */
    return -1;
  }
  log_info("%s: TLS %s failed: %s", s->who, what, gnutls_strerror((int)r));
  errno = EIO;
  return -1;
}

ssize_t tls_recv(struct tls_session *s, void *buf, size_t len) {
  return io_result(s, gnutls_record_recv(s->gs, buf, len), "receive");
}

ssize_t tls_send(struct tls_session *s, const void *buf, size_t len) {
  if (len > TLS_RECORD_MAX)
    len = TLS_RECORD_MAX;
  return io_result(s, gnutls_record_send(s->gs, buf, len), "send");
}

size_t tls_pending(struct tls_session *s) {
  return gnutls_record_check_pending(s->gs);
}

void tls_close(struct tls_session *s) {
  if (!s)
    return;
  gnutls_bye(s->gs, GNUTLS_SHUT_WR); /* best effort: the peer may be gone */
  gnutls_deinit(s->gs);
  tls_creds_put(s->cr);
  free(s);
}
