// The CPU backend's threads: its products and attention split their output
// rows over them (each output is computed by one thread exactly as with one,
// so results do not depend on the count). Without OpenMP in the build there
// is one.
#pragma once

namespace lockstep::cpu {

// n >= 1 threads for the CPU ops of this process.
void set_threads(int n);
int threads();

}  // namespace lockstep::cpu
