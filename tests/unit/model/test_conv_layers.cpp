// SPDX-License-Identifier: Apache-2.0
#include "strata/model/conv2d.hpp"
#include "strata/model/layer_norm.hpp"
#include "strata/model/max_pool2d.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "unit/model/gradient_check.hpp"

namespace sm = strata::model;
using strata::sample_shape;

namespace {

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(engine);
  }
  return v;
}

// n distinct values 0.1 apart in a shuffled order: no ties, and no argmax change under a
// perturbation smaller than 0.05.
std::vector<float> distinct_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = 0.1f * static_cast<float>(i) - 0.05f * static_cast<float>(n);
  }
  std::mt19937 engine(seed);
  std::shuffle(v.begin(), v.end(), engine);
  return v;
}

template <class L>
std::size_t param_count(const L& l, const sample_shape& in) {
  std::size_t n = 0;
  for (const sm::param_spec& p : sm::layer_traits<L>::parameters(l, in)) {
    n += p.elements();
  }
  return n;
}

struct forward_result {
  std::vector<float> output;
  std::vector<float> workspace;
};

template <class L>
forward_result run_forward(const L& l, const sample_shape& in, std::size_t batch,
                           const std::vector<float>& x, const std::vector<float>& params) {
  using traits = sm::layer_traits<L>;
  const sample_shape out = traits::output_shape(l, in);
  forward_result r{
      .output = std::vector<float>(batch * out.elements(), std::numeric_limits<float>::quiet_NaN()),
      .workspace = std::vector<float>(traits::workspace_elements(l, in, batch))};
  traits::forward(l, sm::forward_args{.batch = batch,
                                      .in_shape = in,
                                      .out_shape = out,
                                      .input = x,
                                      .output = r.output,
                                      .params = params,
                                      .workspace = r.workspace});
  return r;
}

// grads and grad_input start as given (grad_input empty: not wanted).
template <class L>
void run_backward(const L& l, const sample_shape& in, std::size_t batch,
                  const std::vector<float>& x, const std::vector<float>& params, forward_result& f,
                  const std::vector<float>& dy, std::vector<float>& grads,
                  std::vector<float>& grad_input) {
  using traits = sm::layer_traits<L>;
  traits::backward(l, sm::backward_args{.batch = batch,
                                        .in_shape = in,
                                        .out_shape = traits::output_shape(l, in),
                                        .input = x,
                                        .output = f.output,
                                        .grad_output = dy,
                                        .grad_input = grad_input,
                                        .params = params,
                                        .grads = grads,
                                        .workspace = f.workspace});
}

// ---- conv2d reference: direct nested loops in double --------------------------------------------

struct conv_reference {
  std::vector<double> output;
  std::vector<double> grad_input;
  std::vector<double> grad_weight;
  std::vector<double> grad_bias;
};

conv_reference reference_conv(const sm::conv2d& l, const sample_shape& in, std::size_t batch,
                              const std::vector<float>& x, const std::vector<float>& params,
                              const std::vector<float>& dy) {
  const sample_shape out = l.output_shape(in);
  const std::size_t k = l.kernel;
  const std::size_t weight_count = l.out_channels * in.channels * k * k;
  conv_reference r{.output = std::vector<double>(batch * out.elements(), 0.0),
                   .grad_input = std::vector<double>(batch * in.elements(), 0.0),
                   .grad_weight = std::vector<double>(weight_count, 0.0),
                   .grad_bias = std::vector<double>(l.out_channels, 0.0)};
  const auto pad = static_cast<long>(l.padding);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t o = 0; o < l.out_channels; ++o) {
      for (std::size_t oy = 0; oy < out.height; ++oy) {
        for (std::size_t ox = 0; ox < out.width; ++ox) {
          const std::size_t yi = ((b * l.out_channels + o) * out.height + oy) * out.width + ox;
          double sum = l.bias ? params[weight_count + o] : 0.0;
          const double g = dy[yi];
          r.grad_bias[o] += g;
          for (std::size_t c = 0; c < in.channels; ++c) {
            for (std::size_t ky = 0; ky < k; ++ky) {
              for (std::size_t kx = 0; kx < k; ++kx) {
                const long iy = static_cast<long>(oy * l.stride + ky) - pad;
                const long ix = static_cast<long>(ox * l.stride + kx) - pad;
                if (iy < 0 || ix < 0 || iy >= static_cast<long>(in.height) ||
                    ix >= static_cast<long>(in.width)) {
                  continue;
                }
                const std::size_t xi =
                    ((b * in.channels + c) * in.height + static_cast<std::size_t>(iy)) * in.width +
                    static_cast<std::size_t>(ix);
                const std::size_t wi = ((o * in.channels + c) * k + ky) * k + kx;
                sum += static_cast<double>(params[wi]) * x[xi];
                r.grad_input[xi] += static_cast<double>(params[wi]) * g;
                r.grad_weight[wi] += static_cast<double>(x[xi]) * g;
              }
            }
          }
          r.output[yi] = sum;
        }
      }
    }
  }
  return r;
}

