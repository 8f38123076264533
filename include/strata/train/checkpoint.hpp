// SPDX-License-Identifier: Apache-2.0
#pragma once

// checkpoint_store: saves training checkpoints with a crash-safe commit, and finds the newest
// intact one on resume.
//
// Layout. <dir>/<name>/ is one checkpoint; name is "epoch-E" (E epochs done) or "epoch-E-step-S"
// (E epochs and S > 0 steps of the next epoch done), so names order by (epoch, step). It holds
// the caller's binary files ("rank-0.params.bin", ...) and manifest.json: format version, name,
// epoch, step, config hash, save time (UTC), each file's size and xxh3-64, and the caller's state
// JSON verbatim under "state". <dir>/latest holds the name of the last committed checkpoint.
//
// Commit. A crash at any point leaves the earlier checkpoints and `latest` usable:
//  1. every file is written under <dir>/.tmp-<name>-<token>/, fsync'ed and closed;
//  2. manifest.json is written last and fsync'ed, then the staging directory is fsync'ed;
//  3. an existing <dir>/<name> is renamed to <dir>/.old-<name>-<token>, the staging directory is
//     renamed to <dir>/<name>, and <dir> is fsync'ed;
//  4. <dir>/latest.tmp gets the name, is fsync'ed and renamed over <dir>/latest; <dir> fsync'ed;
//  5. the set-aside copy, leftover .tmp-* and .old-* entries of <dir>, and the oldest checkpoints
//     beyond `keep` are removed (never the one just written).
// A failure before the rename of step 4 throws checkpoint_error and puts back what was there
// before the save; a failure after it (the last fsync, removing an old checkpoint) throws with
// the new checkpoint committed. A crash between the two renames of step 3 leaves that one name
// absent (the older checkpoints still load); the next save cleans up the set-aside copy.
// checkpoint_fault.hpp kills the process at a phase of a save on request (the fault suite).
//
// Load. A checkpoint is intact when manifest.json parses, has a known format version and
// well-formed fields, and every listed file exists with the listed size and xxh3. load_latest
// tries the one `latest` names, then the committed directories newest first, and reports each
// checkpoint it skips with the file and the failed check. The config hash is returned, never
// judged: check_config_hash refuses a mismatch.
//
// Several ranks: every rank calls begin() with the same token (rank 0's, broadcast) and write()s
// its own files; rank 0 gathers the records and calls commit(). save() does the three in one
// process with the process id as token. One store saves into a directory at a time.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/train/checkpoint_fault.hpp"

namespace strata::train {

// The manifest format this build writes and reads.
inline constexpr std::uint64_t checkpoint_format_version = 1;

// Where in training a checkpoint was taken. Orders by (epoch, step).
struct checkpoint_position {
  std::uint64_t epoch = 0;  // epochs completed
  std::uint64_t step = 0;   // steps of the next epoch completed; 0 at the end of an epoch

  friend bool operator==(const checkpoint_position&, const checkpoint_position&) = default;
  friend auto operator<=>(const checkpoint_position&, const checkpoint_position&) = default;
};

inline std::string to_string(const checkpoint_position& p) {
  return "checkpoint_position{.epoch = " + std::to_string(p.epoch) +
         ", .step = " + std::to_string(p.step) + "}";
}

// "epoch-E" when step is 0, else "epoch-E-step-S".
inline std::string checkpoint_name(const checkpoint_position& p) {
  std::string out = "epoch-" + std::to_string(p.epoch);
  if (p.step != 0) {
    out += "-step-" + std::to_string(p.step);
  }
  return out;
}

namespace detail {

// A decimal without sign or leading zeros ("0" itself is fine) that fits 64 bits.
inline std::optional<std::uint64_t> checkpoint_parse_decimal(std::string_view text) {
  if (text.empty() || (text.size() > 1 && text.front() == '0')) {
    return std::nullopt;
  }
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || ptr != end) {
    return std::nullopt;
  }
  return value;
}

}  // namespace detail

