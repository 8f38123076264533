// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reading IDX files, the format of MNIST and Fashion-MNIST.
//
// An IDX file is a header followed by a payload:
//   bytes 0-1       zero (the magic)
//   byte 2          element type: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64
//   byte 3          number of dimensions d, 1 to idx_max_dimensions
//   bytes 4..4+4d   the d dimensions, big-endian u32, outermost first
//   then            the elements, row-major, big-endian
// A whole file may be gzip-compressed (detected by its 0x1f 0x8b magic); offsets then count bytes
// of the decompressed stream.
//
// Guarantees: read_idx() either returns the whole array in host byte order or throws data_error
// whose file() is the path and whose offset() is the byte where the problem is (none when the
// file cannot be opened), with a message saying what was expected and what was found. Bytes after
// the declared payload are an error, as is a gzip stream that is corrupt or ends early. No
// allocation is sized from the header before the data is seen to be there: a plain file's size is
// compared with the header first, and a gzip stream's buffer grows as data arrives.
//
// idx_dataset pairs an images file (u8, N x H x W or N x C x H x W) with a labels file (u8, N)
// and is a strata::data::dataset; load_fashion_mnist() finds the Fashion-MNIST files in a
// directory.

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/data/concepts.hpp"

namespace strata::data {

// The element type of an IDX file; the value is the type byte.
enum class idx_type : std::uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

constexpr std::string_view to_string(idx_type type) noexcept {
  switch (type) {
    case idx_type::u8:
      return "u8";
    case idx_type::i8:
      return "i8";
    case idx_type::i16:
      return "i16";
    case idx_type::i32:
      return "i32";
    case idx_type::f32:
      return "f32";
    case idx_type::f64:
      return "f64";
  }
  return "?";
}

// Bytes per element; 0 for a value that names no type.
constexpr std::size_t idx_element_size(idx_type type) noexcept {
  switch (type) {
    case idx_type::u8:
    case idx_type::i8:
      return 1;
    case idx_type::i16:
      return 2;
    case idx_type::i32:
    case idx_type::f32:
      return 4;
    case idx_type::f64:
      return 8;
  }
  return 0;
}

// The type a type byte names, or nullopt.
constexpr std::optional<idx_type> idx_type_from_byte(std::uint8_t byte) noexcept {
  switch (byte) {
    case 0x08:
    case 0x09:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x0E:
      return static_cast<idx_type>(byte);
    default:
      return std::nullopt;
  }
}

// The idx_type stored as the C++ type T.
template <class T>
constexpr idx_type idx_type_of() noexcept {
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return idx_type::u8;
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return idx_type::i8;
  } else if constexpr (std::is_same_v<T, std::int16_t>) {
    return idx_type::i16;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return idx_type::i32;
  } else if constexpr (std::is_same_v<T, float>) {
    return idx_type::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return idx_type::f64;
  } else {
    static_assert(sizeof(T) == 0,
                  "data: IDX elements are std::uint8_t, std::int8_t, std::int16_t, "
                  "std::int32_t, float or double");
    return idx_type::u8;
  }
}

// The most dimensions read_idx() accepts (MNIST files have 1 to 4).
inline constexpr std::size_t idx_max_dimensions = 16;

// Decompressed bytes read from a gzip stream per step, and the most reserved up front.
inline constexpr std::size_t idx_gzip_chunk_bytes = std::size_t{1} << 20;
inline constexpr std::size_t idx_gzip_reserve_limit = std::size_t{64} << 20;

namespace detail {

[[noreturn]] inline void idx_fail(const std::string& file, std::optional<std::uint64_t> offset,
                                  std::string message) {
  throw data_error(data_location{.file = file, .offset = offset, .sample_index = std::nullopt},
                   std::move(message));
}

inline std::string idx_hex(std::uint8_t byte) {
  constexpr std::string_view digits = "0123456789abcdef";
  std::string out = "0x";
  out += digits[byte >> 4];
  out += digits[byte & 0x0F];
  return out;
}

inline std::string idx_dims_string(std::span<const std::uint64_t> dims) {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i != 0) {
      out += " x ";
    }
    out += std::to_string(dims[i]);
  }
  return out;
}

