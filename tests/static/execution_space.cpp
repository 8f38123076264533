// SPDX-License-Identifier: Apache-2.0
// Compile-time checks of the execution_space concept: host satisfies it; a type missing one
// requirement fails exactly that requirement.
#include "strata/core/execution_space.hpp"

#include <cstddef>
#include <string_view>

#include "strata/core/host.hpp"
#include "strata/core/memory.hpp"

namespace {

// Everything a space needs, each member removable by a derived type below.
struct complete_space {
  using execution_space_category = strata::execution_space_tag;

  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy_to_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_tracker& memory() const noexcept { return strata::host{}.memory(); }
  strata::memory_snapshot memory_info() const { return {}; }
  void synchronize() {}
};

struct untagged {
  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy_to_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_tracker& memory() const noexcept { return strata::host{}.memory(); }
  strata::memory_snapshot memory_info() const { return {}; }
  void synchronize() {}
};

struct wrong_tag : complete_space {
  using execution_space_category = int;
};

struct no_synchronize {
  using execution_space_category = strata::execution_space_tag;

  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy_to_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_tracker& memory() const noexcept { return strata::host{}.memory(); }
  strata::memory_snapshot memory_info() const { return {}; }
};

struct throwing_deallocate {
  using execution_space_category = strata::execution_space_tag;

  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) {}  // not noexcept
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy_to_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_tracker& memory() const noexcept { return strata::host{}.memory(); }
  strata::memory_snapshot memory_info() const { return {}; }
  void synchronize() {}
};

struct tracker_by_value {
  using execution_space_category = strata::execution_space_tag;

  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy_to_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_stats memory() const noexcept { return {}; }
  strata::memory_snapshot memory_info() const { return {}; }
  void synchronize() {}
};

struct no_copy_to_host {
  using execution_space_category = strata::execution_space_tag;

  std::string_view name() const noexcept { return "test"; }
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void copy_from_host(void*, const void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void fill(void*, std::size_t, std::byte) {}
  void zero(void*, std::size_t) {}
  strata::memory_tracker& memory() const noexcept { return strata::host{}.memory(); }
  strata::memory_snapshot memory_info() const { return {}; }
  void synchronize() {}
};

struct device_only : complete_space {
  static constexpr bool host_accessible = false;
};

struct host_visible : complete_space {
  static constexpr bool host_accessible = true;
};

}  // namespace

static_assert(strata::execution_space<strata::host>);
static_assert(strata::host_accessible_space<strata::host>);
static_assert(strata::check_execution_space<strata::host>());

static_assert(strata::execution_space<complete_space>);
static_assert(strata::check_execution_space<complete_space>());
static_assert(!strata::host_accessible_space<complete_space>);  // undeclared means device
static_assert(!strata::host_accessible_space<device_only>);
static_assert(strata::host_accessible_space<host_visible>);

static_assert(!strata::execution_space_tagged<untagged>);
static_assert(strata::execution_space_named<untagged>);
static_assert(!strata::execution_space<untagged>);

static_assert(!strata::execution_space_tagged<wrong_tag>);
static_assert(!strata::execution_space<wrong_tag>);

static_assert(!strata::execution_space_synchronizes<no_synchronize>);
static_assert(strata::execution_space_copies<no_synchronize>);
static_assert(!strata::execution_space<no_synchronize>);

static_assert(!strata::execution_space_allocates<throwing_deallocate>);
static_assert(!strata::execution_space<throwing_deallocate>);

static_assert(!strata::execution_space_accounts<tracker_by_value>);
static_assert(!strata::execution_space<tracker_by_value>);

static_assert(!strata::execution_space_copies<no_copy_to_host>);
static_assert(!strata::execution_space<no_copy_to_host>);

static_assert(!strata::execution_space<int>);

int main() {}
