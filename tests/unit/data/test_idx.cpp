// SPDX-License-Identifier: Apache-2.0
#include "strata/data/idx.hpp"

#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/data/concepts.hpp"

namespace {

namespace fs = std::filesystem;
using strata::data::idx_type;

using bytes = std::vector<std::uint8_t>;

fs::path work_dir() {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "idx";
  fs::create_directories(dir);
  return dir;
}

template <class T>
void append_big_endian(bytes& out, T value) {
  std::array<std::uint8_t, sizeof(T)> raw{};
  std::memcpy(raw.data(), &value, sizeof(T));
  if constexpr (std::endian::native == std::endian::little) {
    std::reverse(raw.begin(), raw.end());
  }
  out.insert(out.end(), raw.begin(), raw.end());
}

// An IDX header: magic, type byte, dimension count, big-endian dimensions.
bytes idx_header(std::uint8_t type, const std::vector<std::uint32_t>& dims) {
  bytes out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t d : dims) {
    append_big_endian(out, d);
  }
  return out;
}

// A complete IDX file holding `values` with dimensions `dims`.
template <class T>
bytes idx_file(const std::vector<std::uint32_t>& dims, const std::vector<T>& values) {
  bytes out = idx_header(static_cast<std::uint8_t>(strata::data::idx_type_of<T>()), dims);
  for (const T v : values) {
    append_big_endian(out, v);
  }
  return out;
}

fs::path write_plain(const std::string& name, const bytes& content) {
  const fs::path path = work_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(content.data()),
            static_cast<std::streamsize>(content.size()));
  REQUIRE(out.good());
  return path;
}

// Writes `content` as one gzip member (or, with `members` > 1, split over that many members).
fs::path write_gzip(const std::string& name, const bytes& content, std::size_t members = 1) {
  const fs::path path = work_dir() / name;
  fs::remove(path);
  const std::size_t part = (content.size() + members - 1) / members;
  for (std::size_t m = 0; m < members; ++m) {
    gzFile f = gzopen(path.string().c_str(), "ab");
    REQUIRE(f != nullptr);
    const std::size_t begin = std::min(content.size(), m * part);
    const std::size_t n = std::min(content.size() - begin, part);
    if (n != 0) {
      REQUIRE(gzwrite(f, content.data() + begin, static_cast<unsigned>(n)) == static_cast<int>(n));
    }
    REQUIRE(gzclose(f) == Z_OK);
  }
  return path;
}

bytes read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// How many bytes zlib decompresses from `gz` (given whole) before it stops, computed apart from
// the reader under test.
std::uint64_t inflate_count(const bytes& gz) {
  z_stream s{};
  REQUIRE(inflateInit2(&s, 16 + MAX_WBITS) == Z_OK);
  bytes in = gz;
  bytes out(std::size_t{16} << 20);
  s.next_in = in.data();
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&s, Z_FINISH);
  CHECK(rc != Z_STREAM_END);
  const std::uint64_t count = s.total_out;
  inflateEnd(&s);
  return count;
}

