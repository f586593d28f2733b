#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/io/npy.h"
#include "tests/test_support.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes an .npy file of the given version around a header dict and raw data.
void write_npy_raw(const fs::path& path, int major, const std::string& dict,
                   const std::string& data) {
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const size_t length_width = major == 1 ? 2 : 4;
  for (size_t i = 0; i < length_width; ++i) bytes += static_cast<char>(dict.size() >> (8 * i));
  std::ofstream(path, std::ios::binary) << bytes << dict << data;
}

template <typename T>
std::string raw_values(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

using Npy = TempDirTest;

TEST_F(Npy, WriteReadRoundTripWithAlignedHeader) {
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f};
  write_npy_f32(dir_ / "a.npy", {2, 3}, values.data());

  const std::string bytes = read_bytes(dir_ / "a.npy");
  ASSERT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_length = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  const size_t data_begin = 10 + header_length;
  EXPECT_EQ(data_begin % 64, 0u);
  EXPECT_EQ(bytes[data_begin - 1], '\n');
  EXPECT_EQ(bytes.substr(10, 44), "{'descr': '<f4', 'fortran_order': False, 'sh");
  EXPECT_NE(bytes.find("'shape': (2, 3), }"), std::string::npos);
  EXPECT_EQ(bytes.size(), data_begin + values.size() * 4);

  const NpyArray array = read_npy(dir_ / "a.npy");
  EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(array.values.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(array.values[i], values[i]);
}

TEST_F(Npy, RoundTripOneDimensionalAndScalarShapes) {
  const std::vector<float> values = {4.0f, 5.0f, 6.0f};
  write_npy_f32(dir_ / "v.npy", {3}, values.data());
  EXPECT_NE(read_bytes(dir_ / "v.npy").find("'shape': (3,), }"), std::string::npos);
  EXPECT_EQ(read_npy(dir_ / "v.npy").values, (std::vector<double>{4.0, 5.0, 6.0}));

  write_npy_f32(dir_ / "s.npy", {}, values.data());
  const NpyArray scalar = read_npy(dir_ / "s.npy");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.values, (std::vector<double>{4.0}));

  write_npy_f32(dir_ / "e.npy", {0, 5}, nullptr);
  const NpyArray empty = read_npy(dir_ / "e.npy");
  EXPECT_EQ(empty.shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(empty.values.empty());
}

TEST_F(Npy, ReadsVersionsTwoAndThreeAndEveryDtype) {
  write_npy_raw(dir_ / "f8.npy", 2, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n",
                raw_values<double>({0.1, -1e300}));
  EXPECT_EQ(read_npy(dir_ / "f8.npy").values, (std::vector<double>{0.1, -1e300}));

  write_npy_raw(dir_ / "i4.npy", 3,
                "{\"shape\": (1, 2), \"descr\": \"<i4\", \"fortran_order\": False}\n",
                raw_values<int32_t>({-5, 2147483647}));
  const NpyArray i4 = read_npy(dir_ / "i4.npy");
  EXPECT_EQ(i4.shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(i4.values, (std::vector<double>{-5.0, 2147483647.0}));

  write_npy_raw(dir_ / "i8.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }  \n",
                raw_values<int64_t>({1, -2, int64_t{1} << 40}));
  EXPECT_EQ(read_npy(dir_ / "i8.npy").values, (std::vector<double>{1.0, -2.0, 1099511627776.0}));
}

TEST_F(Npy, RejectsUnsupportedOrMalformedFiles) {
  const fs::path path = dir_ / "bad.npy";
  const std::string four_floats = raw_values<float>({1, 2, 3, 4});

  write_npy_raw(path, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n",
                four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument, {"bad.npy", "Fortran"});

  write_npy_raw(path, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }\n",
                four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument,
               {"bad.npy", "unsupported dtype '>f4'"});

  write_npy_raw(path, 4, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n",
                four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument,
               {"unsupported .npy version 4.0"});

  write_npy_raw(path, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }\n",
                four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument, {"needs 20 data bytes", "16"});

  write_npy_raw(path, 1, "{'descr': '<f4', 'fortran_order': False}\n", four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument, {"malformed", "'shape'"});

  write_npy_raw(path, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }\n",
                four_floats);
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument, {"malformed", "non-negative"});

  std::ofstream(path, std::ios::binary) << "PK\x03\x04 not an npy file";
  expect_error([&] { read_npy(path); }, ErrorKind::kInvalidArgument, {"bad.npy", "bad magic"});

  expect_error([&] { read_npy(dir_ / "absent.npy"); }, ErrorKind::kIo, {"absent.npy"});
}

TEST_F(Npy, WriteToAnUnwritablePathFails) {
  const float value = 1.0f;
  expect_error([&] { write_npy_f32(dir_ / "no" / "such" / "dir.npy", {1}, &value); },
               ErrorKind::kIo, {"cannot create", "dir.npy"});
  expect_error([&] { write_npy_f32(dir_ / "neg.npy", {-1}, &value); }, ErrorKind::kInvalidArgument,
               {"negative"});
}

}  // namespace
}  // namespace lockstep
