/* SPDX-License-Identifier: BSD-3-Clause */
/* TLS for the NBD server (GnuTLS): the server's credentials, and one
 * session per connection once a client asked for NBD_OPT_STARTTLS.  The
 * handshake state machine only decides; conn.c upgrades the socket through
 * these functions. */
#ifndef BLOCKPORT_TLS_H
#define BLOCKPORT_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct tls_creds;
struct tls_session;

/* Load X.509 credentials from CERTS_DIR (ca-cert.pem, server-cert.pem,
 * server-key.pem and an optional ca-crl.pem, laid out as QEMU and nbdkit
 * do; with VERIFY_PEER clients must present a certificate signed by
 * ca-cert.pem) and/or PSK keys from PSK_FILE (username:hexkey lines, as
 * psktool writes them; GnuTLS reads the file again at each handshake).
 * Either may be NULL, not both.  Returns them holding one reference, or
 * NULL with the reason in bd_errmsg(). */
struct tls_creds *tls_creds_load(const char *certs_dir, bool verify_peer,
                                 const char *psk_file);
/* References: a reload swaps the server's credentials while sessions
 * started with the old ones carry on; the last put frees them.  Both
 * accept NULL. */
struct tls_creds *tls_creds_ref(struct tls_creds *cr);
void tls_creds_put(struct tls_creds *cr);

/* Run the TLS handshake as the server on blocking socket FD, for at most
 * TIMEOUT_MS in all (0: GnuTLS's default, 40 s); the caller's socket
 * timeouts, if any, must not outlast it.  The session holds its own
 * reference to CR.  Returns the session, or NULL with errno ETIMEDOUT when
 * the time ran out, or EPROTO (logged, naming WHO) when the client failed
 * it: wrong key, untrusted certificate, not TLS at all. */
struct tls_session *tls_accept(struct tls_creds *cr, int fd, const char *who,
                               unsigned timeout_ms);

/* Like recv() and send() on the socket, with errno set on failure (EAGAIN
 * and EINTR on a non-blocking socket; EIO for a TLS error, logged).  A send
 * that fails with EAGAIN must be repeated with the same buffer and length.
 * Both may run at once from two threads, one reading and one writing. */
ssize_t tls_recv(struct tls_session *s, void *buf, size_t len);
ssize_t tls_send(struct tls_session *s, const void *buf, size_t len);
/* Decrypted bytes already buffered: poll() will not report them. */
size_t tls_pending(struct tls_session *s);
/* Send close_notify if the socket takes it, and free the session. */
void tls_close(struct tls_session *s);

/* The largest amount tls_send() sends in one record. */
#define TLS_RECORD_MAX 16384

#endif
