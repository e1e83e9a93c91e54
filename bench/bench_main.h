// The benchmarks' main: a config they cannot read, a missing data file or a failing run is one line on stderr and
// an exit code, as gputrain's own (2: config, 1: anything else), rather than an uncaught exception's abort.
#pragma once

#include "core/error.h"

#include <cstdio>
#include <exception>

namespace gt::bench {

template <class F>
int guarded_main(const char* name, F&& body) {
  try {
    return body();
  } catch (const gt::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return e.kind() == gt::ErrorKind::config ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace gt::bench
