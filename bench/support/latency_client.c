/*
 * The measuring client of bench/http_latency_bench.rb, in C so that reading the replies costs the 2 shared
 * cores as little as possible and the figures are the server's, not a Ruby client's (the Ruby one,
 * bench/support/http_clients.rb, spent more CPU reading 1,000 sockets than the server spent writing them).
 * Same protocol and output as `ruby bench/support/http_clients.rb latency PORT CLIENTS ROUNDS`:
 *
 *   latency_client PORT CLIENTS ROUNDS
 *
 * publishes a warm-up message on /lat (POST /test/publish) for the current last id; then per round opens
 * CLIENTS connections, each sending one message_bus long poll (POST /message-bus/<id>/poll, Dont-Chunk,
 * form body "%2Flat=<last id>"), sleeps max(1.5 s, CLIENTS/2000 s) so that every poll parks, publishes one
 * message {"t": <CLOCK_REALTIME>} without waiting for its answer, and waits with epoll (one read per ready
 * socket per wakeup; one-shot, so a reply that comes in one piece costs one read(2) and no epoll_ctl). A reply
 * is complete when its body has content-length bytes (or ends with "]" without a content-length, or the
 * server closed the socket); its arrival is stamped with
 * CLOCK_REALTIME right after the read that completed it. Latency = arrival - the "t" found in the reply
 * (null when the reply did not carry the message). Prints one JSON array of latencies in seconds per round;
 * with LATENCY_STATS=1, then a line {"wait_cpu": s, "runq": s}: the client's CPU from the publish to the last reply,
 * and how long it waited for a CPU while runnable meanwhile (/proc/self/schedstat: the machine's other work).
 * Nothing is parsed or closed until every client has its reply (or 20 s passed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_S 20.0
#define EVENTS 4096
#define BUF 2048 /* bytes per connection to start with: a reply is ~300 */

typedef struct {
  int fd;
  char *buf;
  size_t len, cap;
  long content_length; /* -1: not known yet or absent */
  size_t body_at;      /* 0: head not complete yet */
  int done;
  int owned; /* buf was malloc'd for this connection (grown), not a slice of the round's arena */
  double arrived;
} conn_t;

static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds this (single-threaded) process has spent runnable but not running; -1 when unknown. */
static double runq_now(void) {
  FILE *f = fopen("/proc/self/schedstat", "r");
  unsigned long long run = 0, wait = 0;
  int got = f ? fscanf(f, "%llu %llu", &run, &wait) : 0;
  if (f) fclose(f);
  return got == 2 ? wait / 1e9 : -1;
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("write");
    }
    data += n;
    len -= n;
  }
}

/* Case-insensitive search for a header's value within the head (len bytes). */
static long header_long(const char *head, size_t len, const char *name) {
  size_t nlen = strlen(name);
  for (size_t i = 0; i + nlen < len; i++) {
    if ((i == 0 || head[i - 1] == '\n') && strncasecmp(head + i, name, nlen) == 0) {
      return strtol(head + i + nlen, NULL, 10);
    }
  }
  return -1;
}

/* Notes the end of the head once it is in; returns whether the reply is complete. */
static int complete(conn_t *c) {
  if (!c->body_at) {
    char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end) return 0;
    c->body_at = (size_t)(end - c->buf) + 4;
    c->content_length = header_long(c->buf, c->body_at, "content-length:");
  }
  size_t body = c->len - c->body_at;
  if (c->content_length >= 0) return body >= (size_t)c->content_length;
  return body > 0 && c->buf[c->len - 1] == ']';
}

/* One read; marks the connection done (and stamps it) when its reply is complete or the server closed it. */
static void on_readable(conn_t *c) {
  if (c->cap - c->len < 1024) {
    char *grown = malloc(c->cap * 4);
    if (!grown) die("malloc");
    memcpy(grown, c->buf, c->len);
    if (c->owned) free(c->buf);
    c->buf = grown;
    c->cap *= 4;
    c->owned = 1;
  }
  ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len - 1);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    c->len += n;
    c->buf[c->len] = '\0';
    if (!complete(c)) return;
  }
  c->arrived = now_real();
  c->done = 1;
}

/* The "t" of the reply's message (the only number after "t": in the body), or a negative value. */
static double sent_time(conn_t *c) {
  if (!c->body_at) return -1;
  char *t = strstr(c->buf + c->body_at, "\"t\":");
  return t ? strtod(t + 4, NULL) : -1;
}

/* "message_id":N in a /test/publish answer. */
static long message_id(const char *reply) {
  const char *m = strstr(reply, "\"message_id\":");
  return m ? strtol(m + 13, NULL, 10) : -1;
}

static long read_reply_id(int fd) {
  char buf[4096];
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += n;
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (body && strchr(body, '}')) break;
  }
  buf[len] = '\0';
  return message_id(buf);
}

