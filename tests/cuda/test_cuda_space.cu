// SPDX-License-Identifier: Apache-2.0
// The CUDA execution space on a real GPU: allocation and accounting, copies, budgets, device
// refusals, memory_info, streams, events and pinned host memory.
#include "strata/core/cuda.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "strata/batch/adaptive.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"

static_assert(strata::execution_space<strata::cuda>);
static_assert(!strata::host_accessible_space<strata::cuda>);
static_assert(strata::check_execution_space<strata::cuda>());
static_assert(strata::execution_space<strata::cuda_pinned>);
static_assert(strata::host_accessible_space<strata::cuda_pinned>);

namespace {

bool aligned_to(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace

TEST_CASE("cuda_check turns CUDA statuses into strata errors") {
  CHECK_NOTHROW(strata::cuda_check(cudaSuccess, "nothing"));
  try {
    strata::cuda_check(cudaErrorInvalidValue, "cudaMemcpy(test)");
    FAIL("cuda_check did not throw");
  } catch (const strata::cuda_error& e) {
    CHECK(e.status() == cudaErrorInvalidValue);
    CHECK(e.call() == "cudaMemcpy(test)");
    const std::string what = e.what();
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("cudaMemcpy(test)") != std::string::npos);
    CHECK(what.find("test_cuda_space.cu") != std::string::npos);
  }
  CHECK_THROWS_AS(strata::cuda_check(cudaErrorMemoryAllocation, "cudaMalloc",
                                     {.space = "cuda:0", .requested = 8}),
                  strata::memory_error);
}

TEST_CASE("cuda allocates aligned, accounted device memory") {
  const strata::cuda space(0);
  CHECK(space.name() == "cuda:0");
  CHECK(&space.memory() == &strata::cuda{}.memory());
  const strata::memory_stats before = space.memory().stats();
  void* p = space.allocate(1000);
  REQUIRE(p != nullptr);
  CHECK(aligned_to(p, 256));
  const strata::memory_stats during = space.memory().stats();
  CHECK(during.in_use == before.in_use + 1024);
  CHECK(during.allocations == before.allocations + 1);
  CHECK(during.peak >= during.in_use);
  space.deallocate(p, 1000);
  CHECK(space.memory().stats().in_use == before.in_use);
  CHECK(space.memory().stats().allocations == before.allocations);

  CHECK(space.allocate(0) == nullptr);
  CHECK(space.memory().stats().allocations == before.allocations);
}

TEST_CASE("cuda copies round trip through device memory") {
  strata::cuda space(0);
  std::vector<float> values(4096);
  std::iota(values.begin(), values.end(), 0.5f);

  strata::buffer<float, strata::cuda> a(space, values.size());
  strata::buffer<float, strata::cuda> b(space, values.size());
  a.copy_from_host(values);
  space.copy(b.data(), a.data(), a.bytes());
  std::vector<float> back(values.size(), 0.0f);
  b.copy_to_host(back);
  CHECK(back == values);

  space.zero(b.data(), b.bytes());
  b.copy_to_host(back);
  CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.0f; }));

  space.fill(b.data(), b.bytes(), std::byte{0xff});
  std::vector<std::uint32_t> bits(values.size(), 0);
  space.copy_to_host(bits.data(), b.data(), b.bytes());
  CHECK(std::all_of(bits.begin(), bits.end(), [](std::uint32_t v) { return v == 0xffffffffu; }));

  auto zeroed = strata::buffer<float, strata::cuda>::zeroed(space, 100);
  std::vector<float> small(100, 1.0f);
  zeroed.copy_to_host(small);
  CHECK(std::all_of(small.begin(), small.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("cuda allocation past the budget throws memory_error and keeps the tracker") {
  const strata::cuda space(0);
  const std::size_t in_use = space.memory().stats().in_use;
  const strata::scoped_budget limit(space.memory(), in_use + (1u << 20));
  strata::buffer<char, strata::cuda> fits(space, 1u << 19);
  const strata::memory_stats before = space.memory().stats();
  try {
    strata::buffer<char, strata::cuda> too_big(space, 1u << 20);
    FAIL("no memory_error");
  } catch (const strata::memory_error& e) {
    CHECK(e.space() == "cuda:0");
    CHECK(e.requested() == (1u << 20));
    CHECK(e.in_use() == in_use + (1u << 19));
    CHECK(e.budget() == in_use + (1u << 20));
    CHECK(std::string(e.what()).find("cuda:0") != std::string::npos);
  }
  CHECK(space.memory().stats() == before);
}

TEST_CASE("cuda turns a refused cudaMalloc into memory_error and recovers") {
  const strata::cuda space(0);
  const strata::memory_snapshot info = space.memory_info();
  const strata::memory_stats before = space.memory().stats();
  CHECK_THROWS_AS((void)space.allocate(info.device_total * 2), strata::memory_error);
  CHECK(space.memory().stats().in_use == before.in_use);
  CHECK(space.memory().stats().allocations == before.allocations);
  CHECK(cudaGetLastError() == cudaSuccess);
  void* p = space.allocate(4096);
  CHECK(p != nullptr);
  space.deallocate(p, 4096);
}

TEST_CASE("cuda memory_info is sane") {
  const strata::cuda space(0);
  strata::buffer<double, strata::cuda> held(space, 1 << 20);
  const strata::memory_snapshot info = space.memory_info();
  CHECK(info.device_total > 0);
  CHECK(info.device_free > 0);
  CHECK(info.device_free <= info.device_total);
  CHECK(info.stats.in_use >= held.bytes());
  CHECK(info.stats.in_use <= info.device_total);
  CHECK(info.stats == space.memory().stats());
}

TEST_CASE("cuda streams and events order asynchronous copies") {
  strata::cuda_stream stream(0);
  const strata::cuda space = stream.space();
  CHECK(space.stream() == stream.get());

  strata::pinned_buffer<int> staging(1 << 16);
  CHECK(aligned_to(staging.data(), 64));
  std::iota(staging.span().begin(), staging.span().end(), 0);
  strata::buffer<int, strata::cuda> device(space, staging.size());

  strata::cuda_event start;
  strata::cuda_event stop;
  start.record(stream);
  space.copy_from_host_async(device.data(), staging.data(), device.bytes());
  stop.record(stream);

  strata::cuda_stream other(0);
  other.wait(stop);
  strata::pinned_buffer<int> back = strata::pinned_buffer<int>::zeroed(staging.size());
  other.space().copy_to_host_async(back.data(), device.data(), device.bytes());
  other.synchronize();
  CHECK(std::equal(back.span().begin(), back.span().end(), staging.span().begin()));

  stop.synchronize();
  CHECK(stop.ready());
  CHECK(strata::elapsed_milliseconds(start, stop) >= 0.0f);

  strata::cuda_event untimed({.device = 0, .timing = false});
  untimed.record(stream);
  untimed.synchronize();
  CHECK(untimed.ready());
}

TEST_CASE("pinned memory is accounted apart from host memory") {
  const strata::memory_stats host_before = strata::host{}.memory().stats();
  const strata::memory_stats pinned_before = strata::cuda_pinned{}.memory().stats();
  {
    strata::pinned_buffer<float> staging(1000);
    CHECK(strata::cuda_pinned{}.memory().stats().in_use == pinned_before.in_use + 4032);
    CHECK(strata::host{}.memory().stats().in_use == host_before.in_use);
  }
  CHECK(strata::cuda_pinned{}.memory().stats().in_use == pinned_before.in_use);
}

TEST_CASE("space_monitor on a GPU counts what the device holds outside the tracker") {
  strata::cuda gpu{0};
  strata::batch::space_monitor<strata::cuda> monitor(gpu);
  const strata::memory_snapshot info = gpu.memory_info();
  REQUIRE(info.device_total > 0);
  CHECK(monitor.budget() == static_cast<std::size_t>(0.8 * static_cast<double>(info.device_total)));
  monitor.reset_peak();
  // The CUDA context alone holds device memory the tracker does not see.
  const std::size_t idle = monitor.peak();
  CHECK(idle > gpu.memory().stats().peak);
  {
    strata::buffer<float, strata::cuda> block(gpu, std::size_t{16} << 20);
    CHECK(monitor.peak() >= idle + (std::size_t{64} << 20));
  }
}
