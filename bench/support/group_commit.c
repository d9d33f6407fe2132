/*
 * The ceiling for fsync: :always's group commit on this machine without Ruby's GVL (docs/log.md, "8 threads
 * against one, third pass"). THREADS pthreads each append a 90-byte record and wait until an fdatasync that
 * began after their record was written has returned; whoever finds no sync under way becomes the syncer,
 * waits up to GATHER_US for every thread to have queued (0: no wait), writes everything queued with one
 * write(2) and syncs it; finished waiters are woken by one broadcast (they run on every core at once).
 * Each round runs 1 thread, then THREADS threads, and prints both rates and their ratio.
 *
 *   cc -O2 -pthread -o /tmp/group_commit bench/support/group_commit.c
 *   /tmp/group_commit FILE ROUNDS GATHER_US [THREADS]    # e.g. /tmp/group_commit herald-gc.dat 3 500
 *   /tmp/group_commit FILE - GATHER_US                    # as a bench worker (bench/log_ab_bench.rb)
 *
 * As a worker it prints "ready", then answers each line "THREADS RECORDS" with one line of JSON:
 * [records/s, 0 objects, CPU us a record, syncs a record, us a sync, null, null, records a sync,
 *  voluntary and involuntary context switches a record] (the columns of log_ab_bench.rb's Ruby worker).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int fd, gather_us, threads, live, pending, syncing;
static long queued, synced, syncs, per_thread;
static double sync_seconds;
static char record[90 * 64];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* Waits (lock held) until every live thread has queued, or gather_us passed. */
static void gather(void) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += gather_us * 1000L;
  if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
  while (pending < live)
    if (pthread_cond_timedwait(&changed, &lock, &until)) break;
}

static void *publisher(void *arg) {
  (void)arg;
  for (long i = 0; i < per_thread; i++) {
    pthread_mutex_lock(&lock);
    long mine = ++queued;
    if (++pending >= live && syncing) pthread_cond_broadcast(&changed);
    while (synced < mine) {
      if (syncing) { pthread_cond_wait(&changed, &lock); continue; }
      syncing = 1;
      if (gather_us && threads > 1) gather();
      int batch = pending;
      long upto = queued;
      pending = 0;
      pthread_mutex_unlock(&lock);
      if (write(fd, record, 90 * (batch < 64 ? batch : 64)) < 0) { perror("write"); exit(1); }
      double started = now();
      if (fdatasync(fd)) { perror("fdatasync"); exit(1); }
      double took = now() - started;
      pthread_mutex_lock(&lock);
      sync_seconds += took;
      synced = upto;
      syncing = 0;
      syncs++;
      pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
  }
  pthread_mutex_lock(&lock);
  live--;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&lock);
  return NULL;
}

static double cpu_seconds(struct rusage *u) {
  return u->ru_utime.tv_sec + u->ru_utime.tv_usec / 1e6 + u->ru_stime.tv_sec + u->ru_stime.tv_usec / 1e6;
}

static double run(int n_threads, long records, int json) {
  pthread_t t[64];
  struct rusage before, after;
  threads = live = n_threads;
  per_thread = records / n_threads;
  queued = synced = syncs = 0;
  sync_seconds = 0;
  getrusage(RUSAGE_SELF, &before);
  double started = now();
  for (int i = 0; i < n_threads; i++) pthread_create(&t[i], NULL, publisher, NULL);
  for (int i = 0; i < n_threads; i++) pthread_join(t[i], NULL);
  double wall = now() - started;
  getrusage(RUSAGE_SELF, &after);
  long n = n_threads * per_thread;
  double rate = n / wall;
  if (json) {
    printf("[%.1f,0,%.2f,%.4f,%.1f,null,null,%.3f,%.3f,%.3f]\n", rate, (cpu_seconds(&after) - cpu_seconds(&before)) * 1e6 / n,
      (double)syncs / n, sync_seconds * 1e6 / syncs, (double)n / syncs, (double)(after.ru_nvcsw - before.ru_nvcsw) / n,
      (double)(after.ru_nivcsw - before.ru_nivcsw) / n);
    fflush(stdout);
    return rate;
  }
  printf("  %d threads: %.0f records/s, %.2f records a sync\n", n_threads, rate, (double)n_threads * per_thread / syncs);
  return rate;
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s FILE ROUNDS GATHER_US [THREADS]\n", argv[0]); return 2; }
  fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  if (fd < 0) { perror(argv[1]); return 1; }
  gather_us = atoi(argv[3]);
  if (strcmp(argv[2], "-") == 0) {
    int n_threads;
    long records;
    printf("ready\n");
    fflush(stdout);
    while (scanf("%d %ld", &n_threads, &records) == 2)
      if (n_threads >= 1 && n_threads <= 64 && records >= n_threads) run(n_threads, records, 1);
    unlink(argv[1]);
    return 0;
  }
  int rounds = atoi(argv[2]), n = argc > 4 ? atoi(argv[4]) : 8;
  if (n < 1 || n > 64) n = 8;
  for (int r = 0; r < rounds; r++) {
    double one = run(1, 600, 0), many = run(n, 3000, 0);
    printf("%d threads / 1 thread: %.2fx\n", n, many / one);
  }
  unlink(argv[1]);
  return 0;
}