template <class U>
constexpr U idx_byteswap(U value) noexcept {
  U out = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) {
    out = static_cast<U>((out << 8) | (value & 0xFF));
    value = static_cast<U>(value >> 8);
  }
  return out;
}

template <class U>
void idx_swap_elements(std::span<std::uint8_t> bytes) noexcept {
  for (std::size_t i = 0; i + sizeof(U) <= bytes.size(); i += sizeof(U)) {
    U value = 0;
    std::memcpy(&value, bytes.data() + i, sizeof(U));
    value = idx_byteswap(value);
    std::memcpy(bytes.data() + i, &value, sizeof(U));
  }
}

// Big-endian elements of `element_size` bytes to host order, in place.
inline void idx_to_host_order(std::span<std::uint8_t> bytes, std::size_t element_size) noexcept {
  static_assert(
      std::endian::native == std::endian::little || std::endian::native == std::endian::big,
      "data: IDX reading needs a little- or big-endian host");
  if constexpr (std::endian::native == std::endian::little) {
    switch (element_size) {
      case 2:
        idx_swap_elements<std::uint16_t>(bytes);
        break;
      case 4:
        idx_swap_elements<std::uint32_t>(bytes);
        break;
      case 8:
        idx_swap_elements<std::uint64_t>(bytes);
        break;
      default:
        break;
    }
  }
}

struct idx_file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

// The bytes of a plain or gzip file, in order. read() returns fewer bytes than asked only at the
// end of the (decompressed) data; every failure throws data_error at the current offset.
class idx_input {
 public:
  idx_input(const std::filesystem::path& path, std::string file) : file_(std::move(file)) {
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(path, ec);
    if (status.type() == std::filesystem::file_type::not_found) {
      idx_fail(file_, std::nullopt, "cannot open the file: it does not exist");
    }
    if (ec) {
      idx_fail(file_, std::nullopt, "cannot open the file: " + ec.message());
    }
    if (!std::filesystem::is_regular_file(status)) {
      idx_fail(file_, std::nullopt, "cannot read the file: it is not a regular file");
    }
    file_size_ = std::filesystem::file_size(path, ec);
    if (ec) {
      idx_fail(file_, std::nullopt, "cannot read the file size: " + ec.message());
    }
    handle_.reset(std::fopen(path.string().c_str(), "rb"));
    if (!handle_) {
      const int err = errno;
      idx_fail(file_, std::nullopt,
               "cannot open the file for reading: " + std::generic_category().message(err));
    }
    std::array<unsigned char, 2> magic{};
    const std::size_t got = std::fread(magic.data(), 1, magic.size(), handle_.get());
    gzip_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    std::rewind(handle_.get());
    if (gzip_) {
      in_buffer_.resize(std::size_t{64} << 10);
      if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {
        idx_fail(file_, std::nullopt, "zlib could not start a gzip decoder");
      }
      z_ready_ = true;
    }
  }

  idx_input(const idx_input&) = delete;
  idx_input& operator=(const idx_input&) = delete;

  ~idx_input() {
    if (z_ready_) {
      inflateEnd(&z_);
    }
  }

  bool gzip() const noexcept { return gzip_; }
  // The size of the file on disk (compressed, for gzip).
  std::uint64_t file_size() const noexcept { return file_size_; }
  // Bytes of (decompressed) data read so far.
  std::uint64_t offset() const noexcept { return offset_; }

