// Tokenizer encode throughput, single-threaded.
//
//   tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]
//
// Prints the load time, the first encode (empty word cache) and the median of
// REPEATS further encodes (default 20) of the whole file, in MB/s (10^6 bytes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 20;
  std::ifstream in(argv[2], std::ios::binary);
  LS_REQUIRE(in.good(), lockstep::ErrorKind::kIo, "cannot open {}", argv[2]);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const double mb = static_cast<double>(text.size()) / 1e6;

  Clock::time_point t0 = Clock::now();
  lockstep::Tokenizer tok = lockstep::Tokenizer::load(argv[1]);
  double load_s = seconds_since(t0);

  t0 = Clock::now();
  size_t n_ids = tok.encode(text).size();
  double first_s = seconds_since(t0);

  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    t0 = Clock::now();
    n_ids = tok.encode(text).size();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  double median_s = times[times.size() / 2];
  std::printf("tokenizer %s\ntext %s: %zu bytes, %zu ids\n", argv[1], argv[2], text.size(), n_ids);
  std::printf("load %.3f s\nfirst encode %.2f MB/s (%.4f s)\n", load_s, mb / first_s, first_s);
  std::printf("median of %d encodes %.2f MB/s (%.4f s), best %.2f MB/s\n", repeats, mb / median_s,
              median_s, mb / times.front());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
}
