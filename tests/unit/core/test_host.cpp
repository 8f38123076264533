// SPDX-License-Identifier: Apache-2.0
#include "strata/core/host.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"

namespace {

std::size_t host_in_use() {
  return strata::host{}.memory().stats().in_use;
}
std::size_t host_live() {
  return strata::host{}.memory().stats().allocations;
}

bool aligned_to(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace

TEST_CASE("host is an execution space named host") {
  static_assert(strata::execution_space<strata::host>);
  static_assert(strata::host_accessible_space<strata::host>);
  static_assert(strata::check_execution_space<strata::host>());
  CHECK(strata::host{}.name() == "host");
  CHECK(&strata::host{}.memory() == &strata::host{}.memory());
  CHECK(strata::host{}.memory().space() == "host");
}

TEST_CASE("host honours alignment and accounts rounded sizes") {
  strata::host space;
  for (std::size_t alignment : {std::size_t{64}, std::size_t{256}, std::size_t{4096}}) {
    CAPTURE(alignment);
    const strata::memory_stats before = space.memory().stats();
    void* p = space.allocate(100, alignment);
    REQUIRE(p != nullptr);
    CHECK(aligned_to(p, alignment));
    const strata::memory_stats during = space.memory().stats();
    CHECK(during.in_use == before.in_use + std::max<std::size_t>(128, alignment));
    CHECK(during.allocations == before.allocations + 1);
    CHECK(during.total_allocations == before.total_allocations + 1);
    space.fill(p, 100, std::byte{0xab});
    CHECK(static_cast<unsigned char*>(p)[99] == 0xab);
    space.deallocate(p, 100, alignment);
    CHECK(space.memory().stats().in_use == before.in_use);
    CHECK(space.memory().stats().allocations == before.allocations);
  }
  void* p = space.allocate(64);
  CHECK(aligned_to(p, strata::host::default_alignment));
  space.deallocate(p, 64);
}

TEST_CASE("host rejects an alignment that is not a power of two") {
  strata::host space;
  const strata::memory_stats before = space.memory().stats();
  CHECK_THROWS_AS((void)space.allocate(64, 48), strata::error);
  CHECK_THROWS_AS((void)space.allocate(64, 0), strata::error);
  CHECK(space.memory().stats() == before);
}

TEST_CASE("host zero-size allocation is nullptr and accounts nothing") {
  strata::host space;
  const strata::memory_stats before = space.memory().stats();
  void* p = space.allocate(0, 256);
  CHECK(p == nullptr);
  CHECK(space.memory().stats() == before);
  space.deallocate(p, 0, 256);
  space.copy(p, p, 0);
  space.zero(p, 0);
  CHECK(space.memory().stats() == before);
}

TEST_CASE("host allocation past the budget throws memory_error naming host") {
  strata::host space;
  const std::size_t in_use = host_in_use();
  strata::scoped_budget limit(space.memory(), in_use + 4096);
  void* kept = space.allocate(4000);  // 4032 bytes accounted
  const strata::memory_stats before = space.memory().stats();
  bool thrown = false;
  try {
    (void)space.allocate(128);
  } catch (const strata::memory_error& e) {
    thrown = true;
    CHECK(e.space() == "host");
    CHECK(e.requested() == 128);
    CHECK(e.in_use() == in_use + 4032);
    CHECK(e.budget() == in_use + 4096);
    const std::string what = e.what();
    CHECK(what.find("host") != std::string::npos);
    CHECK(what.find("requested 128 bytes") != std::string::npos);
    CHECK(what.find("in use " + std::to_string(in_use + 4032) + " bytes") != std::string::npos);
    CHECK(what.find("budget " + std::to_string(in_use + 4096) + " bytes") != std::string::npos);
  }
  CHECK(thrown);
  CHECK(space.memory().stats() == before);
  void* fits = space.allocate(64);
  space.deallocate(fits, 64);
  space.deallocate(kept, 4000);
  CHECK(host_in_use() == in_use);
}

TEST_CASE("host allocation overflowing size_t throws memory_error") {
  strata::host space;
  const strata::memory_stats before = space.memory().stats();
  CHECK_THROWS_AS((void)space.allocate(static_cast<std::size_t>(-1) - 8), strata::memory_error);
  CHECK(space.memory().stats() == before);
}

// AddressSanitizer aborts on an impossible allocation instead of returning null, so the
// refusal path is only registered without it.
#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("host turns a refused system allocation into memory_error") {
  strata::host space;
  const strata::memory_stats before = space.memory().stats();
  // 2^62 bytes is past any user address space.
  CHECK_THROWS_AS((void)space.allocate(std::size_t{1} << 62), strata::memory_error);
  CHECK(space.memory().stats().in_use == before.in_use);
  CHECK(space.memory().stats().allocations == before.allocations);
}
#endif

TEST_CASE("host copies and fills") {
  strata::host space;
  std::vector<int> a(16);
  std::iota(a.begin(), a.end(), 0);
  std::vector<int> b(16, -1);
  space.copy_from_host(b.data(), a.data(), 16 * sizeof(int));
  CHECK(a == b);
  std::vector<int> c(16, -1);
  space.copy_to_host(c.data(), b.data(), 16 * sizeof(int));
  CHECK(a == c);
  space.zero(c.data(), 16 * sizeof(int));
  CHECK(std::all_of(c.begin(), c.end(), [](int v) { return v == 0; }));
  space.synchronize();
}

TEST_CASE("host memory_info reports the machine on Linux") {
  const strata::memory_snapshot info = strata::host{}.memory_info();
  CHECK(info.stats.in_use == host_in_use());
#if defined(__linux__)
  CHECK(info.device_total > 0);
  CHECK(info.device_free > 0);
  CHECK(info.device_free <= info.device_total);
#endif
}

TEST_CASE("meminfo parsing is defensive") {
  const auto info = strata::detail::parse_meminfo(
      "MemTotal:       16318112 kB\nMemFree:  1000 kB\nMemAvailable:   8000000 kB\n");
  CHECK(info.total == std::size_t{16318112} * 1024);
  CHECK(info.available == std::size_t{8000000} * 1024);

  CHECK(strata::detail::parse_meminfo("").total == 0);
  CHECK(strata::detail::parse_meminfo("MemTotal: lots\n").total == 0);
  CHECK(strata::detail::parse_meminfo("MemTotal: 12 MB\n").total == 0);
  CHECK(strata::detail::parse_meminfo("MemTotalish: 12 kB\nMemTotal: 3 kB").total == 3072);
  CHECK(strata::detail::parse_meminfo("MemTotal: 99999999999999999999999 kB\n").total == 0);
  CHECK(strata::detail::parse_meminfo("MemTotal:\t7 kB\r\n").total == 7168);
  const auto partial = strata::detail::parse_meminfo("MemTotal: 5 kB\n");
  CHECK(partial.total == 5120);
  CHECK(partial.available == 0);
}

TEST_CASE("buffer allocates, aligns, accounts and releases") {
  const std::size_t in_use = host_in_use();
  const std::size_t live = host_live();
  {
    strata::buffer<float> b(100);
    CHECK(b.size() == 100);
    CHECK(b.bytes() == 400);
    CHECK_FALSE(b.empty());
    CHECK(b.alignment() == 64);
    CHECK(aligned_to(b.data(), 64));
    CHECK(b.span().size() == 100);
    CHECK(b.span().data() == b.data());
    CHECK(host_in_use() == in_use + 448);
    CHECK(host_live() == live + 1);
    b[99] = 1.5f;
    CHECK(std::as_const(b)[99] == 1.5f);
  }
  CHECK(host_in_use() == in_use);
  CHECK(host_live() == live);

  strata::buffer<double> page(strata::host{}, 3, {.alignment = 4096});
  CHECK(aligned_to(page.data(), 4096));
  CHECK(page.alignment() == 4096);
  page.reset();
  CHECK(page.empty());
  CHECK(page.data() == nullptr);
  CHECK(host_in_use() == in_use);
}

TEST_CASE("buffer alignment is at least alignof(T)") {
  struct alignas(128) wide {
    float v[32];
  };
  strata::buffer<wide> b(2, {.alignment = 8});
  CHECK(b.alignment() == 128);
  CHECK(aligned_to(b.data(), 128));
}

TEST_CASE("buffer zero-fills on request") {
  strata::buffer<std::uint32_t> dirty(256);
  std::fill(dirty.span().begin(), dirty.span().end(), 0xdeadbeefu);
  dirty.reset();
  strata::buffer<std::uint32_t> a(256, {.zero_fill = true});
  CHECK(std::all_of(a.span().begin(), a.span().end(), [](std::uint32_t v) { return v == 0; }));
  auto b = strata::buffer<std::uint32_t>::zeroed(300);
  CHECK(b.size() == 300);
  CHECK(std::all_of(b.span().begin(), b.span().end(), [](std::uint32_t v) { return v == 0; }));
  auto c = strata::buffer<std::uint32_t>::zeroed(strata::host{}, 0);
  CHECK(c.empty());
  CHECK(strata::to_string(strata::buffer_config{.alignment = 256, .zero_fill = true}) ==
        "buffer_config{.alignment = 256, .zero_fill = true}");
}

TEST_CASE("buffer is move-only and moving transfers ownership") {
  static_assert(!std::is_copy_constructible_v<strata::buffer<int>>);
  static_assert(!std::is_copy_assignable_v<strata::buffer<int>>);
  static_assert(std::is_nothrow_move_constructible_v<strata::buffer<int>>);
  static_assert(std::is_nothrow_move_assignable_v<strata::buffer<int>>);

  const std::size_t in_use = host_in_use();
  strata::buffer<int> a(32);
  int* p = a.data();
  a[0] = 7;

  strata::buffer<int> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 32);
  CHECK(b[0] == 7);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  CHECK(a.size() == 0);
  CHECK(host_in_use() == in_use + 128);

