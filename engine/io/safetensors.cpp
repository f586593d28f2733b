#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_set>

#include "common/error.h"
#include "common/file.h"
#include "common/json_sax.h"
#include "common/utf8.h"

namespace lockstep {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Limits taken from the format's reference implementation (Rust crate).
constexpr uint64_t kHeaderLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The writer asks its fill callback for at most this many elements at a time.
constexpr int64_t kWriteChunkElements = int64_t{1} << 20;

// A SAX pass over JSON text that fails on a syntax error, on an object that
// repeats a key (keeping only the keys of the objects still open) or on
// nesting past kMaxJsonDepth.
class DuplicateKeyCheck : public JsonSaxPass<json> {
 public:
  DuplicateKeyCheck(const std::string& file, const char* what) : file_(file), what_(what) {}
  bool on_start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    LS_REQUIRE(open_.back().insert(key).second, ErrorKind::kModel, "{}: duplicate key '{}'", file_, key);
    return true;
  }
  bool on_end_object() override {
    open_.pop_back();
    return true;
  }
  [[noreturn]] void too_deep() override {
    LS_FAIL(ErrorKind::kModel, "{}: {} nests values deeper than {} levels", file_, what_, kMaxJsonDepth);
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    LS_FAIL(ErrorKind::kModel, "{}: {} is not valid JSON: {}", file_, what_, e.what());
  }

 private:
  const std::string& file_;
  const char* what_;
  std::vector<std::unordered_set<std::string>> open_;
};

// Parses JSON text, failing on any object that repeats a key: nlohmann::json
// would silently keep the last one, which would hide a duplicated tensor.
// `what` names the text in errors ("header", "index").
json parse_json_rejecting_duplicate_keys(std::string_view text, const std::string& file, const char* what) {
  // nlohmann's lexer takes a NUL byte for the end of input and would accept
  // "{}\0garbage"; in valid JSON a raw NUL can appear nowhere, not even in strings.
  const size_t nul = text.find('\0');
  LS_REQUIRE(nul == std::string_view::npos, ErrorKind::kModel,
             "{}: {} is not valid JSON: NUL byte at offset {}", file, what, nul);
  DuplicateKeyCheck check(file, what);
  json::sax_parse(text.begin(), text.end(), &check);  // linear: a callback parse grew quadratic with the keys
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    LS_FAIL(ErrorKind::kModel, "{}: {} is not valid JSON: {}", file, what, e.what());
  }
}

// A JSON integer >= 0, read the way serde reads a usize: "-0" counts, 2.0 does not.
bool get_non_negative_integer(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() == 0) {
    *out = 0;
    return true;
  }
  return false;
}

