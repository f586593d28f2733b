#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/io/safetensors.h"
#include "engine/model_writer.h"
#include "tests/test_support.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// Writes a safetensors file byte by byte: the 8-byte length (the header's
// own length unless `declared_length` overrides it), the header text, then
// `data` (zero bytes of `data_size` when `data` is empty).
void write_raw(const fs::path& path, const std::string& header, size_t data_size,
               uint64_t declared_length = UINT64_MAX, std::string data = {}) {
  if (declared_length == UINT64_MAX) declared_length = header.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(declared_length >> (8 * i)));
  out << header;
  if (data.empty()) data.assign(data_size, '\0');
  out << data;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Value i of a test tensor: multiples of 1/4 in [-8, 20), exact in F32, F16
// and BF16, different between tensors 0 to 3.
float test_value(size_t tensor, int64_t i) {
  return static_cast<float>(tensor * 4) + static_cast<float>(i % 64) * 0.25f - 8.0f;
}

void fill_test_values(size_t tensor, int64_t offset, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = test_value(tensor, offset + i);
}

void expect_test_values(const std::vector<float>& values, size_t tensor) {
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(values[i], test_value(tensor, static_cast<int64_t>(i))) << "element " << i;
  }
}

using Safetensors = TempDirTest;

// --- Round trips -------------------------------------------------------------

TEST_F(Safetensors, RoundTripAllDtypesWithMetadata) {
  const std::vector<TensorSpec> specs = {{"z.f32", DType::kF32, {3, 5}},
                                         {"a.f16", DType::kF16, {7}},
                                         {"m.bf16", DType::kBF16, {2, 3, 4}},
                                         {"empty", DType::kF16, {0, 4}}};
  write_safetensors(dir_ / "model.safetensors", specs, fill_test_values, {{"format", "pt"}});

  std::ifstream in(dir_ / "model.safetensors", std::ios::binary);
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), 8);
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  EXPECT_EQ(header_length % 8, 0u);
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"z.f32\":", 0), 0u) << header;
  EXPECT_LT(header.find("a.f16"), header.find("m.bf16"));  // keys in the order given

  SafetensorsFile file(dir_ / "model.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const TensorStore store(dir_);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a.f16", "empty", "m.bf16", "z.f32"}));
  for (size_t t = 0; t < specs.size(); ++t) {
    const TensorInfo& info = store.info(specs[t].name);
    EXPECT_EQ(info.dtype, specs[t].dtype);
    EXPECT_EQ(info.shape, specs[t].shape);
    expect_test_values(store.read_all(specs[t].name), t);
  }
  EXPECT_EQ(store.info("empty").nbytes(), 0u);
  EXPECT_EQ(store.bytes_read(), 15u * 4 + 7 * 2 + 24 * 2);
  const uint8_t* raw = store.raw("z.f32");
  float first;
  std::memcpy(&first, raw, 4);
  EXPECT_EQ(first, test_value(0, 0));
}

TEST_F(Safetensors, WriterStreamsChunksOfAtMostOneMebiElement) {
  const int64_t numel = (int64_t{1} << 20) + 3;
  int64_t next_offset = 0;
  int calls = 0;
  auto fill = [&](size_t tensor, int64_t offset, int64_t count, float* out) {
    EXPECT_EQ(offset, next_offset);
    EXPECT_LE(count, int64_t{1} << 20);
    next_offset += count;
    ++calls;
    fill_test_values(tensor, offset, count, out);
  };
  write_safetensors(dir_ / "model.safetensors", {{"big", DType::kBF16, {numel}}}, fill);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(next_offset, numel);
  EXPECT_FALSE(fs::exists(dir_ / ("model.safetensors.tmp." + std::to_string(::getpid()))));
  const TensorStore store(dir_);
  expect_test_values(store.read_all("big"), 0);
}