  std::size_t read(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const std::size_t step = std::min<std::size_t>(n - done, std::size_t{1} << 30);
      const std::size_t got = gzip_ ? read_gzip(dst + done, step) : read_plain(dst + done, step);
      done += got;
      offset_ += got;
      if (got < step) {
        break;
      }
    }
    return done;
  }

 private:
  std::size_t read_plain(std::uint8_t* dst, std::size_t n) {
    const std::size_t got = std::fread(dst, 1, n, handle_.get());
    if (got < n && std::ferror(handle_.get())) {
      idx_fail(file_, offset_ + got, "the operating system reported a read error");
    }
    return got;
  }

  void refill() {
    const std::size_t got = std::fread(in_buffer_.data(), 1, in_buffer_.size(), handle_.get());
    if (got < in_buffer_.size()) {
      if (std::ferror(handle_.get())) {
        idx_fail(file_, offset_ + produced(), "the operating system reported a read error");
      }
      input_eof_ = true;
    }
    z_.next_in = in_buffer_.data();
    z_.avail_in = static_cast<uInt>(got);
  }

  std::size_t produced() const noexcept { return request_ - z_.avail_out; }

  std::size_t read_gzip(std::uint8_t* dst, std::size_t n) {
    request_ = n;
    z_.next_out = dst;
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0 && !input_eof_) {
        refill();
      }
      if (member_done_) {
        if (z_.avail_in == 0 && input_eof_) {
          break;
        }
        // Another gzip member follows (concatenated .gz files decompress to the concatenation).
        inflateReset(&z_);
        member_done_ = false;
      }
      if (z_.avail_in == 0 && input_eof_) {
        idx_fail(file_, offset_ + produced(),
                 "the gzip stream ends after " + std::to_string(offset_ + produced()) +
                     " decompressed bytes without its end marker; expected a complete stream "
                     "(is the file truncated?)");
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && z_.avail_in == 0)) {
        const std::string reason = z_.msg != nullptr ? z_.msg : zError(rc);
        idx_fail(file_, offset_ + produced(),
                 "the gzip stream is corrupt after " + std::to_string(offset_ + produced()) +
                     " decompressed bytes (zlib: " + reason + "); expected a valid gzip stream");
      }
    }
    return produced();
  }

  std::string file_;
  std::unique_ptr<std::FILE, idx_file_closer> handle_{};
  std::uint64_t file_size_ = 0;
  std::uint64_t offset_ = 0;
  bool gzip_ = false;
  z_stream z_{};
  bool z_ready_ = false;
  bool input_eof_ = false;
  bool member_done_ = false;
  std::size_t request_ = 0;
  std::vector<std::uint8_t> in_buffer_{};
};

}  // namespace detail

// One IDX file in memory.
struct idx_array {
  std::string file{};                   // the path it was read from
  idx_type type = idx_type::u8;         // the element type
  std::vector<std::uint64_t> dims{};    // outermost first
  std::vector<std::uint8_t> payload{};  // the elements, row-major, host byte order
  std::size_t header_bytes = 0;         // 4 + 4 * dims.size(): the offset of the first element

  std::uint64_t element_count() const noexcept {
    std::uint64_t count = 1;
    for (const std::uint64_t d : dims) {
      count *= d;
    }
    return count;
  }

  std::size_t element_size() const noexcept { return idx_element_size(type); }

  // Element i (flat, row-major) as T, which must be the stored type.
  template <class T>
  T at(std::size_t i) const {
    check_type<T>();
    if (i >= payload.size() / sizeof(T)) {
      detail::idx_fail(file, std::nullopt,
                       "element index " + std::to_string(i) + " is out of range: the file has " +
                           std::to_string(payload.size() / sizeof(T)) + " elements");
    }
    T value{};
    std::memcpy(&value, payload.data() + i * sizeof(T), sizeof(T));
    return value;
  }

  // Every element as T, which must be the stored type.
  template <class T>
  std::vector<T> values() const {
    check_type<T>();
    std::vector<T> out(payload.size() / sizeof(T));
    if (!out.empty()) {
      std::memcpy(out.data(), payload.data(), out.size() * sizeof(T));
    }
    return out;
  }