// The position a checkpoint name stands for; nullopt unless the name is exactly what
// checkpoint_name() writes (so "epoch-03", "epoch-3-step-0" and ".tmp-epoch-3-7" are not names).
inline std::optional<checkpoint_position> parse_checkpoint_name(std::string_view name) {
  constexpr std::string_view epoch_prefix = "epoch-";
  constexpr std::string_view step_infix = "-step-";
  if (!name.starts_with(epoch_prefix)) {
    return std::nullopt;
  }
  name.remove_prefix(epoch_prefix.size());
  const std::size_t cut = name.find(step_infix);
  const auto epoch = detail::checkpoint_parse_decimal(name.substr(0, cut));
  if (!epoch) {
    return std::nullopt;
  }
  if (cut == std::string_view::npos) {
    return checkpoint_position{.epoch = *epoch, .step = 0};
  }
  const auto step = detail::checkpoint_parse_decimal(name.substr(cut + step_infix.size()));
  if (!step || *step == 0) {
    return std::nullopt;
  }
  return checkpoint_position{.epoch = *epoch, .step = *step};
}

// A file name allowed inside a checkpoint: 1 to 255 of [A-Za-z0-9._-], not starting with '.',
// not "manifest.json".
inline bool is_checkpoint_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '.' || name == "manifest.json") {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

struct checkpoint_config {
  std::filesystem::path dir{};  // holds one directory per checkpoint, and `latest`
  std::size_t keep = 3;         // committed checkpoints left after a save; at least 1
  std::string config_hash{};    // written into every manifest

  friend bool operator==(const checkpoint_config&, const checkpoint_config&) = default;
};

inline std::string to_string(const checkpoint_config& c) {
  return "checkpoint_config{.dir = \"" + c.dir.string() + "\", .keep = " + std::to_string(c.keep) +
         ", .config_hash = \"" + c.config_hash + "\"}";
}

// One file to save: a name (is_checkpoint_file_name) and a view of its bytes.
struct checkpoint_blob {
  std::string name{};
  std::span<const std::byte> bytes{};

  // Same name and same bytes (std::span has no operator== to default to).
  friend bool operator==(const checkpoint_blob& a, const checkpoint_blob& b) {
    return a.name == b.name && std::ranges::equal(a.bytes, b.bytes);
  }
};

inline std::string to_string(const checkpoint_blob& b) {
  return "checkpoint_blob{.name = \"" + b.name + "\", .bytes = <" + std::to_string(b.bytes.size()) +
         " bytes>}";
}

namespace detail {

inline std::string checkpoint_hex(std::uint64_t value) {
  constexpr char digits[] = "0123456789abcdef";
  std::string out(18, '0');
  out[1] = 'x';
  for (std::size_t i = 17; i >= 2; --i) {
    out[i] = digits[value & 0xfU];
    value >>= 4U;
  }
  return out;
}

// "0x" and exactly 16 hex digits.
inline std::optional<std::uint64_t> checkpoint_parse_hex(std::string_view text) {
  if (text.size() != 18 || !text.starts_with("0x")) {
    return std::nullopt;
  }
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data() + 2, end, value, 16);
  if (ec != std::errc{} || ptr != end) {
    return std::nullopt;
  }
  return value;
}

inline std::uint64_t checkpoint_xxh3(std::span<const std::byte> bytes) {
  return static_cast<std::uint64_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace detail

// A file as written: its name, byte size and xxh3-64. write() returns these; commit() lists them
// in the manifest.
struct checkpoint_file_record {
  std::string name{};
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;

  friend bool operator==(const checkpoint_file_record&, const checkpoint_file_record&) = default;
};

inline std::string to_string(const checkpoint_file_record& r) {
  return "checkpoint_file_record{.name = \"" + r.name + "\", .size = " + std::to_string(r.size) +
         ", .xxh3 = " + detail::checkpoint_hex(r.xxh3) + "}";
}

// A committed checkpoint directory.
struct checkpoint_info {
  std::string name{};
  std::filesystem::path path{};
  checkpoint_position position{};

  friend bool operator==(const checkpoint_info&, const checkpoint_info&) = default;
};

inline std::string to_string(const checkpoint_info& i) {
  return "checkpoint_info{.name = \"" + i.name + "\", .path = \"" + i.path.string() +
         "\", .position = " + to_string(i.position) + "}";
}

// A save in progress: the staging directory the ranks write their files into.
struct checkpoint_stage {
  checkpoint_position position{};
  std::uint64_t token = 0;       // the same on every rank of one save
  std::filesystem::path path{};  // <dir>/.tmp-<name>-<token>

  friend bool operator==(const checkpoint_stage&, const checkpoint_stage&) = default;
};

inline std::string to_string(const checkpoint_stage& s) {
  return "checkpoint_stage{.position = " + to_string(s.position) +
         ", .token = " + std::to_string(s.token) + ", .path = \"" + s.path.string() + "\"}";
}

namespace detail {

[[noreturn]] inline void checkpoint_fail(const std::filesystem::path& path, std::string check,
                                         std::string message) {
  throw checkpoint_error(checkpoint_location{.path = path.string(), .check = std::move(check)},
                         std::move(message));
}

inline std::string checkpoint_errno_text(int err) {
  return std::generic_category().message(err);
}

}  // namespace detail

// A checkpoint read back and verified: its manifest, the caller's state and every file's bytes.
struct loaded_checkpoint {
  checkpoint_info info{};  // name and position as the manifest gives them; the directory read
  std::uint64_t format_version = 0;
  std::string config_hash{};
  std::string saved_at{};  // UTC, "2024-05-01T12:00:00Z"
  std::vector<checkpoint_file_record> files{};
  nlohmann::json state{};
  std::map<std::string, std::vector<std::byte>, std::less<>> blobs{};  // file name -> bytes

  // The bytes of one file; checkpoint_error (check "missing file") when the checkpoint has none.
  const std::vector<std::byte>& blob(std::string_view name) const {
    const auto it = blobs.find(name);
    if (it == blobs.end()) {
      detail::checkpoint_fail(info.path / std::string(name), "missing file",
                              "checkpoint " + info.name + " has no file " + std::string(name));
    }
    return it->second;
  }

  // Copies one file into `out`, which must have exactly the file's size; else checkpoint_error
  // (check "size").
  template <class T>
  requires(std::is_trivially_copyable_v<T> &&
           !std::is_const_v<T>) void copy_blob(std::string_view name, std::span<T> out) const {
    const std::vector<std::byte>& bytes = blob(name);
    if (bytes.size() != out.size_bytes()) {
      detail::checkpoint_fail(info.path / std::string(name), "size",
                              "size mismatch in " + std::string(name) + ": the file has " +
                                  std::to_string(bytes.size()) + " bytes, the destination " +
                                  std::to_string(out.size_bytes()) + " (" +
                                  std::to_string(out.size()) + " elements of " +
                                  std::to_string(sizeof(T)) + " bytes)");
    }
    if (!bytes.empty()) {
      std::memcpy(out.data(), bytes.data(), bytes.size());
    }
  }

  friend bool operator==(const loaded_checkpoint&, const loaded_checkpoint&) = default;
};

inline std::string to_string(const loaded_checkpoint& c) {
  std::string out = "loaded_checkpoint{.info = " + to_string(c.info) +
                    ", .format_version = " + std::to_string(c.format_version) +
                    ", .config_hash = \"" + c.config_hash + "\", .saved_at = \"" + c.saved_at +
                    "\", .files = [";
  for (std::size_t i = 0; i < c.files.size(); ++i) {
    out += (i == 0 ? "" : ", ") + to_string(c.files[i]);
  }
  out += "], .state = " + c.state.dump() + ", .blobs = <" + std::to_string(c.blobs.size()) +
         " files>}";
  return out;
}

// Throws checkpoint_error (check "config hash") naming both hashes when the checkpoint was saved
// under another configuration than `expected`.
inline void check_config_hash(const loaded_checkpoint& checkpoint, std::string_view expected) {
  if (checkpoint.config_hash != expected) {
    detail::checkpoint_fail(checkpoint.info.path, "config hash",
                            "checkpoint " + checkpoint.info.name + " was saved with config hash '" +
                                checkpoint.config_hash + "', this run has config hash '" +
                                std::string(expected) +
                                "': a key that changes the numbers differs (learning rate, "
                                "batch, epochs, seed, ...). Start afresh with resume = false or "
                                "another checkpoint_dir");
  }
}

namespace detail {

// Owns a POSIX file descriptor.
class checkpoint_fd {
 public:
  explicit checkpoint_fd(int fd) noexcept : fd_(fd) {}
  checkpoint_fd(const checkpoint_fd&) = delete;
  checkpoint_fd& operator=(const checkpoint_fd&) = delete;
  ~checkpoint_fd() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }

  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Creates or truncates `path`, writes `bytes`, fsyncs and closes it.
inline void checkpoint_write_file(const std::filesystem::path& path,
                                  std::span<const std::byte> bytes) {
  const int raw = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0) {
    const int err = errno;
    checkpoint_fail(path, "write",
                    "cannot create " + path.string() + ": " + checkpoint_errno_text(err));
  }
  checkpoint_fd fd(raw);
  const std::byte* next = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const std::size_t chunk = std::min<std::size_t>(left, std::size_t{1} << 30U);
    const ssize_t n = ::write(fd.get(), next, chunk);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      checkpoint_fail(path, "write",
                      "cannot write " + path.string() + " (" + std::to_string(bytes.size() - left) +
                          " of " + std::to_string(bytes.size()) +
                          " bytes written): " + checkpoint_errno_text(err));
    }
    next += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    checkpoint_fail(path, "fsync",
                    "cannot fsync " + path.string() + ": " + checkpoint_errno_text(err));
  }
  if (::close(fd.release()) != 0) {
    const int err = errno;
    checkpoint_fail(path, "write",
                    "cannot close " + path.string() + ": " + checkpoint_errno_text(err));
  }
}