TEST_F(Safetensors, FailedWriteLeavesNoFileBehind) {
  auto failing_fill = [](size_t, int64_t, int64_t, float*) {
    throw Error(ErrorKind::kInternal, "fill failed");
  };
  EXPECT_THROW(write_safetensors(dir_ / "out.safetensors", {{"w", DType::kF32, {4}}}, failing_fill),
               Error);
  EXPECT_TRUE(fs::is_empty(dir_));
  expect_error(
      [&] {
        write_safetensors(dir_ / "absent" / "out.safetensors", {{"w", DType::kF32, {4}}},
                          fill_test_values);
      },
      ErrorKind::kIo, {"cannot write", "out.safetensors"});
  expect_error(
      [&] {
        write_safetensors(dir_ / "out.safetensors",
                          {{"w", DType::kF32, {4}}, {"w", DType::kF16, {1}}}, fill_test_values);
      },
      ErrorKind::kInvalidArgument, {"duplicate", "'w'"});
}

TEST_F(Safetensors, ShardedIndexRoundTrip) {
  write_safetensors(dir_ / "model-00001-of-00002.safetensors",
                    {{"embed", DType::kBF16, {4, 8}}, {"norm", DType::kF32, {8}}},
                    fill_test_values);
  write_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"head", DType::kF16, {8, 4}}},
                    fill_test_values);
  write_bytes(dir_ / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 168},
    "weight_map": {"embed": "model-00001-of-00002.safetensors",
                   "norm": "model-00001-of-00002.safetensors",
                   "head": "./model-00002-of-00002.safetensors"}})");
  const TensorStore store(dir_);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"embed", "head", "norm"}));
  EXPECT_TRUE(store.has("head"));
  EXPECT_FALSE(store.has("missing"));
  expect_test_values(store.read_all("embed"), 0);
  expect_test_values(store.read_all("norm"), 1);
  expect_test_values(store.read_all("head"), 0);
}

// --- Reading blocks ------------------------------------------------------------

TEST_F(Safetensors, ReadBlockCopiesOnlyTheRequestedRowsAndColumns) {
  write_safetensors(dir_ / "model.safetensors",
                    {{"w", DType::kF16, {4, 2, 3}}, {"bias", DType::kF32, {5}}}, fill_test_values);
  const TensorStore store(dir_);  // "w" is viewed as [4, 6]
  auto value = [](int64_t row, int64_t col) { return test_value(0, row * 6 + col); };

  std::vector<float> rows(2 * 6);
  store.read_block("w", 1, 3, 0, 6, rows.data());
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(rows[r * 6 + c], value(1 + r, c));
  EXPECT_EQ(store.bytes_read(), 2u * 6 * 2);

  std::vector<float> cols(4 * 3);
  store.read_block("w", 0, 4, 2, 5, cols.data());
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(cols[r * 3 + c], value(r, 2 + c));
  EXPECT_EQ(store.bytes_read(), 2u * 6 * 2 + 4 * 3 * 2);

  std::vector<float> bias(3);  // a 1-D tensor is [5, 1]
  store.read_block("bias", 1, 4, 0, 1, bias.data());
  EXPECT_EQ(bias, (std::vector<float>{test_value(1, 1), test_value(1, 2), test_value(1, 3)}));
  EXPECT_EQ(store.bytes_read(), 2u * 6 * 2 + 4 * 3 * 2 + 3 * 4);

  float unused[8];
  expect_error([&] { store.read_block("w", 3, 5, 0, 6, unused); }, ErrorKind::kInvalidArgument,
               {"'w'", "rows"});
  expect_error([&] { store.read_block("w", 0, 1, 4, 7, unused); }, ErrorKind::kInvalidArgument,
               {"'w'", "columns"});
  expect_error([&] { store.read_block("bias", 0, 1, 0, 2, unused); }, ErrorKind::kInvalidArgument,
               {"'bias'", "columns"});
  EXPECT_EQ(store.bytes_read(), 2u * 6 * 2 + 4 * 3 * 2 + 3 * 4);
}