bool checked_multiply(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

std::vector<int64_t> parse_shape(const json& entry, const std::string& name,
                                 const std::string& file) {
  const auto it = entry.find("shape");
  LS_REQUIRE(it != entry.end(), ErrorKind::kModel, "{}: tensor '{}' has no 'shape'", file, name);
  LS_REQUIRE(it->is_array(), ErrorKind::kModel,
             "{}: shape of tensor '{}' must be an array of non-negative integers, got {}", file,
             name, it->dump());
  std::vector<int64_t> shape;
  for (const json& dim : *it) {
    uint64_t value = 0;
    LS_REQUIRE(get_non_negative_integer(dim, &value), ErrorKind::kModel,
               "{}: shape of tensor '{}' must be an array of non-negative integers, got {}", file,
               name, it->dump());
    LS_REQUIRE(value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               ErrorKind::kModel, "{}: tensor '{}' has a dimension too large ({})", file, name,
               value);
    shape.push_back(static_cast<int64_t>(value));
  }
  return shape;
}

void parse_data_offsets(const json& entry, const std::string& file, TensorInfo* info) {
  const auto it = entry.find("data_offsets");
  LS_REQUIRE(it != entry.end(), ErrorKind::kModel, "{}: tensor '{}' has no 'data_offsets'", file,
             info->name);
  LS_REQUIRE(it->is_array() && it->size() == 2 &&
                 get_non_negative_integer((*it)[0], &info->data_begin) &&
                 get_non_negative_integer((*it)[1], &info->data_end),
             ErrorKind::kModel,
             "{}: data_offsets of tensor '{}' must be two non-negative integers, got {}", file,
             info->name, it->dump());
  LS_REQUIRE(info->data_begin <= info->data_end, ErrorKind::kModel,
             "{}: data_offsets [{}, {}] of tensor '{}' end before they begin", file,
             info->data_begin, info->data_end, info->name);
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, const std::string& file) {
  LS_REQUIRE(entry.is_object(), ErrorKind::kModel, "{}: entry of tensor '{}' is not a JSON object",
             file, name);
  TensorInfo info;
  info.name = name;
  const auto dtype = entry.find("dtype");
  LS_REQUIRE(dtype != entry.end(), ErrorKind::kModel, "{}: tensor '{}' has no 'dtype'", file, name);
  LS_REQUIRE(dtype->is_string(), ErrorKind::kModel, "{}: dtype of tensor '{}' is not a string",
             file, name);
  const auto& dtype_text = dtype->get_ref<const std::string&>();
  LS_REQUIRE(parse_safetensors_dtype(dtype_text, &info.dtype), ErrorKind::kModel,
             "{}: tensor '{}' has unsupported dtype '{}' (supported: F32, F16, BF16)", file, name,
             dtype_text);
  info.shape = parse_shape(entry, name, file);
  parse_data_offsets(entry, file, &info);

  uint64_t numel = 1;
  for (int64_t dim : info.shape) {
    LS_REQUIRE(checked_multiply(numel, static_cast<uint64_t>(dim), &numel), ErrorKind::kModel,
               "{}: element count of tensor '{}' overflows", file, name);
  }
  uint64_t nbytes = 0;
  LS_REQUIRE(checked_multiply(numel, dtype_size(info.dtype), &nbytes), ErrorKind::kModel,
             "{}: byte size of tensor '{}' overflows", file, name);
  LS_REQUIRE(nbytes == info.nbytes(), ErrorKind::kModel,
             "{}: tensor '{}' ({} with {} elements) needs {} bytes but its data_offsets [{}, {}] "
             "span {} bytes (size mismatch)",
             file, name, dtype_text, numel, nbytes, info.data_begin, info.data_end, info.nbytes());
  return info;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& file) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;  // the reference reads `null` as "no metadata"
  LS_REQUIRE(value.is_object(), ErrorKind::kModel, "{}: __metadata__ is not a JSON object", file);
  for (const auto& [key, item] : value.items()) {
    LS_REQUIRE(item.is_string(), ErrorKind::kModel,
               "{}: __metadata__ value of '{}' is not a string", file, key);
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// The tensors, sorted by offset, must tile the data section exactly: the first
// starts at 0, each starts where the previous one ended, the last ends at the
// end of the file.
void check_tensors_tile_data(const std::vector<TensorInfo>& sorted, uint64_t data_size,
                             const std::string& file) {
  uint64_t expected_begin = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : sorted) {
    LS_REQUIRE(t.data_end <= data_size, ErrorKind::kModel,
               "{}: data_offsets [{}, {}] of tensor '{}' are out of bounds of the {}-byte data "
               "section",
               file, t.data_begin, t.data_end, t.name, data_size);
    LS_REQUIRE(t.data_begin >= expected_begin, ErrorKind::kModel,
               "{}: tensor '{}' [{}, {}] overlaps tensor '{}' [{}, {}]", file, t.name, t.data_begin,
               t.data_end, previous->name, previous->data_begin, previous->data_end);
    LS_REQUIRE(t.data_begin == expected_begin, ErrorKind::kModel,
               "{}: gap of {} bytes before tensor '{}' (starts at {}, expected {})", file,
               t.data_begin - expected_begin, t.name, t.data_begin, expected_begin);
    expected_begin = t.data_end;
    previous = &t;
  }
  LS_REQUIRE(expected_begin == data_size, ErrorKind::kModel,
             "{}: {} trailing bytes after the last tensor (tensors cover {} of {} data bytes)",
             file, data_size - expected_begin, expected_begin, data_size);
}

// Copies n elements out of a mapping and converts them. Element offsets are
// multiples of the element size, but the data section itself starts at
// 8 + header length, which a valid file may leave unaligned: such data goes
// through an aligned bounce buffer.
void convert_mapped_to_f32(const uint8_t* src, DType dtype, float* dst, size_t n) {
  if (n == 0) return;  // dst may be null for an empty block
  const size_t element_size = dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(src) % element_size == 0) {
    convert_to_f32(src, dtype, dst, n);
    return;
  }
  alignas(uint32_t) uint8_t bounce[4096];
  const size_t per_chunk = sizeof(bounce) / element_size;
  for (size_t done = 0; done < n;) {
    const size_t count = std::min(per_chunk, n - done);
    std::memcpy(bounce, src + done * element_size, count * element_size);
    convert_to_f32(bounce, dtype, dst + done, count);
    done += count;
  }
}