  strata::buffer<int> c(64);
  CHECK(host_in_use() == in_use + 128 + 256);
  c = std::move(b);  // c's own 64 ints are released
  CHECK(c.data() == p);
  CHECK(c.size() == 32);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  CHECK(host_in_use() == in_use + 128);

  strata::buffer<int>& alias = c;
  c = std::move(alias);  // self-move keeps the storage
  CHECK(c.data() == p);

  { strata::buffer<int> d(std::move(c)); }
  CHECK(host_in_use() == in_use);
}

TEST_CASE("buffer of zero elements and default buffer hold nothing") {
  const strata::memory_stats before = strata::host{}.memory().stats();
  strata::buffer<int> empty;
  strata::buffer<int> zero(0, {.zero_fill = true});
  CHECK(empty.empty());
  CHECK(zero.empty());
  CHECK(zero.data() == nullptr);
  CHECK(zero.span().empty());
  CHECK(strata::host{}.memory().stats() == before);
}

TEST_CASE("buffer copies to and from host ranges of its size") {
  std::vector<float> values(10);
  std::iota(values.begin(), values.end(), 1.0f);
  strata::buffer<float> b(10);
  b.copy_from_host(values);
  CHECK(b[9] == 10.0f);
  std::vector<float> back(10, 0.0f);
  b.copy_to_host(back);
  CHECK(back == values);
  std::vector<float> wrong(9);
  CHECK_THROWS_AS(b.copy_from_host(wrong), strata::error);
  CHECK_THROWS_AS(b.copy_to_host(wrong), strata::error);
}