// Blocks read in another dtype: the checkpoint's own bytes when the dtypes
// agree (raw()), else each value rounded once (to nearest even), whole-row
// blocks (cut into chunks over the host threads) and column blocks alike.
TEST_F(Safetensors, ReadBlockInAnotherDtypeCopiesOrRoundsOnce) {
  const int64_t big_rows = 1100, big_cols = 1000;  // > one 1M-element chunk
  write_safetensors(dir_ / "model.safetensors",
                    {{"w16", DType::kBF16, {4, 6}}, {"w32", DType::kF32, {4, 6}},
                     {"big", DType::kF32, {big_rows, big_cols}}},
                    [](size_t tensor, int64_t offset, int64_t count, float* out) {
                      fill_test_values(tensor, offset, count, out);
                      if (tensor == 0) return;  // float32 values that 16 bits cannot hold
                      for (int64_t i = 0; i < count; ++i) out[i] += 1.0f / 3.0f + static_cast<float>(offset + i) * 1e-4f;
                    });
  const TensorStore store(dir_);
  std::vector<uint16_t> same(4 * 6);
  store.read_block("w16", 0, 4, 0, 6, DType::kBF16, same.data());
  EXPECT_EQ(std::memcmp(same.data(), store.raw("w16"), same.size() * 2), 0);

  const std::vector<float> w32 = store.read_all("w32");
  std::vector<uint16_t> rounded(4 * 3), want(4 * 3);
  store.read_block("w32", 0, 4, 1, 4, DType::kBF16, rounded.data());
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) want[r * 3 + c] = float_to_bf16(w32[r * 6 + 1 + c]);
  EXPECT_EQ(rounded, want);

  std::vector<uint16_t> as_f16(4 * 6);
  store.read_block("w16", 0, 4, 0, 6, DType::kF16, as_f16.data());
  const std::vector<float> w16 = store.read_all("w16");
  for (size_t i = 0; i < w16.size(); ++i) EXPECT_EQ(as_f16[i], float_to_f16(w16[i])) << i;

  const std::vector<float> big = store.read_all("big");
  std::vector<uint16_t> big_bf16(static_cast<size_t>(big_rows - 1) * big_cols);
  store.read_block("big", 1, big_rows, 0, big_cols, DType::kBF16, big_bf16.data());
  for (size_t i = 0; i < big_bf16.size(); ++i)
    ASSERT_EQ(big_bf16[i], float_to_bf16(big[i + big_cols])) << i;
}

TEST_F(Safetensors, ReadsDataSectionAtAnOddOffset) {
  // A valid file need not pad its header: here the data starts at an odd byte.
  std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  if (header.size() % 2 == 0) header += ' ';
  const std::string data = {'\x00', '\x3c', '\x00', '\xc0', '\x00', '\x00'};  // 1, -2, 0
  write_raw(dir_ / "model.safetensors", header, 0, UINT64_MAX, data);
  const TensorStore store(dir_);
  EXPECT_EQ(store.read_all("h"), (std::vector<float>{1.0f, -2.0f, 0.0f}));
}

TEST_F(Safetensors, AbsentTensorIsReportedWithTheFolder) {
  write_safetensors(dir_ / "model.safetensors", {{"w", DType::kF32, {1}}}, fill_test_values);
  const TensorStore store(dir_);
  expect_error([&] { store.info("nope"); }, ErrorKind::kModel,
               {"tensor 'nope' not found in", dir_.string()});
  expect_error([&] { store.raw("nope"); }, ErrorKind::kModel, {"'nope'", "not found"});
}

// --- Header validation -------------------------------------------------------

class SafetensorsValidation : public TempDirTest {
 protected:
  // Writes `header` with `data_size` data bytes and expects opening it to fail.
  void expect_rejected(const std::string& header, size_t data_size,
                       std::initializer_list<std::string> words) {
    write_raw(path(), header, data_size);
    expect_error([&] { SafetensorsFile file(path()); }, ErrorKind::kModel, words);
  }
  fs::path path() const { return dir_ / "model.safetensors"; }
};