// n elements of `src_type` at src (in the mapping, maybe unaligned) as
// `dst_type` at dst: a copy when the types agree, else through float32.
void convert_mapped(const uint8_t* src, DType src_type, uint8_t* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  if (dst_type == DType::kF32) {
    convert_mapped_to_f32(src, src_type, reinterpret_cast<float*>(dst), n);
    return;
  }
  float bounce[1024];
  for (size_t done = 0; done < n;) {
    const size_t count = std::min(std::size(bounce), n - done);
    convert_mapped_to_f32(src + done * dtype_size(src_type), src_type, bounce, count);
    convert_from_f32(bounce, dst + done * dtype_size(dst_type), dst_type, count);
    done += count;
  }
}

// The [rows, cols] view used by read_block: rows is shape[0] and cols the
// product of the other dimensions; a scalar is [1, 1], a 1-D tensor [shape0, 1].
std::pair<int64_t, int64_t> matrix_shape(const TensorInfo& t) {
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  int64_t cols = 1;
  for (size_t i = 1; i < t.shape.size(); ++i) cols *= t.shape[i];
  return {rows, cols};
}

bool is_strictly_inside(const fs::path& child, const fs::path& dir) {
  const auto [dir_end, child_rest] =
      std::mismatch(dir.begin(), dir.end(), child.begin(), child.end());
  return dir_end == dir.end() && child_rest != child.end();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const std::string file = path.string();
  // O_NONBLOCK: a FIFO (or a device) given as a shard is refused below, not
  // waited on forever for a writer; it changes nothing for a regular file.
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  LS_REQUIRE(fd >= 0, ErrorKind::kIo, "cannot open {}: {}", file, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    LS_FAIL(ErrorKind::kIo, "cannot read {}: not a regular file", file);
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderLengthBytes) {
    ::close(fd);
    LS_FAIL(ErrorKind::kModel, "{}: file is {} bytes, too small to hold the 8-byte header length",
            file, file_size);
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  LS_REQUIRE(mapping != MAP_FAILED, ErrorKind::kIo, "cannot map {}: {}", file,
             std::strerror(mmap_errno));
  mapping_ = mapping;
  mapping_size_ = file_size;
  try {
    parse_header();
  } catch (...) {
    ::munmap(mapping_, mapping_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { ::munmap(mapping_, mapping_size_); }

void SafetensorsFile::parse_header() {
  const std::string file = path_.string();
  const auto* bytes = static_cast<const uint8_t*>(mapping_);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = header_length << 8 | bytes[i];
  LS_REQUIRE(header_length <= kMaxHeaderBytes, ErrorKind::kModel,
             "{}: header length {} exceeds the limit of {} bytes (header too large)", file,
             header_length, kMaxHeaderBytes);
  // header_length <= 1e8, so the addition cannot overflow.
  LS_REQUIRE(kHeaderLengthBytes + header_length <= mapping_size_, ErrorKind::kModel,
             "{}: header length {} runs past the end of the {}-byte file", file, header_length,
             mapping_size_);
  const std::string_view text(reinterpret_cast<const char*>(bytes) + kHeaderLengthBytes,
                              header_length);
  LS_REQUIRE(find_invalid_utf8(text) == std::string_view::npos, ErrorKind::kModel, "{}: header is not valid UTF-8", file);
  const json header = parse_json_rejecting_duplicate_keys(text, file, "header");
  LS_REQUIRE(header.is_object(), ErrorKind::kModel, "{}: header is not a JSON object", file);

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      metadata_ = parse_metadata(value, file);
    } else {
      tensors_.push_back(parse_tensor_entry(key, value, file));
    }
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.data_begin, a.data_end) < std::tie(b.data_begin, b.data_end);
  });
  data_section_ = bytes + kHeaderLengthBytes + header_length;
  check_tensors_tile_data(tensors_, mapping_size_ - kHeaderLengthBytes - header_length, file);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------
// TensorStore

TensorStore::TensorStore(const fs::path& model_dir) : model_dir_(model_dir) {
  require_model_folder(model_dir);
  std::error_code ec;
  // path_present: a link that loops or dangles counts, so that opening it
  // names the actual problem rather than "not found".
  // As transformers' from_pretrained: model.safetensors first, else the index.
  const fs::path index = model_dir / "model.safetensors.index.json";
  const fs::path single = model_dir / "model.safetensors";
  const bool has_index = path_present(index);
  if (has_index && !path_present(single)) {
    open_shards(index);
    return;
  }
  if (has_index && process_identity().rank == 0)
    spdlog::warn("{} holds both model.safetensors and model.safetensors.index.json: reading model.safetensors, "
                 "as transformers does", model_dir.string());
  if (!path_present(single)) {
    // Weights in another format: say so rather than only that safetensors are missing.
    for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json", "consolidated.00.pth",
                              "model.gguf"})
      LS_REQUIRE(!fs::exists(model_dir / other, ec), ErrorKind::kModel,
                 "{} holds {}: lockstep reads only safetensors (model.safetensors or model.safetensors.index.json); "
                 "convert the weights to safetensors first", model_dir.string(), other);
    LS_FAIL(ErrorKind::kIo, "model file not found: {} (and no model.safetensors.index.json)", single.string());
  }
  files_.push_back(std::make_unique<SafetensorsFile>(single));
  register_tensors(*files_.back());
}

