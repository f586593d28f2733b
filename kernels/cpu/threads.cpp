#include "kernels/cpu_threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/error.h"

namespace lockstep::cpu {

void set_threads(int n) {
  LS_REQUIRE(n >= 1, ErrorKind::kInvalidArgument, "CPU threads must be >= 1, got {}", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace lockstep::cpu