TEST_CASE("buffer too large for the address space throws memory_error") {
  const strata::memory_stats before = strata::host{}.memory().stats();
  CHECK_THROWS_AS(strata::buffer<double>(static_cast<std::size_t>(-1) / 4), strata::memory_error);
  CHECK(strata::host{}.memory().stats() == before);
}

TEST_CASE("buffer past the budget throws memory_error and leaks nothing") {
  const strata::memory_stats before = strata::host{}.memory().stats();
  {
    strata::scoped_budget limit(strata::host{}.memory(), before.in_use + 1024);
    strata::buffer<char> fits(1024);
    CHECK_THROWS_AS(strata::buffer<char>(1), strata::memory_error);
  }
  const strata::memory_stats after = strata::host{}.memory().stats();
  CHECK(after.in_use == before.in_use);
  CHECK(after.allocations == before.allocations);
  CHECK(after.budget == before.budget);
}

TEST_CASE("host_account accounts the thread's allocations apart, inside the process tracker") {
  strata::memory_tracker& process = strata::host{}.memory();
  const std::size_t process_before = process.stats().in_use;
  strata::buffer<float> outlives;
  {
    strata::host_account account("host:test");
    strata::memory_tracker& mine = account.memory();
    CHECK(mine.space() == "host:test");
    CHECK(mine.parent() == &process);
    CHECK(&strata::host{}.memory() == &mine);
    // A moved-from value still accounts where it did.
    strata::host from;
    const strata::host to = std::move(from);
    CHECK(&from.memory() == &mine);  // NOLINT(bugprone-use-after-move): what is tested
    CHECK(&to.memory() == &mine);

    strata::buffer<float> a(1000);  // 4000 bytes, 4032 rounded to 64
    CHECK(mine.stats().in_use == 4032);
    CHECK(process.stats().in_use == process_before + 4032);
    CHECK(&a.space().memory() == &mine);

    // Another thread allocates in the process tracker, and may free the account's buffer.
    std::size_t other_in_mine = 0;
    std::thread([&] {
      const strata::buffer<float> b(16);
      CHECK(&strata::host{}.memory() == &process);
      other_in_mine = mine.stats().in_use;
      strata::buffer<float> taken = std::move(a);
    }).join();
    CHECK(other_in_mine == 4032);
    CHECK(mine.stats().in_use == 0);
    CHECK(process.stats().in_use == process_before);

    // The account's budget is its own.
    {
      const strata::scoped_budget limit(mine, 1024);
      CHECK_THROWS_WITH_AS(strata::buffer<float>(1000), doctest::Contains("host:test"),
                           strata::memory_error);
      CHECK(process.stats().in_use == process_before);
    }

    // Nested accounts end in reverse order and count in the enclosing one.
    {
      strata::host_account inner("host:inner");
      CHECK(inner.memory().parent() == &mine);
      const strata::buffer<float> c(16);
      CHECK(inner.memory().stats().in_use == 64);
      CHECK(mine.stats().in_use == 64);
      CHECK(process.stats().in_use == process_before + 64);
    }
    CHECK(&strata::host{}.memory() == &mine);
    outlives = strata::buffer<float>(32);
    CHECK(mine.stats().in_use == 128);
  }
  // The account ended; the thread is back on the process tracker, and the buffer made inside
  // still returns its bytes to the account's tracker (kept alive by the buffer) and the process.
  CHECK(&strata::host{}.memory() == &process);
  CHECK(outlives.space().memory().space() == "host:test");
  CHECK(process.stats().in_use == process_before + 128);
  outlives.reset();
  CHECK(process.stats().in_use == process_before);
}

