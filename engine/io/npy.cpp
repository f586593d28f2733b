#include "engine/io/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include "common/error.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Magic, two version bytes and (for version 1.0) a 2-byte header length.
constexpr size_t kV1PreambleBytes = 10;
constexpr size_t kHeaderAlignment = 64;

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";  // Python's one-element tuple
  return text + ")";
}

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the Python dict literal of an .npy header, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class NpyHeaderParser {
 public:
  NpyHeaderParser(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    while (!consume('}')) {
      const std::string key = parse_string();
      expect(':');
      if (key == "descr" && !seen_descr) {
        header.descr = parse_string();
        seen_descr = true;
      } else if (key == "fortran_order" && !seen_order) {
        header.fortran_order = parse_bool();
        seen_order = true;
      } else if (key == "shape" && !seen_shape) {
        header.shape = parse_shape();
        seen_shape = true;
      } else {
        fail(fmt::format("unexpected or repeated key '{}'", key));
      }
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header dict");
    if (!seen_descr || !seen_order || !seen_shape) {
      fail("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    LS_FAIL(ErrorKind::kInvalidArgument, "{}: malformed .npy header: {}", file_, problem);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n')) ++pos_;
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) fail(fmt::format("expected '{}' at offset {}", c, pos_));
  }

  std::string parse_string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      fail(fmt::format("expected a string at offset {}", pos_));
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  bool parse_bool() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail("fortran_order is neither True nor False");
  }

  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (!consume(')')) {
      skip_space();
      int64_t dim = 0;
      const size_t start = pos_;
      for (; pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; ++pos_) {
        if (__builtin_mul_overflow(dim, 10, &dim) ||
            __builtin_add_overflow(dim, text_[pos_] - '0', &dim)) {
          fail("shape dimension overflows");
        }
      }
      if (pos_ == start) fail(fmt::format("expected a non-negative integer at offset {}", pos_));
      shape.push_back(dim);
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }

  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
};

std::string read_file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  LS_REQUIRE(in, ErrorKind::kIo, "cannot open {}: {}", path.string(), std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  LS_REQUIRE(in.good() || in.eof(), ErrorKind::kIo, "cannot read {}", path.string());
  return bytes.str();
}

uint32_t read_le(const std::string& bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = width; i-- > 0;) value = value << 8 | static_cast<uint8_t>(bytes[offset + i]);
  return value;
}

template <typename T>
void convert_values(const char* src, size_t n, std::vector<double>* out) {
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    (*out)[i] = static_cast<double>(value);
  }
}

// Splits the file into its header dict text and the offset where data starts.
std::pair<std::string_view, size_t> locate_header(const std::string& bytes,
                                                  const std::string& file) {
  LS_REQUIRE(bytes.size() >= kV1PreambleBytes && std::string_view(bytes).substr(0, 6) == kMagic,
             ErrorKind::kInvalidArgument, "{}: not an .npy file (bad magic)", file);
  const auto major = static_cast<uint8_t>(bytes[6]);
  const auto minor = static_cast<uint8_t>(bytes[7]);
  LS_REQUIRE(major >= 1 && major <= 3 && minor == 0, ErrorKind::kInvalidArgument,
             "{}: unsupported .npy version {}.{} (supported: 1.0, 2.0, 3.0)", file, major, minor);
  // Version 1.0 stores the header length in 2 bytes, 2.0 and 3.0 in 4 bytes.
  const size_t length_width = major == 1 ? 2 : 4;
  const size_t header_begin = 8 + length_width;
  LS_REQUIRE(bytes.size() >= header_begin, ErrorKind::kInvalidArgument,
             "{}: truncated .npy preamble", file);
  const size_t header_length = read_le(bytes, 8, length_width);
  LS_REQUIRE(header_length <= bytes.size() - header_begin, ErrorKind::kInvalidArgument,
             "{}: .npy header length {} runs past the end of the file", file, header_length);
  return {std::string_view(bytes).substr(header_begin, header_length),
          header_begin + header_length};
}

}  // namespace

