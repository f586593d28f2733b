// Memory-mapped safetensors files (single file or sharded through
// model.safetensors.index.json), validated before any tensor byte is touched,
// and a streaming writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace lockstep {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offsets relative to the start of the data section
  uint64_t data_end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return data_end - data_begin; }
};

// One mapped .safetensors file. The constructor validates the whole header as
// the format's reference implementation does and throws kModel (naming the
// file and the problem) on: file < 8 bytes; header length > 100 MB or past the
// end of the file (checked arithmetic); header not UTF-8 / not a JSON object;
// unknown dtype; shape with negative dims or whose byte size overflows or
// differs from end - begin; offsets out of bounds, overlapping, with gaps, or
// not ending exactly at the end of the file; duplicate names.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // Pointer to the first byte of the tensor's data inside the mapping.
  const uint8_t* data(const TensorInfo& t) const { return data_section_ + t.data_begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void parse_header();  // validates and fills tensors_, index_, metadata_, data_section_

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// A tensor that a function produces instead of a file: fill(first, count,
// out) writes elements [first, first + count) as float32; the store rounds
// them to spec.dtype, as a file of that dtype would hold them.
struct GeneratedTensor {
  TensorSpec spec;
  std::function<void(int64_t, int64_t, float*)> fill;
};

// All tensors of a model folder: model.safetensors, or the shards listed by
// model.safetensors.index.json (every shard must lie inside the folder and its
// name hold no NUL byte; a FIFO or device is refused, not waited on; every
// tensor named by the index must be in the shard it names, and no tensor may
// appear twice across shards).
//
// Reads go through read_block(), which converts to float32 or another dtype
// and counts the bytes it copied out of the mapping (bytes_read()), so tests
// can prove a rank reads only its own share.
class TensorStore {
 public:
  explicit TensorStore(const std::filesystem::path& model_dir);
  // Tensors generated as they are read (a random-weight model with no
  // files); `origin` names them in errors. Reads count bytes as from a file
  // of the tensors' dtypes; raw() has no bytes to give.
  TensorStore(std::vector<GeneratedTensor> tensors, const std::string& origin);

  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws kModel naming the tensor
  std::vector<std::string> names() const;

  // Rows [row_begin, row_end) of a tensor viewed as [rows, cols] where rows is
  // shape[0] and cols the product of the rest; columns [col_begin, col_end).
  // Writes (row_end-row_begin) x (col_end-col_begin) float32 values to dst.
  void read_block(const std::string& name, int64_t row_begin, int64_t row_end, int64_t col_begin,
                  int64_t col_end, float* dst) const;
  // The same block as `out` elements: the checkpoint's bytes when the dtypes
  // agree, else converted through float32 (rounding to nearest even). Host
  // threads (OpenMP) share the rows. Not thread-safe (bytes_read()).
  void read_block(const std::string& name, int64_t row_begin, int64_t row_end, int64_t col_begin,
                  int64_t col_end, DType out, void* dst) const;
  // The whole tensor as float32.
  std::vector<float> read_all(const std::string& name) const;
  // Raw bytes of the whole tensor (its own dtype); not for generated tensors.
  const uint8_t* raw(const std::string& name) const;

  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Entry {
    const SafetensorsFile* file;         // null for a generated tensor
    const TensorInfo* info;
    const GeneratedTensor* generated;  // null for a tensor in a file
  };
  void read_generated(const Entry& e, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                      DType out, uint8_t* dst) const;
  const Entry& entry(const std::string& name) const;
  void open_shards(const std::filesystem::path& index);
  std::filesystem::path resolve_shard(const std::string& shard,
                                      const std::filesystem::path& index) const;
  void register_tensors(const SafetensorsFile& file);  // throws on a name already registered

  std::filesystem::path model_dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<GeneratedTensor> generated_;
  std::vector<TensorInfo> generated_info_;
  std::map<std::string, Entry> entries_;
  mutable uint64_t bytes_read_ = 0;
};

// Streams a safetensors file: the header is written from the declared tensors,
// then each tensor's bytes are produced in order by a callback, chunk by
// chunk, so a file far larger than memory can be written.

// fill(tensor_index, element_offset, count, float* out) must write `count`
// float32 values; the writer converts them to the tensor's dtype.
using TensorFill = std::function<void(size_t, int64_t, int64_t, float*)>;

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                       const TensorFill& fill,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace lockstep