 private:
  template <class T>
  void check_type() const {
    constexpr idx_type wanted = idx_type_of<T>();
    if (wanted != type) {
      detail::idx_fail(file, std::nullopt,
                       "the file holds " + std::string(to_string(type)) + " elements; " +
                           std::string(to_string(wanted)) + " were asked for");
    }
  }
};

// Reads a plain or gzip IDX file. Throws data_error as described at the top of this header.
inline idx_array read_idx(const std::filesystem::path& path) {
  idx_array array;
  array.file = path.string();
  const std::string& file = array.file;
  detail::idx_input in(path, file);
  const std::string_view what = in.gzip() ? "the decompressed file" : "the file";

  std::array<std::uint8_t, 4> head{};
  const std::size_t head_got = in.read(head.data(), head.size());
  if ((head_got >= 1 && head[0] != 0) || (head_got >= 2 && head[1] != 0)) {
    std::string found = detail::idx_hex(head[0]);
    if (head_got >= 2) {
      found += " " + detail::idx_hex(head[1]);
    }
    detail::idx_fail(file, 0, "expected the IDX magic 0x00 0x00, found " + found);
  }
  if (head_got >= 3 && !idx_type_from_byte(head[2])) {
    detail::idx_fail(file, 2,
                     "expected an element type byte (0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d "
                     "f32 or 0x0e f64), found " +
                         detail::idx_hex(head[2]));
  }
  if (head_got < head.size()) {
    detail::idx_fail(file, head_got,
                     std::string(what) + " ends after " + std::to_string(head_got) +
                         " bytes; expected an IDX header of at least 4 bytes");
  }
  array.type = *idx_type_from_byte(head[2]);
  const std::size_t rank = head[3];
  if (rank == 0 || rank > idx_max_dimensions) {
    detail::idx_fail(file, 3,
                     "expected 1 to " + std::to_string(idx_max_dimensions) + " dimensions, found " +
                         std::to_string(rank));
  }
  array.header_bytes = 4 + 4 * rank;

  std::array<std::uint8_t, 4 * idx_max_dimensions> dim_bytes{};
  const std::size_t dims_got = in.read(dim_bytes.data(), 4 * rank);
  if (dims_got < 4 * rank) {
    detail::idx_fail(file, 4 + dims_got,
                     "the header declares " + std::to_string(rank) + " dimensions (" +
                         std::to_string(array.header_bytes) + " header bytes), " +
                         std::string(what) + " ends after " + std::to_string(4 + dims_got) +
                         " bytes");
  }
  array.dims.resize(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    array.dims[i] =
        (std::uint64_t{dim_bytes[4 * i]} << 24) | (std::uint64_t{dim_bytes[4 * i + 1]} << 16) |
        (std::uint64_t{dim_bytes[4 * i + 2]} << 8) | std::uint64_t{dim_bytes[4 * i + 3]};
  }

  // The payload size, checked against 64 bits and size_t one dimension at a time.
  const std::uint64_t limit = std::min<std::uint64_t>(std::numeric_limits<std::uint64_t>::max(),
                                                      std::numeric_limits<std::size_t>::max());
  const bool empty = std::find(array.dims.begin(), array.dims.end(), 0) != array.dims.end();
  std::uint64_t declared = 0;
  if (!empty) {
    declared = array.element_size();
    for (std::size_t i = 0; i < rank; ++i) {
      if (declared > limit / array.dims[i]) {
        detail::idx_fail(file, 4 + 4 * i,
                         "the dimensions " + detail::idx_dims_string(array.dims) + " of " +
                             std::string(to_string(array.type)) + " elements make more than " +
                             std::to_string(limit) +
                             " bytes; expected a payload size that fits in 64 bits and in size_t");
      }
      declared *= array.dims[i];
    }
  }
  const std::string declares = "the header declares " + std::to_string(declared) +
                               " bytes of payload (" + detail::idx_dims_string(array.dims) + " " +
                               std::string(to_string(array.type)) + ")";
  const std::uint64_t end = array.header_bytes + declared;

  if (!in.gzip()) {
    const std::uint64_t have = in.file_size() - array.header_bytes;
    if (have < declared) {
      detail::idx_fail(file, in.file_size(), declares + ", the file has " + std::to_string(have));
    }
    if (have > declared) {
      detail::idx_fail(file, end,
                       "found " + std::to_string(have - declared) + " trailing bytes after the " +
                           std::to_string(declared) +
                           " bytes of payload the header declares; expected the file to end at "
                           "byte offset " +
                           std::to_string(end));
    }
    array.payload.resize(static_cast<std::size_t>(declared));
    const std::size_t got = in.read(array.payload.data(), array.payload.size());
    if (got < array.payload.size()) {
      detail::idx_fail(
          file, in.offset(),
          declares + ", the file has " + std::to_string(got) + " (it shrank while being read)");
    }
  } else {
    array.payload.reserve(
        static_cast<std::size_t>(std::min<std::uint64_t>(declared, idx_gzip_reserve_limit)));
    while (array.payload.size() < declared) {
      const std::size_t old = array.payload.size();
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(idx_gzip_chunk_bytes, declared - old));
      array.payload.resize(old + want);
      const std::size_t got = in.read(array.payload.data() + old, want);
      array.payload.resize(old + got);
      if (got < want) {
        detail::idx_fail(
            file, in.offset(),
            declares + ", the decompressed file has " + std::to_string(array.payload.size()));
      }
    }
    // Read to the end: the stream's checksum is verified there, and trailing bytes are counted.
    std::vector<std::uint8_t> scratch(std::size_t{64} << 10);
    std::uint64_t trailing = 0;
    for (std::size_t got = 1; got != 0;) {
      got = in.read(scratch.data(), scratch.size());
      trailing += got;
    }
    if (trailing != 0) {
      detail::idx_fail(file, end,
                       "found " + std::to_string(trailing) + " trailing bytes after the " +
                           std::to_string(declared) +
                           " bytes of payload the header declares; expected the decompressed "
                           "file to end at byte offset " +
                           std::to_string(end));
    }
  }
  detail::idx_to_host_order(array.payload, array.element_size());
  return array;
}