TEST_F(SafetensorsValidation, AcceptsAMinimalValidFile) {
  write_raw(path(), R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  SafetensorsFile file(path());
  ASSERT_NE(file.find("x"), nullptr);
  EXPECT_EQ(file.find("x")->numel(), 2);
  EXPECT_EQ(file.find("y"), nullptr);
}

// 200000 tensors (a header of 13 MB) open: the duplicate-key check is one
// linear pass (a callback parse took ~6 s at 40000 and minutes at 200000).
TEST_F(SafetensorsValidation, TwoHundredThousandTensorsOpen) {
  std::string header = "{";
  for (int i = 0; i < 200000; ++i)
    header += fmt::format("{}\"t{}\":{{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]}}", i ? "," : "", i);
  write_raw(path(), header + "}", 0);
  SafetensorsFile file(path());
  ASSERT_NE(file.find("t199999"), nullptr);
  EXPECT_EQ(file.find("t199999")->numel(), 0);
}

TEST_F(SafetensorsValidation, FileSmallerThanEightBytes) {
  write_bytes(path(), "\x02\x00\x00");
  expect_error([&] { SafetensorsFile file(path()); }, ErrorKind::kModel,
               {"model.safetensors", "too small"});
}

TEST_F(SafetensorsValidation, HeaderLengthAboveTheLimit) {
  write_raw(path(), "{}", 0, 100'000'001);
  expect_error([&] { SafetensorsFile file(path()); }, ErrorKind::kModel, {"header too large"});
  write_raw(path(), "{}", 0, UINT64_MAX - 1);
  expect_error([&] { SafetensorsFile file(path()); }, ErrorKind::kModel, {"header too large"});
}

TEST_F(SafetensorsValidation, HeaderLengthPastTheEndOfTheFile) {
  write_raw(path(), "{}", 0, 3);
  expect_error([&] { SafetensorsFile file(path()); }, ErrorKind::kModel,
               {"header length 3", "past the end"});
}

TEST_F(SafetensorsValidation, HeaderNotJsonNotAnObjectOrNotUtf8) {
  expect_rejected("{\"x\": ", 0, {"not valid JSON"});
  expect_rejected("[1, 2]", 0, {"not a JSON object"});
  expect_rejected("{\"\xff\": 1}", 0, {"not valid UTF-8"});
  expect_rejected("{\"\xed\xa0\x80\": 1}", 0, {"not valid UTF-8"});  // a UTF-16 surrogate
  expect_rejected(std::string("{}\0\0", 4), 0, {"not valid JSON", "NUL"});
  expect_rejected(R"({"__metadata__":{"format":1}})", 0, {"__metadata__", "not a string"});
}

TEST_F(SafetensorsValidation, UnsupportedDtype) {
  expect_rejected(R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4,
                  {"'q'", "unsupported dtype 'I8'"});
  expect_rejected(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, {"'d'", "'F64'"});
}

TEST_F(SafetensorsValidation, NegativeOrNonIntegerShape) {
  expect_rejected(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0,
                  {"shape of tensor 'x'", "non-negative integers"});
  expect_rejected(R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
                  {"shape of tensor 'x'", "non-negative integers"});
  expect_rejected(R"({"x":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8,
                  {"shape of tensor 'x'"});
  // Like the reference (serde reading a usize), "-0" is zero and accepted.
  write_raw(path(), R"({"x":{"dtype":"F32","shape":[-0],"data_offsets":[0,-0]}})", 0);
  EXPECT_EQ(SafetensorsFile(path()).find("x")->numel(), 0);
}

TEST_F(SafetensorsValidation, SizeDoesNotMatchTheShape) {
  expect_rejected(R"({"x":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8,
                  {"'x'", "size mismatch"});
}

TEST_F(SafetensorsValidation, ShapeProductOverflows) {
  expect_rejected(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  8, {"'x'", "overflows"});
  // The element count fits in 64 bits, the byte count does not.
  expect_rejected(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
                  {"'x'", "overflows"});
}

TEST_F(SafetensorsValidation, OffsetsThatEndBeforeTheyBegin) {
  expect_rejected(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8,
                  {"'x'", "end before they begin"});
  expect_rejected(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
                  {"'x'", "data_offsets"});
}

TEST_F(SafetensorsValidation, OverlappingTensors) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                      "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12, {"'b'", "overlaps", "'a'"});
}

