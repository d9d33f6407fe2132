/*
 * What one thread waking another costs on this machine, without Ruby (docs/log.md, "8 threads against one,
 * third pass"): 8 pthreads pass a baton round a ring, each waiting on a condition variable of its own and
 * signalling the next (fsync: :always's chain of hand-offs after a sync does the same under the GVL).
 * WORK_US: busy work after each signal, like an appender's own Ruby between two records.
 *
 *   cc -O2 -pthread -o /tmp/wake_ring bench/support/wake_ring.c
 *   /tmp/wake_ring HOPS WORK_US               # e.g. /tmp/wake_ring 20000 0; taskset -c 0 /tmp/wake_ring 20000 0
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RING 8
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_of[RING];
static int turn;
static long hops, total;
static int work_us;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void *member(void *arg) {
  int me = (int)(long)arg;
  pthread_mutex_lock(&lock);
  while (hops < total) {
    while (turn != me && hops < total) pthread_cond_wait(&turn_of[me], &lock);
    if (hops >= total) break;
    hops++;
    turn = (me + 1) % RING;
    pthread_cond_signal(&turn_of[turn]);
    if (work_us) {
      pthread_mutex_unlock(&lock);
      double until = now_us() + work_us;
      while (now_us() < until) {}
      pthread_mutex_lock(&lock);
    }
  }
  for (int i = 0; i < RING; i++) pthread_cond_signal(&turn_of[i]);
  pthread_mutex_unlock(&lock);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s HOPS WORK_US\n", argv[0]); return 2; }
  total = atol(argv[1]);
  work_us = atoi(argv[2]);
  pthread_t t[RING];
  for (int i = 0; i < RING; i++) pthread_cond_init(&turn_of[i], NULL);
  double started = now_us();
  for (long i = 0; i < RING; i++) pthread_create(&t[i], NULL, member, (void *)i);
  for (int i = 0; i < RING; i++) pthread_join(t[i], NULL);
  printf("ring of %d threads, %d us of work after each signal: %.1f us a hop\n", RING, work_us, (now_us() - started) / total);
  return 0;
}