// Makes the entries of directory `dir` durable. File systems that cannot fsync a directory
// (EINVAL) are taken as having nothing to do.
inline void checkpoint_sync_dir(const std::filesystem::path& dir) {
  const int raw = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (raw < 0) {
    const int err = errno;
    checkpoint_fail(dir, "fsync",
                    "cannot open directory " + dir.string() + ": " + checkpoint_errno_text(err));
  }
  checkpoint_fd fd(raw);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    const int err = errno;
    checkpoint_fail(dir, "fsync",
                    "cannot fsync directory " + dir.string() + ": " + checkpoint_errno_text(err));
  }
}

// The whole file; checkpoint_error with `check` when it cannot be read.
inline std::vector<std::byte> checkpoint_read_file(const std::filesystem::path& path,
                                                   const std::string& check) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    const int err = errno;
    checkpoint_fail(path, check,
                    "cannot open " + path.string() + ": " + checkpoint_errno_text(err));
  }
  checkpoint_fd fd(raw);
  // Reads straight into a buffer of the size fstat reports, then probes for more (the file may
  // have changed size since).
  struct stat st {};
  const std::size_t expected =
      ::fstat(fd.get(), &st) == 0 && st.st_size > 0 ? static_cast<std::size_t>(st.st_size) : 0;
  std::vector<std::byte> out(expected);
  std::size_t used = 0;
  std::byte probe[4096];
  for (;;) {
    const bool fill = used < out.size();
    std::byte* into = fill ? out.data() + used : probe;
    const std::size_t room = fill ? out.size() - used : sizeof(probe);
    const ssize_t n = ::read(fd.get(), into, room);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      const int err = errno;
      checkpoint_fail(path, check,
                      "cannot read " + path.string() + ": " + checkpoint_errno_text(err));
    }
    if (n == 0) {
      out.resize(used);
      return out;
    }
    if (!fill) {
      out.insert(out.end(), probe, probe + n);
    }
    used += static_cast<std::size_t>(n);
  }
}

