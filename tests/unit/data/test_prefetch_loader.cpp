// SPDX-License-Identifier: Apache-2.0
#include "strata/data/prefetch_loader.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sd = strata::data;
using namespace std::chrono_literals;

namespace {

// Sample i is 2 x 3 x 3 values derived from i, label i % 10; reads may be slowed, made to fail
// or counted.
struct synthetic {
  using dataset_category = sd::dataset_tag;

  std::size_t n = 0;
  std::uint64_t fail_on = UINT64_MAX;
  std::uint64_t slow_on = UINT64_MAX;
  std::chrono::milliseconds slow_for{0};
  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> inside = std::make_shared<std::atomic<int>>(0);

  std::size_t size() const { return n; }
  sd::sample_shape shape() const { return {.channels = 2, .height = 3, .width = 3}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    ++*inside;
    ++*reads;
    if (i == slow_on) {
      std::this_thread::sleep_for(slow_for);
    }
    if (i == fail_on) {
      --*inside;
      throw std::runtime_error("disk gone at sample " + std::to_string(i));
    }
    for (std::size_t e = 0; e < out.size(); ++e) {
      out[e] = static_cast<float>(i) + 0.001f * static_cast<float>(e);
    }
    --*inside;
    return static_cast<std::int32_t>(i % 10);
  }
};

// Adds noise drawn from the sample's stream and keeps only the first channel: output 1 x 3 x 3.
struct noisy_first_channel {
  using transform_category = sd::transform_tag;
  sd::sample_shape output_shape(const sd::sample_shape& in) const {
    return {.channels = 1, .height = in.height, .width = in.width};
  }
  void apply(std::span<const float> in, const sd::sample_shape& shape, std::span<float> out,
             const sd::transform_context& context) const {
    strata::rng_stream rng = context.rng();
    for (std::size_t e = 0; e < shape.plane(); ++e) {
      out[e] = in[e] + rng.uniform(-0.5f, 0.5f);
    }
  }
};

struct epoch_result {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;
  std::vector<std::size_t> indices;
  std::vector<std::size_t> sizes;
};

template <class Loader>
epoch_result drain(Loader& loader, std::uint32_t epoch, std::size_t first_batch = 0) {
  epoch_result r;
  loader.start_epoch(epoch, first_batch);
  while (auto batch = loader.next()) {
    r.inputs.insert(r.inputs.end(), batch->inputs.begin(), batch->inputs.end());
    r.labels.insert(r.labels.end(), batch->labels.begin(), batch->labels.end());
    r.indices.insert(r.indices.end(), batch->indices.begin(), batch->indices.end());
    r.sizes.push_back(batch->size);
  }
  return r;
}

epoch_result run(std::size_t workers, std::size_t n, std::size_t batch, int ranks = 1, int rank = 0,
                 std::uint32_t epoch = 1, std::size_t first_batch = 0) {
  synthetic data{.n = n};
  sd::prefetch_loader loader(
      data, noisy_first_channel{},
      sd::distributed_sampler({.dataset_size = n, .ranks = ranks, .rank = rank, .seed = 11}),
      {.batch_size = batch, .workers = workers, .prefetch_depth = 3, .seed = 5});
  return drain(loader, epoch, first_batch);
}

}  // namespace

TEST_CASE("the batches do not depend on the worker count") {
  const epoch_result sync = run(0, 203, 16);
  CHECK(sync.indices.size() == 203);
  CHECK(sync.sizes.size() == 13);
  CHECK(sync.sizes.back() == 203 - 12 * 16);
  for (std::size_t workers : {1u, 2u, 4u}) {
    CAPTURE(workers);
    const epoch_result r = run(workers, 203, 16);
    CHECK(r.indices == sync.indices);
    CHECK(r.labels == sync.labels);
    CHECK(r.sizes == sync.sizes);
    CHECK(r.inputs == sync.inputs);  // bit for bit
  }
  // Labels and indices agree with the dataset; the augmentation differs between epochs.
  for (std::size_t i = 0; i < sync.indices.size(); ++i) {
    CHECK(sync.labels[i] == static_cast<std::int32_t>(sync.indices[i] % 10));
  }
  CHECK(run(2, 203, 16, 1, 0, 2).inputs != sync.inputs);
}

