// The one assertion the C++ tests use: report a failed condition and go on,
// so a run lists every failure; main() turns the count into the exit code.
#pragma once

#include <cstdio>

static int failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)