TensorStore::TensorStore(std::vector<GeneratedTensor> tensors, const std::string& origin)
    : model_dir_(origin), generated_(std::move(tensors)) {
  generated_info_.reserve(generated_.size());  // entries_ point into it: no reallocation
  for (const GeneratedTensor& g : generated_) {
    TensorInfo t{.name = g.spec.name, .dtype = g.spec.dtype, .shape = g.spec.shape};
    t.data_end = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype);
    generated_info_.push_back(std::move(t));
    const auto [it, is_new] = entries_.try_emplace(g.spec.name, Entry{nullptr, &generated_info_.back(), &g});
    LS_REQUIRE(is_new, ErrorKind::kModel, "{}: tensor '{}' generated twice", origin, g.spec.name);
  }
}

// Resolves a shard name from the index to a path that must lie inside the
// model folder once `..` and symlinks are resolved.
fs::path TensorStore::resolve_shard(const std::string& shard, const fs::path& index) const {
  // A NUL is valid in a JSON string but in no path: open() would stop at it
  // and read another file than the one checked below.
  LS_REQUIRE(shard.find('\0') == std::string::npos, ErrorKind::kModel,
             "{}: shard path '{}' holds a NUL byte", index.string(), shard);
  const fs::path relative(shard);
  LS_REQUIRE(!relative.empty() && !relative.has_root_path(), ErrorKind::kModel,
             "{}: shard path '{}' must be relative to the model folder", index.string(), shard);
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(model_dir_, ec);
  LS_REQUIRE(!ec, ErrorKind::kIo, "cannot resolve {}: {}", model_dir_.string(), ec.message());
  const fs::path resolved = fs::weakly_canonical(model_dir_ / relative, ec);
  LS_REQUIRE(!ec, ErrorKind::kIo, "{}: cannot resolve shard '{}': {}", index.string(), shard,
             ec.message());
  LS_REQUIRE(is_strictly_inside(resolved, dir), ErrorKind::kModel,
             "{}: shard '{}' resolves to {}, outside the model folder {}", index.string(), shard,
             resolved.string(), dir.string());
  return resolved;
}