TEST_CASE("two ranks with half the batch hold the one-rank batches") {
  const std::size_t n = 200;
  const epoch_result one = run(2, n, 8);
  const epoch_result r0 = run(2, n, 4, 2, 0);
  const epoch_result r1 = run(1, n, 4, 2, 1);
  REQUIRE(r0.sizes.size() == one.sizes.size());
  REQUIRE(r1.sizes.size() == one.sizes.size());
  const std::size_t e = 9;  // output elements per sample
  for (std::size_t k = 0; k < one.sizes.size(); ++k) {
    std::map<std::size_t, std::vector<float>> global;
    std::map<std::size_t, std::vector<float>> joined;
    for (std::size_t j = 0; j < 8; ++j) {
      const std::size_t s = k * 8 + j;
      global[one.indices[s]] = {one.inputs.begin() + static_cast<long>(s * e),
                                one.inputs.begin() + static_cast<long>((s + 1) * e)};
    }
    for (const epoch_result* part : {&r0, &r1}) {
      for (std::size_t j = 0; j < 4; ++j) {
        const std::size_t s = k * 4 + j;
        joined[part->indices[s]] = {part->inputs.begin() + static_cast<long>(s * e),
                                    part->inputs.begin() + static_cast<long>((s + 1) * e)};
      }
    }
    CHECK(global == joined);
  }
}

TEST_CASE("an epoch covers every sample once; drop_last drops the short batch") {
  const epoch_result r = run(3, 96, 10);
  std::vector<std::size_t> sorted = r.indices;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < 96; ++i) {
    CHECK(sorted[i] == i);
  }

  synthetic data{.n = 96};
  sd::prefetch_loader loader(data, sd::no_transform{},
                             sd::distributed_sampler({.dataset_size = 96, .seed = 1}),
                             {.batch_size = 10, .workers = 2, .drop_last = true});
  CHECK(loader.batches_per_epoch() == 9);
  const epoch_result dropped = drain(loader, 0);
  CHECK(dropped.sizes == std::vector<std::size_t>(9, 10));
  CHECK(loader.stats().batches == 9);
  CHECK(loader.stats().samples == 90);
}

TEST_CASE("an epoch resumes at a batch with the same batches") {
  const epoch_result full = run(2, 150, 8);
  const epoch_result tail = run(2, 150, 8, 1, 0, 1, 5);
  CHECK(tail.indices == std::vector<std::size_t>(full.indices.begin() + 40, full.indices.end()));
  CHECK(tail.inputs == std::vector<float>(full.inputs.begin() + 40 * 9, full.inputs.end()));
  const epoch_result none = run(2, 150, 8, 1, 0, 1, 19);
  CHECK(none.indices.empty());
}

TEST_CASE("batches are aligned, reported and restartable") {
  synthetic data{.n = 64};
  sd::prefetch_loader loader(
      data, sd::no_transform{}, sd::distributed_sampler({.dataset_size = 64, .shuffle = false}),
      {.batch_size = 5, .workers = 2, .prefetch_depth = 2, .alignment = 256});
  CHECK(loader.slot_count() == 3);
  CHECK(loader.output_shape() == sd::sample_shape{.channels = 2, .height = 3, .width = 3});
  loader.start_epoch(0);
  auto first = loader.next();
  REQUIRE(first);
  CHECK(reinterpret_cast<std::uintptr_t>(first->inputs.data()) % 256 == 0);
  CHECK(first->indices[0] == 0);
  CHECK(first->inputs[18] == doctest::Approx(1.0));  // sample 1, element 0
  CHECK(first->wait_seconds >= 0.0);
  auto second = loader.next();
  REQUIRE(second);
  CHECK(second->step == 1);
  CHECK(second->first_sample == 5);
  CHECK(loader.next_batch() == 2);
  // Restarting mid-epoch stops the workers and begins again.
  loader.start_epoch(0);
  auto again = loader.next();
  REQUIRE(again);
  CHECK(again->indices[0] == 0);
  CHECK(loader.stats().batches == 1);
  CHECK_THROWS_AS(loader.start_epoch(0, 99), std::invalid_argument);
}