// Where an idx_dataset's data comes from and how pixels become floats.
struct idx_dataset_config {
  std::filesystem::path images{};  // u8, N x H x W or N x C x H x W; plain or gzip
  std::filesystem::path labels{};  // u8, N; plain or gzip
  std::size_t classes = 10;        // every label must be below this
  float scale = 1.0f / 255.0f;     // read() gives pixel * scale

  friend bool operator==(const idx_dataset_config&, const idx_dataset_config&) = default;
};

inline std::string to_string(const idx_dataset_config& c) {
  std::array<char, 32> buf{};
  const auto [last, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), c.scale);
  const std::string scale = ec == std::errc{} ? std::string(buf.data(), last) : std::string("?");
  return "idx_dataset_config{.images = \"" + c.images.string() + "\", .labels = \"" +
         c.labels.string() + "\", .classes = " + std::to_string(c.classes) + ", .scale = " + scale +
         "}";
}

// An image classification dataset from an IDX images file and an IDX labels file. Images stay u8
// in memory; read() converts one sample to floats. Every member is const and read() keeps no
// state, so it is safe from several threads at once.
class idx_dataset {
 public:
  using dataset_category = dataset_tag;

  // Reads and checks both files. Throws data_error for a malformed file, a file that is not u8
  // images (3 or 4 dimensions) or u8 labels (1 dimension), counts that differ, a label not below
  // config.classes, or config.classes == 0.
  static idx_dataset open(const idx_dataset_config& config) {
    if (config.classes == 0) {
      detail::idx_fail(config.labels.string(), std::nullopt,
                       "idx_dataset_config.classes is 0; expected at least 1 class");
    }
    return idx_dataset(config, read_idx(config.images), read_idx(config.labels));
  }