inline void checkpoint_rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    checkpoint_fail(to, "rename",
                    "cannot rename " + from.string() + " to " + to.string() + ": " +
                        checkpoint_errno_text(err));
  }
}

inline std::string checkpoint_utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// Reads and checks manifest.json of `dir` (everything but the listed files' contents).
inline loaded_checkpoint checkpoint_read_manifest(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path manifest_path = dir / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(manifest_path, ec)) {
    checkpoint_fail(manifest_path, "missing file", "missing file manifest.json");
  }
  const std::vector<std::byte> raw = checkpoint_read_file(manifest_path, "manifest read");
  const std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    checkpoint_fail(manifest_path, "manifest parse",
                    "manifest.json: parse error at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::exception& e) {
    // Well-formed JSON the parser still refuses, e.g. a number beyond double's range; the
    // parser's "[json.exception...] " prefix is dropped.
    const std::string_view what = e.what();
    const std::size_t end = what.find("] ");
    checkpoint_fail(manifest_path, "manifest parse",
                    "manifest.json: " +
                        std::string(end == std::string_view::npos ? what : what.substr(end + 2)));
  }
  const auto schema = [&](const std::string& message) {
    checkpoint_fail(manifest_path, "manifest schema", "manifest.json: " + message);
  };
  if (!m.is_object()) {
    schema("the top level is not an object");
  }
  const auto field = [&](const char* key) -> const nlohmann::json& {
    const auto it = m.find(key);
    if (it == m.end()) {
      schema(std::string("field '") + key + "' is missing");
    }
    return *it;
  };
  const auto unsigned_field = [&](const char* key) {
    const nlohmann::json& v = field(key);
    if (!v.is_number_unsigned()) {
      schema(std::string("field '") + key + "' is not an unsigned integer: " + v.dump());
    }
    return v.get<std::uint64_t>();
  };
  const auto string_field = [&](const char* key) {
    const nlohmann::json& v = field(key);
    if (!v.is_string()) {
      schema(std::string("field '") + key + "' is not a string: " + v.dump());
    }
    return v.get<std::string>();
  };

  loaded_checkpoint out;
  out.format_version = unsigned_field("format_version");
  if (out.format_version != checkpoint_format_version) {
    checkpoint_fail(manifest_path, "format version",
                    "unknown format version " + std::to_string(out.format_version) +
                        " (this build reads version " + std::to_string(checkpoint_format_version) +
                        ")");
  }
  out.info.name = string_field("name");
  out.info.path = dir;
  out.info.position = {.epoch = unsigned_field("epoch"), .step = unsigned_field("step")};
  if (out.info.name != checkpoint_name(out.info.position)) {
    schema("name '" + out.info.name + "' does not match epoch " +
           std::to_string(out.info.position.epoch) + ", step " +
           std::to_string(out.info.position.step));
  }
  out.config_hash = string_field("config_hash");
  out.saved_at = string_field("saved_at");
  out.state = field("state");
  const nlohmann::json& files = field("files");
  if (!files.is_array()) {
    schema("field 'files' is not an array");
  }
  std::set<std::string, std::less<>> seen;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& f = files[i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("xxh3") || !f["xxh3"].is_string()) {
      schema(where +
             " is not {\"name\": string, \"size\": unsigned, \"xxh3\": string}: " + f.dump());
    }
    checkpoint_file_record record{.name = f["name"].get<std::string>(),
                                  .size = f["size"].get<std::uint64_t>()};
    if (!is_checkpoint_file_name(record.name)) {
      schema(where + ".name '" + record.name + "' is not a checkpoint file name");
    }
    if (!seen.insert(record.name).second) {
      schema(where + ".name '" + record.name + "' is listed twice");
    }
    const std::string hex = f["xxh3"].get<std::string>();
    const auto hash = checkpoint_parse_hex(hex);
    if (!hash) {
      schema(where + ".xxh3 '" + hex + "' is not 0x and 16 hex digits");
    }
    record.xxh3 = *hash;
    out.files.push_back(std::move(record));
  }
  return out;
}

}  // namespace detail

