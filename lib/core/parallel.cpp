// Thread-count control: OpenMP runs every parallel loop, OpenBLAS stays single-threaded inside them.
#include "core/parallel.h"

#include <cblas.h>

namespace gt {

void set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  // Our kernels split GEMMs across OpenMP threads themselves (ops/cpu/matmul.cpp); a second pool inside OpenBLAS
  // would fight them for the same cores.
  openblas_set_num_threads(1);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace gt