  std::size_t size() const noexcept { return size_; }
  sample_shape shape() const noexcept { return shape_; }
  std::size_t classes() const noexcept { return config_.classes; }
  float scale() const noexcept { return config_.scale; }
  const idx_dataset_config& config() const noexcept { return config_; }
  const std::string& images_file() const noexcept { return images_file_; }
  const std::string& labels_file() const noexcept { return labels_file_; }

  // Every label, in sample order.
  std::span<const std::uint8_t> labels() const noexcept { return labels_; }

  std::int32_t label(std::size_t index) const {
    check_index(index);
    return labels_[index];
  }

  // The stored u8 pixels of sample `index`, shape().elements() of them.
  std::span<const std::uint8_t> pixels(std::size_t index) const {
    check_index(index);
    const std::size_t n = shape_.elements();
    return std::span<const std::uint8_t>(images_).subspan(index * n, n);
  }

  // Writes sample `index` as pixel * scale into `out` (shape().elements() floats) and returns
  // its label.
  std::int32_t read(std::size_t index, std::span<float> out) const {
    check_index(index);
    const std::size_t n = shape_.elements();
    if (out.size() != n) {
      throw data_error(
          data_location{.file = images_file_, .offset = std::nullopt, .sample_index = index},
          "the output span has " + std::to_string(out.size()) + " floats; expected " +
              std::to_string(n) + " (one " + to_string(shape_) + " sample)");
    }
    const std::uint8_t* src = images_.data() + index * n;
    const float scale = config_.scale;
    for (std::size_t k = 0; k < n; ++k) {
      out[k] = static_cast<float>(src[k]) * scale;
    }
    return labels_[index];
  }

 private:
  idx_dataset(const idx_dataset_config& config, idx_array images, idx_array labels)
      : config_(config), images_file_(images.file), labels_file_(labels.file) {
    if (images.type != idx_type::u8) {
      detail::idx_fail(images_file_, 2,
                       "expected u8 images (type byte 0x08), found " +
                           std::string(to_string(images.type)) + " (type byte " +
                           detail::idx_hex(static_cast<std::uint8_t>(images.type)) + ")");
    }
    if (images.dims.size() != 3 && images.dims.size() != 4) {
      detail::idx_fail(
          images_file_, 3,
          "expected images with 3 dimensions (N x H x W) or 4 (N x C x H x W), found " +
              std::to_string(images.dims.size()) + " (" + detail::idx_dims_string(images.dims) +
              ")");
    }
    const std::size_t first = images.dims.size() == 3 ? 2 : 1;
    for (std::size_t d = first; d < images.dims.size(); ++d) {
      if (images.dims[d] == 0) {
        detail::idx_fail(
            images_file_, 4 + 4 * d,
            "expected nonzero image dimensions, found " + detail::idx_dims_string(images.dims));
      }
    }
    if (labels.type != idx_type::u8) {
      detail::idx_fail(labels_file_, 2,
                       "expected u8 labels (type byte 0x08), found " +
                           std::string(to_string(labels.type)) + " (type byte " +
                           detail::idx_hex(static_cast<std::uint8_t>(labels.type)) + ")");
    }
    if (labels.dims.size() != 1) {
      detail::idx_fail(labels_file_, 3,
                       "expected labels with 1 dimension (N), found " +
                           std::to_string(labels.dims.size()) + " (" +
                           detail::idx_dims_string(labels.dims) + ")");
    }
    const std::uint64_t image_count = images.dims[0];
    const std::uint64_t label_count = labels.dims[0];
    if (image_count != label_count) {
      detail::idx_fail(labels_file_, std::nullopt,
                       "expected one label per image: the labels file " + labels_file_ + " has " +
                           std::to_string(label_count) + " labels, the images file " +
                           images_file_ + " has " + std::to_string(image_count) + " images");
    }
    for (std::size_t i = 0; i < labels.payload.size(); ++i) {
      if (labels.payload[i] >= config_.classes) {
        throw data_error(
            data_location{
                .file = labels_file_, .offset = labels.header_bytes + i, .sample_index = i},
            "label " + std::to_string(labels.payload[i]) + " of sample " + std::to_string(i) +
                " is out of range; expected a label below " + std::to_string(config_.classes) +
                " (the class count)");
      }
    }
    shape_ = images.dims.size() == 3
                 ? sample_shape{.channels = 1,
                                .height = static_cast<std::size_t>(images.dims[1]),
                                .width = static_cast<std::size_t>(images.dims[2])}
                 : sample_shape{.channels = static_cast<std::size_t>(images.dims[1]),
                                .height = static_cast<std::size_t>(images.dims[2]),
                                .width = static_cast<std::size_t>(images.dims[3])};
    size_ = static_cast<std::size_t>(image_count);
    images_ = std::move(images.payload);
    labels_ = std::move(labels.payload);
  }