TEST_F(SafetensorsValidation, GapBetweenTensors) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                      "b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                  20, {"gap of 4 bytes", "'b'"});
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, {"gap", "'a'"});
}

TEST_F(SafetensorsValidation, TrailingBytesAfterTheLastTensor) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9,
                  {"1 trailing bytes"});
}

TEST_F(SafetensorsValidation, OffsetsOutOfBounds) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                  {"'a'", "out of bounds"});
}

TEST_F(SafetensorsValidation, DuplicateTensorName) {
  expect_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                      "w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  8, {"duplicate", "'w'"});
}

// --- Model folders -------------------------------------------------------------

using TensorStoreFolder = TempDirTest;

TEST_F(TensorStoreFolder, MissingFolder) {
  expect_error([&] { TensorStore store(dir_ / "absent"); }, ErrorKind::kIo,
               {"model folder not found", "absent"});
}

TEST_F(TensorStoreFolder, MissingModelSafetensors) {
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kIo,
               {"not found", (dir_ / "model.safetensors").string()});
}

TEST_F(TensorStoreFolder, IndexShardOutsideTheFolder) {
  const fs::path model = dir_ / "model";
  fs::create_directories(model);
  write_safetensors(dir_ / "outside.safetensors", {{"w", DType::kF32, {1}}}, fill_test_values);
  fs::create_symlink(dir_ / "outside.safetensors", model / "link.safetensors");
  for (const std::string& shard :
       {std::string("../outside.safetensors"), std::string("link.safetensors"),
        (dir_ / "outside.safetensors").string()}) {
    write_bytes(model / "model.safetensors.index.json",
                R"({"weight_map": {"w": ")" + shard + R"("}})");
    expect_error([&] { TensorStore store(model); }, ErrorKind::kModel, {shard, "outside"});
  }
}

TEST_F(TensorStoreFolder, IndexNamesATensorMissingFromItsShard) {
  write_safetensors(dir_ / "a.safetensors", {{"w", DType::kF32, {1}}}, fill_test_values);
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"w": "a.safetensors", "v": "a.safetensors"}})");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kModel,
               {"'v'", "missing", "a.safetensors"});
}

TEST_F(TensorStoreFolder, TensorInTwoShards) {
  write_safetensors(dir_ / "a.safetensors", {{"w", DType::kF32, {1}}, {"x", DType::kF32, {1}}},
                    fill_test_values);
  write_safetensors(dir_ / "b.safetensors", {{"w", DType::kF32, {1}}, {"y", DType::kF32, {1}}},
                    fill_test_values);
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"w": "a.safetensors", "x": "a.safetensors",
                                 "y": "b.safetensors"}})");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kModel,
               {"'w'", "two shards", "a.safetensors", "b.safetensors"});
  // The same tensor listed twice in the index is refused as well.
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kModel, {"duplicate", "'w'"});
}

// A shard name with a NUL (valid in JSON) is refused: open() would stop at
// the NUL and read another file than the one checked to lie in the folder.
// The message keeps its text past the NUL (written \x00).
TEST_F(TensorStoreFolder, ShardNameWithNulIsRefused) {
  write_safetensors(dir_ / "a.safetensors", {{"w", DType::kF32, {1}}}, fill_test_values);
  write_bytes(dir_ / "model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors\u0000/../../x"}})");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kModel,
               {"'a.safetensors\\x00/../../x'", "NUL byte", "model.safetensors.index.json"});
}

