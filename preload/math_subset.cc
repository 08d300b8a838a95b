// The preload library's own exp, log and round (preload/mathlite.h): the
// only libm functions it uses (jemalloc's profiling code), defined here
// hidden so that the library does not need libm.so.6 at all
// (tests/allocator/preload_needed.sh checks).
#include "preload/mathlite.h"

extern "C" {
double exp(double x);
double log(double x);
double round(double x);

double exp(double x) {
  return farmem::mathlite::exp(x);
}
double log(double x) {
  return farmem::mathlite::log(x);
}
double round(double x) {
  return farmem::mathlite::round(x);
}
}