// Pseudo-random bytes that deflate cannot shrink much.
bytes noise(std::size_t n, std::uint32_t seed) {
  bytes out(n);
  std::uint32_t x = seed;
  for (auto& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(x >> 24);
  }
  return out;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

template <class F>
std::optional<strata::data_error> catch_data_error(F&& f) {
  try {
    f();
  } catch (const strata::data_error& e) {
    return e;
  }
  return std::nullopt;
}

// read_idx(path) must throw data_error naming the path, at `offset`, with `fragment` in what().
void check_idx_error(const fs::path& path, std::optional<std::uint64_t> offset,
                     std::string_view fragment) {
  CAPTURE(path.string());
  const auto e = catch_data_error([&] { (void)strata::data::read_idx(path); });
  REQUIRE_MESSAGE(e.has_value(), "read_idx did not throw data_error");
  CAPTURE(std::string(e->what()));
  CHECK(e->file() == path.string());
  CHECK(contains(e->what(), path.string()));
  CHECK(e->offset() == offset);
  CHECK(contains(e->what(), fragment));
}

template <class T>
void check_round_trip(const std::string& name, const std::vector<std::uint32_t>& dims,
                      const std::vector<T>& values) {
  const bytes content = idx_file(dims, values);
  for (const bool gz : {false, true}) {
    CAPTURE(name);
    CAPTURE(gz);
    const fs::path path = gz ? write_gzip(name + ".gz", content) : write_plain(name, content);
    const strata::data::idx_array a = strata::data::read_idx(path);
    CHECK(a.file == path.string());
    CHECK(a.type == strata::data::idx_type_of<T>());
    CHECK(a.dims == std::vector<std::uint64_t>(dims.begin(), dims.end()));
    CHECK(a.header_bytes == 4 + 4 * dims.size());
    CHECK(a.element_count() == values.size());
    CHECK(a.element_size() == sizeof(T));
    CHECK(a.payload.size() == values.size() * sizeof(T));
    CHECK(a.values<T>() == values);
    if (!values.empty()) {
      CHECK(a.at<T>(values.size() - 1) == values.back());
    }
  }
}

}  // namespace

TEST_CASE("idx types: bytes, names and sizes") {
  using strata::data::idx_element_size;
  using strata::data::idx_type_from_byte;
  CHECK(idx_type_from_byte(0x08) == idx_type::u8);
  CHECK(idx_type_from_byte(0x09) == idx_type::i8);
  CHECK(idx_type_from_byte(0x0B) == idx_type::i16);
  CHECK(idx_type_from_byte(0x0C) == idx_type::i32);
  CHECK(idx_type_from_byte(0x0D) == idx_type::f32);
  CHECK(idx_type_from_byte(0x0E) == idx_type::f64);
  CHECK_FALSE(idx_type_from_byte(0x0A).has_value());
  CHECK_FALSE(idx_type_from_byte(0x00).has_value());
  CHECK(idx_element_size(idx_type::u8) == 1);
  CHECK(idx_element_size(idx_type::i16) == 2);
  CHECK(idx_element_size(idx_type::f32) == 4);
  CHECK(idx_element_size(idx_type::f64) == 8);
  CHECK(to_string(idx_type::i32) == "i32");
  static_assert(strata::data::idx_type_of<double>() == idx_type::f64);
}

TEST_CASE("read_idx round-trips every element type, plain and gzip") {
  check_round_trip<std::uint8_t>("u8.idx", {2, 3}, {0, 1, 2, 127, 128, 255});
  check_round_trip<std::int8_t>("i8.idx", {4}, {-128, -1, 0, 127});
  check_round_trip<std::int16_t>("i16.idx", {2, 2}, {-32768, -2, 0x1234, 32767});
  check_round_trip<std::int32_t>("i32.idx", {1, 1, 3}, {-123456789, 0x01020304, 2147483647});
  check_round_trip<float>("f32.idx", {3}, {1.5f, -0.25f, 3.4e38f});
  check_round_trip<double>("f64.idx", {2, 1}, {-1e300, 0.1});
  check_round_trip<std::uint8_t>("empty.idx", {0, 28, 28}, {});
}

TEST_CASE("read_idx reads a gzip file of several members as their concatenation") {
  const bytes payload = noise(3000, 7);
  const bytes content = idx_file<std::uint8_t>({3, 1000}, payload);
  const fs::path path = write_gzip("members.idx.gz", content, 3);
  const strata::data::idx_array a = strata::data::read_idx(path);
  CHECK(a.payload == payload);
}

TEST_CASE("idx_array::values and at check the element type and index") {
  const fs::path path = write_plain("typed.idx", idx_file<std::int16_t>({2}, {1, 2}));
  const strata::data::idx_array a = strata::data::read_idx(path);
  const auto wrong_type = catch_data_error([&] { (void)a.values<float>(); });
  REQUIRE(wrong_type.has_value());
  CHECK(contains(wrong_type->what(), "i16"));
  CHECK(contains(wrong_type->what(), "f32"));
  CHECK(catch_data_error([&] { (void)a.at<std::int16_t>(2); }).has_value());
}