void write_npy_f32(const fs::path& path, const std::vector<int64_t>& shape, const float* data) {
  const std::string file = path.string();
  uint64_t numel = 1;
  for (int64_t dim : shape) {
    LS_REQUIRE(dim >= 0, ErrorKind::kInvalidArgument, "{}: negative dimension in shape {}", file,
               shape_tuple(shape));
    LS_REQUIRE(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel),
               ErrorKind::kInvalidArgument, "{}: element count of shape {} overflows", file,
               shape_tuple(shape));
  }
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  // Pad with spaces so that the data starts at a multiple of 64 bytes; the
  // header always ends with '\n'.
  const size_t unpadded = kV1PreambleBytes + header.size() + 1;
  header.append((kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment, ' ');
  header += '\n';
  LS_REQUIRE(header.size() <= 0xffff, ErrorKind::kInvalidArgument,
             "{}: shape {} makes the .npy header too long", file, shape_tuple(shape));

  std::unique_ptr<FILE, FileCloser> out(std::fopen(file.c_str(), "wb"));
  LS_REQUIRE(out != nullptr, ErrorKind::kIo, "cannot create {}: {}", file, std::strerror(errno));
  std::string preamble(kMagic);
  preamble += {'\x01', '\x00', static_cast<char>(header.size() & 0xff),
               static_cast<char>(header.size() >> 8)};
  const size_t data_bytes = numel * sizeof(float);
  const bool written =
      std::fwrite(preamble.data(), 1, preamble.size(), out.get()) == preamble.size() &&
      std::fwrite(header.data(), 1, header.size(), out.get()) == header.size() &&
      (data_bytes == 0 || std::fwrite(data, 1, data_bytes, out.get()) == data_bytes);
  LS_REQUIRE(written, ErrorKind::kIo, "cannot write {}: {}", file, std::strerror(errno));
  LS_REQUIRE(std::fclose(out.release()) == 0, ErrorKind::kIo, "cannot write {}: {}", file,
             std::strerror(errno));
}

NpyArray read_npy(const fs::path& path) {
  const std::string file = path.string();
  const std::string bytes = read_file_bytes(path);
  const auto [header_text, data_begin] = locate_header(bytes, file);
  const NpyHeader header = NpyHeaderParser(header_text, file).parse();
  LS_REQUIRE(!header.fortran_order, ErrorKind::kInvalidArgument,
             "{}: Fortran-order arrays are not supported (C order only)", file);

  size_t item_size = 0;
  if (header.descr == "<f4" || header.descr == "<i4") item_size = 4;
  if (header.descr == "<f8" || header.descr == "<i8") item_size = 8;
  LS_REQUIRE(item_size != 0, ErrorKind::kInvalidArgument,
             "{}: unsupported dtype '{}' (supported: <f4, <f8, <i4, <i8)", file, header.descr);
  uint64_t numel = 1;
  uint64_t needed = 0;
  for (int64_t dim : header.shape) {
    LS_REQUIRE(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel),
               ErrorKind::kInvalidArgument, "{}: element count overflows", file);
  }
  LS_REQUIRE(!__builtin_mul_overflow(numel, item_size, &needed), ErrorKind::kInvalidArgument,
             "{}: data size overflows", file);
  const uint64_t available = bytes.size() - data_begin;
  LS_REQUIRE(needed == available, ErrorKind::kInvalidArgument,
             "{}: shape {} of '{}' needs {} data bytes but the file holds {}", file,
             shape_tuple(header.shape), header.descr, needed, available);

  NpyArray array;
  array.shape = header.shape;
  const char* data = bytes.data() + data_begin;
  if (header.descr == "<f4") convert_values<float>(data, numel, &array.values);
  if (header.descr == "<f8") convert_values<double>(data, numel, &array.values);
  if (header.descr == "<i4") convert_values<int32_t>(data, numel, &array.values);
  if (header.descr == "<i8") convert_values<int64_t>(data, numel, &array.values);
  return array;
}

}  // namespace lockstep
