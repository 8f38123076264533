// SPDX-License-Identifier: Apache-2.0
#pragma once

// The host execution space and buffer<T, Space>, an owning, aligned, accounted array in any
// execution space.

#include <cassert>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/execution_space.hpp"
#include "strata/core/memory.hpp"

namespace strata {

namespace detail {

inline bool is_power_of_two(std::size_t n) noexcept {
  return n != 0 && (n & (n - 1)) == 0;
}

// `bytes` rounded up to a multiple of `alignment` (a power of two); false on overflow.
inline bool round_up(std::size_t bytes, std::size_t alignment, std::size_t& rounded) noexcept {
  if (bytes > std::numeric_limits<std::size_t>::max() - (alignment - 1)) {
    return false;
  }
  rounded = (bytes + alignment - 1) & ~(alignment - 1);
  return true;
}

struct meminfo {
  std::size_t total = 0;      // MemTotal, bytes; 0 when absent
  std::size_t available = 0;  // MemAvailable, bytes; 0 when absent
};

// The value of one "Key:   123 kB" line of /proc/meminfo, in bytes; 0 when missing or malformed.
inline std::size_t meminfo_field(std::string_view text, std::string_view key) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') {
      continue;
    }
    line.remove_prefix(key.size() + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    std::size_t value = 0;
    const auto [rest, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
    if (ec != std::errc{}) {
      return 0;
    }
    std::string_view unit(rest, static_cast<std::size_t>(line.data() + line.size() - rest));
    while (!unit.empty() && (unit.front() == ' ' || unit.front() == '\t')) {
      unit.remove_prefix(1);
    }
    while (!unit.empty() && (unit.back() == ' ' || unit.back() == '\r')) {
      unit.remove_suffix(1);
    }
    std::size_t scale = 1;
    if (unit == "kB") {
      scale = 1024;
    } else if (!unit.empty()) {
      return 0;
    }
    if (value > std::numeric_limits<std::size_t>::max() / scale) {
      return 0;
    }
    return value * scale;
  }
  return 0;
}

inline meminfo parse_meminfo(std::string_view text) {
  return {.total = meminfo_field(text, "MemTotal"),
          .available = meminfo_field(text, "MemAvailable")};
}

// /proc/meminfo of this machine; zeros where it cannot be read (not Linux, no /proc).
inline meminfo read_meminfo() noexcept {
  try {
    std::ifstream in("/proc/meminfo");
    if (!in) {
      return {};
    }
    std::ostringstream text;
    text << in.rdbuf();
    return parse_meminfo(text.str());
  } catch (...) {
    return {};
  }
}

inline memory_tracker& host_tracker() noexcept {
  static memory_tracker tracker("host");
  return tracker;
}

// The host_account in effect on this thread (null: the process tracker).
inline std::shared_ptr<memory_tracker>& current_host_account() noexcept {
  thread_local std::shared_ptr<memory_tracker> account;
  return account;
}

// An account's tracker, which keeps its parent account (if any) alive as long as it lives.
struct account_tracker : memory_tracker {
  account_tracker(std::string space, std::shared_ptr<memory_tracker> enclosing)
      : memory_tracker(std::move(space), enclosing ? enclosing.get() : &detail::host_tracker()),
        parent_account(std::move(enclosing)) {}
  std::shared_ptr<memory_tracker> parent_account;
};

}  // namespace detail

// Host memory. Every `host` value accounts its allocations in a tracker: the process-wide one
// (which counts the bytes allocated through strata::host, not the whole process), or the
// host_account in effect on the thread that made the value. Sizes are rounded up to a multiple
// of the alignment and accounted rounded. A buffer keeps the value it allocated with, so its
// memory goes back to the same tracker whichever thread frees it.
class host {
 public:
  using execution_space_category = execution_space_tag;
  static constexpr bool host_accessible = true;
  static constexpr std::size_t default_alignment = 64;

  // Accounts in the calling thread's host_account, or the process tracker when none.
  host() noexcept
      : account_(detail::current_host_account()),
        tracker_(account_ ? account_.get() : &detail::host_tracker()) {}
  // Copies only: a moved-from value must still account where it did.
  host(const host&) noexcept = default;
  host& operator=(const host&) noexcept = default;
  ~host() = default;