void TensorStore::open_shards(const fs::path& index) {
  const std::string index_file = index.string();
  const json root = parse_json_rejecting_duplicate_keys(read_whole_file(index, "shard index"), index_file, "index");
  LS_REQUIRE(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
             ErrorKind::kModel, "{}: no 'weight_map' object", index_file);

  std::map<fs::path, const SafetensorsFile*> shard_by_path;
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    LS_REQUIRE(shard.is_string(), ErrorKind::kModel,
               "{}: weight_map entry of tensor '{}' is not a string", index_file, tensor);
    const auto& shard_name = shard.get_ref<const std::string&>();
    const fs::path resolved = resolve_shard(shard_name, index);
    auto [it, is_new] = shard_by_path.try_emplace(resolved, nullptr);
    if (is_new) {
      files_.push_back(std::make_unique<SafetensorsFile>(model_dir_ / shard_name));
      it->second = files_.back().get();
    }
    LS_REQUIRE(it->second->find(tensor) != nullptr, ErrorKind::kModel,
               "{}: tensor '{}' is missing from its shard {}", index_file, tensor,
               it->second->path().string());
  }
  for (const auto& file : files_) register_tensors(*file);
}

void TensorStore::register_tensors(const SafetensorsFile& file) {
  for (const TensorInfo& t : file.tensors()) {
    const auto [it, is_new] = entries_.try_emplace(t.name, Entry{&file, &t, nullptr});
    LS_REQUIRE(is_new, ErrorKind::kModel, "tensor '{}' appears in two shards: {} and {}", t.name,
               it->second.file->path().string(), file.path().string());
  }
}

const TensorStore::Entry& TensorStore::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  LS_REQUIRE(it != entries_.end(), ErrorKind::kModel, "tensor '{}' not found in {}", name,
             model_dir_.string());
  return it->second;
}

bool TensorStore::has(const std::string& name) const { return entries_.count(name) != 0; }

const TensorInfo& TensorStore::info(const std::string& name) const { return *entry(name).info; }

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, e] : entries_) result.push_back(name);
  return result;
}

void TensorStore::read_block(const std::string& name, int64_t row_begin, int64_t row_end,
                             int64_t col_begin, int64_t col_end, float* dst) const {
  read_block(name, row_begin, row_end, col_begin, col_end, DType::kF32, dst);
}