TEST_CASE("read_idx rejects each malformed header with its file and offset") {
  // The first two bytes must be zero.
  check_idx_error(write_plain("magic.idx", {0x01, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7}), 0,
                  "expected the IDX magic 0x00 0x00, found 0x01 0x00");
  // A type byte that names no type.
  check_idx_error(write_plain("type.idx", {0, 0, 0x07, 1, 0, 0, 0, 1, 7}), 2, "found 0x07");
  // Zero dimensions, and an absurd count of them.
  check_idx_error(write_plain("zero-dims.idx", {0, 0, 0x08, 0}), 3, "found 0");
  check_idx_error(write_plain("many-dims.idx", {0, 0, 0x08, 200}), 3, "found 200");
  // Headers cut short.
  check_idx_error(write_plain("empty-file.idx", {}), 0, "ends after 0 bytes");
  check_idx_error(write_plain("short-head.idx", {0, 0}), 2, "ends after 2 bytes");
  check_idx_error(write_plain("short-dims.idx", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0}), 10,
                  "declares 3 dimensions (16 header bytes)");
  check_idx_error(write_gzip("short-dims.idx.gz", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0}), 10,
                  "ends after 10 bytes");
  // Dimensions whose product overflows 64 bits: the third one (offset 12) overflows.
  check_idx_error(write_plain("overflow.idx", idx_header(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 28})), 12,
                  "fits in 64 bits");
  // 2^16 x 2^16 x 2^16 fits; the fourth 2^16 (offset 16) does not.
  check_idx_error(write_plain("overflow4.idx", idx_header(0x08, {65536, 65536, 65536, 65536})), 16,
                  "fits in 64 bits");
  // f64 elements: 8 x (2^32 - 1) x (2^32 - 1) overflows at the second dimension (offset 8).
  check_idx_error(write_plain("overflow-f64.idx", idx_header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF})), 8,
                  "f64");
}

TEST_CASE("read_idx rejects a payload shorter than the header declares") {
  bytes content = idx_header(0x08, {10});
  const bytes six = {1, 2, 3, 4, 5, 6};
  content.insert(content.end(), six.begin(), six.end());
  check_idx_error(write_plain("short.idx", content), 14,
                  "the header declares 10 bytes of payload (10 u8), the file has 6");
  check_idx_error(write_gzip("short.idx.gz", content), 14,
                  "the header declares 10 bytes of payload (10 u8), the decompressed file has 6");

  // Multi-byte elements: 3 i32 declared (12 bytes), 5 bytes present.
  bytes ints = idx_header(0x0C, {3});
  ints.insert(ints.end(), six.begin(), six.begin() + 5);
  check_idx_error(write_plain("short-i32.idx", ints), 13, "declares 12 bytes of payload");
}

TEST_CASE("read_idx rejects a huge declared payload in a tiny file quickly") {
  // 2^16 x 2^16 x 2^8 = 2^40 bytes declared, 5 present.
  bytes content = idx_header(0x08, {65536, 65536, 256});
  const bytes five = {1, 2, 3, 4, 5};
  content.insert(content.end(), five.begin(), five.end());
  const auto start = std::chrono::steady_clock::now();
  check_idx_error(write_plain("huge.idx", content), content.size(),
                  "declares 1099511627776 bytes of payload (65536 x 65536 x 256 u8), the file has "
                  "5");
  check_idx_error(write_gzip("huge.idx.gz", content), content.size(),
                  "declares 1099511627776 bytes of payload");
  // Two 32-bit dimensions of 0xFFFFFFFF and one of 28 overflow before any allocation.
  check_idx_error(
      write_gzip("huge-overflow.idx.gz", idx_header(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 28})), 12,
      "fits in 64 bits");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < std::chrono::seconds(2));
}

TEST_CASE("read_idx rejects trailing bytes after the declared payload") {
  bytes content = idx_file<std::uint8_t>({4}, {1, 2, 3, 4});
  content.push_back(9);
  content.push_back(9);
  check_idx_error(write_plain("trailing.idx", content), 12, "found 2 trailing bytes");
  check_idx_error(write_gzip("trailing.idx.gz", content), 12, "found 2 trailing bytes");
}

