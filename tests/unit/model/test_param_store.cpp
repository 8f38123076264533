// SPDX-License-Identifier: Apache-2.0
#include "strata/model/param_store.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace sm = strata::model;

namespace {

std::vector<sm::param_spec> dense(std::size_t in, std::size_t out) {
  return {{.name = "weight",
           .rows = out,
           .cols = in,
           .init = sm::init_kind::kaiming_uniform,
           .fan_in = in,
           .fan_out = out},
          {.name = "bias",
           .rows = 1,
           .cols = out,
           .init = sm::init_kind::zeros,
           .fan_in = in,
           .fan_out = out,
           .weight_decay = false}};
}

}  // namespace

TEST_CASE("groups start aligned, tensors are packed, views are named") {
  sm::param_store store({"0", "1", "2"}, {dense(3, 5), {}, dense(5, 2)});
  CHECK(store.groups().size() == 3);
  CHECK(store.entries().size() == 4);
  CHECK(store.parameter_count() == 3 * 5 + 5 + 5 * 2 + 2);
  // Group 0 at 0 (20 floats), group 1 empty at 32, group 2 at 32 (16 floats per 64 bytes).
  CHECK(store.groups()[0].offset == 0);
  CHECK(store.groups()[0].elements == 20);
  CHECK(store.groups()[2].offset == 32);
  CHECK(store.entry("2.weight").offset == 32);
  CHECK(store.entry("2.bias").offset == 42);
  CHECK(store.size() == 44);
  CHECK(reinterpret_cast<std::uintptr_t>(store.values().data()) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(store.grads().data()) % 64 == 0);
  CHECK(store.group_values(2).size() == 12);
  CHECK(store.group_values(2).data() == store.values().data() + 32);
  CHECK(store.value("0.bias").size() == 5);
  CHECK_THROWS_WITH_AS(store.entry("3.weight"),
                       doctest::Contains("no parameter '3.weight'; parameters: 0.weight, 0.bias"),
                       std::invalid_argument);
  CHECK_THROWS_AS(store.group_values(3), std::out_of_range);
}

TEST_CASE("initialisation follows each tensor's kind and seed, independent of the layout") {
  sm::param_store a({"0", "1"}, {dense(100, 50), dense(50, 10)});
  a.initialize(7);
  // Padding stays zero; the bias is zero; the weight lies within the Kaiming bound.
  const float bound = std::sqrt(6.0f / 100.0f);
  float largest = 0.0f;
  double sum = 0.0;
  for (float v : a.value("0.weight")) {
    largest = std::max(largest, std::abs(v));
    sum += v;
  }
  CHECK(largest <= bound);
  CHECK(largest > 0.9f * bound);
  CHECK(std::abs(sum / 5000.0) < 0.02);
  for (float v : a.value("0.bias")) {
    CHECK(v == 0.0f);
  }
  for (std::size_t i = a.groups()[0].elements; i < a.groups()[1].offset; ++i) {
    CHECK(a.values()[i] == 0.0f);
  }
  // Same seed: same values; another alignment: the same values at other offsets.
  sm::param_store b({"0", "1"}, {dense(100, 50), dense(50, 10)}, {.alignment = 256});
  b.initialize(7);
  CHECK(std::vector<float>(a.value("1.weight").begin(), a.value("1.weight").end()) ==
        std::vector<float>(b.value("1.weight").begin(), b.value("1.weight").end()));
  sm::param_store c({"0", "1"}, {dense(100, 50), dense(50, 10)});
  c.initialize(8);
  CHECK(std::vector<float>(a.value("0.weight").begin(), a.value("0.weight").end()) !=
        std::vector<float>(c.value("0.weight").begin(), c.value("0.weight").end()));
}

TEST_CASE("every init kind has its scale") {
  const std::size_t in = 400;
  const std::size_t out = 200;
  auto spread = [&](sm::init_kind kind) {
    sm::param_store s(
        {"0"},
        {{{.name = "w", .rows = out, .cols = in, .init = kind, .fan_in = in, .fan_out = out}}});
    s.initialize(3);
    double sq = 0.0;
    for (float v : s.value("0.w")) {
      sq += static_cast<double>(v) * v;
    }
    return std::sqrt(sq / static_cast<double>(in * out));
  };
  CHECK(spread(sm::init_kind::zeros) == 0.0);
  CHECK(spread(sm::init_kind::ones) == 1.0);
  // Standard deviations: uniform(-b, b) has b / sqrt(3).
  CHECK(spread(sm::init_kind::kaiming_uniform) ==
        doctest::Approx(std::sqrt(2.0 / in)).epsilon(0.02));
  CHECK(spread(sm::init_kind::kaiming_normal) ==
        doctest::Approx(std::sqrt(2.0 / in)).epsilon(0.02));
  CHECK(spread(sm::init_kind::xavier_uniform) ==
        doctest::Approx(std::sqrt(2.0 / (in + out))).epsilon(0.02));
  CHECK(spread(sm::init_kind::xavier_normal) ==
        doctest::Approx(std::sqrt(2.0 / (in + out))).epsilon(0.02));
  CHECK(spread(sm::init_kind::uniform_fan_in) ==
        doctest::Approx(1.0 / std::sqrt(3.0 * in)).epsilon(0.02));
}

TEST_CASE("gradients share the layout and are zeroed together") {
  sm::param_store store({"0"}, {dense(4, 4)});
  for (float& g : store.grads()) {
    g = 3.0f;
  }
  CHECK(store.grad("0.bias")[0] == 3.0f);
  store.zero_grads();
  for (float g : store.grads()) {
    CHECK(g == 0.0f);
  }
  CHECK_THROWS_AS(sm::param_store({"0", "1"}, {dense(1, 1)}), std::invalid_argument);
  CHECK_THROWS_AS(sm::param_store({"0"}, {dense(1, 1)}, {.alignment = 48}), std::invalid_argument);
}
