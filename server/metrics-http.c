/* SPDX-License-Identifier: BSD-3-Clause */
/* The metrics listener: a thread of its own running one poll() loop over
 * non-blocking sockets, answering GET /metrics once per connection
 * (HTTP/1.0 style).  It shares nothing with the NBD server but the
 * counters.  Every client is bounded: its request head in size
 * (METRICS_HTTP_MAX), its whole exchange in time (METRICS_HTTP_CLIENT_MS),
 * and the clients in number (METRICS_HTTP_CLIENTS; a new one beyond that
 * closes the oldest that has not finished its request), so an idle, slow
 * or hostile client costs a slot, never another client's scrape. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/blockdev.h"
#include "core/log.h"
#include "metrics.h"

#define DRAIN_MS 1000 /* after the reply, for the client to close first */
#define PAUSE_MS 100  /* no accept after running out of descriptors */

enum client_state {
  READING,  /* the request head */
  WRITING,  /* the reply, maybe in several sends */
  DRAINING, /* replied and shut down for writing: wait for the client's
             * end, so that unread input does not turn our close into a
             * reset that could destroy the reply */
};

struct client {
  int fd;
  enum client_state state;
  int64_t since, deadline; /* ms, monotonic */
  size_t rlen;
  char req[METRICS_HTTP_MAX];
  char *out; /* the reply */
  size_t olen, osent;
};

struct metrics_http {
  int lfd, stopfd;
  struct metrics *m;
  pthread_t thread;
  char *page; /* reused between scrapes */
  size_t pagecap;
  int64_t paused_until; /* ms: accept nothing before */
  size_t nclients;
  struct client clients[METRICS_HTTP_CLIENTS];
  struct pollfd pfd[2 + METRICS_HTTP_CLIENTS];
};
bool metrics_http_parse_addr(const char *text, char *host, size_t hostlen,
                             char *port, size_t portlen) {
  const char *colon, *h = text;
  size_t hl;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':')
      return false;
    h = text + 1;
    hl = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon || memchr(text, ':', (size_t)(colon - text)))
      return false; /* IPv6 needs brackets */
    hl = (size_t)(colon - text);
  }
  const char *p = colon + 1;
  size_t pl = strlen(p);
  if (hl == 0 || hl >= hostlen || pl == 0 || pl >= portlen ||
      strspn(p, "0123456789") != pl || atoi(p) < 1 || atoi(p) > 65535)
    return false;
  memcpy(host, h, hl);
  host[hl] = '\0';
  memcpy(port, p, pl + 1);
  return true;
}