class checkpoint_store {
 public:
  // Throws std::invalid_argument for an empty dir or keep 0.
  explicit checkpoint_store(checkpoint_config config) : config_(std::move(config)) {
    (void)planned_checkpoint_fault();  // a bad STRATA_CHECKPOINT_FAULT fails here, not mid-run
    if (config_.dir.empty()) {
      throw std::invalid_argument("checkpoint_config.dir is empty");
    }
    if (config_.keep == 0) {
      throw std::invalid_argument(
          "checkpoint_config.keep is 0; it must be at least 1 (the checkpoint just saved)");
    }
    config_.dir = config_.dir.lexically_normal();
    if (!config_.dir.has_filename() && config_.dir.has_parent_path()) {
      config_.dir = config_.dir.parent_path();
    }
  }

  const checkpoint_config& config() const noexcept { return config_; }

  // Writes `blobs` and `state` as checkpoint checkpoint_name(position) in one process: begin()
  // with the process id, write(), commit(). On failure throws checkpoint_error and leaves the
  // earlier checkpoints and `latest` as they were.
  checkpoint_info save(const checkpoint_position& position, const nlohmann::json& state,
                       std::span<const checkpoint_blob> blobs) {
    const checkpoint_stage stage = begin(position, static_cast<std::uint64_t>(::getpid()));
    try {
      const std::vector<checkpoint_file_record> records = write(stage, blobs);
      return commit(stage, state, records);
    } catch (...) {
      abandon(stage);
      throw;
    }
  }

