// SPDX-License-Identifier: Apache-2.0
#pragma once

// Error types of strata. Every error carries what a user needs to act on it: the config key, the
// file and byte offset, the rank and collective, the checkpoint and the check that failed, the
// bytes asked for. what() is a complete one-paragraph message built from those fields.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

// Base of every exception strata throws on purpose.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i != 0) {
      out += ", ";
    }
    out += std::to_string(ranks[i]);
  }
  out += "]";
  return out;
}

}  // namespace detail

// Where a configuration problem is: the key, and, when it came from a file, file/line/column.
struct config_location {
  std::string key{};       // the config key ("batch_size_per_gpu"); empty for a syntax error
  std::string file{};      // the TOML file, or "command line"; empty when not known
  std::uint32_t line = 0;  // 1-based; 0 when not known
  std::uint32_t column = 0;
};

// A bad configuration value, an unknown key, a TOML syntax error or two inconsistent keys.
class config_error : public error {
 public:
  config_error(config_location where, std::string message)
      : error(compose(where, message)), where_(std::move(where)), message_(std::move(message)) {}

  const std::string& key() const noexcept { return where_.key; }
  const std::string& file() const noexcept { return where_.file; }
  std::uint32_t line() const noexcept { return where_.line; }
  std::uint32_t column() const noexcept { return where_.column; }
  // The message without the location prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string compose(const config_location& where, const std::string& message) {
    std::string out = "config error";
    if (!where.file.empty()) {
      out += " in " + where.file;
      if (where.line != 0) {
        out += ":" + std::to_string(where.line);
        if (where.column != 0) {
          out += ":" + std::to_string(where.column);
        }
      }
    }
    if (!where.key.empty()) {
      out += " at key '" + where.key + "'";
    }
    return out + ": " + message;
  }

  config_location where_;
  std::string message_{};
};

// Where a data problem is: the file, the byte offset in it, the sample index.
struct data_location {
  std::string file{};
  std::optional<std::uint64_t> offset{};        // byte offset in the (decompressed) stream
  std::optional<std::uint64_t> sample_index{};  // the sample being read or transformed
};

// A malformed or unreadable data file, or a failure while loading a sample.
class data_error : public error {
 public:
  data_error(data_location where, std::string message)
      : error(compose(where, message)), where_(std::move(where)) {}

  const std::string& file() const noexcept { return where_.file; }
  std::optional<std::uint64_t> offset() const noexcept { return where_.offset; }
  std::optional<std::uint64_t> sample_index() const noexcept { return where_.sample_index; }

 private:
  static std::string compose(const data_location& where, const std::string& message) {
    std::string out = "data error";
    if (!where.file.empty()) {
      out += " in " + where.file;
    }
    if (where.offset) {
      out += " at byte offset " + std::to_string(*where.offset);
    }
    if (where.sample_index) {
      out += " (sample " + std::to_string(*where.sample_index) + ")";
    }
    return out + ": " + message;
  }

  data_location where_;
};

enum class comm_error_kind {
  timeout,           // a wait passed its deadline
  peer_failed,       // a peer died or threw
  mismatch,          // ranks called different collectives (fingerprint check)
  aborted,           // the communicator was aborted by another rank's error
  backend,           // the backend library (MPI, NCCL) returned an error
  invalid_argument,  // a call that is wrong on this rank alone (bad root, peer, sizes)
};

constexpr std::string_view to_string(comm_error_kind kind) noexcept {
  switch (kind) {
    case comm_error_kind::timeout:
      return "timeout";
    case comm_error_kind::peer_failed:
      return "peer_failed";
    case comm_error_kind::mismatch:
      return "mismatch";
    case comm_error_kind::aborted:
      return "aborted";
    case comm_error_kind::backend:
      return "backend";
    case comm_error_kind::invalid_argument:
      return "invalid_argument";
  }
  return "unknown";
}

// What a communication error is about.
struct comm_error_info {
  comm_error_kind kind = comm_error_kind::backend;
  std::string op{};            // "all_reduce", "send", ...
  std::uint64_t sequence = 0;  // the op's sequence number on this communicator
  int rank = -1;               // the rank that reports the error
  std::vector<int> arrived{};  // ranks that reached the op (when known)
  std::vector<int> missing{};  // ranks that did not (when known)
};

class comm_error : public error {
 public:
  comm_error(comm_error_info info, std::string message)
      : error(compose(info, message)), info_(std::move(info)) {}

  comm_error_kind kind() const noexcept { return info_.kind; }
  const std::string& op() const noexcept { return info_.op; }
  std::uint64_t sequence() const noexcept { return info_.sequence; }
  int rank() const noexcept { return info_.rank; }
  const std::vector<int>& arrived() const noexcept { return info_.arrived; }
  const std::vector<int>& missing() const noexcept { return info_.missing; }

 private:
  static std::string compose(const comm_error_info& info, const std::string& message) {
    std::string out = "comm error (" + std::string(to_string(info.kind)) + ")";
    if (info.rank >= 0) {
      out += " on rank " + std::to_string(info.rank);
    }
    if (!info.op.empty()) {
      out += " in " + info.op + " #" + std::to_string(info.sequence);
    }
    out += ": " + message;
    if (!info.arrived.empty()) {
      out += "; arrived: " + detail::join_ranks(info.arrived);
    }
    if (!info.missing.empty()) {
      out += "; missing: " + detail::join_ranks(info.missing);
    }
    return out;
  }

  comm_error_info info_;
};

// A checkpoint that could not be written, or one found torn or corrupt on resume.
struct checkpoint_location {
  std::string path{};   // the checkpoint directory or file
  std::string check{};  // the check that failed ("manifest parse", "xxh3 of shard-0.bin", ...)
};

class checkpoint_error : public error {
 public:
  checkpoint_error(checkpoint_location where, std::string message)
      : error(compose(where, message)), where_(std::move(where)) {}

  const std::string& path() const noexcept { return where_.path; }
  const std::string& check() const noexcept { return where_.check; }

 private:
  static std::string compose(const checkpoint_location& where, const std::string& message) {
    std::string out = "checkpoint error";
    if (!where.path.empty()) {
      out += " in " + where.path;
    }
    if (!where.check.empty()) {
      out += " (check: " + where.check + ")";
    }
    return out + ": " + message;
  }

  checkpoint_location where_;
};

// An allocation that would exceed a memory budget, or that the system refused.
struct memory_request {
  std::string space{};        // "host", "cuda:0"
  std::size_t requested = 0;  // bytes asked for
  std::size_t in_use = 0;     // bytes in use before the request
  std::size_t budget = 0;     // the budget; 0 when unlimited
};

class memory_error : public error {
 public:
  memory_error(memory_request request, std::string message)
      : error(compose(request, message)), request_(std::move(request)) {}

  const std::string& space() const noexcept { return request_.space; }
  std::size_t requested() const noexcept { return request_.requested; }
  std::size_t in_use() const noexcept { return request_.in_use; }
  std::size_t budget() const noexcept { return request_.budget; }

 private:
  static std::string compose(const memory_request& r, const std::string& message) {
    std::string out = "memory error";
    if (!r.space.empty()) {
      out += " in " + r.space;
    }
    out += ": " + message + " (requested " + std::to_string(r.requested) + " bytes, in use " +
           std::to_string(r.in_use) + " bytes";
    if (r.budget != 0) {
      out += ", budget " + std::to_string(r.budget) + " bytes";
    }
    return out + ")";
  }

  memory_request request_;
};

}  // namespace strata