  std::string_view name() const noexcept { return "host"; }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) const {
    if (!detail::is_power_of_two(alignment)) {
      throw error("host: alignment " + std::to_string(alignment) + " is not a power of two");
    }
    if (bytes == 0) {
      return nullptr;
    }
    memory_tracker& tracker = memory();
    std::size_t rounded = 0;
    if (!detail::round_up(bytes, alignment, rounded)) {
      throw memory_error({.space = tracker.space(),
                          .requested = bytes,
                          .in_use = tracker.stats().in_use,
                          .budget = tracker.budget()},
                         "the request overflows the address space");
    }
    tracker.reserve(rounded);
    void* p = ::operator new (rounded, std::align_val_t{alignment}, std::nothrow);
    if (p == nullptr) {
      tracker.release(rounded);
      const memory_stats now = tracker.stats();
      throw memory_error({.space = tracker.space(),
                          .requested = rounded,
                          .in_use = now.in_use,
                          .budget = now.budget},
                         "the system refused the allocation");
    }
    return p;
  }

  void deallocate(void* p, std::size_t bytes,
                  std::size_t alignment = default_alignment) const noexcept {
    if (p == nullptr) {
      return;
    }
    ::operator delete (p, std::align_val_t{alignment});
    std::size_t rounded = 0;
    detail::round_up(bytes, alignment, rounded);
    memory().release(rounded);
  }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) const noexcept {
    copy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const noexcept {
    copy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const noexcept {
    if (bytes != 0) {
      std::memcpy(dst, src, bytes);
    }
  }

  void fill(void* dst, std::size_t bytes, std::byte value) const noexcept {
    if (bytes != 0) {
      std::memset(dst, static_cast<int>(value), bytes);
    }
  }
  void zero(void* dst, std::size_t bytes) const noexcept { fill(dst, bytes, std::byte{0}); }

  // The tracker this value accounts in: its host_account's, or the process's.
  memory_tracker& memory() const noexcept { return *tracker_; }

  // The tracker's stats, with MemTotal and MemAvailable of /proc/meminfo (0 when unknown).
  memory_snapshot memory_info() const noexcept {
    const detail::meminfo info = detail::read_meminfo();
    return {.stats = memory().stats(), .device_total = info.total, .device_free = info.available};
  }

  void synchronize() const noexcept {}

  // All host values are the same memory (copies between them are plain memcpy), whichever
  // tracker accounts it: equality does not compare accounts (memory() does).
  bool operator==(const host&) const noexcept { return true; }

 private:
  friend class host_account;
  friend class host_account_scope;

  std::shared_ptr<memory_tracker> account_;  // keeps an account's tracker alive; null: process
  memory_tracker* tracker_;
};

// Accounts the host allocations the calling thread makes while it lives in a tracker of their
// own, named `space`, inside the tracker in effect before (the process's, or an enclosing
// account's): its budget and peak are this thread's alone, and the process tracker still counts
// every byte. comm::threads::run opens one per rank ("host:rank0", ...), the host's counterpart
// of one tracker per GPU. Helper threads the owner starts account in the process tracker unless
// they open an account of their own or enter the owner's (host_account_scope).
//
//   {
//     strata::host_account mine("host:worker");
//     strata::scoped_budget limit(mine.memory(), 64 << 20);
//     strata::buffer<float> b(1024);  // counted in mine.memory() and in the process tracker
//   }
//
// Scoped: accounts on one thread end in the reverse order of their start, on that thread.
// Memory allocated inside outlives the account safely: its tracker lives until the last buffer
// (or host value) made with it is gone, freed by any thread. A reference from memory() lives as
// long as the account or such a value: a tracker_monitor over it must not outlive both.
class host_account {
 public:
  explicit host_account(std::string space) : host_account(std::move(space), host{}) {}
  // The same, inside the account `enclosing` accounts in (the process tracker when it has
  // none) instead of this thread's: a thread started for someone else's work can count in
  // theirs (comm::threads::run puts each rank inside the caller's account).
  host_account(std::string space, const host& enclosing)
      : previous_(detail::current_host_account()),
        tracker_(std::make_shared<detail::account_tracker>(std::move(space), enclosing.account_)) {
    detail::current_host_account() = tracker_;
  }
  // Ends on the thread that started it, after every account started inside it has ended.
  ~host_account() {
    assert(detail::current_host_account() == tracker_ &&
           "host_account: accounts end in reverse order, on the thread that started them");
    detail::current_host_account() = std::move(previous_);
  }

  host_account(const host_account&) = delete;
  host_account& operator=(const host_account&) = delete;

  memory_tracker& memory() const noexcept { return *tracker_; }

 private:
  std::shared_ptr<memory_tracker> previous_;
  std::shared_ptr<memory_tracker> tracker_;
};

// Makes the host allocations the calling thread makes while it lives count where `owner`'s do:
// in the account `owner` was made in, or the process tracker when it was made outside one. A
// helper thread that works for an owner (a loader's worker for the rank that built the loader)
// opens one, so its allocations meet the owner's budget. Scoped like host_account: ends on the
// thread that started it, in reverse order with the accounts and scopes started inside it.
//
//   const strata::host owner;            // on the rank's thread
//   std::thread([owner] {
//     const strata::host_account_scope in(owner);
//     strata::buffer<float> b(1024);      // counted in the rank's account
//   });
class host_account_scope {
 public:
  explicit host_account_scope(const host& owner)
      : previous_(detail::current_host_account()), account_(owner.account_) {
    detail::current_host_account() = account_;
  }
  ~host_account_scope() {
    assert(detail::current_host_account() == account_ &&
           "host_account_scope: scopes end in reverse order, on the thread that started them");
    detail::current_host_account() = std::move(previous_);
  }

  host_account_scope(const host_account_scope&) = delete;
  host_account_scope& operator=(const host_account_scope&) = delete;

 private:
  std::shared_ptr<memory_tracker> previous_;
  std::shared_ptr<memory_tracker> account_;
};

// How a buffer is allocated.
struct buffer_config {
  std::size_t alignment = host::default_alignment;  // bytes, a power of two; at least alignof(T)
  bool zero_fill = false;                           // clear the bytes after allocating

  bool operator==(const buffer_config&) const = default;
};

inline std::string to_string(const buffer_config& c) {
  return "buffer_config{.alignment = " + std::to_string(c.alignment) +
         ", .zero_fill = " + (c.zero_fill ? "true" : "false") + "}";
}

// An owning, move-only array of n trivially copyable T in an execution space, accounted in the
// space's tracker and released on destruction. Element access (span(), operator[]) exists only
// for host-accessible spaces; for device spaces data() is a device pointer.
//
//   strata::buffer<float> weights(1024, {.zero_fill = true});
//   strata::buffer<float, strata::cuda> on_gpu(strata::cuda{0}, 1024);
template <class T, execution_space Space = host>
class buffer {
  static_assert(std::is_trivially_copyable_v<T>, "buffer: T must be trivially copyable");

 public:
  using value_type = T;
  using space_type = Space;

  buffer() noexcept(std::is_nothrow_default_constructible_v<Space>) = default;

  explicit buffer(std::size_t n, buffer_config config = {}) : buffer(Space{}, n, config) {}

  buffer(Space space, std::size_t n, buffer_config config = {})
      : space_(std::move(space)),
        alignment_(config.alignment < alignof(T) ? alignof(T) : config.alignment) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      const memory_stats now = space_.memory().stats();
      throw memory_error({.space = std::string(space_.name()),
                          .requested = std::numeric_limits<std::size_t>::max(),
                          .in_use = now.in_use,
                          .budget = now.budget},
                         "buffer of " + std::to_string(n) + " elements of " +
                             std::to_string(sizeof(T)) + " bytes overflows the address space");
    }
    data_ = static_cast<T*>(space_.allocate(n * sizeof(T), alignment_));
    size_ = n;
    if (config.zero_fill && data_ != nullptr) {
      try {
        space_.zero(data_, bytes());
      } catch (...) {
        reset();
        throw;
      }
    }
  }

  // A buffer of n elements, every byte zero.
  static buffer zeroed(std::size_t n) { return buffer(Space{}, n, {.zero_fill = true}); }
  static buffer zeroed(Space space, std::size_t n) {
    return buffer(std::move(space), n, {.zero_fill = true});
  }

  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  buffer(buffer&& other) noexcept
      : space_(other.space_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        alignment_(other.alignment_) {}

  buffer& operator=(buffer&& other) noexcept {
    if (this != &other) {
      reset();
      space_ = other.space_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      alignment_ = other.alignment_;
    }
    return *this;
  }

  ~buffer() { reset(); }

  // Frees the storage now; the buffer becomes empty.
  void reset() noexcept {
    if (data_ != nullptr) {
      space_.deallocate(data_, bytes(), alignment_);
    }
    data_ = nullptr;
    size_ = 0;
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  std::size_t alignment() const noexcept { return alignment_; }
  bool empty() const noexcept { return size_ == 0; }
  const Space& space() const noexcept { return space_; }

  std::span<T> span() noexcept requires host_accessible_space<Space> { return {data_, size_}; }
  std::span<const T> span() const noexcept requires host_accessible_space<Space> {
    return {data_, size_};
  }
  T& operator[](std::size_t i) noexcept requires host_accessible_space<Space> { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept requires host_accessible_space<Space> {
    return data_[i];
  }

  // Copies size() elements from host memory into the buffer; the sizes must match.
  void copy_from_host(std::span<const T> values) {
    check_size(values.size(), "copy_from_host");
    space_.copy_from_host(data_, values.data(), values.size_bytes());
  }

  // Copies the buffer into host memory of size() elements.
  void copy_to_host(std::span<T> values) const {
    check_size(values.size(), "copy_to_host");
    Space space = space_;
    space.copy_to_host(values.data(), data_, values.size_bytes());
  }

 private:
  void check_size(std::size_t n, const char* op) const {
    if (n != size_) {
      throw error("buffer::" + std::string(op) + ": host range has " + std::to_string(n) +
                  " elements, the buffer " + std::to_string(size_));
    }
  }

  [[no_unique_address]] Space space_{};
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t alignment_ = host::default_alignment;
};

}  // namespace strata