void TensorStore::read_block(const std::string& name, int64_t row_begin, int64_t row_end, int64_t col_begin,
                             int64_t col_end, DType out, void* dst) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.info;
  const auto [rows, cols] = matrix_shape(t);
  LS_REQUIRE(0 <= row_begin && row_begin <= row_end && row_end <= rows, ErrorKind::kInvalidArgument,
             "tensor '{}': rows [{}, {}) out of bounds for {} rows", name, row_begin, row_end,
             rows);
  LS_REQUIRE(0 <= col_begin && col_begin <= col_end && col_end <= cols, ErrorKind::kInvalidArgument,
             "tensor '{}': columns [{}, {}) out of bounds for {} columns", name, col_begin, col_end,
             cols);

  const auto in_size = static_cast<int64_t>(dtype_size(t.dtype));
  const auto out_size = static_cast<int64_t>(dtype_size(out));
  auto* to = static_cast<uint8_t*>(dst);
  const int64_t width = col_end - col_begin;
  bytes_read_ += static_cast<uint64_t>((row_end - row_begin) * width * in_size);
  if (e.generated != nullptr) {
    read_generated(e, row_begin, row_end, col_begin, col_end, out, to);
    return;
  }
  const uint8_t* base = e.file->data(t);
  // Elementwise, so the threads' split does not change a value; nothing in
  // the loops can throw (the three dtypes the parser admits always convert).
  if (width == cols) {  // whole rows are one contiguous range, cut into chunks
    constexpr int64_t kChunk = int64_t{1} << 20;
    const int64_t n = (row_end - row_begin) * cols;
    const uint8_t* from = base + row_begin * cols * in_size;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < (n + kChunk - 1) / kChunk; ++k) {
      const int64_t at = k * kChunk;
      convert_mapped(from + at * in_size, t.dtype, to + at * out_size, out,
                     static_cast<size_t>(std::min(kChunk, n - at)));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = row_begin; r < row_end; ++r)
      convert_mapped(base + (r * cols + col_begin) * in_size, t.dtype, to + (r - row_begin) * width * out_size, out,
                     static_cast<size_t>(width));
  }
}

// Each row's values in pieces: generated as float32, rounded to the
// tensor's dtype, converted to `out`.
void TensorStore::read_generated(const Entry& e, int64_t row_begin, int64_t row_end, int64_t col_begin,
                                 int64_t col_end, DType out, uint8_t* dst) const {
  const TensorInfo& t = *e.info;
  const int64_t cols = matrix_shape(t).second;
  const int64_t width = col_end - col_begin;
  const auto out_size = static_cast<int64_t>(dtype_size(out));
  constexpr int64_t kPiece = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t r = row_begin; r < row_end; ++r) {
    float values[kPiece];
    uint8_t stored[kPiece * 4];
    for (int64_t c = 0; c < width; c += kPiece) {
      const int64_t n = std::min(kPiece, width - c);
      e.generated->fill(r * cols + col_begin + c, n, values);
      convert_from_f32(values, stored, t.dtype, static_cast<size_t>(n));
      convert_mapped(stored, t.dtype, dst + ((r - row_begin) * width + c) * out_size, out, static_cast<size_t>(n));
    }
  }
}

std::vector<float> TensorStore::read_all(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  const auto [rows, cols] = matrix_shape(t);
  read_block(name, 0, rows, 0, cols, values.data());
  return values;
}

const uint8_t* TensorStore::raw(const std::string& name) const {
  const Entry& e = entry(name);
  LS_REQUIRE(e.file != nullptr, ErrorKind::kInternal, "tensor '{}' is generated: it has no bytes to map", name);
  return e.file->data(*e.info);
}

// ---------------------------------------------------------------------------
// write_safetensors