TEST_CASE("read_idx rejects a truncated or corrupt gzip stream") {
  const bytes payload = noise(200 * 1000, 11);
  const bytes content = idx_file<std::uint8_t>({200, 1000}, payload);
  const bytes gz = read_all(write_gzip("whole.idx.gz", content));
  REQUIRE(gz.size() > 1000);
  REQUIRE(strata::data::read_idx(work_dir() / "whole.idx.gz").payload == payload);

  SUBCASE("cut in half") {
    const bytes half(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
    const std::uint64_t expected = inflate_count(half);
    CHECK(expected > 12);
    CHECK(expected < content.size());
    check_idx_error(write_plain("half.idx.gz", half), expected, "without its end marker");
  }
  SUBCASE("cut before the trailer") {
    // The deflate data is complete but the CRC and size are missing.
    const bytes cut(gz.begin(), gz.end() - 8);
    check_idx_error(write_plain("no-trailer.idx.gz", cut), content.size(),
                    "without its end marker");
  }
  SUBCASE("corrupt checksum") {
    bytes bad = gz;
    bad[bad.size() - 8] ^= 0xFF;
    check_idx_error(write_plain("bad-crc.idx.gz", bad), content.size(),
                    "the gzip stream is corrupt");
  }
  SUBCASE("corrupt compression method") {
    bytes bad = gz;
    bad[2] = 0x07;
    check_idx_error(write_plain("bad-method.idx.gz", bad), 0, "the gzip stream is corrupt");
  }
  SUBCASE("corrupt deflate data") {
    // A compressible file, so the damage lands in Huffman-coded blocks.
    bytes text = idx_header(0x08, {100000});
    for (std::size_t i = 0; i < 100000; ++i) {
      text.push_back(static_cast<std::uint8_t>("the quick brown fox "[i % 20]));
    }
    bytes bad = read_all(write_gzip("text.idx.gz", text));
    for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 16; ++i) {
      bad[i] = static_cast<std::uint8_t>(bad[i] ^ 0xA5);
    }
    const std::uint64_t expected = inflate_count(bad);
    check_idx_error(write_plain("bad-data.idx.gz", bad), expected, "the gzip stream is corrupt");
  }
}

TEST_CASE("read_idx names a missing file, without an offset") {
  const fs::path path = work_dir() / "no-such-file.idx";
  check_idx_error(path, std::nullopt, "does not exist");
  check_idx_error(work_dir(), std::nullopt, "not a regular file");
}

namespace {

struct small_files {
  fs::path images{};
  fs::path labels{};
};

// Three 2 x 2 images with pixels 0..11 and the given labels.
small_files write_small(const std::string& name, const std::vector<std::uint8_t>& labels) {
  std::vector<std::uint8_t> pixels(12);
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    pixels[i] = static_cast<std::uint8_t>(i * 20);
  }
  return small_files{
      .images = write_plain(name + "-images.idx", idx_file<std::uint8_t>({3, 2, 2}, pixels)),
      .labels =
          write_gzip(name + "-labels.idx.gz",
                     idx_file<std::uint8_t>({static_cast<std::uint32_t>(labels.size())}, labels))};
}

}  // namespace

