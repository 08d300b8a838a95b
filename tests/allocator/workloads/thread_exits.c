/* Threads of a program under the preload library end in every way glibc
 * offers while their data is far: a return, pthread_exit(), cancellation
 * at a cancellation point, and detached threads that return or call
 * pthread_exit(). Each thread fills and checks its own 2 MiB of heap (16
 * threads, 32 MiB in all, far above the budget). The preload library wraps
 * every thread the program starts (preload/shim.cc, app_thread_main); a
 * forced unwind through it once aborted the program. Prints what it saw;
 * the output must be identical with and without the library. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kThreads = 16, kBytes = 2 << 20 };

struct Job {
  int id;
  uint64_t* mem;
  uint64_t sum;
  pthread_mutex_t* mu;
  pthread_cond_t* cv;
  int* started;
};

static uint64_t fill_and_sum(struct Job* j, int rounds) {
  uint64_t sum = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < kBytes / 8; ++i) j->mem[i] = (uint64_t)j->id * 1000003u + i * 7 + r;
    for (size_t i = 0; i < kBytes / 8; ++i) sum += j->mem[i];
  }
  return sum;
}

/* Counts the thread in for main, which waits for them all. */
static void tell_main(struct Job* j) {
  pthread_mutex_lock(j->mu);
  ++*j->started;
  pthread_cond_broadcast(j->cv);
  pthread_mutex_unlock(j->mu);
}

static void* returns(void* p) {
  struct Job* j = p;
  j->sum = fill_and_sum(j, 2);
  return j;
}

static void* exits(void* p) {
  struct Job* j = p;
  j->sum = fill_and_sum(j, 2);
  pthread_exit(j);
  return NULL;
}

static void* waits_to_be_cancelled(void* p) {
  struct Job* j = p;
  j->sum = fill_and_sum(j, 2);
  tell_main(j);
  for (;;) pause(); /* a cancellation point */
  return NULL;
}

static void* detached(void* p) {
  struct Job* j = p;
  j->sum = fill_and_sum(j, 1);
  tell_main(j);
  if (j->id % 2) pthread_exit(NULL);
  return NULL;
}

int main(void) {
  static struct Job jobs[kThreads];
  pthread_t t[kThreads];
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  int cancelled_ready = 0, detached_done = 0;
  for (int i = 0; i < kThreads; ++i) {
    jobs[i].id = i;
    jobs[i].mem = malloc(kBytes);
    if (jobs[i].mem == NULL) return 2;
    jobs[i].mu = &mu;
    jobs[i].cv = &cv;
    jobs[i].started = i < 8 ? &cancelled_ready : &detached_done;
  }
  /* 0-3 return, 4-5 pthread_exit, 6-7 cancelled, 8-15 detached. */
  for (int round = 0; round < 3; ++round) {
    cancelled_ready = detached_done = 0;
    for (int i = 0; i < kThreads; ++i) {
      void* (*fn)(void*) = i < 4   ? returns
                           : i < 6 ? exits
                           : i < 8 ? waits_to_be_cancelled
                                   : detached;
      if (pthread_create(&t[i], NULL, fn, &jobs[i]) != 0) return 3;
      if (i >= 8) pthread_detach(t[i]);
    }
    pthread_mutex_lock(&mu);
    while (cancelled_ready < 2 || detached_done < 8) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    for (int i = 6; i < 8; ++i) pthread_cancel(t[i]);
    for (int i = 0; i < 8; ++i) {
      void* ret = NULL;
      if (pthread_join(t[i], &ret) != 0) return 4;
      const char* how = i < 4 ? "returned" : i < 6 ? "exited" : "cancelled";
      int ok = i < 6 ? ret == &jobs[i] : ret == PTHREAD_CANCELED;
      printf("round %d thread %d %s %s sum %llu\n", round, i, how, ok ? "ok" : "WRONG",
             (unsigned long long)jobs[i].sum);
    }
    for (int i = 8; i < kThreads; ++i)
      printf("round %d detached thread %d sum %llu\n", round, i, (unsigned long long)jobs[i].sum);
  }
  for (int i = 0; i < kThreads; ++i) free(jobs[i].mem);
  return 0;
}