  // Creates <dir> and the staging directory <dir>/.tmp-<name>-<token> (both may exist already,
  // so every rank of one save may call it).
  checkpoint_stage begin(const checkpoint_position& position, std::uint64_t token) const {
    namespace fs = std::filesystem;
    checkpoint_stage stage{
        .position = position,
        .token = token,
        .path = config_.dir / (".tmp-" + checkpoint_name(position) + "-" + std::to_string(token))};
    std::error_code ec;
    const bool created = fs::create_directories(config_.dir, ec);
    if (ec) {
      detail::checkpoint_fail(
          config_.dir, "create directory",
          "cannot create the checkpoint directory " + config_.dir.string() + ": " + ec.message());
    }
    if (created) {
      detail::checkpoint_sync_dir(config_.dir.has_parent_path() ? config_.dir.parent_path()
                                                                : fs::path("."));
    }
    fs::create_directory(stage.path, ec);
    if (ec) {
      detail::checkpoint_fail(
          stage.path, "create directory",
          "cannot create the staging directory " + stage.path.string() + ": " + ec.message());
    }
    return stage;
  }

  // Writes each blob to the staging directory (written, fsync'ed, closed) and returns what it
  // wrote. Names must pass is_checkpoint_file_name and differ; checked before anything is
  // written.
  std::vector<checkpoint_file_record> write(const checkpoint_stage& stage,
                                            std::span<const checkpoint_blob> blobs) const {
    check_names(stage, blobs,
                [](const checkpoint_blob& b) -> const std::string& { return b.name; });
    std::vector<checkpoint_file_record> records;
    records.reserve(blobs.size());
    for (const checkpoint_blob& blob : blobs) {
      detail::checkpoint_write_file(stage.path / blob.name, blob.bytes);
      records.push_back({.name = blob.name,
                         .size = static_cast<std::uint64_t>(blob.bytes.size()),
                         .xxh3 = detail::checkpoint_xxh3(blob.bytes)});
      if (records.size() == 1) {
        detail::checkpoint_crash_point(checkpoint_phase::shards, stage.path);
      }
    }
    return records;
  }

  // Rank 0, once every rank's write() has returned: checks that each record's file is staged
  // with its size, writes the manifest and commits (steps 2 to 5 of the protocol). Staged files
  // without a record are dropped. A checkpoint_error with check "prune" means the checkpoint is
  // committed but an old one could not be removed.
  checkpoint_info commit(const checkpoint_stage& stage, const nlohmann::json& state,
                         std::span<const checkpoint_file_record> records) {
    namespace fs = std::filesystem;
    const std::string name = checkpoint_name(stage.position);
    const std::set<std::string, std::less<>> names =
        check_names(stage, records,
                    [](const checkpoint_file_record& r) -> const std::string& { return r.name; });
    for (const checkpoint_file_record& r : records) {
      const fs::path file = stage.path / r.name;
      std::error_code ec;
      const std::uintmax_t size = fs::file_size(file, ec);
      if (ec) {
        detail::checkpoint_fail(
            file, "missing file",
            "missing file " + r.name + " in " + stage.path.string() + ": " + ec.message());
      }
      if (size != r.size) {
        detail::checkpoint_fail(file, "size",
                                "size mismatch in " + r.name + ": record " +
                                    std::to_string(r.size) + " bytes, file " +
                                    std::to_string(size) + " bytes");
      }
    }
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(stage.path, ec)) {
      if (!names.contains(entry.path().filename().string())) {
        std::error_code ignored;
        fs::remove_all(entry.path(), ignored);
      }
    }
    if (ec) {
      detail::checkpoint_fail(stage.path, "staging directory",
                              "cannot list " + stage.path.string() + ": " + ec.message());
    }

    std::string manifest_text;
    try {
      nlohmann::ordered_json manifest = nlohmann::ordered_json::object();
      manifest["format_version"] = checkpoint_format_version;
      manifest["name"] = name;
      manifest["epoch"] = stage.position.epoch;
      manifest["step"] = stage.position.step;
      manifest["config_hash"] = config_.config_hash;
      manifest["saved_at"] = detail::checkpoint_utc_now();
      nlohmann::ordered_json files = nlohmann::ordered_json::array();
      for (const checkpoint_file_record& r : records) {
        files.push_back(
            {{"name", r.name}, {"size", r.size}, {"xxh3", detail::checkpoint_hex(r.xxh3)}});
      }
      manifest["files"] = std::move(files);
      manifest["state"] = nlohmann::ordered_json(state);
      manifest_text = manifest.dump(2) + "\n";
    } catch (const nlohmann::json::exception& e) {
      detail::checkpoint_fail(stage.path / "manifest.json", "manifest write",
                              std::string("cannot serialize the manifest: ") + e.what());
    }
    detail::checkpoint_crash_point(checkpoint_phase::manifest, stage.path);
    detail::checkpoint_write_file(stage.path / "manifest.json",
                                  std::as_bytes(std::span(manifest_text)));
    detail::checkpoint_sync_dir(stage.path);
    detail::checkpoint_crash_point(checkpoint_phase::rename, stage.path);