TEST_CASE("idx_dataset is a dataset and reads scaled samples") {
  static_assert(strata::data::dataset<strata::data::idx_dataset>);
  static_assert(strata::data::check_dataset<strata::data::idx_dataset>());

  const small_files files = write_small("small", {2, 0, 1});
  const strata::data::idx_dataset_config config{
      .images = files.images, .labels = files.labels, .classes = 3, .scale = 0.5f};
  CHECK(config == config);
  CHECK(contains(to_string(config), ".classes = 3"));
  CHECK(contains(to_string(config), ".scale = 0.5"));
  const auto ds = strata::data::idx_dataset::open(config);
  CHECK(ds.size() == 3);
  CHECK(ds.shape() == strata::data::sample_shape{.channels = 1, .height = 2, .width = 2});
  CHECK(ds.classes() == 3);
  CHECK(ds.images_file() == files.images.string());
  CHECK(ds.labels_file() == files.labels.string());
  CHECK(ds.config() == config);
  CHECK(std::vector<std::uint8_t>(ds.labels().begin(), ds.labels().end()) ==
        std::vector<std::uint8_t>{2, 0, 1});
  CHECK(ds.label(2) == 1);

  std::array<float, 4> out{};
  CHECK(ds.read(1, out) == 0);
  CHECK(out == std::array<float, 4>{40.0f, 50.0f, 60.0f, 70.0f});
  CHECK(ds.pixels(1)[3] == 140);

  // A wrong output size or index throws with the sample index and writes nothing.
  std::array<float, 5> too_big{};
  const auto wrong_size = catch_data_error([&] { (void)ds.read(1, too_big); });
  REQUIRE(wrong_size.has_value());
  CHECK(wrong_size->sample_index() == std::optional<std::uint64_t>{1});
  CHECK(contains(wrong_size->what(), "5 floats"));
  CHECK(too_big == std::array<float, 5>{});
  const auto bad_index = catch_data_error([&] { (void)ds.read(3, out); });
  REQUIRE(bad_index.has_value());
  CHECK(bad_index->sample_index() == std::optional<std::uint64_t>{3});
  CHECK(catch_data_error([&] { (void)ds.label(3); }).has_value());
}

TEST_CASE("idx_dataset takes N x C x H x W images") {
  std::vector<std::uint8_t> pixels(2 * 3 * 1 * 2);
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    pixels[i] = static_cast<std::uint8_t>(i);
  }
  const auto ds = strata::data::idx_dataset::open(
      {.images = write_plain("nchw-images.idx", idx_file<std::uint8_t>({2, 3, 1, 2}, pixels)),
       .labels = write_plain("nchw-labels.idx", idx_file<std::uint8_t>({2}, {4, 5})),
       .classes = 6,
       .scale = 1.0f});
  CHECK(ds.shape() == strata::data::sample_shape{.channels = 3, .height = 1, .width = 2});
  std::array<float, 6> out{};
  CHECK(ds.read(1, out) == 5);
  CHECK(out == std::array<float, 6>{6, 7, 8, 9, 10, 11});
}

