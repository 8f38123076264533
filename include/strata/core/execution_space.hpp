// SPDX-License-Identifier: Apache-2.0
#pragma once

// The execution_space concept: where memory lives and work runs. Policies allocate, copy, fill
// and synchronize through it, and read its memory monitor; strata ships `host` (core/host.hpp)
// and `cuda` (core/cuda.cuh).
//
// An execution space S, with `S& s` and `const S& cs`, must:
//   1. opt in with `using execution_space_category = strata::execution_space_tag;` and be a
//      copyable value (a handle: copies name the same memory and the same tracker);
//   2. name itself: `cs.name()` converts to std::string_view ("host", "cuda:0");
//   3. allocate: `s.allocate(bytes, alignment) -> void*` returns memory of at least `bytes`
//      aligned to `alignment` (a power of two), accounted in memory(); 0 bytes gives nullptr and
//      accounts nothing; failure throws memory_error. `s.deallocate(p, bytes, alignment)` is
//      noexcept, takes back exactly what allocate returned, and is a no-op for nullptr;
//   4. copy: `s.copy_from_host(dst, src, bytes)`, `s.copy_to_host(dst, src, bytes)` and
//      `s.copy(dst, src, bytes)` within the space; non-overlapping ranges; complete on return;
//   5. fill: `s.fill(dst, bytes, std::byte value)` sets every byte, `s.zero(dst, bytes)` clears;
//   6. account: `cs.memory() -> memory_tracker&` (shared by every copy of the space) and
//      `cs.memory_info() -> memory_snapshot`;
//   7. synchronize: `s.synchronize()` returns once all work submitted to the space is done.
//
// A space whose memory the host may dereference also declares
// `static constexpr bool host_accessible = true;` (see host_accessible_space).

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "strata/core/memory.hpp"

namespace strata {

struct execution_space_tag {};

// 1.
template <class S>
concept execution_space_tagged = requires {
  typename S::execution_space_category;
}
&&std::same_as<typename S::execution_space_category, execution_space_tag>&& std::copyable<S>;

// 2.
template <class S>
concept execution_space_named = requires(const S& cs) {
  { cs.name() } -> std::convertible_to<std::string_view>;
};

// 3.
template <class S>
concept execution_space_allocates = requires(S& s, void* p, std::size_t n) {
  { s.allocate(n, n) } -> std::same_as<void*>;
  { s.deallocate(p, n, n) }
  noexcept;
};

// 4.
template <class S>
concept execution_space_copies = requires(S& s, void* dst, const void* src, std::size_t n) {
  s.copy_from_host(dst, src, n);
  s.copy_to_host(dst, src, n);
  s.copy(dst, src, n);
};

// 5.
template <class S>
concept execution_space_fills = requires(S& s, void* dst, std::size_t n, std::byte value) {
  s.fill(dst, n, value);
  s.zero(dst, n);
};

// 6.
template <class S>
concept execution_space_accounts = requires(const S& cs) {
  { cs.memory() } -> std::same_as<memory_tracker&>;
  { cs.memory_info() } -> std::same_as<memory_snapshot>;
};

// 7.
template <class S>
concept execution_space_synchronizes = requires(S& s) {
  s.synchronize();
};

template <class S>
concept execution_space = execution_space_tagged<S> && execution_space_named<S> &&
    execution_space_allocates<S> && execution_space_copies<S> && execution_space_fills<S> &&
    execution_space_accounts<S> && execution_space_synchronizes<S>;

// An execution space whose memory the host can read and write directly (host, pinned host
// memory): buffers in it give std::span access.
template <class S>
concept host_accessible_space = execution_space<S> && requires {
  { S::host_accessible } -> std::convertible_to<bool>;
} && std::bool_constant<S::host_accessible>::value;

// One message per requirement, for the places where a space meets policies:
//   static_assert(strata::check_execution_space<Space>());
template <class S>
consteval bool check_execution_space() {
  static_assert(execution_space_tagged<S>,
                "ExecutionSpace: missing 'using execution_space_category = "
                "strata::execution_space_tag;' or not copyable");
  static_assert(execution_space_named<S>,
                "ExecutionSpace: missing 'std::string_view name() const'");
  static_assert(execution_space_allocates<S>,
                "ExecutionSpace: missing 'void* allocate(std::size_t bytes, std::size_t "
                "alignment)' or 'void deallocate(void*, std::size_t, std::size_t) noexcept'");
  static_assert(execution_space_copies<S>,
                "ExecutionSpace: missing 'copy_from_host', 'copy_to_host' or 'copy' "
                "(void* dst, const void* src, std::size_t bytes)");
  static_assert(execution_space_fills<S>,
                "ExecutionSpace: missing 'fill(void*, std::size_t, std::byte)' or "
                "'zero(void*, std::size_t)'");
  static_assert(execution_space_accounts<S>,
                "ExecutionSpace: missing 'strata::memory_tracker& memory() const' or "
                "'strata::memory_snapshot memory_info() const'");
  static_assert(execution_space_synchronizes<S>, "ExecutionSpace: missing 'void synchronize()'");
  return true;
}

}  // namespace strata