    const fs::path target = config_.dir / name;
    const fs::path aside = config_.dir / (".old-" + name + "-" + std::to_string(stage.token));
    const fs::path latest = config_.dir / "latest";
    const fs::path latest_tmp = config_.dir / "latest.tmp";
    bool moved_aside = false;
    bool renamed = false;
    try {
      if (fs::exists(fs::symlink_status(target, ec))) {
        fs::remove_all(aside, ec);
        detail::checkpoint_rename(target, aside);
        moved_aside = true;
      }
      detail::checkpoint_rename(stage.path, target);
      renamed = true;
      detail::checkpoint_sync_dir(config_.dir);
      detail::checkpoint_crash_point(checkpoint_phase::latest, target);
      const std::string latest_text = name + "\n";
      detail::checkpoint_write_file(latest_tmp, std::as_bytes(std::span(latest_text)));
      detail::checkpoint_rename(latest_tmp, latest);
    } catch (...) {
      std::error_code ignored;
      fs::remove(latest_tmp, ignored);
      if (renamed) {
        fs::remove_all(target, ignored);
      }
      if (moved_aside) {
        fs::rename(aside, target, ignored);
      }
      throw;
    }
    detail::checkpoint_sync_dir(config_.dir);
    detail::checkpoint_crash_point(checkpoint_phase::cleanup, target);