TEST_CASE("idx_dataset rejects mismatched or out-of-range labels and wrong layouts") {
  SUBCASE("label count differs from image count") {
    const small_files files = write_small("count", {0, 1, 2, 0});
    const auto e = catch_data_error([&] {
      (void)strata::data::idx_dataset::open({.images = files.images, .labels = files.labels});
    });
    REQUIRE(e.has_value());
    CHECK(contains(e->what(), files.images.string()));
    CHECK(contains(e->what(), files.labels.string()));
    CHECK(contains(e->what(), "has 4 labels"));
    CHECK(contains(e->what(), "has 3 images"));
  }
  SUBCASE("a label not below the class count") {
    const small_files files = write_small("range", {1, 0, 12});
    const auto e = catch_data_error([&] {
      (void)strata::data::idx_dataset::open({.images = files.images, .labels = files.labels});
    });
    REQUIRE(e.has_value());
    CHECK(e->file() == files.labels.string());
    CHECK(e->offset() == std::optional<std::uint64_t>{8 + 2});
    CHECK(e->sample_index() == std::optional<std::uint64_t>{2});
    CHECK(contains(e->what(), "label 12"));
    CHECK(contains(e->what(), "below 10"));
  }
  SUBCASE("zero classes") {
    const small_files files = write_small("zero", {0, 0, 0});
    const auto e = catch_data_error([&] {
      (void)strata::data::idx_dataset::open(
          {.images = files.images, .labels = files.labels, .classes = 0});
    });
    REQUIRE(e.has_value());
    CHECK(contains(e->what(), "classes is 0"));
  }
  SUBCASE("images that are not u8") {
    const fs::path images = write_plain("i16-images.idx", idx_file<std::int16_t>({1, 1, 1}, {3}));
    const fs::path labels = write_plain("one-label.idx", idx_file<std::uint8_t>({1}, {0}));
    const auto e = catch_data_error(
        [&] { (void)strata::data::idx_dataset::open({.images = images, .labels = labels}); });
    REQUIRE(e.has_value());
    CHECK(e->file() == images.string());
    CHECK(e->offset() == std::optional<std::uint64_t>{2});
  }
  SUBCASE("images with 2 dimensions") {
    const fs::path images =
        write_plain("flat-images.idx", idx_file<std::uint8_t>({1, 4}, {1, 2, 3, 4}));
    const fs::path labels = write_plain("one-label.idx", idx_file<std::uint8_t>({1}, {0}));
    const auto e = catch_data_error(
        [&] { (void)strata::data::idx_dataset::open({.images = images, .labels = labels}); });
    REQUIRE(e.has_value());
    CHECK(e->file() == images.string());
    CHECK(e->offset() == std::optional<std::uint64_t>{3});
  }
  SUBCASE("labels with 2 dimensions") {
    const small_files files = write_small("labels2d", {0, 0, 0});
    const fs::path labels = write_plain("labels-2d.idx", idx_file<std::uint8_t>({3, 1}, {0, 0, 0}));
    const auto e = catch_data_error(
        [&] { (void)strata::data::idx_dataset::open({.images = files.images, .labels = labels}); });
    REQUIRE(e.has_value());
    CHECK(e->file() == labels.string());
    CHECK(e->offset() == std::optional<std::uint64_t>{3});
  }
  SUBCASE("a missing images file") {
    const small_files files = write_small("missing", {0, 0, 0});
    const fs::path images = work_dir() / "absent-images.idx";
    const auto e = catch_data_error(
        [&] { (void)strata::data::idx_dataset::open({.images = images, .labels = files.labels}); });
    REQUIRE(e.has_value());
    CHECK(e->file() == images.string());
    CHECK_FALSE(e->offset().has_value());
  }
}

TEST_CASE("load_fashion_mnist finds plain or .gz files and names what it tried") {
  const fs::path dir = work_dir() / "fake-fashion";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const small_files files = write_small("fake", {9, 0, 3});
  fs::copy_file(files.images, dir / "t10k-images-idx3-ubyte");
  fs::copy_file(files.labels, dir / "t10k-labels-idx1-ubyte.gz");
  const auto test = strata::data::load_fashion_mnist(dir, strata::data::fashion_mnist_split::test);
  CHECK(test.size() == 3);
  CHECK(test.images_file() == (dir / "t10k-images-idx3-ubyte").string());
  CHECK(test.labels_file() == (dir / "t10k-labels-idx1-ubyte.gz").string());

  // The train files are missing from this directory.
  const auto missing_train = catch_data_error([&] {
    (void)strata::data::load_fashion_mnist(dir, strata::data::fashion_mnist_split::train);
  });
  REQUIRE(missing_train.has_value());
  CHECK(contains(missing_train->what(), (dir / "train-images-idx3-ubyte").string()));
  CHECK(contains(missing_train->what(), (dir / "train-images-idx3-ubyte.gz").string()));
  CHECK(contains(missing_train->what(), "dataset-fashion-mnist"));

  // A directory that does not exist.
  const fs::path nowhere = work_dir() / "no-such-dir";
  const auto missing_dir = catch_data_error([&] {
    (void)strata::data::load_fashion_mnist(nowhere, strata::data::fashion_mnist_split::test);
  });
  REQUIRE(missing_dir.has_value());
  CHECK(missing_dir->file() == nowhere.string());
  CHECK(contains(missing_dir->what(), "does not exist"));
  CHECK(contains(missing_dir->what(), "t10k-images-idx3-ubyte.gz"));
  CHECK(contains(missing_dir->what(), "dataset-fashion-mnist"));
  CHECK(contains(missing_dir->what(), "/usr/share/datasets/fashion-mnist"));
}

