/* SPDX-License-Identifier: BSD-3-Clause */
/* The metrics listener: a thread answering GET /metrics, one request per
 * connection (HTTP/1.0 style).  It shares nothing with the NBD server but
 * the counters, and bounds each client in size and time, so a slow or
 * hostile scraper can only delay other scrapes. */
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

#define REQ_MAX 4096   /* request line and headers */
#define CLIENT_MS 2000 /* a client's whole request and reply */

struct metrics_http {
  int lfd, stopfd;
  struct metrics *m;
  pthread_t thread;
  char *page; /* reused between scrapes */
  size_t pagecap;
};

bool metrics_parse_addr(const char *text, char *host, size_t hostlen,
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
  if (!metrics_parse_addr(text, host, sizeof host, port, sizeof port)) {
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
      listen(fd, 16) < 0) {
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

/* Wait until FD is ready for EVENTS, or DEADLINE (ms) passes. */
static bool wait_fd(int fd, short events, int64_t deadline) {
  int left = (int)(deadline - now_ms());
  if (left <= 0)
    return false;
  struct pollfd p = {.fd = fd, .events = events};
  return poll(&p, 1, left) > 0;
}

/* Read the request head into BUF.  Returns its length, 0 if the client
 * went away or was too slow, -1 if it is larger than the buffer. */
static int read_head(int fd, char *buf, size_t cap, int64_t deadline) {
  size_t len = 0;
  while (len + 1 < cap) {
    if (!wait_fd(fd, POLLIN, deadline))
      return 0;
    ssize_t n = recv(fd, buf + len, cap - 1 - len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (n <= 0)
      return 0;
    len += (size_t)n;
    buf[len] = '\0';
    if (memmem(buf, len, "\r\n\r\n", 4) || memmem(buf, len, "\n\n", 2))
      return (int)len;
  }
  return -1;
}

static void send_all(int fd, const char *p, size_t len, int64_t deadline) {
  while (len > 0 && wait_fd(fd, POLLOUT, deadline)) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (n <= 0)
      return;
    p += n;
    len -= (size_t)n;
  }
}

static void send_status(int fd, const char *status, int64_t deadline) {
  char msg[256];
  int n = snprintf(msg, sizeof msg,
                   "HTTP/1.0 %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                   status, strlen(status) + 1, status);
  send_all(fd, msg, (size_t)n, deadline);
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

static void send_metrics(struct metrics_http *h, int fd, bool head,
                         int64_t deadline) {
  size_t len;
  const char *page = render_page(h, &len);
  if (!page) {
    send_status(fd, "500 Internal Server Error", deadline);
    return;
  }
  char hdr[200];
  int n = snprintf(hdr, sizeof hdr,
                   "HTTP/1.0 200 OK\r\n"
                   "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   len);
  send_all(fd, hdr, (size_t)n, deadline);
  if (!head)
    send_all(fd, page, len, deadline);
}

/* "GET /metrics HTTP/1.1": the path may carry a query string. */
static void answer(struct metrics_http *h, int fd, char *req,
                   int64_t deadline) {
  char *sp1 = strchr(req, ' ');
  char *sp2 = sp1 ? strpbrk(sp1 + 1, " \r\n") : NULL;
  if (!sp1 || !sp2 || *sp2 != ' ' || strncmp(sp2 + 1, "HTTP/", 5) != 0) {
    send_status(fd, "400 Bad Request", deadline);
    return;
  }
  *sp1 = *sp2 = '\0';
  char *path = sp1 + 1, *q = strchr(path, '?');
  if (q)
    *q = '\0';
  bool get = !strcmp(req, "GET"), head = !strcmp(req, "HEAD");
  if (strcmp(path, "/metrics") != 0)
    send_status(fd, "404 Not Found", deadline);
  else if (!get && !head)
    send_status(fd, "405 Method Not Allowed", deadline);
  else
    send_metrics(h, fd, head, deadline);
}

static void serve_client(struct metrics_http *h, int fd) {
  char req[REQ_MAX];
  int64_t deadline = now_ms() + CLIENT_MS;
  int n = read_head(fd, req, sizeof req, deadline);
  if (n < 0)
    send_status(fd, "431 Request Header Fields Too Large", deadline);
  else if (n > 0 && memchr(req, '\0', (size_t)n))
    send_status(fd, "400 Bad Request", deadline);
  else if (n > 0)
    answer(h, fd, req, deadline);
  shutdown(fd, SHUT_WR);
  close(fd);
}

static void *http_main(void *arg) {
  struct metrics_http *h = arg;
  pthread_setname_np(pthread_self(), "bp-metrics");
  for (;;) {
    struct pollfd p[2] = {{.fd = h->lfd, .events = POLLIN},
                          {.fd = h->stopfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!(p[0].revents & POLLIN))
      continue;
    int fd = accept4(h->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
      serve_client(h, fd);
  }
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