/* Sends a publish on /lat, {"t": t} (or {"warmup": true} for t < 0); the answer is read later. */
static int send_publish(int port, double t) {
  char body[128], req[512];
  int blen = t < 0 ? snprintf(body, sizeof body, "{\"channel\":\"/lat\",\"data\":{\"warmup\":true}}")
                   : snprintf(body, sizeof body, "{\"channel\":\"/lat\",\"data\":{\"t\":%.6f}}", t);
  int rlen = snprintf(req, sizeof req,
    "POST /test/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    "Content-Length: %d\r\nConnection: close\r\n\r\n%s", blen, body);
  int fd = connect_to(port);
  write_all(fd, req, rlen);
  return fd;
}

static void send_poll(conn_t *c, int port, long last_id) {
  static const char hex[] = "0123456789abcdef";
  char id[33], body[64], req[512];
  for (int i = 0; i < 32; i++) id[i] = hex[random() & 15];
  id[32] = '\0';
  int blen = snprintf(body, sizeof body, "%%2Flat=%ld", last_id);
  int rlen = snprintf(req, sizeof req,
    "POST /message-bus/%s/poll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n"
    "Dont-Chunk: true\r\nX-Silence-Logger: true\r\n\r\n%s", id, blen, body);
  c->fd = connect_to(port);
  write_all(c->fd, req, rlen);
}

/* LATENCY_DEBUG=1: on stderr, when the server stamped the publish ("st") and when the first and last replies
 * came, all after the client's "t" (ms). */
static void debug(conn_t *conns, int clients) {
  double first = 1e18, last = 0, st = -1, t = -1;
  int shown = 0;
  for (int i = 0; i < clients; i++) {
    conn_t *c = &conns[i];
    if (c->done && sent_time(c) < 0 && shown++ < 2) fprintf(stderr, "reply without the message: %s\n", c->buf + c->body_at);
    if (!c->done || sent_time(c) < 0) continue;
    t = sent_time(c);
    char *s = strstr(c->buf + c->body_at, "\"st\":");
    if (s) st = strtod(s + 5, NULL);
    if (c->arrived < first) first = c->arrived;
    if (c->arrived > last) last = c->arrived;
  }
  fprintf(stderr, "t->st %.2f ms, t->first %.2f ms, t->last %.2f ms\n", (st - t) * 1e3, (first - t) * 1e3, (last - t) * 1e3);
}

static long round_trip(int port, int clients, long last_id) {
  conn_t *conns = calloc(clients, sizeof *conns);
  char *arena = malloc((size_t)clients * BUF);
  int ep = epoll_create1(0);
  if (!conns || !arena || ep < 0) die("setup");
  /* Touch every page of the reply buffers now: a fresh arena of CLIENTS x 2 KiB faults a page in on the first read
   * into it, and those faults (a third of the reading's CPU, perf) fell inside the measured window. */
  memset(arena, 0, (size_t)clients * BUF);
  for (int i = 0; i < clients; i++) {
    conn_t *c = &conns[i];
    c->cap = BUF;
    c->buf = arena + (size_t)i * BUF;
    c->content_length = -1;
    send_poll(c, port, last_id);
    /* One-shot: a socket reports once, then is re-armed only while its reply is incomplete (no DEL per reply). */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
  }
  double park = clients / 2000.0;
  usleep((useconds_t)((park > 1.5 ? park : 1.5) * 1e6)); /* let every poll reach the server and park */

  double runq_start = runq_now();
  double cpu_start = cpu_now();
  int publisher = send_publish(port, now_real());
  int done = 0;
  double deadline = now_mono() + DEADLINE_S;
  struct epoll_event events[EVENTS];
  while (done < clients) {
    int wait_ms = (int)((deadline - now_mono()) * 1000);
    if (wait_ms <= 0) break;
    int n = epoll_wait(ep, events, EVENTS, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      conn_t *c = events[i].data.ptr;
      on_readable(c);
      if (c->done) {
        done++;
      } else {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
      }
    }
  }
  double wait_cpu = cpu_now() - cpu_start;
  double runq = runq_now() - runq_start;
  long published = read_reply_id(publisher);
  close(publisher);

  printf("[");
  for (int i = 0; i < clients; i++) {
    conn_t *c = &conns[i];
    double t = c->done ? sent_time(c) : -1;
    if (i) putchar(',');
    if (t > 0) printf("%.6f", c->arrived - t);
    else printf("null");
    close(c->fd);
    if (c->owned) free(c->buf);
  }
  printf("]\n");
  if (getenv("LATENCY_STATS")) printf("{\"wait_cpu\":%.6f,\"runq\":%.6f}\n", wait_cpu, runq_start < 0 ? -1.0 : runq);
  fflush(stdout);
  if (getenv("LATENCY_DEBUG")) debug(conns, clients);
  close(ep);
  free(arena);
  free(conns);
  return published > 0 ? published : last_id;
}

static long warm_up(int port) {
  int fd = send_publish(port, -1);
  long id = read_reply_id(fd);
  close(fd);
  if (id < 0) {
    fprintf(stderr, "latency_client: the warm-up publish got no message_id\n");
    exit(1);
  }
  return id;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: latency_client PORT CLIENTS ROUNDS\n");
    return 2;
  }
  int port = atoi(argv[1]), clients = atoi(argv[2]), rounds = atoi(argv[3]);
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  srandom((unsigned)(now_real() * 1e6) ^ (unsigned)getpid());
  long last_id = warm_up(port);
  usleep(200000); /* worker processes learn of the warm-up through the log's wakeup: a poll for an id a worker
                     has not seen yet would be answered at once with a status, not parked */
  for (int r = 0; r < rounds; r++) last_id = round_trip(port, clients, last_id);
  return 0;
}