static int listen_on(const char *text) {
  char host[256], port[8];
  if (!metrics_http_parse_addr(text, host, sizeof host, port, sizeof port)) {
    bd_set_error("--metrics %s: expected ADDR:PORT or [ADDR]:PORT", text);
    return -EINVAL;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int r = getaddrinfo(host, port, &hints, &res);
  if (r != 0) {
    bd_set_error("--metrics %s: %s", text, gai_strerror(r));
    return -EINVAL;
  }
  int fd =
          socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
      one = 1;
  if (fd >= 0)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 ||
      listen(fd, METRICS_HTTP_CLIENTS) < 0) {
    int e = errno;
    bd_set_error("--metrics %s: %s", text, strerror(e));
    if (fd >= 0)
      close(fd);
    fd = -e;
  }
  freeaddrinfo(res);
  return fd;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Render the metrics into h->page, growing it as needed. */
static const char *render_page(struct metrics_http *h, size_t *len) {
  for (;;) {
    size_t need = metrics_render(h->m, h->page, h->pagecap);
    if (need < h->pagecap) {
      *len = need;
      return h->page;
    }
    char *p = realloc(h->page, need + 4096);
    if (!p)
      return NULL;
    h->page = p;
    h->pagecap = need + 4096;
  }
}

/* A reply of STATUS with the headers and BODY (LEN bytes), in a buffer of
 * its own for C.  False when out of memory. */
static bool set_reply(struct client *c, const char *status, const char *type,
                      const char *body, size_t len, bool head) {
  char hdr[256];
  int n = snprintf(hdr, sizeof hdr,
                   "HTTP/1.0 %s\r\nContent-Type: %s\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, type, len);
  size_t body_len = head ? 0 : len;
  c->out = malloc((size_t)n + body_len);
  if (!c->out)
    return false;
  memcpy(c->out, hdr, (size_t)n);
  memcpy(c->out + n, body, body_len);
  c->olen = (size_t)n + body_len;
  c->osent = 0;
  return true;
}

static bool set_status(struct client *c, const char *status) {
  char body[64];
  int n = snprintf(body, sizeof body, "%s\n", status);
  return set_reply(c, status, "text/plain", body, (size_t)n, false);
}

static const char *status_of(enum metrics_http_verdict v) {
  switch (v) {
  case METRICS_HTTP_NOT_FOUND: return "404 Not Found";
  case METRICS_HTTP_BAD_METHOD: return "405 Method Not Allowed";
  case METRICS_HTTP_TOO_LARGE: return "431 Request Header Fields Too Large";
  default: return "400 Bad Request";
  }
}

/* The reply to what C asked.  False when none can be made. */
static bool answer(struct metrics_http *h, struct client *c,
                   enum metrics_http_verdict v) {
  if (v != METRICS_HTTP_GET && v != METRICS_HTTP_HEAD)
    return set_status(c, status_of(v));
  size_t len;
  const char *page = render_page(h, &len);
  if (!page)
    return set_status(c, "500 Internal Server Error");
  return set_reply(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8",
                   page, len, v == METRICS_HTTP_HEAD);
}

static void drop(struct metrics_http *h, size_t i) {
  struct client *c = &h->clients[i];
  close(c->fd);
  free(c->out);
  h->nclients--;
  if (i != h->nclients)
    h->clients[i] = h->clients[h->nclients];
}

/* Send what the socket takes.  False when C is done with. */
static bool step_write(struct client *c) {
  while (c->osent < c->olen) {
    ssize_t n = send(c->fd, c->out + c->osent, c->olen - c->osent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return true;
    if (n <= 0)
      return false;
    c->osent += (size_t)n;
  }
  free(c->out);
  c->out = NULL;
  shutdown(c->fd, SHUT_WR);
  c->state = DRAINING;
  int64_t until = now_ms() + DRAIN_MS;
  if (until < c->deadline)
    c->deadline = until;
  return true;
}

/* Read what has come.  False when C is done with. */
static bool step_read(struct metrics_http *h, struct client *c) {
  char scratch[4096];
  bool draining = c->state == DRAINING;
  char *to = draining ? scratch : c->req + c->rlen;
  size_t room = draining ? sizeof scratch : sizeof c->req - c->rlen;
  ssize_t n = recv(c->fd, to, room, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return true;
  /* The client's end (before its whole head: no reply), an error, or
   * input after the reply, dropped. */
  if (n <= 0 || draining)
    return n > 0;
  c->rlen += (size_t)n;
  enum metrics_http_verdict v = metrics_http_parse(c->req, c->rlen);
  if (v == METRICS_HTTP_MORE)
    return true;
  if (!answer(h, c, v))
    return false;
  c->state = WRITING;
  return step_write(c);
}

/* Room for one more client: close the oldest one still reading its
 * request (idle, or too slow), if any. */
static bool make_room(struct metrics_http *h) {
  if (h->nclients < METRICS_HTTP_CLIENTS)
    return true;
  size_t oldest = SIZE_MAX;
  for (size_t i = 0; i < h->nclients; i++)
    if (h->clients[i].state == READING &&
        (oldest == SIZE_MAX || h->clients[i].since < h->clients[oldest].since))
      oldest = i;
  if (oldest == SIZE_MAX)
    return false;
  drop(h, oldest);
  return true;
}

static void accept_clients(struct metrics_http *h) {
  for (;;) {
    int fd = accept4(h->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      /* Out of descriptors, the listener stays readable: poll would
       * spin on it, so leave it alone for a moment. */
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM)
        h->paused_until = now_ms() + PAUSE_MS;
      return; /* or EAGAIN: all taken */
    }
    if (!make_room(h)) {
      close(fd); /* every client is being answered: this one must wait */
      continue;
    }
    struct client *c = &h->clients[h->nclients++];
    c->fd = fd;
    c->state = READING;
    c->since = now_ms();
    c->deadline = c->since + METRICS_HTTP_CLIENT_MS;
    c->rlen = 0;
    c->out = NULL;
  }
}

/* The pollfds of the listener and the clients; returns the poll timeout
 * (ms) until the nearest client deadline or the end of a pause, -1 for
 * none. */
static int prepare_poll(struct metrics_http *h, int64_t now) {
  h->pfd[0] = (struct pollfd){.fd = h->stopfd, .events = POLLIN};
  bool paused = now < h->paused_until;
  h->pfd[1] = (struct pollfd){.fd = paused ? -1 : h->lfd, .events = POLLIN};
  int64_t next = paused ? h->paused_until : -1;
  for (size_t i = 0; i < h->nclients; i++) {
    struct client *c = &h->clients[i];
    h->pfd[2 + i] = (struct pollfd){
        .fd = c->fd, .events = c->state == WRITING ? POLLOUT : POLLIN};
    if (next < 0 || c->deadline < next)
      next = c->deadline;
  }
  if (next < 0)
    return -1;
  return next > now ? (int)(next - now) : 0;
}

/* Serve the clients poll found ready; drop those done or out of time.
 * Backwards, as drop() moves the last client into the hole. */
static void serve_clients(struct metrics_http *h) {
  int64_t now = now_ms();
  for (size_t i = h->nclients; i-- > 0;) {
    struct client *c = &h->clients[i];
    short re = h->pfd[2 + i].revents;
    bool keep = true;
    if (re & (POLLIN | POLLERR | POLLHUP))
      keep = c->state == WRITING ? step_write(c) : step_read(h, c);
    else if (re & POLLOUT)
      keep = step_write(c);
    if (!keep || now >= c->deadline)
      drop(h, i);
  }
}

static void *http_main(void *arg) {
  struct metrics_http *h = arg;
  pthread_setname_np(pthread_self(), "bp-metrics");
  for (;;) {
    size_t n = h->nclients;
    int timeout = prepare_poll(h, now_ms());
    if (poll(h->pfd, 2 + n, timeout) < 0 && errno != EINTR)
      break;
    if (h->pfd[0].revents)
      break;
    serve_clients(h);
    if (h->pfd[1].revents & POLLIN)
      accept_clients(h);
  }
  while (h->nclients > 0)
    drop(h, h->nclients - 1);
  return NULL;
}

struct metrics_http *metrics_http_start(const char *text, struct metrics *m) {
  struct metrics_http *h = calloc(1, sizeof *h);
  if (!h) {
    bd_set_error("--metrics %s: %s", text, strerror(ENOMEM));
    return NULL;
  }
  h->m = m;
  h->lfd = -1;
  h->stopfd = eventfd(0, EFD_CLOEXEC);
  if (h->stopfd < 0)
    bd_set_error("--metrics %s: %s", text, strerror(errno));
  else if ((h->lfd = listen_on(text)) >= 0 &&
           pthread_create(&h->thread, NULL, http_main, h) != 0) {
    bd_set_error("--metrics %s: cannot start its thread", text);
    close(h->lfd);
    h->lfd = -1;
  }
  if (h->lfd < 0 || h->stopfd < 0) {
    if (h->lfd >= 0)
      close(h->lfd);
    if (h->stopfd >= 0)
      close(h->stopfd);
    free(h);
    return NULL;
  }
  log_info("metrics: http://%s/metrics", text);
  return h;
}

void metrics_http_stop(struct metrics_http *h) {
  if (!h)
    return;
  uint64_t one = 1;
  ssize_t r = write(h->stopfd, &one, sizeof one);
  (void)r;
  pthread_join(h->thread, NULL);
  close(h->lfd);
  close(h->stopfd);
  free(h->page);
  free(h);
}