    // Step 5: what is left is garbage to every reader, so failures here only cost disk space,
    // except when an old checkpoint stays (reported).
    remove_leftovers();
    prune(name, stage.token);
    return {.name = name, .path = target, .position = stage.position};
  }

  // Removes a staging directory after a failed save (best effort).
  void abandon(const checkpoint_stage& stage) const noexcept {
    std::error_code ignored;
    std::filesystem::remove_all(stage.path, ignored);
  }

  // The committed checkpoint directories (named as checkpoint_name writes), oldest first by
  // (epoch, step); their contents are not checked. Empty when <dir> does not exist.
  std::vector<checkpoint_info> list() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(config_.dir, ec);
    if (status.type() == fs::file_type::not_found) {
      return {};
    }
    if (status.type() != fs::file_type::directory) {
      detail::checkpoint_fail(config_.dir, "directory",
                              config_.dir.string() + " is not a directory" +
                                  (ec ? ": " + ec.message() : std::string()));
    }
    std::vector<checkpoint_info> out;
    for (const fs::directory_entry& entry : fs::directory_iterator(config_.dir, ec)) {
      const std::string name = entry.path().filename().string();
      const auto position = parse_checkpoint_name(name);
      std::error_code type_ec;
      if (position && entry.is_directory(type_ec)) {
        out.push_back({.name = name, .path = entry.path(), .position = *position});
      }
    }
    if (ec) {
      detail::checkpoint_fail(config_.dir, "directory",
                              "cannot list " + config_.dir.string() + ": " + ec.message());
    }
    std::sort(out.begin(), out.end(), [](const checkpoint_info& a, const checkpoint_info& b) {
      return a.position < b.position;
    });
    return out;
  }

  // Reads and verifies the checkpoint in directory `path`; throws checkpoint_error naming the
  // file and the failed check ("missing file", "size", "xxh3", "manifest parse",
  // "format version", "manifest schema", ...).
  loaded_checkpoint load(const std::filesystem::path& path) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      detail::checkpoint_fail(path, "directory",
                              "checkpoint directory " + path.string() + " does not exist");
    }
    loaded_checkpoint out = detail::checkpoint_read_manifest(path);
    for (const checkpoint_file_record& r : out.files) {
      const fs::path file = path / r.name;
      if (!fs::is_regular_file(file, ec)) {
        detail::checkpoint_fail(file, "missing file", "missing file " + r.name);
      }
      std::vector<std::byte> bytes = detail::checkpoint_read_file(file, "read");
      if (bytes.size() != r.size) {
        detail::checkpoint_fail(file, "size",
                                "size mismatch in " + r.name + ": manifest " +
                                    std::to_string(r.size) + " bytes, file " +
                                    std::to_string(bytes.size()) + " bytes");
      }
      const std::uint64_t hash = detail::checkpoint_xxh3(bytes);
      if (hash != r.xxh3) {
        detail::checkpoint_fail(file, "xxh3",
                                "xxh3 mismatch in " + r.name + ": manifest " +
                                    detail::checkpoint_hex(r.xxh3) + ", file " +
                                    detail::checkpoint_hex(hash));
      }
      out.blobs.emplace(r.name, std::move(bytes));
    }
    return out;
  }

  // The newest intact checkpoint: the one `latest` names, else the committed ones newest first.
  // Each checkpoint skipped (and a `latest` that names nothing usable) is appended to `skipped`
  // when given. nullopt when none is intact. Throws checkpoint_error only when <dir> exists but
  // cannot be listed.
  std::optional<loaded_checkpoint> load_latest(
      std::vector<checkpoint_error>* skipped = nullptr) const {
    namespace fs = std::filesystem;
    const auto skip = [&](checkpoint_error e) {
      if (skipped != nullptr) {
        skipped->push_back(std::move(e));
      }
    };
    std::vector<checkpoint_info> committed = list();
    std::string tried;
    const fs::path latest = config_.dir / "latest";
    std::error_code ec;
    if (fs::exists(fs::symlink_status(latest, ec))) {
      try {
        const std::vector<std::byte> raw = detail::checkpoint_read_file(latest, "latest");
        std::string name(reinterpret_cast<const char*>(raw.data()), raw.size());
        while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) {
          name.pop_back();
        }
        if (!parse_checkpoint_name(name)) {
          detail::checkpoint_fail(latest, "latest",
                                  "latest holds '" + name + "', which is not a checkpoint name");
        }
        const auto it = std::find_if(committed.begin(), committed.end(),
                                     [&](const checkpoint_info& c) { return c.name == name; });
        if (it == committed.end()) {
          detail::checkpoint_fail(
              latest, "latest",
              "latest names " + name + ", which is not a checkpoint in " + config_.dir.string());
        }
        tried = name;
        return load(it->path);
      } catch (checkpoint_error& e) {
        skip(std::move(e));
      }
    }
    for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
      if (it->name == tried) {
        continue;
      }
      try {
        return load(it->path);
      } catch (checkpoint_error& e) {
        skip(std::move(e));
      }
    }
    return std::nullopt;
  }

 private:
  // Every name valid and distinct; returns the set of names.
  template <class T, class Name>
  static std::set<std::string, std::less<>> check_names(const checkpoint_stage& stage,
                                                        std::span<const T> items, Name name_of) {
    std::set<std::string, std::less<>> names;
    for (const T& item : items) {
      const std::string& name = name_of(item);
      if (!is_checkpoint_file_name(name)) {
        detail::checkpoint_fail(stage.path, "file name",
                                "'" + name +
                                    "' is not a checkpoint file name (1 to 255 of A-Z a-z 0-9 . _ "
                                    "-, not starting with '.', not manifest.json)");
      }
      if (!names.insert(name).second) {
        detail::checkpoint_fail(stage.path, "file name", "two files are named '" + name + "'");
      }
    }
    return names;
  }

  // Removes .tmp-* and .old-* entries of <dir> (best effort).
  void remove_leftovers() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (const fs::directory_entry& entry : fs::directory_iterator(config_.dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(".tmp-") || name.starts_with(".old-")) {
        doomed.push_back(entry.path());
      }
    }
    for (const fs::path& p : doomed) {
      fs::remove_all(p, ec);
    }
  }

  // Removes the oldest committed checkpoints until `keep` are left, never `current`. Each is
  // renamed out of the committed names first, so a crash never leaves one half removed.
  void prune(const std::string& current, std::uint64_t token) const {
    namespace fs = std::filesystem;
    const std::vector<checkpoint_info> committed = list();
    std::size_t left = committed.size();
    for (const checkpoint_info& c : committed) {
      if (left <= config_.keep) {
        break;
      }
      if (c.name == current) {
        continue;
      }
      const fs::path doomed = config_.dir / (".old-" + c.name + "-" + std::to_string(token));
      std::error_code ec;
      fs::remove_all(doomed, ec);
      fs::rename(c.path, doomed, ec);
      if (!ec) {
        fs::remove_all(doomed, ec);
      }
      if (ec) {
        detail::checkpoint_fail(c.path, "prune",
                                "checkpoint " + current +
                                    " is committed, but removing the old "
                                    "checkpoint " +
                                    c.path.string() + " failed: " + ec.message());
      }
      --left;
    }
  }

  checkpoint_config config_;
};

}  // namespace strata::train
