// The launcher of the `programs` set (bench/eval/programs.py): runs one
// unmodified program and reports its own resource use.
//
//   farmem_eval_runprog REPORT [--preload LIB] -- PROGRAM ARGS...
//
// Why a launcher: wait4's ru_maxrss survives execve, so a program forked
// straight from the (large) Python harness would report the harness's RSS
// as its peak. This process is small; the program is forked from it, so
// its ru_maxrss is its own. --preload sets LD_PRELOAD for the program only
// (not for this launcher). stdin, stdout and stderr are the program's.
//
// REPORT gets "pid N\n" as soon as the program runs (the harness finds its
// stats socket by that pid), then one JSON line when it ends:
//   {"status": S, "signal": N, "wall_s": ..., "user_s": ..., "sys_s": ...,
//    "maxrss_kib": ...}
// status is the exit status, or -1 with signal set when it was killed.
// SIGTERM/SIGINT/SIGHUP sent to the launcher are passed on to the program.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace {

volatile sig_atomic_t g_child = 0;

void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double tv_s(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
}

[[noreturn]] void usage() {
  fprintf(stderr, "usage: farmem_eval_runprog REPORT [--preload LIB] -- PROGRAM ARGS...\n");
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) usage();
  const char* report = argv[1];
  const char* preload = nullptr;
  int i = 2;
  if (strcmp(argv[i], "--preload") == 0) {
    if (i + 1 >= argc) usage();
    preload = argv[i + 1];
    i += 2;
  }
  if (i >= argc || strcmp(argv[i], "--") != 0 || i + 1 >= argc) usage();
  char** prog = argv + i + 1;

  FILE* rep = fopen(report, "w");
  if (rep == nullptr) {
    fprintf(stderr, "farmem_eval_runprog: %s: %s\n", report, strerror(errno));
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  const double t0 = now_s();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "farmem_eval_runprog: fork: %s\n", strerror(errno));
    return 2;
  }
  if (pid == 0) {
    if (preload != nullptr && setenv("LD_PRELOAD", preload, 1) != 0) _exit(127);
    execvp(prog[0], prog);
    fprintf(stderr, "farmem_eval_runprog: %s: %s\n", prog[0], strerror(errno));
    _exit(127);
  }
  g_child = pid;
  fprintf(rep, "pid %d\n", static_cast<int>(pid));
  fflush(rep);

  int status = 0;
  rusage ru;
  memset(&ru, 0, sizeof ru);
  for (;;) {
    pid_t w = wait4(pid, &status, 0, &ru);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      fprintf(stderr, "farmem_eval_runprog: wait4: %s\n", strerror(errno));
      return 2;
    }
  }
  const double wall = now_s() - t0;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  fprintf(rep,
          "{\"status\": %d, \"signal\": %d, \"wall_s\": %.6f, \"user_s\": %.6f, \"sys_s\": %.6f, "
          "\"maxrss_kib\": %ld}\n",
          code, sig, wall, tv_s(ru.ru_utime), tv_s(ru.ru_stime), ru.ru_maxrss);
  fclose(rep);
  return code >= 0 ? code : 128 + sig;
}