// Facts pinned from the files of the Debian package dataset-fashion-mnist (the original
// Fashion-MNIST release, gzip-compressed).
TEST_CASE("Fashion-MNIST from the installed package") {
  const fs::path dir(strata::data::fashion_mnist_default_dir);
  REQUIRE_MESSAGE(fs::is_directory(dir),
                  "Fashion-MNIST is not installed in "
                      << dir.string() << "; install the Debian package dataset-fashion-mnist");
  using strata::data::fashion_mnist_split;
  const auto train = strata::data::load_fashion_mnist(dir, fashion_mnist_split::train);
  const auto test = strata::data::load_fashion_mnist(fashion_mnist_split::test);
  const strata::data::sample_shape shape{.channels = 1, .height = 28, .width = 28};

  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.shape() == shape);
  CHECK(test.shape() == shape);
  CHECK(train.classes() == 10);
  CHECK(strata::data::fashion_mnist_class_names[9] == "Ankle boot");

  std::array<std::size_t, 10> train_histogram{};
  for (const std::uint8_t l : train.labels()) {
    ++train_histogram.at(l);
  }
  std::array<std::size_t, 10> test_histogram{};
  for (const std::uint8_t l : test.labels()) {
    ++test_histogram.at(l);
  }
  for (std::size_t c = 0; c < 10; ++c) {
    CAPTURE(c);
    CHECK(train_histogram[c] == 6000);
    CHECK(test_histogram[c] == 1000);
  }

  // The first training labels and the pixel sums of the first samples.
  const std::vector<std::uint8_t> first_labels(train.labels().begin(), train.labels().begin() + 10);
  CHECK(first_labels == std::vector<std::uint8_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  const auto pixel_sum = [](std::span<const std::uint8_t> pixels) {
    std::uint64_t sum = 0;
    for (const std::uint8_t p : pixels) {
      sum += p;
    }
    return sum;
  };
  CHECK(pixel_sum(train.pixels(0)) == 76247);
  CHECK(pixel_sum(train.pixels(1)) == 84598);
  CHECK(pixel_sum(test.pixels(0)) == 33456);
  std::uint64_t all = 0;
  for (std::size_t i = 0; i < train.size(); ++i) {
    all += pixel_sum(train.pixels(i));
  }
  CHECK(all == 3431114169ull);

  std::vector<float> sample(shape.elements());
  CHECK(train.read(0, sample) == 9);
  CHECK(test.read(0, sample) == 9);
  double scaled_sum = 0;
  CHECK(train.read(0, sample) == 9);
  for (const float v : sample) {
    scaled_sum += v;
  }
  CHECK(scaled_sum * 255.0 == doctest::Approx(76247.0).epsilon(1e-6));
  CHECK(*std::max_element(sample.begin(), sample.end()) == 1.0f);

  bool in_range = true;
  for (std::size_t i = 0; i < test.size(); ++i) {
    (void)test.read(i, sample);
    in_range = in_range && std::all_of(sample.begin(), sample.end(),
                                       [](float v) { return v >= 0.0f && v <= 1.0f; });
  }
  CHECK(in_range);
}

TEST_CASE("idx_dataset::read is safe from several threads") {
  std::vector<std::uint8_t> pixels = noise(500 * 16, 3);
  std::vector<std::uint8_t> labels(500);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::uint8_t>(i % 10);
  }
  const auto ds = strata::data::idx_dataset::open(
      {.images = write_gzip("threads-images.idx.gz", idx_file<std::uint8_t>({500, 4, 4}, pixels)),
       .labels = write_plain("threads-labels.idx", idx_file<std::uint8_t>({500}, labels))});
  std::vector<float> serial(500 * 16);
  std::vector<std::int32_t> serial_labels(500);
  for (std::size_t i = 0; i < 500; ++i) {
    serial_labels[i] = ds.read(i, std::span<float>(serial).subspan(i * 16, 16));
  }
  std::vector<float> parallel(500 * 16);
  std::vector<std::int32_t> parallel_labels(500);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < 500; i += 4) {
        parallel_labels[i] = ds.read(i, std::span<float>(parallel).subspan(i * 16, 16));
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(parallel == serial);
  CHECK(parallel_labels == serial_labels);
}