// A NUL inside a header string no longer cuts the error message short.
TEST_F(SafetensorsValidation, NulInADtypeIsNamedInFull) {
  expect_rejected(R"({"x":{"dtype":"F16\u0000","shape":[1],"data_offsets":[0,2]}})", 2,
                  {"'F16\\x00'", "(supported: F32, F16, BF16)"});
}

// A FIFO where a weights file goes is refused at once, not waited on for a
// writer that never comes (open() blocked before the regular-file check).
TEST_F(TensorStoreFolder, FifoWeightsAreRefusedNotWaitedOn) {
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors").c_str(), 0600), 0);
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kIo, {"model.safetensors", "not a regular file"});
  fs::remove(dir_ / "model.safetensors");
  write_bytes(dir_ / "model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors"}})");
  ASSERT_EQ(::mkfifo((dir_ / "a.safetensors").c_str(), 0600), 0);
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kIo, {"a.safetensors", "not a regular file"});
}

// A model.safetensors or index that is a link looping on itself is named as
// such, not reported as missing (nor, with the index, as "no index").
TEST_F(TensorStoreFolder, LoopingLinksAreNamed) {
  fs::create_symlink("model.safetensors", dir_ / "model.safetensors");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kIo,
               {"model.safetensors", "Too many levels of symbolic links"});
  fs::remove(dir_ / "model.safetensors");
  fs::create_symlink("model.safetensors.index.json", dir_ / "model.safetensors.index.json");
  expect_error([&] { TensorStore store(dir_); }, ErrorKind::kIo,
               {"model.safetensors.index.json", "Too many levels of symbolic links"});
}

// A random model generated in memory (bench --preset) holds exactly the
// values make-model writes: every tensor, whole and in a column block, in its
// own dtype and widened, with the same byte count read.
TEST_F(Safetensors, GeneratedModelEqualsTheWrittenOne) {
  ModelConfig shape = model_preset("tiny", Arch::kQwen3);
  shape.vocab_size = 300;
  MakeModelOptions o{.shape = shape, .dtype = DType::kBF16, .seed = 5, .out = dir_ / "m", .write_tokenizer = false};
  write_random_model(o);
  const TensorStore file(o.out);
  RandomModel m = random_model(shape, DType::kBF16, 5);
  EXPECT_EQ(m.config.summary(), load_model_config(o.out).summary());
  const TensorStore generated(std::move(m.tensors), "preset tiny");
  ASSERT_EQ(generated.names(), file.names());
  for (const std::string& name : file.names()) {
    const TensorInfo& t = file.info(name);
    EXPECT_EQ(generated.info(name).shape, t.shape) << name;
    EXPECT_EQ(generated.info(name).nbytes(), t.nbytes()) << name;
    const int64_t rows = t.shape[0], cols = t.numel() / rows;
    for (DType out : {DType::kBF16, DType::kF32}) {
      const int64_t c0 = cols > 2 ? 1 : 0, c1 = cols > 2 ? cols - 1 : cols;  // a column block where there are columns
      std::vector<uint8_t> a(static_cast<size_t>(rows * cols * 4)), b(a.size());
      const uint64_t before = generated.bytes_read();
      generated.read_block(name, 0, rows, c0, c1, out, a.data());
      file.read_block(name, 0, rows, c0, c1, out, b.data());
      EXPECT_EQ(a, b) << name << " as " << dtype_name(out);
      EXPECT_EQ(generated.bytes_read() - before, static_cast<uint64_t>(rows * (c1 - c0) * 2)) << name;
    }
  }
  expect_error([&] { generated.raw("model.norm.weight"); }, ErrorKind::kInternal, {"model.norm.weight", "generated"});
}

}  // namespace
}  // namespace lockstep