// The largest |a[offset + i] - b[i]|; infinity where either is not finite.
template <class A, class B>
double max_difference(const std::vector<A>& a, const std::vector<B>& b, std::size_t offset = 0) {
  double worst = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[offset + i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d)) {
      return std::numeric_limits<double>::infinity();
    }
    worst = std::max(worst, d);
  }
  return worst;
}

struct conv_case {
  sm::conv2d layer{};
  sample_shape in{};
  std::size_t batch = 3;
};

std::vector<conv_case> conv_cases() {
  return {
      {.layer = {.in_channels = 3, .out_channels = 4}, .in = {3, 7, 6}},
      {.layer = {.in_channels = 3, .out_channels = 5, .stride = 2}, .in = {3, 8, 7}},
      {.layer = {.in_channels = 2, .out_channels = 3, .kernel = 5, .stride = 2, .padding = 0},
       .in = {2, 9, 11}},
      {.layer = {.in_channels = 4, .out_channels = 6, .kernel = 1, .padding = 0}, .in = {4, 5, 5}},
      {.layer = {.in_channels = 2, .out_channels = 3, .kernel = 1, .stride = 2, .padding = 0},
       .in = {2, 7, 6}},
      {.layer = {.in_channels = 3, .out_channels = 2, .kernel = 5, .padding = 2, .bias = false},
       .in = {3, 6, 6}},
      {.layer = {.in_channels = 1, .out_channels = 2, .kernel = 2, .stride = 3, .padding = 1},
       .in = {1, 8, 10},
       .batch = 2},
      {.layer = {.in_channels = 2, .out_channels = 2, .kernel = 1, .padding = 1}, .in = {2, 4, 3}},
      {.layer = {.in_channels = 1, .out_channels = 2, .kernel = 5, .padding = 2}, .in = {1, 3, 3}},
      {.layer = {.in_channels = 3, .out_channels = 8}, .in = {3, 16, 16}, .batch = 2},
  };
}

}  // namespace

// ---- conv2d -------------------------------------------------------------------------------------

TEST_CASE("conv2d output_shape, parameters, cost and printing") {
  const sm::conv2d conv{.in_channels = 3, .out_channels = 8};
  CHECK(conv.output_shape({3, 32, 32}) == sample_shape{8, 32, 32});
  CHECK(sm::conv2d{.in_channels = 3, .out_channels = 16, .kernel = 5, .stride = 2, .padding = 0}
            .output_shape({3, 32, 32}) == sample_shape{16, 14, 14});
  CHECK(sm::conv2d{.in_channels = 1, .out_channels = 1, .kernel = 3, .stride = 2}.output_shape(
            {1, 8, 5}) == sample_shape{1, 4, 3});
  CHECK(sm::conv2d{.in_channels = 2, .out_channels = 4, .kernel = 1, .padding = 1}.output_shape(
            {2, 4, 3}) == sample_shape{4, 6, 5});

  const std::vector<sm::param_spec> specs = conv.parameters({3, 32, 32});
  REQUIRE(specs.size() == 2);
  CHECK(specs[0] == sm::param_spec{.name = "weight",
                                   .rows = 8,
                                   .cols = 27,
                                   .init = sm::init_kind::kaiming_uniform,
                                   .fan_in = 27,
                                   .fan_out = 72,
                                   .weight_decay = true});
  CHECK(specs[1] == sm::param_spec{.name = "bias",
                                   .rows = 1,
                                   .cols = 8,
                                   .init = sm::init_kind::uniform_fan_in,
                                   .fan_in = 27,
                                   .fan_out = 8,
                                   .weight_decay = false});
  sm::conv2d no_bias = conv;
  no_bias.bias = false;
  CHECK(no_bias.parameters({3, 32, 32}).size() == 1);
  CHECK(no_bias != conv);
  CHECK(sm::layer_traits<sm::conv2d>::workspace_elements(conv, {3, 32, 32}, 64) == 0);

  const sm::layer_cost cost = conv.cost({3, 32, 32});
  CHECK(cost.forward_flops == doctest::Approx(2.0 * 27 * 8 * 1024));
  CHECK(cost.backward_flops == doctest::Approx(4.0 * 27 * 8 * 1024));
  CHECK(cost.activation_bytes == 8 * 1024 * sizeof(float));
  const sm::layer_cost strided =
      sm::conv2d{.in_channels = 2, .out_channels = 4, .kernel = 5, .stride = 2, .padding = 0}.cost(
          {2, 9, 11});
  CHECK(strided.forward_flops == doctest::Approx(2.0 * 50 * 4 * 3 * 4));

  CHECK(to_string(conv) ==
        "conv2d{.in_channels = 3, .out_channels = 8, .kernel = 3, .stride = 1, .padding = 1, "
        ".bias = true}");
}