  void check_index(std::size_t index) const {
    if (index >= size_) {
      throw data_error(
          data_location{.file = images_file_, .offset = std::nullopt, .sample_index = index},
          "sample index " + std::to_string(index) + " is out of range; expected an index below " +
              std::to_string(size_) + " (the sample count)");
    }
  }

  idx_dataset_config config_{};
  std::string images_file_{};
  std::string labels_file_{};
  sample_shape shape_{};
  std::size_t size_ = 0;
  std::vector<std::uint8_t> images_{};
  std::vector<std::uint8_t> labels_{};
};

static_assert(check_dataset<idx_dataset>());

// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 28 x 28 grey images of 10 kinds of clothing,
// 60000 for training and 10000 for testing.
enum class fashion_mnist_split { train, test };

constexpr std::string_view to_string(fashion_mnist_split split) noexcept {
  return split == fashion_mnist_split::train ? "train" : "test";
}

// Where the Debian package dataset-fashion-mnist installs the files.
inline constexpr std::string_view fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

// The class names, indexed by label.
inline constexpr std::array<std::string_view, 10> fashion_mnist_class_names = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

namespace detail {

// `dir`/`name`, or `dir`/`name`.gz when only that exists.
inline std::filesystem::path fashion_mnist_find(const std::filesystem::path& dir,
                                                const std::string& name) {
  const std::filesystem::path plain = dir / name;
  const std::filesystem::path gz = dir / (name + ".gz");
  std::error_code ec;
  if (std::filesystem::is_regular_file(plain, ec)) {
    return plain;
  }
  if (std::filesystem::is_regular_file(gz, ec)) {
    return gz;
  }
  std::string message =
      "no Fashion-MNIST file " + name + ": tried " + plain.string() + " and " + gz.string();
  if (!std::filesystem::is_directory(dir, ec)) {
    message += " (the directory " + dir.string() + " does not exist)";
  }
  message += "; on Debian and Ubuntu, the package dataset-fashion-mnist installs the files in " +
             std::string(fashion_mnist_default_dir);
  idx_fail(dir.string(), std::nullopt, std::move(message));
}

}  // namespace detail

// The config for one split of Fashion-MNIST in `dir`, taking each file plain or with a .gz suffix
// (plain first). Throws data_error naming the paths tried when a file is in neither form.
inline idx_dataset_config fashion_mnist_config(const std::filesystem::path& dir,
                                               fashion_mnist_split split) {
  const std::string prefix = split == fashion_mnist_split::train ? "train" : "t10k";
  return idx_dataset_config{
      .images = detail::fashion_mnist_find(dir, prefix + "-images-idx3-ubyte"),
      .labels = detail::fashion_mnist_find(dir, prefix + "-labels-idx1-ubyte"),
      .classes = fashion_mnist_class_names.size(),
      .scale = 1.0f / 255.0f};
}

inline idx_dataset load_fashion_mnist(const std::filesystem::path& dir, fashion_mnist_split split) {
  return idx_dataset::open(fashion_mnist_config(dir, split));
}

inline idx_dataset load_fashion_mnist(fashion_mnist_split split) {
  return load_fashion_mnist(std::filesystem::path(fashion_mnist_default_dir), split);
}

}  // namespace strata::data