TEST_CASE("host_account_scope lets a helper thread count in its owner's account") {
  strata::memory_tracker& process = strata::host{}.memory();
  const std::size_t process_before = process.stats().in_use;
  strata::host_account account("host:owner");
  const strata::host owner;
  std::string seen;
  std::string seen_inner;
  std::string seen_after;
  std::thread([&] {
    {
      const strata::host_account_scope in(owner);
      seen = strata::host{}.memory().space();
      const strata::buffer<float> b(16);
      CHECK(account.memory().stats().in_use == 64);
      {
        // An account opened inside the scope sits inside the owner's.
        strata::host_account inner("host:helper");
        seen_inner = inner.memory().parent()->space();
      }
      // Under the owner's budget: the helper's allocation past it fails, naming the account.
      const strata::scoped_budget limit(account.memory(), 128);
      CHECK_THROWS_WITH_AS(strata::buffer<float>(64), doctest::Contains("host:owner"),
                           strata::memory_error);
    }
    seen_after = strata::host{}.memory().space();
  }).join();
  CHECK(seen == "host:owner");
  CHECK(seen_inner == "host:owner");
  CHECK(seen_after == process.space());
  CHECK(account.memory().stats().in_use == 0);
  CHECK(account.memory().stats().peak == 64);
  CHECK(process.stats().in_use == process_before);

  // A value made outside every account enters the process tracker.
  const strata::host_account other("host:other");
  std::string plain;
  std::thread([&] {
    const strata::host_account_scope in(strata::host{});  // this thread has no account
    plain = strata::host{}.memory().space();
  }).join();
  CHECK(plain == process.space());
}