TEST_CASE("workers stay at most prefetch_depth batches ahead of the step") {
  synthetic data{.n = 400};
  sd::prefetch_loader loader(data, sd::no_transform{},
                             sd::distributed_sampler({.dataset_size = 400}),
                             {.batch_size = 10, .workers = 3, .prefetch_depth = 2});
  loader.start_epoch(0);
  REQUIRE(loader.next());
  std::this_thread::sleep_for(200ms);
  // The held batch and two ahead: 30 samples, and nothing more.
  CHECK(data.reads->load() == 30);
  REQUIRE(loader.next());
  std::this_thread::sleep_for(200ms);
  CHECK(data.reads->load() == 40);
}

TEST_CASE("a worker's exception reaches the step with the worker and the sample") {
  for (std::size_t workers : {0u, 1u, 3u}) {
    CAPTURE(workers);
    synthetic data{.n = 100, .fail_on = 37};
    sd::prefetch_loader loader(data, sd::no_transform{},
                               sd::distributed_sampler({.dataset_size = 100, .shuffle = false}),
                               {.batch_size = 8, .workers = workers});
    loader.start_epoch(0);
    std::size_t delivered = 0;
    bool thrown = false;
    try {
      while (auto b = loader.next()) {
        delivered += b->size;
      }
    } catch (const strata::data_error& e) {
      thrown = true;
      CHECK(e.sample_index() == 37u);
      const std::string what = e.what();
      CHECK(what.find("sample 37") != std::string::npos);
      CHECK(what.find("disk gone at sample 37") != std::string::npos);
      CHECK(what.find("batch 4") != std::string::npos);
      if (workers > 0) {
        CHECK(what.find("loader worker ") != std::string::npos);
      }
    }
    CHECK(thrown);
    CHECK(delivered <= 32);  // batches 0..3 at most; batch 4 holds sample 37
    // Later calls keep failing rather than returning garbage.
    CHECK_THROWS_AS(loader.next(), strata::data_error);
  }
}

