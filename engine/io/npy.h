// Minimal NumPy .npy reading and writing (little-endian float32 / int32 / int64, C order).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace lockstep {

void write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                   const float* data);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // converted from the file's dtype (<f4, <f8, <i4, <i8)
};
// Throws kIo / kInvalidArgument naming the file and the problem.
NpyArray read_npy(const std::filesystem::path& path);

}  // namespace lockstep