TEST_CASE("conv2d rejects bad numbers and shapes in words") {
  const auto shape_of = [](sm::conv2d l, sample_shape in) { return l.output_shape(in); };
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 0, .out_channels = 4}, {1, 4, 4}),
                       doctest::Contains("conv2d: in_channels must be at least 1, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 1, .out_channels = 0}, {1, 4, 4}),
                       doctest::Contains("conv2d: out_channels must be at least 1, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 1, .out_channels = 1, .kernel = 0}, {1, 4, 4}),
                       doctest::Contains("conv2d: kernel must be at least 1, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 1, .out_channels = 1, .stride = 0}, {1, 4, 4}),
                       doctest::Contains("conv2d: stride must be at least 1, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 3, .out_channels = 1}, {2, 4, 4}),
                       doctest::Contains("has 2 channels, in_channels is 3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      shape_of({.in_channels = 1, .out_channels = 1, .kernel = 5, .padding = 0}, {1, 4, 9}),
      doctest::Contains("conv2d: input 1x4x9 with padding 0 is smaller than kernel 5"),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(shape_of({.in_channels = 1, .out_channels = 1}, {1, 0, 4}),
                       doctest::Contains("empty plane"), std::invalid_argument);
  // Padding can make a small input big enough.
  CHECK(shape_of({.in_channels = 1, .out_channels = 1, .kernel = 5, .padding = 1}, {1, 3, 3}) ==
        sample_shape{1, 1, 1});

  // forward checks the shapes and spans it is given.
  const sm::conv2d conv{.in_channels = 1, .out_channels = 1};
  std::vector<float> x(16, 1.0f);
  std::vector<float> y(16, 0.0f);
  std::vector<float> params(10, 0.0f);
  sm::forward_args args{.batch = 1,
                        .in_shape = {1, 4, 4},
                        .out_shape = {1, 4, 3},
                        .input = x,
                        .output = y,
                        .params = params};
  CHECK_THROWS_WITH_AS(conv.forward(args),
                       doctest::Contains("out_shape 1x4x3 does not match 1x4x4"),
                       std::invalid_argument);
  args.out_shape = {1, 4, 4};
  args.params = std::span<const float>(params).first(9);
  CHECK_THROWS_WITH_AS(conv.forward(args), doctest::Contains("params must hold 10 floats, got 9"),
                       std::invalid_argument);
}

TEST_CASE("conv2d matches a direct convolution: forward and the three gradients") {
  std::uint32_t seed = 1;
  for (const conv_case& c : conv_cases()) {
    CAPTURE(to_string(c.layer));
    CAPTURE(to_string(c.in));
    const sample_shape out = c.layer.output_shape(c.in);
    const std::vector<float> x = random_values(c.batch * c.in.elements(), ++seed);
    const std::vector<float> params = random_values(param_count(c.layer, c.in), ++seed);
    const std::vector<float> dy = random_values(c.batch * out.elements(), ++seed);
    const conv_reference ref = reference_conv(c.layer, c.in, c.batch, x, params, dy);

    forward_result f = run_forward(c.layer, c.in, c.batch, x, params);
    CHECK(max_difference(f.output, ref.output) < 1e-5);

    // Parameter gradients are added to what is there; grad_input is overwritten.
    std::vector<float> grads(params.size(), 0.25f);
    std::vector<float> grad_input(x.size(), std::numeric_limits<float>::quiet_NaN());
    run_backward(c.layer, c.in, c.batch, x, params, f, dy, grads, grad_input);
    std::vector<double> expected_weight = ref.grad_weight;
    for (double& g : expected_weight) {
      g += 0.25;
    }
    CHECK(max_difference(grad_input, ref.grad_input) < 1e-5);
    CHECK(max_difference(grads, expected_weight) < 1e-4);
    if (c.layer.bias) {
      std::vector<double> expected_bias = ref.grad_bias;
      for (double& g : expected_bias) {
        g += 0.25;
      }
      CHECK(max_difference(grads, expected_bias, expected_weight.size()) < 1e-4);
    }

    // Without grad_input the parameter gradients are the same.
    std::vector<float> grads_only(params.size(), 0.25f);
    std::vector<float> none;
    run_backward(c.layer, c.in, c.batch, x, params, f, dy, grads_only, none);
    CHECK(grads_only == grads);
  }
}

TEST_CASE("conv2d gradients agree with finite differences") {
  const std::vector<conv_case> cases = conv_cases();
  std::uint64_t seed = 100;
  for (std::size_t i : {0, 1, 2, 3, 5, 6}) {
    const conv_case& c = cases[i];
    CAPTURE(to_string(c.layer));
    // conv2d is linear in the input and in the parameters, so a large step costs no accuracy.
    const auto result = sm::testing::check_gradients(c.layer, {.batch = c.batch,
                                                               .in_shape = c.in,
                                                               .seed = ++seed,
                                                               .epsilon = 0.05,
                                                               .relative_tolerance = 2e-4,
                                                               .absolute_tolerance = 2e-4});
    CHECK_MESSAGE(result.passed(), result.report());
    CHECK(result.probes == c.batch * c.in.elements() + param_count(c.layer, c.in));
  }
}

TEST_CASE("conv2d backward accumulates over calls and is deterministic") {
  const conv_case c = conv_cases()[1];
  const sample_shape out = c.layer.output_shape(c.in);
  const std::vector<float> x = random_values(c.batch * c.in.elements(), 7);
  const std::vector<float> params = random_values(param_count(c.layer, c.in), 8);
  const std::vector<float> dy = random_values(c.batch * out.elements(), 9);
  forward_result f = run_forward(c.layer, c.in, c.batch, x, params);
  CHECK(run_forward(c.layer, c.in, c.batch, x, params).output == f.output);

  std::vector<float> once(params.size(), 0.0f);
  std::vector<float> twice(params.size(), 0.0f);
  std::vector<float> none;
  run_backward(c.layer, c.in, c.batch, x, params, f, dy, once, none);
  run_backward(c.layer, c.in, c.batch, x, params, f, dy, twice, none);
  run_backward(c.layer, c.in, c.batch, x, params, f, dy, twice, none);
  bool doubled = true;
  for (std::size_t i = 0; i < once.size(); ++i) {
    doubled = doubled && std::abs(twice[i] - 2.0f * once[i]) <= 1e-5f * (1.0f + std::abs(once[i]));
  }
  CHECK(doubled);
  CHECK(std::any_of(once.begin(), once.end(), [](float g) { return g != 0.0f; }));
}

// ---- max_pool2d ---------------------------------------------------------------------------------

TEST_CASE("max_pool2d output_shape, workspace, cost and errors") {
  const sm::max_pool2d pool{};
  CHECK(pool.output_shape({3, 32, 32}) == sample_shape{3, 16, 16});
  CHECK(pool.output_shape({2, 5, 7}) == sample_shape{2, 2, 3});
  CHECK(sm::max_pool2d{.kernel = 3, .stride = 2}.output_shape({4, 7, 8}) == sample_shape{4, 3, 3});
  CHECK(sm::max_pool2d{.kernel = 3, .stride = 1}.output_shape({1, 3, 5}) == sample_shape{1, 1, 3});
  CHECK(pool.workspace_elements({3, 32, 32}, 5) == 5 * 3 * 256);
  CHECK(sm::layer_traits<sm::max_pool2d>::parameters(pool, {3, 32, 32}).empty());

  const sm::layer_cost cost = pool.cost({3, 32, 32});
  CHECK(cost.forward_flops == doctest::Approx(768.0 * 4));
  CHECK(cost.backward_flops == doctest::Approx(768.0));
  CHECK(cost.activation_bytes == 2 * 768 * sizeof(float));

  CHECK(to_string(sm::max_pool2d{.kernel = 3, .stride = 1}) ==
        "max_pool2d{.kernel = 3, .stride = 1}");
  CHECK(sm::max_pool2d{} == sm::max_pool2d{.kernel = 2, .stride = 2});

  CHECK_THROWS_WITH_AS(sm::max_pool2d{.kernel = 0}.output_shape({1, 4, 4}),
                       doctest::Contains("max_pool2d: kernel must be in [1, 4096], got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sm::max_pool2d{.kernel = 5000}.output_shape({1, 4, 4}),
                       doctest::Contains("kernel must be in [1, 4096], got 5000"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sm::max_pool2d{.stride = 0}.output_shape({1, 4, 4}),
                       doctest::Contains("max_pool2d: stride must be at least 1, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sm::max_pool2d{.kernel = 3}.output_shape({1, 2, 8}),
                       doctest::Contains("max_pool2d: input 1x2x8 is smaller than kernel 3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pool.output_shape({0, 4, 4}), doctest::Contains("has no channels"),
                       std::invalid_argument);
}

TEST_CASE("max_pool2d forward picks window maxima and records where") {
  // One 4x5 plane, kernel 2 stride 2: two output columns, the last input column dropped.
  const std::vector<float> x = {1, 5, 2, 0, 9,   //
                                3, 4, 8, 7, 9,   //
                                6, 2, 1, 1, 9,   //
                                0, 7, 3, 4, 9};  //
  forward_result f = run_forward(sm::max_pool2d{}, {1, 4, 5}, 1, x, {});
  CHECK(f.output == std::vector<float>{5, 8, 7, 4});
  CHECK(f.workspace == std::vector<float>{1, 2, 3, 3});

  // Ties go to the first in row-major window order; NaN wins.
  const std::vector<float> ties = {2, 2, 3, 3, 2, 2, 3, 3};
  forward_result t = run_forward(sm::max_pool2d{}, {1, 2, 4}, 1, ties, {});
  CHECK(t.workspace == std::vector<float>{0, 0});
  std::vector<float> grad_input(ties.size(), -1.0f);
  std::vector<float> none;
  run_backward(sm::max_pool2d{}, {1, 2, 4}, 1, ties, {}, t, {10, 20}, none, grad_input);
  CHECK(grad_input == std::vector<float>{10, 0, 20, 0, 0, 0, 0, 0});

  const float nan = std::numeric_limits<float>::quiet_NaN();
  forward_result n = run_forward(sm::max_pool2d{}, {1, 2, 2}, 1, {1, nan, 9, nan}, {});
  CHECK(std::isnan(n.output[0]));
  CHECK(n.workspace == std::vector<float>{1});
}

TEST_CASE("max_pool2d backward scatters into the argmax, adding where windows overlap") {
  // A single large value in the middle of a 1x4x4 plane is the max of all four 3x3 windows.
  std::vector<float> x(16, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = 0.01f * static_cast<float>(i);
  }
  x[5] = 10.0f;
  const sm::max_pool2d pool{.kernel = 3, .stride = 1};
  forward_result f = run_forward(pool, {1, 4, 4}, 1, x, {});
  CHECK(f.output == std::vector<float>{10, 10, 10, 10});
  std::vector<float> grad_input(16, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> none;
  run_backward(pool, {1, 4, 4}, 1, x, {}, f, {1, 2, 3, 4}, none, grad_input);
  std::vector<float> expected(16, 0.0f);
  expected[5] = 10.0f;
  CHECK(grad_input == expected);
}

TEST_CASE("max_pool2d gradients agree with finite differences") {
  struct pool_case {
    sm::max_pool2d layer{};
    sample_shape in{};
  };
  const std::vector<pool_case> cases = {
      {.layer = {}, .in = {3, 6, 8}},
      {.layer = {}, .in = {2, 5, 7}},
      {.layer = {.kernel = 3, .stride = 2}, .in = {2, 7, 9}},
      {.layer = {.kernel = 3, .stride = 1}, .in = {2, 5, 6}},
      {.layer = {.kernel = 1, .stride = 2}, .in = {1, 5, 5}},
  };
  std::uint32_t seed = 200;
  for (const pool_case& c : cases) {
    CAPTURE(to_string(c.layer));
    const std::size_t batch = 3;
    const auto result = sm::testing::check_gradients(
        c.layer, {.batch = batch,
                  .in_shape = c.in,
                  .input = distinct_values(batch * c.in.elements(), ++seed),
                  .epsilon = 0.01,
                  .relative_tolerance = 2e-4,
                  .absolute_tolerance = 2e-4});
    CHECK_MESSAGE(result.passed(), result.report());
    CHECK(result.probes == batch * c.in.elements());
  }
}

// ---- layer_norm ---------------------------------------------------------------------------------

TEST_CASE("layer_norm output_shape, parameters, workspace, cost and errors") {
  const sm::layer_norm norm{.features = 12};
  CHECK(norm.output_shape({3, 2, 2}) == sample_shape{3, 2, 2});
  CHECK(norm.output_shape({1, 1, 12}) == sample_shape{1, 1, 12});
  CHECK(norm.workspace_elements({3, 2, 2}, 5) == 10);
  const std::vector<sm::param_spec> specs = norm.parameters({3, 2, 2});
  REQUIRE(specs.size() == 2);
  CHECK(specs[0] == sm::param_spec{.name = "weight",
                                   .rows = 1,
                                   .cols = 12,
                                   .init = sm::init_kind::ones,
                                   .fan_in = 12,
                                   .fan_out = 12,
                                   .weight_decay = false});
  CHECK(specs[1] == sm::param_spec{.name = "bias",
                                   .rows = 1,
                                   .cols = 12,
                                   .init = sm::init_kind::zeros,
                                   .fan_in = 12,
                                   .fan_out = 12,
                                   .weight_decay = false});
  const sm::layer_norm plain{.features = 12, .affine = false};
  CHECK(plain.parameters({3, 2, 2}).empty());

  CHECK(norm.cost({3, 2, 2}) ==
        sm::layer_cost{.forward_flops = 96.0, .backward_flops = 168.0, .activation_bytes = 56});
  CHECK(plain.cost({3, 2, 2}) ==
        sm::layer_cost{.forward_flops = 72.0, .backward_flops = 120.0, .activation_bytes = 56});

  CHECK(to_string(norm) == "layer_norm{.features = 12, .eps = 1e-05, .affine = true}");
  CHECK(to_string(sm::layer_norm{.features = 3, .eps = 0.25f, .affine = false}) ==
        "layer_norm{.features = 3, .eps = 0.25, .affine = false}");
  CHECK(norm != plain);

  CHECK_THROWS_WITH_AS(sm::layer_norm{}.output_shape({1, 1, 1}),
                       doctest::Contains("layer_norm: features must be at least 1, got 0"),
                       std::invalid_argument);
  const sm::layer_norm zero_eps{.features = 4, .eps = 0.0f};
  const sm::layer_norm infinite_eps{.features = 4, .eps = std::numeric_limits<float>::infinity()};
  CHECK_THROWS_WITH_AS(zero_eps.output_shape({1, 1, 4}),
                       doctest::Contains("layer_norm: eps must be finite and > 0, got 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(infinite_eps.output_shape({1, 1, 4}),
                       doctest::Contains("eps must be finite and > 0, got inf"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      norm.output_shape({3, 2, 3}),
      doctest::Contains("layer_norm: input 3x2x3 has 18 elements and width 3, features is 12"),
      std::invalid_argument);
}

TEST_CASE("layer_norm forward normalises each sample and saves mean and rstd") {
  const sm::layer_norm norm{.features = 8};
  const std::size_t batch = 3;
  const std::vector<float> x = random_values(batch * 8, 31, -2.0f, 5.0f);
  std::vector<float> params(16, 0.0f);
  std::fill(params.begin(), params.begin() + 8, 1.0f);
  forward_result f = run_forward(norm, {2, 2, 2}, batch, x, params);
  for (std::size_t b = 0; b < batch; ++b) {
    double mean = 0.0;
    for (std::size_t i = 0; i < 8; ++i) {
      mean += x[b * 8 + i];
    }
    mean /= 8.0;
    double variance = 0.0;
    for (std::size_t i = 0; i < 8; ++i) {
      variance += (x[b * 8 + i] - mean) * (x[b * 8 + i] - mean);
    }
    variance /= 8.0;
    const double rstd = 1.0 / std::sqrt(variance + 1e-5);
    CHECK(f.workspace[2 * b] == doctest::Approx(mean).epsilon(1e-6));
    CHECK(f.workspace[2 * b + 1] == doctest::Approx(rstd).epsilon(1e-6));
    double out_mean = 0.0;
    double out_squares = 0.0;
    for (std::size_t i = 0; i < 8; ++i) {
      CHECK(f.output[b * 8 + i] == doctest::Approx((x[b * 8 + i] - mean) * rstd).epsilon(1e-5));
      out_mean += f.output[b * 8 + i];
      out_squares += static_cast<double>(f.output[b * 8 + i]) * f.output[b * 8 + i];
    }
    CHECK(std::abs(out_mean / 8.0) < 1e-6);
    CHECK(out_squares / 8.0 == doctest::Approx(variance / (variance + 1e-5)).epsilon(1e-5));
  }

  // The affine step scales and shifts per element.
  std::vector<float> affine = random_values(16, 32);
  forward_result g = run_forward(norm, {2, 2, 2}, batch, x, affine);
  for (std::size_t i = 0; i < batch * 8; ++i) {
    CHECK(g.output[i] == doctest::Approx(f.output[i] * affine[i % 8] + affine[8 + i % 8]));
  }
}

TEST_CASE("layer_norm gradients agree with finite differences") {
  std::uint64_t seed = 300;
  for (bool affine : {true, false}) {
    for (sample_shape in : {sample_shape{1, 1, 7}, sample_shape{3, 2, 4}}) {
      CAPTURE(affine);
      CAPTURE(to_string(in));
      const sm::layer_norm norm{.features = in.elements(), .affine = affine};
      const auto result = sm::testing::check_gradients(norm, {.batch = 3,
                                                              .in_shape = in,
                                                              .seed = ++seed,
                                                              .input_range = 2.0f,
                                                              .epsilon = 0.01,
                                                              .relative_tolerance = 5e-4,
                                                              .absolute_tolerance = 5e-4});
      CHECK_MESSAGE(result.passed(), result.report());
      CHECK(result.probes == (affine ? 5 : 3) * in.elements());
    }
  }
}

TEST_CASE("layer_norm backward adds parameter gradients and writes grad_input") {
  const sm::layer_norm norm{.features = 6};
  const sample_shape in{1, 2, 3};
  const std::size_t batch = 2;
  const std::vector<float> x = random_values(batch * 6, 41);
  const std::vector<float> params = random_values(12, 42);
  const std::vector<float> dy = random_values(batch * 6, 43);
  forward_result f = run_forward(norm, in, batch, x, params);

  std::vector<float> fresh(12, 0.0f);
  std::vector<float> grad_input(batch * 6, 0.0f);
  run_backward(norm, in, batch, x, params, f, dy, fresh, grad_input);

  std::vector<float> added(12, 1.5f);
  std::vector<float> overwritten(batch * 6, std::numeric_limits<float>::quiet_NaN());
  run_backward(norm, in, batch, x, params, f, dy, added, overwritten);
  for (std::size_t i = 0; i < 12; ++i) {
    CHECK(added[i] == doctest::Approx(fresh[i] + 1.5f));
  }
  CHECK(overwritten == grad_input);

  // The bias gradient is the batch sum of grad_output; grad_input sums to 0 per sample.
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(fresh[6 + i] == doctest::Approx(dy[i] + dy[6 + i]));
  }
  for (std::size_t b = 0; b < batch; ++b) {
    double sum = 0.0;
    for (std::size_t i = 0; i < 6; ++i) {
      sum += grad_input[b * 6 + i];
    }
    CHECK(std::abs(sum) < 1e-5);
  }

  // Without grad_input the parameter gradients are the same.
  std::vector<float> grads_only(12, 0.0f);
  std::vector<float> none;
  run_backward(norm, in, batch, x, params, f, dy, grads_only, none);
  CHECK(grads_only == fresh);
}