TEST_CASE("a stalled worker hits the timeout with a clear message") {
  synthetic data{.n = 64, .slow_on = 12, .slow_for = 1500ms};
  sd::prefetch_loader loader(data, sd::no_transform{},
                             sd::distributed_sampler({.dataset_size = 64, .shuffle = false}),
                             {.batch_size = 8, .workers = 2, .timeout_seconds = 0.3});
  loader.start_epoch(0);
  REQUIRE(loader.next());  // batch 0: samples 0..7
  const auto begin = std::chrono::steady_clock::now();
  try {
    loader.next();  // batch 1 holds sample 12
    FAIL("no timeout");
  } catch (const strata::data_error& e) {
    const std::string what = e.what();
    CHECK(what.find("batch 1 of epoch 0 not ready after") != std::string::npos);
    CHECK(what.find("loader_timeout") != std::string::npos);
    CHECK(what.find("on sample 12 for") != std::string::npos);
    CHECK(e.sample_index() == 12u);
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  CHECK(waited >= 0.29);
  CHECK(waited < 1.4);
}

TEST_CASE("destroying a loader mid-epoch joins every worker") {
  synthetic data{.n = 10000, .slow_on = 40, .slow_for = 300ms};
  {
    sd::prefetch_loader loader(data, sd::no_transform{},
                               sd::distributed_sampler({.dataset_size = 10000, .shuffle = false}),
                               {.batch_size = 16, .workers = 4, .prefetch_depth = 8});
    loader.start_epoch(0);
    REQUIRE(loader.next());
    std::this_thread::sleep_for(50ms);
    CHECK(data.inside->load() >= 1);  // a worker is inside the slow read
  }
  CHECK(data.inside->load() == 0);
  const int reads = data.reads->load();
  std::this_thread::sleep_for(100ms);
  CHECK(data.reads->load() == reads);  // nothing runs after the destructor
}

namespace {

// A type the loader cannot change: adapted by specializing the traits (tier 2).
struct legacy_table {
  std::vector<float> values;  // one value per sample
  std::size_t count() const { return values.size(); }
};

}  // namespace

template <>
inline constexpr bool sd::enable_dataset<legacy_table> = true;

template <>
struct sd::dataset_traits<legacy_table> {
  static std::size_t size(const legacy_table& t) { return t.count(); }
  static sd::sample_shape shape(const legacy_table&) { return {}; }
  static std::int32_t read(const legacy_table& t, std::size_t i, std::span<float> out) {
    out[0] = t.values[i];
    return 0;
  }
};

TEST_CASE("a user type joins through the traits, and mismatches are refused") {
  static_assert(sd::dataset<legacy_table>);
  legacy_table table{.values = {1.0f, 2.0f, 3.0f}};
  sd::prefetch_loader loader(table, sd::no_transform{},
                             sd::distributed_sampler({.dataset_size = 3, .shuffle = false}),
                             {.batch_size = 2, .workers = 1});
  const epoch_result r = drain(loader, 0);
  CHECK(r.inputs == std::vector<float>{1.0f, 2.0f, 3.0f});

  CHECK_THROWS_WITH_AS(
      sd::prefetch_loader(table, sd::no_transform{}, sd::distributed_sampler({.dataset_size = 4}),
                          {.batch_size = 2}),
      doctest::Contains("the sampler is for 4 samples, the dataset has 3"), std::invalid_argument);
  CHECK_THROWS_AS(
      sd::prefetch_loader(table, sd::no_transform{}, sd::distributed_sampler({.dataset_size = 3}),
                          {.batch_size = 0}),
      std::invalid_argument);
  sd::prefetch_loader idle(table, sd::no_transform{}, sd::distributed_sampler({.dataset_size = 3}),
                           {.batch_size = 2});
  CHECK_THROWS_AS(idle.next(), std::logic_error);
}

namespace {

// Copies its input through a scratch buffer of strata's, noting the tracker that counted it.
struct scratch_transform {
  using transform_category = sd::transform_tag;
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::set<std::string>> spaces = std::make_shared<std::set<std::string>>();
  sd::sample_shape output_shape(const sd::sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sd::sample_shape&, std::span<float> out,
             const sd::transform_context&) const {
    strata::buffer<float> scratch(in.size());
    std::copy(in.begin(), in.end(), scratch.data());
    std::copy(scratch.data(), scratch.data() + in.size(), out.begin());
    const std::lock_guard lock(*mutex);
    spaces->insert(scratch.space().memory().space());
  }
};

}  // namespace

TEST_CASE("workers count their allocations in the account of the thread that built the loader") {
  synthetic data{.n = 200};
  const scratch_transform transform;
  strata::host_account account("host:loader-owner");
  {
    sd::prefetch_loader loader(data, transform,
                               sd::distributed_sampler({.dataset_size = 200, .shuffle = false}),
                               {.batch_size = 16, .workers = 2, .prefetch_depth = 2});
    const std::size_t slots = account.memory().stats().in_use;
    CHECK(slots > 0);  // the batch slots are the builder's
    const epoch_result r = drain(loader, 0);
    CHECK(r.indices.size() == 200);
    CHECK(account.memory().stats().peak > slots);  // and so are the workers' scratch buffers
  }
  CHECK(*transform.spaces == std::set<std::string>{"host:loader-owner"});
  CHECK(account.memory().stats().in_use == 0);
}

namespace {

// Records the nice value of every thread that transforms a sample.
struct nice_recorder {
  using transform_category = sd::transform_tag;
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::set<int>> nice = std::make_shared<std::set<int>>();
  sd::sample_shape output_shape(const sd::sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sd::sample_shape&, std::span<float> out,
             const sd::transform_context&) const {
    std::copy(in.begin(), in.end(), out.begin());
    const std::lock_guard lock(*mutex);
    nice->insert(strata::this_thread_nice());
  }
};

}  // namespace

TEST_CASE("workers run below the caller's priority, by worker_nice, and the caller keeps its own") {
  synthetic data{.n = 64};
  const int caller = strata::this_thread_nice();
  for (const int increment : {10, 3, 0}) {
    CAPTURE(increment);
    const nice_recorder transform;
    sd::prefetch_loader loader(
        data, transform, sd::distributed_sampler({.dataset_size = 64, .shuffle = false}),
        {.batch_size = 8, .workers = 2, .prefetch_depth = 2, .worker_nice = increment});
    CHECK(drain(loader, 0).indices.size() == 64);
#if defined(__linux__)
    CHECK(*transform.nice == std::set<int>{std::min(19, caller + increment)});
#endif
    CHECK(strata::this_thread_nice() == caller);
  }
  CHECK(to_string(sd::loader_config{.worker_nice = 4}).find(".worker_nice = 4}") !=
        std::string::npos);
}
