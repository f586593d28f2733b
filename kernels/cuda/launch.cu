// The process-wide launch setting declared in check.h.
#include "kernels/cuda/check.h"

namespace lockstep::cuda {

namespace {
bool g_overlapped_launches = true;
}  // namespace

void set_overlapped_launches(bool on) { g_overlapped_launches = on; }
bool overlapped_launches() { return g_overlapped_launches; }

}  // namespace lockstep::cuda