namespace {

struct PlannedHeader {
  std::string text;  // JSON, padded with spaces to a multiple of 8 bytes
  std::vector<uint64_t> numels;
};

PlannedHeader plan_header(const fs::path& path, const std::vector<TensorSpec>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  PlannedHeader plan;
  uint64_t offset = 0;
  for (const TensorSpec& spec : tensors) {
    LS_REQUIRE(spec.name != "__metadata__", ErrorKind::kInvalidArgument,
               "{}: '__metadata__' cannot be a tensor name", file);
    LS_REQUIRE(!header.contains(spec.name), ErrorKind::kInvalidArgument,
               "{}: duplicate tensor name '{}'", file, spec.name);
    uint64_t numel = 1;
    for (int64_t dim : spec.shape) {
      LS_REQUIRE(dim >= 0, ErrorKind::kInvalidArgument, "{}: tensor '{}' has a negative dimension",
                 file, spec.name);
      LS_REQUIRE(checked_multiply(numel, static_cast<uint64_t>(dim), &numel),
                 ErrorKind::kInvalidArgument, "{}: element count of tensor '{}' overflows", file,
                 spec.name);
    }
    uint64_t nbytes = 0;
    uint64_t end = 0;
    LS_REQUIRE(checked_multiply(numel, dtype_size(spec.dtype), &nbytes) &&
                   !__builtin_add_overflow(offset, nbytes, &end),
               ErrorKind::kInvalidArgument, "{}: byte size of tensor '{}' overflows", file,
               spec.name);
    header[spec.name] = {{"dtype", dtype_safetensors_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, end}}};
    offset = end;
    plan.numels.push_back(numel);
  }
  try {
    plan.text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {  // e.g. a name that is not UTF-8
    LS_FAIL(ErrorKind::kInvalidArgument, "{}: cannot encode the header: {}", file, e.what());
  }
  plan.text.append((8 - plan.text.size() % 8) % 8, ' ');
  LS_REQUIRE(plan.text.size() <= kMaxHeaderBytes, ErrorKind::kInvalidArgument,
             "{}: header of {} bytes exceeds the limit of {} bytes", file, plan.text.size(),
             kMaxHeaderBytes);
  return plan;
}

// A file written under a temporary name and renamed over the target only once
// complete, so a failed write never leaves a truncated file under the real name.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const fs::path& path)
      : path_(path), temp_(path.string() + ".tmp." + std::to_string(::getpid())) {
    out_ = std::fopen(temp_.c_str(), "wb");
    LS_REQUIRE(out_ != nullptr, ErrorKind::kIo, "cannot write {}: cannot create {}: {}",
               path_.string(), temp_.string(), std::strerror(errno));
  }
  ~AtomicFileWriter() {
    if (out_ != nullptr) std::fclose(out_);
    if (!committed_) {
      std::error_code ignored;
      fs::remove(temp_, ignored);
    }
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size) {
    LS_REQUIRE(size == 0 || std::fwrite(data, 1, size, out_) == size, ErrorKind::kIo,
               "cannot write {}: {}", path_.string(), std::strerror(errno));
  }

  void commit() {
    FILE* out = out_;
    out_ = nullptr;
    LS_REQUIRE(std::fclose(out) == 0, ErrorKind::kIo, "cannot write {}: {}", path_.string(),
               std::strerror(errno));
    std::error_code ec;
    fs::rename(temp_, path_, ec);
    LS_REQUIRE(!ec, ErrorKind::kIo, "cannot rename {} to {}: {}", temp_.string(), path_.string(),
               ec.message());
    committed_ = true;
  }

 private:
  fs::path path_;
  fs::path temp_;
  FILE* out_ = nullptr;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<TensorSpec>& tensors,
                       const TensorFill& fill, const std::map<std::string, std::string>& metadata) {
  const PlannedHeader plan = plan_header(path, tensors, metadata);
  AtomicFileWriter out(path);
  uint8_t length_bytes[kHeaderLengthBytes];
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    length_bytes[i] = static_cast<uint8_t>(plan.text.size() >> (8 * i));
  }
  out.write(length_bytes, sizeof(length_bytes));
  out.write(plan.text.data(), plan.text.size());

  const uint64_t largest =
      plan.numels.empty() ? 0 : *std::max_element(plan.numels.begin(), plan.numels.end());
  const auto chunk_capacity = static_cast<size_t>(std::min<uint64_t>(largest, kWriteChunkElements));
  std::vector<float> values(chunk_capacity);
  std::vector<uint8_t> encoded(chunk_capacity * sizeof(float));
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto numel = static_cast<int64_t>(plan.numels[t]);
    for (int64_t offset = 0; offset < numel; offset += kWriteChunkElements) {
      const int64_t count = std::min(kWriteChunkElements, numel - offset);
      fill(t, offset, count, values.data());
      convert_from_f32(values.data(), encoded.data(), tensors[t].dtype, static_cast<size_t>(count));
      out.write(encoded.data(), static_cast<size_t>(count) * dtype_size(tensors[t].dtype));
    }
  }
  out.commit();
}

}  // namespace lockstep
