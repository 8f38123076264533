// SPDX-License-Identifier: Apache-2.0
#include "strata/model/activations.hpp"
#include "strata/model/blas.hpp"
#include "strata/model/dropout.hpp"
#include "strata/model/flatten.hpp"
#include "strata/model/gemm.hpp"
#include "strata/model/linear.hpp"
#include "strata/model/softmax_cross_entropy.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/cpu_features.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "unit/common/needs.hpp"
#include "unit/model/gradient_check.hpp"

namespace {

namespace sm = strata::model;
using sm::testing::check_gradients;
using sm::testing::gradient_check_config;
using strata::sample_shape;

constexpr sample_shape vec(std::size_t n) {
  return {.channels = 1, .height = 1, .width = n};
}

// What a container would do for one forward: buffers sized from the traits.
struct forward_run {
  sample_shape out_shape{};
  std::vector<float> output{};
  std::vector<float> workspace{};
};

template <class L>
forward_run run_forward(const L& l, const sample_shape& in_shape, std::size_t batch,
                        std::span<const float> input, std::span<const float> params = {},
                        bool training = true, sm::layer_rng_key key = {},
                        std::span<const std::uint64_t> sample_ids = {}) {
  using traits = sm::layer_traits<L>;
  forward_run run;
  run.out_shape = traits::output_shape(l, in_shape);
  run.output.assign(batch * run.out_shape.elements(), std::numeric_limits<float>::quiet_NaN());
  run.workspace.assign(traits::workspace_elements(l, in_shape, batch), -1.0f);
  traits::forward(l, sm::forward_args{.batch = batch,
                                      .in_shape = in_shape,
                                      .out_shape = run.out_shape,
                                      .input = input,
                                      .output = run.output,
                                      .params = params,
                                      .workspace = run.workspace,
                                      .training = training,
                                      .rng = key,
                                      .sample_ids = sample_ids});
  return run;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float range = 1.0f) {
  strata::rng_stream rng(seed);
  std::vector<float> values(n);
  for (float& v : values) {
    v = rng.uniform(-range, range);
  }
  return values;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

template <class L>
std::string error_of(const L& l, const sample_shape& in) {
  try {
    (void)l.output_shape(in);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

// ---- finite-difference checks -------------------------------------------------------------------

TEST_CASE("linear: backward matches central differences") {
  SUBCASE("with bias, flat input") {
    const auto r = check_gradients(sm::linear{.in = 5, .out = 4}, {.batch = 3, .in_shape = vec(5)});
    CHECK_MESSAGE(r.passed(), r.report());
    CHECK(r.probes == 3 * 5 + 4 * 5 + 4);
  }
  SUBCASE("without bias, a 2 x 1 x 3 input read as 6 features") {
    const auto r = check_gradients(
        sm::linear{.in = 6, .out = 3, .bias = false},
        {.batch = 2, .in_shape = {.channels = 2, .height = 1, .width = 3}, .seed = 5});
    CHECK_MESSAGE(r.passed(), r.report());
    CHECK(r.probes == 2 * 6 + 3 * 6);
  }
  SUBCASE("wider, probing a subset") {
    const auto r = check_gradients(sm::linear{.in = 40, .out = 24},
                                   {.batch = 9, .in_shape = vec(40), .seed = 9, .max_probes = 50});
    CHECK_MESSAGE(r.passed(), r.report());
    CHECK(r.probes == 50 + 50 + 24);
  }
  SUBCASE("a fused ReLU, with and without bias") {
    const auto r =
        check_gradients(sm::linear{.in = 7, .out = 6, .activation = sm::fused_activation::relu},
                        {.batch = 4, .in_shape = vec(7), .seed = 11});
    CHECK_MESSAGE(r.passed(), r.report());
    CHECK(r.probes == 4 * 7 + 6 * 7 + 6);
    const auto no_bias = check_gradients(
        sm::linear{.in = 5, .out = 4, .bias = false, .activation = sm::fused_activation::relu},
        {.batch = 3, .in_shape = vec(5), .seed = 12});
    CHECK_MESSAGE(no_bias.passed(), no_bias.report());
  }
  SUBCASE("a fused ReLU and dropout, in training and evaluation") {
    const sm::linear l{.in = 6, .out = 8, .activation = sm::fused_activation::relu, .dropout = 0.4};
    const auto training = check_gradients(l, {.batch = 4, .in_shape = vec(6), .seed = 13});
    CHECK_MESSAGE(training.passed(), training.report());
    const auto evaluation =
        check_gradients(l, {.batch = 4, .in_shape = vec(6), .seed = 13, .training = false});
    CHECK_MESSAGE(evaluation.passed(), evaluation.report());
  }
}

TEST_CASE("linear with a fused ReLU equals linear then relu, on every provider, split or whole") {
  const std::size_t batch = 9;
  const std::size_t in = 37;
  const std::size_t out = 21;
  const auto x = random_values(batch * in, 21);
  const auto dy = random_values(batch * out, 22);
  for (const bool bias : {true, false}) {
    const sm::linear plain{.in = in, .out = out, .bias = bias};
    const sm::linear fused{
        .in = in, .out = out, .bias = bias, .activation = sm::fused_activation::relu};
    const auto params = random_values(bias ? out * in + out : out * in, 23);
    for (const sm::gemm_provider p : sm::available_gemm_providers()) {
      CAPTURE(sm::to_string(p));
      CAPTURE(bias);
      const sm::gemm_scope use(p);
      // linear, then relu over its output.
      const auto z = run_forward(plain, vec(in), batch, x, params);
      const auto y = run_forward(sm::relu{}, vec(out), batch, z.output);
      const auto f = run_forward(fused, vec(in), batch, x, params);
      REQUIRE(f.workspace.size() == batch * out);
      std::size_t zeros = 0;
      for (std::size_t i = 0; i < y.output.size(); ++i) {
        CHECK(f.output[i] == doctest::Approx(y.output[i]).epsilon(1e-6));
        CHECK((f.output[i] > 0.0f) == (y.output[i] > 0.0f));
        zeros += y.output[i] == 0.0f ? 1 : 0;
      }
      CHECK(zeros > batch * out / 4);  // the ReLU is exercised
      CHECK(zeros < batch * out * 3 / 4);

      // Backward of the pair: relu's, then linear's.
      std::vector<float> dz(batch * out);
      sm::relu{}.backward({.batch = batch,
                           .in_shape = vec(out),
                           .out_shape = vec(out),
                           .input = z.output,
                           .output = y.output,
                           .grad_output = dy,
                           .grad_input = dz});
      std::vector<float> want_grads(params.size(), 0.0f);
      std::vector<float> want_dx(batch * in);
      plain.backward({.batch = batch,
                      .in_shape = vec(in),
                      .out_shape = vec(out),
                      .input = x,
                      .output = z.output,
                      .grad_output = dz,
                      .grad_input = want_dx,
                      .params = params,
                      .grads = want_grads});
      const auto same = [](const std::vector<float>& got, const std::vector<float>& want) {
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1.0));
        }
      };
      // Whole, then split with the input gradient first (a zero-bubble schedule's order), each
      // from a workspace holding garbage.
      for (const bool split : {false, true}) {
        CAPTURE(split);
        std::vector<float> work(batch * out, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> grads(params.size(), 0.0f);
        std::vector<float> dx(batch * in, std::numeric_limits<float>::quiet_NaN());
        const sm::backward_args args{.batch = batch,
                                     .in_shape = vec(in),
                                     .out_shape = vec(out),
                                     .input = x,
                                     .output = f.output,
                                     .grad_output = dy,
                                     .grad_input = dx,
                                     .params = params,
                                     .grads = grads,
                                     .workspace = work};
        if (split) {
          fused.backward_input(args);
          std::fill(work.begin(), work.end(), std::numeric_limits<float>::quiet_NaN());
          fused.backward_weight(args);
        } else {
          fused.backward(args);
        }
        same(grads, want_grads);
        same(dx, want_dx);
      }
    }
  }
}

TEST_CASE("linear with a fused ReLU and dropout equals the fused ReLU then dropout, bit for bit") {
  // The same draws (the layer's own stream, given to the dropout), every provider, rows of a
  // token-like input too, whole and split backward, training and evaluation.
  const std::size_t batch = 6;
  const std::size_t in = 19;
  const std::size_t out = 70;  // a block of 64 and a rest per row
  const sm::layer_rng_key key{.seed = 5, .step = 9, .layer = 3};
  const std::vector<std::uint64_t> ids = {40, 41, 7, 1000, 3, 12};
  for (const sample_shape in_shape :
       {vec(in), sample_shape{.channels = 1, .height = 3, .width = in}}) {
    // 1 x 1 x out for the flat input, 1 x 3 x out for the rows.
    const sample_shape out_shape{.channels = 1, .height = in_shape.height, .width = out};
    const std::size_t n = batch * out_shape.elements();
    const sm::linear relu_only{.in = in, .out = out, .activation = sm::fused_activation::relu};
    const sm::linear fused{
        .in = in, .out = out, .activation = sm::fused_activation::relu, .dropout = 0.3};
    REQUIRE(fused.output_shape(in_shape) == out_shape);
    const auto x = random_values(batch * in_shape.elements(), 31);
    const auto params = random_values(out * in + out, 32);
    const auto dz = random_values(n, 33);
    for (const sm::gemm_provider p : sm::available_gemm_providers()) {
      for (const bool training : {true, false}) {
        CAPTURE(sm::to_string(p));
        CAPTURE(strata::to_string(in_shape));
        CAPTURE(training);
        const sm::gemm_scope use(p);
        const auto y = run_forward(relu_only, in_shape, batch, x, params, training, key, ids);
        auto d = run_forward(sm::dropout{.rate = 0.3}, out_shape, batch, y.output, {}, training,
                             key, ids);
        const auto f = run_forward(fused, in_shape, batch, x, params, training, key, ids);
        REQUIRE(f.workspace.size() == n + 1);
        CHECK(f.output == d.output);
        // t = round(0.3 x 65536) = 19661: the kept elements' scale 65536 / 45875; 1 in evaluation.
        CHECK(f.workspace[n] == (training ? static_cast<float>(65536.0 / 45875.0) : 1.0f));
        std::size_t dropped = 0;
        for (std::size_t i = 0; i < n; ++i) {
          dropped += y.output[i] > 0.0f && f.output[i] == 0.0f ? 1 : 0;
        }
        if (training) {  // about 30% of the positive outputs
          CHECK(dropped > n / 10);
          CHECK(dropped < n / 4);
        } else {
          CHECK(dropped == 0);
        }
        // Backward of the pair: dropout's, then the fused ReLU's.
        std::vector<float> dy(n);
        sm::dropout{.rate = 0.3}.backward({.batch = batch,
                                           .in_shape = out_shape,
                                           .out_shape = out_shape,
                                           .input = y.output,
                                           .output = d.output,
                                           .grad_output = dz,
                                           .grad_input = dy,
                                           .workspace = d.workspace});
        std::vector<float> relu_work(n);
        std::vector<float> want_grads(params.size(), 0.0f);
        std::vector<float> want_dx(x.size());
        relu_only.backward({.batch = batch,
                            .in_shape = in_shape,
                            .out_shape = out_shape,
                            .input = x,
                            .output = y.output,
                            .grad_output = dy,
                            .grad_input = want_dx,
                            .params = params,
                            .grads = want_grads,
                            .workspace = relu_work});
        for (const bool split : {false, true}) {
          CAPTURE(split);
          std::vector<float> work = f.workspace;
          std::vector<float> grads(params.size(), 0.0f);
          std::vector<float> dx(x.size(), std::numeric_limits<float>::quiet_NaN());
          const sm::backward_args args{.batch = batch,
                                       .in_shape = in_shape,
                                       .out_shape = out_shape,
                                       .input = x,
                                       .output = f.output,
                                       .grad_output = dz,
                                       .grad_input = dx,
                                       .params = params,
                                       .grads = grads,
                                       .workspace = work};
          if (split) {
            fused.backward_input(args);
            std::fill(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(n),
                      std::numeric_limits<float>::quiet_NaN());
            fused.backward_weight(args);
          } else {
            fused.backward(args);
          }
          CHECK(grads == want_grads);
          CHECK(dx == want_dx);
        }
      }
    }
  }
}

TEST_CASE("relu: values at the edges, in place, without a branch on the sign") {
  // max(x, 0) with NaN and -0 going to +0, as before the loop became a bit mask; the gradient
  // passes where the input is above 0 only.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x{-2.0f, -0.0f, 0.0f, 1e-40f, 3.5f, nan, inf, -inf, -1e-40f};
  std::vector<float> g{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f};
  const sample_shape shape = vec(9);
  std::vector<float> y(9, -1.0f);
  sm::relu{}.forward({.batch = 1, .in_shape = shape, .out_shape = shape, .input = x, .output = y});
  const std::vector<float> want_y{0.0f, 0.0f, 0.0f, 1e-40f, 3.5f, 0.0f, inf, 0.0f, 0.0f};
  CHECK(y == want_y);
  for (const float v : y) {
    CHECK_FALSE(std::signbit(v));
  }
  std::vector<float> dx(9, -1.0f);
  sm::relu{}.backward({.batch = 1,
                       .in_shape = shape,
                       .out_shape = shape,
                       .input = x,
                       .output = want_y,
                       .grad_output = g,
                       .grad_input = dx});
  CHECK(dx == std::vector<float>{0.0f, 0.0f, 0.0f, 4.0f, 5.0f, 0.0f, 7.0f, 0.0f, 0.0f});
  std::vector<float> in_place = x;
  sm::relu{}.forward(
      {.batch = 1, .in_shape = shape, .out_shape = shape, .input = in_place, .output = in_place});
  CHECK(in_place == want_y);
}

TEST_CASE("cpu: a program compiled for narrower vectors than the CPU has says so") {
  using strata::isa_level;
  CHECK(strata::compiled_isa_note(isa_level::avx512, isa_level::avx512).empty());
  CHECK(strata::compiled_isa_note(isa_level::avx2, isa_level::avx2).empty());
  CHECK(strata::compiled_isa_note(isa_level::avx512, isa_level::avx2).empty());
  const std::string sse_on_avx512 =
      strata::compiled_isa_note(isa_level::baseline, isa_level::avx512);
  CHECK(sse_on_avx512.find("compiled for SSE and the CPU has AVX-512") != std::string::npos);
  CHECK(sse_on_avx512.find("-march=native") != std::string::npos);
  CHECK(sse_on_avx512.find("x86-64-v4") != std::string::npos);
  CHECK(strata::compiled_isa_note(isa_level::avx, isa_level::avx2).find("x86-64-v3") !=
        std::string::npos);
  // This test program is built without -march (RelWithDebInfo): what the note compares.
#if !defined(__AVX2__)
  CHECK(strata::compiled_isa() == isa_level::baseline);
#endif
}

TEST_CASE("relu, gelu, flatten: backward matches central differences") {
  const sample_shape image{.channels = 2, .height = 3, .width = 2};
  const auto relu_result = check_gradients(
      sm::relu{},
      {.batch = 3, .in_shape = image, .input_range = 2.0f, .input_min_magnitude = 0.05f});
  CHECK_MESSAGE(relu_result.passed(), relu_result.report());
  CHECK(relu_result.probes == 36);

  const auto gelu_result =
      check_gradients(sm::gelu{}, {.batch = 3, .in_shape = image, .input_range = 4.0f});
  CHECK_MESSAGE(gelu_result.passed(), gelu_result.report());

  const auto flatten_result = check_gradients(sm::flatten{}, {.batch = 2, .in_shape = image});
  CHECK_MESSAGE(flatten_result.passed(), flatten_result.report());
}

TEST_CASE("dropout: backward matches central differences in training and evaluation") {
  const sample_shape shape{.channels = 3, .height = 2, .width = 4};
  const auto training = check_gradients(sm::dropout{.rate = 0.3}, {.batch = 4, .in_shape = shape});
  CHECK_MESSAGE(training.passed(), training.report());
  const auto evaluation =
      check_gradients(sm::dropout{.rate = 0.3}, {.batch = 4, .in_shape = shape, .training = false});
  CHECK_MESSAGE(evaluation.passed(), evaluation.report());
}

// ---- the checker itself catches broken layers ---------------------------------------------------

namespace {

// y = x * s with one parameter s; the flaw chosen breaks one part of the contract.
enum class flaw { none, overwrites_grads, wrong_grad_input, skips_grad_input_half };

template <flaw Flaw>
struct scale_layer {
  using layer_category = sm::layer_tag;

  sample_shape output_shape(const sample_shape& in) const { return in; }
  std::vector<sm::param_spec> parameters(const sample_shape&) const {
    return {sm::param_spec{.name = "scale", .rows = 1, .cols = 1}};
  }
  void forward(const sm::forward_args& a) const {
    for (std::size_t i = 0; i < a.input.size(); ++i) {
      a.output[i] = a.input[i] * a.params[0];
    }
  }
  void backward(const sm::backward_args& a) const {
    float ds = 0.0f;
    for (std::size_t i = 0; i < a.input.size(); ++i) {
      ds += a.grad_output[i] * a.input[i];
    }
    if (Flaw == flaw::overwrites_grads) {
      a.grads[0] = ds;
    } else {
      a.grads[0] += ds;
    }
    const std::size_t written =
        Flaw == flaw::skips_grad_input_half ? a.grad_input.size() / 2 : a.grad_input.size();
    for (std::size_t i = 0; i < written; ++i) {
      const float g = a.grad_output[i] * a.params[0];
      a.grad_input[i] = Flaw == flaw::wrong_grad_input ? -g : g;
    }
  }
  friend bool operator==(const scale_layer&, const scale_layer&) = default;
};

static_assert(sm::check_layer<scale_layer<flaw::none>>());

}  // namespace

TEST_CASE("gradient_check reports layers that break the backward contract") {
  const gradient_check_config config{.batch = 2, .in_shape = vec(3)};
  const auto good = check_gradients(scale_layer<flaw::none>{}, config);
  CHECK_MESSAGE(good.passed(), good.report());

  const auto overwrites = check_gradients(scale_layer<flaw::overwrites_grads>{}, config);
  CHECK_FALSE(overwrites.passed());
  REQUIRE_FALSE(overwrites.problems.empty());
  CHECK(contains(overwrites.report(), "does not add into grads"));

  const auto wrong = check_gradients(scale_layer<flaw::wrong_grad_input>{}, config);
  CHECK_FALSE(wrong.passed());
  CHECK(wrong.mismatches == 6);
  CHECK(contains(wrong.report(), "grad_input[0]"));

  const auto half = check_gradients(scale_layer<flaw::skips_grad_input_half>{}, config);
  CHECK_FALSE(half.passed());
  CHECK(half.mismatches == 3);
  CHECK(contains(half.report(), "grad_input[5]"));

  gradient_check_config short_input = config;
  short_input.input = {1.0f, 2.0f};
  const auto bad_config = check_gradients(scale_layer<flaw::none>{}, short_input);
  CHECK_FALSE(bad_config.passed());
  CHECK(contains(bad_config.report(), "config.input holds 2 floats, expected 6"));
}

// ---- linear -------------------------------------------------------------------------------------

TEST_CASE("linear: a hand-computed example, forward and backward") {
  const sm::linear l{.in = 2, .out = 3};
  const std::vector<float> x = {1.0f, -1.0f, 2.0f, 0.5f};
  // weight (3 x 2) then bias (3)
  const std::vector<float> params = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 0.5f, -1.0f, 2.0f};
  const auto run = run_forward(l, vec(2), 2, x, params);
  CHECK(run.out_shape == vec(3));
  CHECK(run.workspace.empty());
  CHECK(run.output == std::vector<float>{-0.5f, -2.0f, 1.0f, 3.5f, 7.0f, 15.0f});

  const std::vector<float> dy = {1.0f, 0.0f, -1.0f, 2.0f, 1.0f, 0.0f};
  std::vector<float> grads(9, 1.0f);
  std::vector<float> dx(4, std::numeric_limits<float>::quiet_NaN());
  l.backward({.batch = 2,
              .in_shape = vec(2),
              .out_shape = vec(3),
              .input = x,
              .output = run.output,
              .grad_output = dy,
              .grad_input = dx,
              .params = params,
              .grads = grads,
              .workspace = {}});
  // dW = dy^T x, db = column sums of dy, each plus the 1 already there; dx = dy W.
  CHECK(grads == std::vector<float>{6.0f, 1.0f, 3.0f, 1.5f, 0.0f, 2.0f, 4.0f, 2.0f, 0.0f});
  CHECK(dx == std::vector<float>{-4.0f, -4.0f, 5.0f, 8.0f});

  // Without grad_input, the parameter gradients still accumulate.
  l.backward({.batch = 2,
              .in_shape = vec(2),
              .out_shape = vec(3),
              .input = x,
              .output = run.output,
              .grad_output = dy,
              .grad_input = {},
              .params = params,
              .grads = grads,
              .workspace = {}});
  CHECK(grads == std::vector<float>{11.0f, 1.0f, 5.0f, 2.0f, -1.0f, 3.0f, 7.0f, 3.0f, -1.0f});
}

TEST_CASE("linear: the GEMM path agrees with a double-precision loop") {
  const sm::linear l{.in = 33, .out = 17};
  const std::size_t batch = 19;
  const auto x = random_values(batch * 33, 1);
  const auto params = random_values(17 * 33 + 17, 2);
  const auto run = run_forward(l, vec(33), batch, x, params);
  double worst = 0.0;
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t o = 0; o < 17; ++o) {
      double y = params[17 * 33 + o];
      for (std::size_t i = 0; i < 33; ++i) {
        y += static_cast<double>(x[b * 33 + i]) * params[o * 33 + i];
      }
      worst = std::max(worst, std::abs(y - run.output[b * 17 + o]));
    }
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("linear: asked for parts, it reports rows of the weight gradient as they are final") {
  const sm::linear l{.in = 10, .out = 40};
  const std::size_t batch = 7;
  const auto x = random_values(batch * 10, 3);
  const auto params = random_values(40 * 10 + 40, 4);
  const auto dy = random_values(batch * 40, 5);
  const auto run = run_forward(l, vec(10), batch, x, params);
  const auto backward = [&](std::vector<float>& grads, std::vector<float>& dx,
                            sm::grads_progress progress) {
    l.backward({.batch = batch,
                .in_shape = vec(10),
                .out_shape = vec(40),
                .input = x,
                .output = run.output,
                .grad_output = dy,
                .grad_input = dx,
                .params = params,
                .grads = grads,
                .workspace = {},
                .progress = progress});
  };
  std::vector<float> whole_grads(40 * 10 + 40, 0.5f);
  std::vector<float> whole_dx(batch * 10);
  backward(whole_grads, whole_dx, {});

  // Parts of at least 170 floats: 17 rows of 10 each; the reports come as the rows are added.
  struct seen {
    std::vector<std::size_t> reports;
    std::vector<float>* grads = nullptr;
    std::vector<float> expected;
    bool final_when_reported = true;
  } s;
  std::vector<float> grads(40 * 10 + 40, 0.5f);
  std::vector<float> dx(batch * 10);
  s.grads = &grads;
  s.expected = whole_grads;
  backward(grads, dx,
           {.report =
                [](void* context, std::size_t n) {
                  auto* t = static_cast<seen*>(context);
                  t->reports.push_back(n);
                  for (std::size_t i = 0; i < n; ++i) {
                    // Final: what the whole computation ends with (up to the GEMM's rounding).
                    if (std::abs((*t->grads)[i] - t->expected[i]) > 1e-4f) {
                      t->final_when_reported = false;
                    }
                  }
                },
            .context = &s,
            .chunk = 170});
  CHECK(s.reports == std::vector<std::size_t>{170, 340, 400});
  CHECK(s.final_when_reported);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient ", i);
    CHECK(grads[i] == doctest::Approx(whole_grads[i]).epsilon(1e-4));
  }
  CHECK(dx == whole_dx);

  // Parts smaller than a row: blocks of at least linear::min_part_rows (16) rows.
  s.reports.clear();
  const auto record = [](void* context, std::size_t n) {
    static_cast<seen*>(context)->reports.push_back(n);
  };
  backward(grads, dx, {.report = record, .context = &s, .chunk = 5});
  CHECK(s.reports == std::vector<std::size_t>{160, 320, 400});

  // A part as large as the whole weight gradient: computed whole, no reports.
  s.reports.clear();
  backward(grads, dx, {.report = record, .context = &s, .chunk = 400});
  CHECK(s.reports.empty());
}

TEST_CASE("max_magnitude: the largest |x|, infinity for any inf or NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(sm::detail::max_magnitude(nullptr, 0) == 0.0f);
  for (std::size_t n = 1; n <= 40; ++n) {
    INFO("n = ", n);
    std::vector<float> x = random_values(n, 50 + n, 3.0f);
    x[n / 2] = -0.0f;
    x[n - 1] = std::numeric_limits<float>::denorm_min();
    float want = 0.0f;
    for (const float v : x) {
      want = std::max(want, std::abs(v));
    }
    CHECK(sm::detail::max_magnitude(x.data(), n) == want);
    x[0] = -std::numeric_limits<float>::max();
    CHECK(sm::detail::max_magnitude(x.data(), n) == std::numeric_limits<float>::max());
    for (std::size_t i = 0; i < n; ++i) {
      for (const float bad : {inf, -inf, nan, -nan}) {
        std::vector<float> y = x;
        y[i] = bad;
        CHECK(sm::detail::max_magnitude(y.data(), n) == inf);
      }
    }
  }
}

TEST_CASE("linear: the bound it reports covers every gradient's change (requirement 11)") {
  const float inf = std::numeric_limits<float>::infinity();
  const sm::linear layers[] = {
      {.in = 10, .out = 40},
      {.in = 10, .out = 40, .bias = false},
      {.in = 10, .out = 40, .activation = sm::fused_activation::relu},
      {.in = 10, .out = 40, .activation = sm::fused_activation::relu, .dropout = 0.2}};
  // Batches 1 and 3 bound from the factors (fewer than the 440 gradients); 20 reads the
  // gradients after the product.
  for (const sm::linear& l : layers) {
    for (const std::size_t batch : {1, 3, 20}) {
      for (const bool write : {false, true}) {
        INFO(sm::to_string(l), ", batch ", batch, write ? ", writing" : ", adding");
        const std::size_t n_params = 40 * 10 + (l.bias ? 40 : 0);
        const auto x = random_values(batch * 10, 60 + batch, 2.0f);
        const auto params = random_values(n_params, 61);
        const auto dy = random_values(batch * 40, 62 + batch, 3.0f);
        auto run = run_forward(l, vec(10), batch, x, params, true, {.seed = 9, .layer = 1});
        std::vector<float> grads = random_values(n_params, 63, 0.5f);
        const std::vector<float> before = grads;
        const float before_bound = write ? 0.0f : 0.5f;
        std::vector<float> dx(batch * 10);
        double bound = -1.0;
        const sm::backward_args a{.batch = batch,
                                  .in_shape = vec(10),
                                  .out_shape = vec(40),
                                  .input = x,
                                  .output = run.output,
                                  .grad_output = dy,
                                  .grad_input = dx,
                                  .params = params,
                                  .grads = grads,
                                  .workspace = run.workspace,
                                  .write_grads = write,
                                  .grad_bound = &bound};
        l.backward(a);
        REQUIRE(std::isfinite(bound));
        float moved = 0.0f;
        for (std::size_t i = 0; i < n_params; ++i) {
          CHECK(std::abs(grads[i]) <= before_bound + bound);
          moved = std::max(moved, std::abs(grads[i] - (write ? 0.0f : before[i])));
        }
        CHECK(moved > 0.0f);
        CHECK(bound <= 4.0 * static_cast<double>(batch) * 3.0 * 2.0 + before_bound * 2.0);

        // An inf in the input or a NaN in the output gradient: nothing is known.
        for (const int which : {0, 1}) {
          auto bad_x = x;
          auto bad_dy = dy;
          if (which == 0) {
            bad_x[batch * 10 - 3] = inf;
          } else {
            bad_dy[0] = std::numeric_limits<float>::quiet_NaN();
          }
          auto bad_run =
              run_forward(l, vec(10), batch, bad_x, params, true, {.seed = 9, .layer = 1});
          grads = before;
          sm::backward_args b = a;
          b.input = bad_x;
          b.output = bad_run.output;
          b.grad_output = bad_dy;
          b.workspace = bad_run.workspace;
          bound = 0.0;
          l.backward(b);
          bool all_finite = true;
          for (const float g : grads) {
            all_finite = all_finite && std::isfinite(g);
          }
          // A fused ReLU may mask the bad element away; then the gradients stay finite.
          CHECK((bound == inf || all_finite));
          if (l.activation == sm::fused_activation::none) {
            CHECK(bound == inf);
          }
        }
      }
    }
  }
  // Reported final in parts (data parallelism may be reducing them already): read again only
  // from the factors; at batch 20 (the gradients read after the product) nothing is known.
  {
    const sm::linear l{.in = 10, .out = 40};
    for (const std::size_t batch : {3, 20}) {
      INFO("batch ", batch);
      const auto x = random_values(batch * 10, 70);
      const auto params = random_values(440, 71);
      const auto dy = random_values(batch * 40, 72);
      std::vector<float> grads(440);
      double bound = std::numeric_limits<double>::infinity();
      std::size_t reports = 0;
      l.backward(
          {.batch = batch,
           .in_shape = vec(10),
           .out_shape = vec(40),
           .input = x,
           .grad_output = dy,
           .params = params,
           .grads = grads,
           .progress = {.report = [](void* c, std::size_t) { ++*static_cast<std::size_t*>(c); },
                        .context = &reports,
                        .chunk = 170},
           .write_grads = true,
           .grad_bound = &bound});
      CHECK(reports == 3);
      CHECK((batch == 3 ? std::isfinite(bound) : bound == inf));
    }
  }
  // Batch 0: nothing moved.
  const sm::linear l{.in = 3, .out = 2};
  std::vector<float> params(8, 1.0f);
  std::vector<float> grads(8, 2.0f);
  double bound = -1.0;
  l.backward({.batch = 0,
              .in_shape = vec(3),
              .out_shape = vec(2),
              .params = params,
              .grads = grads,
              .grad_bound = &bound});
  CHECK(bound == 0.0);
}

TEST_CASE("linear: batch 0 touches nothing") {
  const sm::linear l{.in = 3, .out = 2};
  std::vector<float> params(8, 1.0f);
  std::vector<float> grads(8, 2.0f);
  l.forward({.batch = 0, .in_shape = vec(3), .out_shape = vec(2), .params = params});
  l.backward(
      {.batch = 0, .in_shape = vec(3), .out_shape = vec(2), .params = params, .grads = grads});
  CHECK(grads == std::vector<float>(8, 2.0f));
}

TEST_CASE("linear: parameters, shapes, printing") {
  const sm::linear l{.in = 784, .out = 10};
  const auto specs = sm::layer_traits<sm::linear>::parameters(l, vec(784));
  REQUIRE(specs.size() == 2);
  CHECK(specs[0] == sm::param_spec{.name = "weight",
                                   .rows = 10,
                                   .cols = 784,
                                   .init = sm::init_kind::kaiming_uniform,
                                   .fan_in = 784,
                                   .fan_out = 10,
                                   .weight_decay = true});
  CHECK(specs[1] == sm::param_spec{.name = "bias",
                                   .rows = 1,
                                   .cols = 10,
                                   .init = sm::init_kind::uniform_fan_in,
                                   .fan_in = 784,
                                   .fan_out = 10,
                                   .weight_decay = false});
  const auto no_bias = sm::linear{.in = 4, .out = 2, .bias = false}.parameters(vec(4));
  REQUIRE(no_bias.size() == 1);
  CHECK(no_bias[0].name == "weight");
  CHECK(no_bias[0].elements() == 8);

  CHECK(l.output_shape({.channels = 1, .height = 28, .width = 28}) == vec(10));
  CHECK(to_string(l) == "linear{.in = 784, .out = 10, .bias = true}");
  CHECK(to_string(sm::linear{.in = 3, .out = 1, .bias = false}) ==
        "linear{.in = 3, .out = 1, .bias = false}");
  CHECK(l == sm::linear{.in = 784, .out = 10, .bias = true});
  CHECK_FALSE(l == sm::linear{.in = 784, .out = 10, .bias = false});
  const sm::linear fused{.in = 784, .out = 10, .activation = sm::fused_activation::relu};
  CHECK(to_string(fused) == "linear{.in = 784, .out = 10, .bias = true, .activation = relu}");
  CHECK_FALSE(l == fused);
  CHECK(fused.parameters(vec(784)) == specs);
  CHECK(sm::layer_traits<sm::linear>::workspace_elements(l, vec(784), 5) == 0);
  CHECK(sm::layer_traits<sm::linear>::workspace_elements(fused, vec(784), 5) == 50);
  const sm::linear dropped{
      .in = 784, .out = 10, .activation = sm::fused_activation::relu, .dropout = 0.1};
  CHECK(to_string(dropped) ==
        "linear{.in = 784, .out = 10, .bias = true, .activation = relu, .dropout = 0.1}");
  CHECK_FALSE(dropped == fused);
  CHECK(dropped.parameters(vec(784)) == specs);
  CHECK(sm::layer_traits<sm::linear>::workspace_elements(dropped, vec(784), 5) == 51);
}

TEST_CASE("linear: output_shape names the numbers it rejects") {
  const std::string wrong =
      error_of(sm::linear{.in = 20, .out = 5}, {.channels = 2, .height = 3, .width = 4});
  CHECK(contains(wrong, "linear"));
  CHECK(contains(wrong, "2x3x4"));
  CHECK(contains(wrong, "24 elements"));
  CHECK(contains(wrong, "in = 20"));
  CHECK(contains(error_of(sm::linear{.in = 0, .out = 5}, vec(1)), "linear: in must be at least 1"));
  CHECK(
      contains(error_of(sm::linear{.in = 3, .out = 0}, vec(3)), "linear: out must be at least 1"));
  const std::string no_relu = error_of(sm::linear{.in = 3, .out = 2, .dropout = 0.5}, vec(3));
  CHECK(contains(no_relu, "linear: .dropout = 0.5 needs .activation = fused_activation::relu"));
  CHECK(contains(no_relu, "put a dropout layer after the linear"));
  constexpr auto relu = sm::fused_activation::relu;
  for (const double rate : {1.0, -0.25, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(rate);
    CHECK(contains(
        error_of(sm::linear{.in = 3, .out = 2, .activation = relu, .dropout = rate}, vec(3)),
        "linear: dropout must be in [0, 1), got "));
  }
  CHECK(
      contains(error_of(sm::linear{.in = 3, .out = 2, .activation = relu, .dropout = 1.0}, vec(3)),
               "got 1"));
}

// ---- activations, flatten -----------------------------------------------------------------------

TEST_CASE("relu: values and the gradient mask, 0 counting as inactive") {
  const std::vector<float> x = {-2.0f, -0.0f, 0.0f, 0.25f, 3.0f, -1e-30f};
  const auto run = run_forward(sm::relu{}, vec(3), 2, x);
  CHECK(run.output == std::vector<float>{0.0f, 0.0f, 0.0f, 0.25f, 3.0f, 0.0f});

  const std::vector<float> dy = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<float> dx(6, std::numeric_limits<float>::quiet_NaN());
  sm::relu{}.backward({.batch = 2,
                       .in_shape = vec(3),
                       .out_shape = vec(3),
                       .input = x,
                       .output = run.output,
                       .grad_output = dy,
                       .grad_input = dx});
  CHECK(dx == std::vector<float>{0.0f, 0.0f, 0.0f, 4.0f, 5.0f, 0.0f});
}

TEST_CASE("gelu: the tanh approximation's values, and its distance from the erf form") {
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 2.0f, 10.0f, -10.0f};
  const auto run = run_forward(sm::gelu{}, vec(6), 1, x);
  CHECK(run.output[0] == 0.0f);
  CHECK(run.output[1] == doctest::Approx(0.8411920).epsilon(1e-6));
  CHECK(run.output[2] == doctest::Approx(-0.1588080).epsilon(1e-5));
  CHECK(run.output[3] == doctest::Approx(1.9545977).epsilon(1e-6));
  CHECK(run.output[4] == 10.0f);
  CHECK(std::abs(run.output[5]) < 1e-5f);

  std::vector<float> grid;
  for (int k = -600; k <= 600; ++k) {
    grid.push_back(static_cast<float>(k) * 0.01f);
  }
  const auto grid_run = run_forward(sm::gelu{}, vec(grid.size()), 1, grid);
  double worst = 0.0;
  for (std::size_t i = 0; i < grid.size(); ++i) {
    const double v = grid[i];
    const double exact = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    worst = std::max(worst, std::abs(exact - grid_run.output[i]));
  }
  CHECK(worst < 1e-3);
  CHECK(worst > 1e-5);  // it is the approximation, not the erf form

  // tanh is Eigen's vectorised one: within 2e-6 of the formula through std::tanh in double for
  // the values, 1e-5 for the derivatives (4.2e-6 measured).
  using gt = sm::detail::gelu_tanh;
  double worst_value = 0.0;
  double worst_derivative = 0.0;
  for (const float v : grid) {
    const double x = v;
    const double u = gt::scale * (x + gt::cubic * x * x * x);
    const double t = std::tanh(u);
    const double du = gt::scale * (1.0 + 3.0 * gt::cubic * x * x);
    worst_value = std::max(worst_value, std::abs(0.5 * x * (1.0 + t) - gt::value(v)));
    worst_derivative =
        std::max(worst_derivative,
                 std::abs(0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du - gt::derivative(v)));
  }
  CHECK(worst_value < 2e-6);
  CHECK(worst_derivative < 1e-5);

  // An element's value and gradient do not depend on where it sits: every offset and length of
  // the span (blocks, their padded tail, unaligned addresses) gives each element's own bits.
  const auto pool = random_values(200, 7, 4.0f);
  const auto scales = random_values(200, 8);
  std::vector<float> y(200);
  std::vector<float> g(200);
  bool same = true;
  for (std::size_t first = 0; first < 19; ++first) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{17}, std::size_t{64},
                                    std::size_t{65}, std::size_t{200} - first}) {
      gt::values(pool.data() + first, y.data(), count);
      gt::gradients(pool.data() + first, scales.data() + first, g.data(), count);
      for (std::size_t i = 0; i < count; ++i) {
        same = same && y[i] == gt::value(pool[first + i]) &&
               g[i] == scales[first + i] * gt::derivative(pool[first + i]);
      }
    }
  }
  CHECK(same);
}

TEST_CASE("flatten: shape and copies") {
  const sample_shape image{.channels = 2, .height = 2, .width = 3};
  CHECK(sm::flatten{}.output_shape(image) == vec(12));
  const auto x = random_values(24, 4);
  const auto run = run_forward(sm::flatten{}, image, 2, x);
  CHECK(run.output == x);
  std::vector<float> dx(24, 0.0f);
  sm::flatten{}.backward({.batch = 2,
                          .in_shape = image,
                          .out_shape = vec(12),
                          .input = x,
                          .output = run.output,
                          .grad_output = x,
                          .grad_input = dx});
  CHECK(dx == x);
}

TEST_CASE("shape-preserving layers reject dimensions of 0") {
  const sample_shape empty{.channels = 0, .height = 2, .width = 2};
  CHECK(contains(error_of(sm::relu{}, empty), "relu: input shape"));
  CHECK(contains(error_of(sm::gelu{}, empty), "gelu: input shape"));
  CHECK(contains(error_of(sm::flatten{}, empty), "flatten: input shape"));
  CHECK(contains(error_of(sm::dropout{}, empty), "0x2x2"));
}

// ---- dropout ------------------------------------------------------------------------------------

TEST_CASE("dropout: keeps 1 - rate of the elements, scaled by the inverse keep probability") {
  const sm::dropout d{.rate = 0.3};
  const std::size_t batch = 64;
  const std::size_t n = 1000;
  const std::vector<float> x(batch * n, 2.0f);
  const auto run = run_forward(d, vec(n), batch, x, {}, true, {.seed = 3, .step = 1, .layer = 4});
  REQUIRE(run.workspace.size() == batch * n);
  // 16-bit draws: keep when the draw >= t = round(0.3 x 65536); scale 65536 / (65536 - t).
  const auto t = static_cast<std::uint32_t>(0.3 * 65536.0 + 0.5);
  const float scale = static_cast<float>(65536.0 / (65536.0 - t));
  CHECK(scale == doctest::Approx(1.0 / 0.7).epsilon(1e-4));
  std::size_t kept = 0;
  std::size_t other = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (run.output[i] == 0.0f && run.workspace[i] == 0.0f) {
      continue;
    }
    if (run.output[i] == 2.0f * scale && run.workspace[i] == scale) {
      ++kept;
    } else {
      ++other;
    }
  }
  CHECK(other == 0);
  // 64000 draws: the standard deviation of the kept fraction is 0.0018.
  CHECK(static_cast<double>(kept) / static_cast<double>(x.size()) ==
        doctest::Approx(0.7).epsilon(0.015));
}

TEST_CASE("dropout: the mask is a function of (seed, step, layer, sample id) only") {
  const sm::dropout d{.rate = 0.5};
  const std::size_t n = 256;
  const std::vector<float> x(3 * n, 1.0f);
  const sm::layer_rng_key key{.seed = 42, .step = 7, .layer = 1};
  const auto first = run_forward(d, vec(n), 3, x, {}, true, key);
  const auto again = run_forward(d, vec(n), 3, x, {}, true, key);
  CHECK(first.output == again.output);
  CHECK(first.workspace == again.workspace);

  const auto differing = [&](const std::vector<float>& other) {
    std::size_t count = 0;
    for (std::size_t i = 0; i < first.workspace.size(); ++i) {
      count += first.workspace[i] != other[i] ? 1 : 0;
    }
    return count;
  };
  // Independent masks of rate 0.5 differ in about half the places.
  CHECK(differing(
            run_forward(d, vec(n), 3, x, {}, true, {.seed = 42, .step = 8, .layer = 1}).workspace) >
        250);
  CHECK(differing(
            run_forward(d, vec(n), 3, x, {}, true, {.seed = 43, .step = 7, .layer = 1}).workspace) >
        250);
  CHECK(differing(
            run_forward(d, vec(n), 3, x, {}, true, {.seed = 42, .step = 7, .layer = 2}).workspace) >
        250);

  // Samples differ from each other, and a sample keeps its mask at another batch position.
  const std::span<const float> sample0(first.workspace.data(), n);
  const std::span<const float> sample1(first.workspace.data() + n, n);
  std::size_t between = 0;
  for (std::size_t i = 0; i < n; ++i) {
    between += sample0[i] != sample1[i] ? 1 : 0;
  }
  CHECK(between > 80);
  const std::vector<std::uint64_t> ids = {9, 1, 0};
  const auto moved = run_forward(d, vec(n), 3, x, {}, true, key, ids);
  CHECK(std::vector<float>(moved.workspace.begin() + 2 * n, moved.workspace.end()) ==
        std::vector<float>(sample0.begin(), sample0.end()));
  CHECK(std::vector<float>(moved.workspace.begin() + n, moved.workspace.begin() + 2 * n) ==
        std::vector<float>(sample1.begin(), sample1.end()));

  // The documented draw, word by word: sample b's stream, one word per two elements (low half
  // first); an odd element count uses the low half of one more word.
  const std::size_t odd = 229;  // 3 blocks of 64 and a rest
  const std::vector<float> odd_x(2 * odd, 1.0f);
  const auto odd_run = run_forward(d, vec(odd), 2, odd_x, {}, true, key);
  const auto t = static_cast<std::uint32_t>(0.5 * 65536.0 + 0.5);
  for (std::size_t b = 0; b < 2; ++b) {
    strata::rng_stream stream = key.stream(b);
    std::uint32_t word = 0;
    for (std::size_t i = 0; i < odd; ++i) {
      word = i % 2 == 0 ? stream() : word >> 16;
      const float expected = (word & 0xFFFFu) >= t ? 2.0f : 0.0f;
      CHECK(odd_run.workspace[b * odd + i] == expected);
    }
  }

  // A longer sample starts with the shorter one's mask.
  const std::vector<float> shorter_x(100, 1.0f);
  const auto shorter = run_forward(d, vec(100), 1, shorter_x, {}, true, key);
  CHECK(shorter.workspace == std::vector<float>(sample0.begin(), sample0.begin() + 100));
}

TEST_CASE("dropout: backward applies the forward mask; evaluation and rate 0 are the identity") {
  const sm::dropout d{.rate = 0.25};
  const auto x = random_values(2 * 50, 6);
  auto run = run_forward(d, vec(50), 2, x, {}, true, {.seed = 1});
  const auto dy = random_values(2 * 50, 7);
  std::vector<float> dx(100, std::numeric_limits<float>::quiet_NaN());
  d.backward({.batch = 2,
              .in_shape = vec(50),
              .out_shape = vec(50),
              .input = x,
              .output = run.output,
              .grad_output = dy,
              .grad_input = dx,
              .workspace = run.workspace});
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < 100; ++i) {
    CHECK(dx[i] == dy[i] * run.workspace[i]);
    CHECK((run.output[i] == 0.0f) == (dx[i] == 0.0f));
    dropped += dx[i] == 0.0f ? 1 : 0;
  }
  CHECK(dropped > 5);
  CHECK(dropped < 50);

  const auto eval = run_forward(d, vec(50), 2, x, {}, false, {.seed = 1});
  CHECK(eval.output == x);
  CHECK(eval.workspace == std::vector<float>(100, 1.0f));

  const auto none = run_forward(sm::dropout{.rate = 0.0}, vec(50), 2, x, {}, true, {.seed = 1});
  CHECK(none.output == x);
}

TEST_CASE("dropout: rate must be in [0, 1)") {
  CHECK(contains(error_of(sm::dropout{.rate = 1.0}, vec(3)),
                 "dropout: rate must be in [0, 1), got 1"));
  CHECK(contains(error_of(sm::dropout{.rate = -0.1}, vec(3)), "got -0.1"));
  CHECK(contains(error_of(sm::dropout{.rate = std::numeric_limits<double>::quiet_NaN()}, vec(3)),
                 "got nan"));
  CHECK(sm::dropout{.rate = 0.0}.output_shape(vec(3)) == vec(3));
  CHECK(to_string(sm::dropout{.rate = 0.1}) == "dropout{.rate = 0.1}");
  CHECK(sm::dropout{} == sm::dropout{.rate = 0.5});
}

// ---- costs --------------------------------------------------------------------------------------

TEST_CASE("layer costs per sample") {
  using sm::layer_cost;
  CHECK(sm::layer_traits<sm::linear>::cost(sm::linear{.in = 10, .out = 4}, vec(10)) ==
        layer_cost{.forward_flops = 80.0, .backward_flops = 160.0, .activation_bytes = 16});
  CHECK(sm::layer_traits<sm::linear>::cost(
            sm::linear{.in = 10, .out = 4, .activation = sm::fused_activation::relu}, vec(10)) ==
        layer_cost{.forward_flops = 84.0, .backward_flops = 164.0, .activation_bytes = 16});
  CHECK(
      sm::layer_traits<sm::linear>::cost(
          sm::linear{.in = 10, .out = 4, .activation = sm::fused_activation::relu, .dropout = 0.5},
          vec(10)) ==
      layer_cost{.forward_flops = 88.0, .backward_flops = 168.0, .activation_bytes = 16});
  const sample_shape image{.channels = 2, .height = 3, .width = 5};
  CHECK(sm::relu{}.cost(image) ==
        layer_cost{.forward_flops = 30.0, .backward_flops = 30.0, .activation_bytes = 120});
  CHECK(sm::gelu{}.cost(image) ==
        layer_cost{.forward_flops = 270.0, .backward_flops = 540.0, .activation_bytes = 120});
  CHECK(sm::flatten{}.cost(image) ==
        layer_cost{.forward_flops = 0.0, .backward_flops = 0.0, .activation_bytes = 120});
  CHECK(sm::dropout{}.cost(image) ==
        layer_cost{.forward_flops = 30.0, .backward_flops = 30.0, .activation_bytes = 240});
  CHECK(sm::layer_traits<sm::dropout>::workspace_elements(sm::dropout{}, image, 7) == 210);
  CHECK(sm::layer_traits<sm::relu>::workspace_elements(sm::relu{}, image, 7) == 0);
  CHECK(sm::layer_traits<sm::relu>::parameters(sm::relu{}, image).empty());
}

// ---- softmax_cross_entropy ----------------------------------------------------------------------

TEST_CASE("softmax_cross_entropy: a hand-computed batch") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 2.0f, 1.0f, 0.0f};
  const std::vector<std::int32_t> labels = {2, 1};
  std::vector<float> grad(6, std::numeric_limits<float>::quiet_NaN());
  const sm::loss_result r = sm::softmax_cross_entropy{}.evaluate({.batch = 2,
                                                                  .classes = 3,
                                                                  .logits = logits,
                                                                  .labels = labels,
                                                                  .grad_logits = grad,
                                                                  .grad_scale = 0.5f});
  // log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2), and the same sum minus 1 for the second.
  const double log_sum = std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));
  CHECK(r.loss_sum == doctest::Approx(log_sum + (log_sum + 1.0)).epsilon(1e-12));
  CHECK(r.correct == 1);
  CHECK(r.samples == 2);
  CHECK(r.mean_loss() == doctest::Approx(log_sum + 0.5).epsilon(1e-12));
  CHECK(r.accuracy() == 0.5);
  // softmax(1, 2, 3) = (0.0900306, 0.2447285, 0.6652410).
  const std::vector<double> expected = {0.0900306, 0.2447285,       0.6652410 - 1.0,
                                        0.6652410, 0.2447285 - 1.0, 0.0900306};
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(grad[i] == doctest::Approx(0.5 * expected[i]).epsilon(1e-5));
  }

  // Without grad_logits only the numbers come back.
  const auto numbers_only = sm::softmax_cross_entropy{}.evaluate(
      {.batch = 2, .classes = 3, .logits = logits, .labels = labels});
  CHECK(numbers_only == r);
}

TEST_CASE("softmax_cross_entropy: ties go to the lowest index") {
  const std::vector<float> logits = {1.0f, 1.0f, 0.0f, 0.0f, 2.0f, 2.0f, 3.0f, 3.0f, 3.0f};
  // Argmaxes 0, 1, 0: the first and the last sample are correct.
  const std::vector<std::int32_t> labels = {0, 2, 0};
  const auto r = sm::softmax_cross_entropy{}.evaluate(
      {.batch = 3, .classes = 3, .logits = logits, .labels = labels});
  CHECK(r.correct == 2);
}

TEST_CASE("softmax_cross_entropy: the gradient matches central differences of the loss") {
  const std::size_t batch = 4;
  const std::size_t classes = 7;
  auto logits = random_values(batch * classes, 12, 3.0f);
  const std::vector<std::int32_t> labels = {0, 6, 3, 3};
  const float scale = 0.25f;
  std::vector<float> grad(batch * classes);
  sm::softmax_cross_entropy{}.evaluate({.batch = batch,
                                        .classes = classes,
                                        .logits = logits,
                                        .labels = labels,
                                        .grad_logits = grad,
                                        .grad_scale = scale});
  const auto loss = [&]() {
    return sm::softmax_cross_entropy{}
        .evaluate({.batch = batch, .classes = classes, .logits = logits, .labels = labels})
        .loss_sum;
  };
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float original = logits[i];
    const float up = original + 1e-3f;
    const float down = original - 1e-3f;
    logits[i] = up;
    const double loss_up = loss();
    logits[i] = down;
    const double loss_down = loss();
    logits[i] = original;
    const double numeric = scale * (loss_up - loss_down) / (double{up} - double{down});
    CHECK(grad[i] == doctest::Approx(numeric).epsilon(1e-3).scale(1e-3));
  }
}

TEST_CASE("softmax_cross_entropy: stable for logits of 1e4; gradient may overwrite the logits") {
  std::vector<float> logits = {1e4f, 0.0f, -1e4f, 1e4f, 1e4f, 1e4f};
  const std::vector<std::int32_t> labels = {1, 2};
  std::vector<float> grad(6);
  const auto r = sm::softmax_cross_entropy{}.evaluate(
      {.batch = 2, .classes = 3, .logits = logits, .labels = labels, .grad_logits = grad});
  CHECK(std::isfinite(r.loss_sum));
  CHECK(r.loss_sum == doctest::Approx(1e4 + std::log(3.0)).epsilon(1e-12));
  CHECK(grad == std::vector<float>{1.0f, -1.0f, 0.0f, 1.0f / 3.0f, 1.0f / 3.0f, -2.0f / 3.0f});

  const std::vector<std::int32_t> first_class = {0};
  const auto easy = sm::softmax_cross_entropy{}.evaluate(
      {.batch = 1, .classes = 3, .logits = std::span(logits).first(3), .labels = first_class});
  CHECK(easy.loss_sum == 0.0);
  CHECK(easy.correct == 1);

  // In place: the gradient written over the logits equals the one written elsewhere.
  const auto in_place = sm::softmax_cross_entropy{}.evaluate(
      {.batch = 2, .classes = 3, .logits = logits, .labels = labels, .grad_logits = logits});
  CHECK(in_place == r);
  CHECK(logits == grad);
}

TEST_CASE("softmax_cross_entropy: bad labels and sizes throw before writing anything") {
  const std::vector<float> logits(12, 0.5f);
  std::vector<float> grad(12, 9.0f);
  const auto message = [&](std::size_t batch, std::vector<std::int32_t> labels,
                           std::size_t classes = 3, std::span<float> g = {}) {
    try {
      sm::softmax_cross_entropy{}.evaluate({.batch = batch,
                                            .classes = classes,
                                            .logits = logits,
                                            .labels = labels,
                                            .grad_logits = g});
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("<no exception>");
  };
  CHECK(message(4, {0, 1, -1, 2}, 3, grad) ==
        "softmax_cross_entropy: label of sample 2 is -1, outside [0, 3)");
  CHECK(grad == std::vector<float>(12, 9.0f));
  CHECK(message(4, {0, 1, 2, 3}) ==
        "softmax_cross_entropy: label of sample 3 is 3, outside [0, 3)");
  CHECK(contains(message(3, {0, 1, 2}), "logits must hold batch x classes = 9 floats, got 12"));
  CHECK(contains(message(3, {0, 0}, 4), "labels must hold batch = 3 values, got 2"));
  CHECK(contains(message(4, {0, 1, 2, 0}, 3, std::span(grad).first(5)),
                 "grad_logits must be empty or hold batch x classes = 12 floats, got 5"));
  CHECK(contains(message(0, {}, 0), "classes must be at least 1, got 0"));
}

TEST_CASE("loss_result accumulates micro-batches") {
  sm::loss_result total{};
  total += {.loss_sum = 1.5, .correct = 2, .samples = 4};
  total += {.loss_sum = 0.5, .correct = 1, .samples = 4};
  CHECK(total == sm::loss_result{.loss_sum = 2.0, .correct = 3, .samples = 8});
  CHECK(total.mean_loss() == 0.25);
  CHECK(total.accuracy() == 0.375);
  CHECK(sm::loss_result{}.mean_loss() == 0.0);
  CHECK(to_string(total) == "loss_result{.loss_sum = 2, .correct = 3, .samples = 8}");
}

// ---- gemm ---------------------------------------------------------------------------------------

namespace {

sm::gemm_environment fake_machine(strata::cpu_features cpu, bool onednn, std::string core,
                                  strata::isa_level eigen) {
  return {.cpu = cpu,
          .onednn = onednn,
          .onednn_isa = onednn ? "avx512_core" : "",
          .onednn_version = onednn ? "2.6.3" : "",
          .openblas = !core.empty(),
          .openblas_core = std::move(core),
          .eigen_isa = eigen};
}

bool has_note(const sm::gemm_decision& d, std::initializer_list<std::string_view> parts) {
  for (const std::string& note : d.notes) {
    bool all = true;
    for (const std::string_view part : parts) {
      all = all && note.find(part) != std::string::npos;
    }
    if (all) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("gemm: auto takes the table's provider for the CPU's maker and class where it fits") {
  using strata::cpu_vendor;
  using strata::isa_level;
  const strata::cpu_features zen_avx2{.avx2 = true, .vendor = cpu_vendor::amd};
  const strata::cpu_features zen4{
      .avx2 = true, .avx512 = true, .avx512_bf16 = true, .vendor = cpu_vendor::amd};
  const strata::cpu_features haswell{.avx2 = true, .vendor = cpu_vendor::intel};
  CHECK(sm::gemm_table_choice(zen_avx2) == sm::gemm_provider::openblas);
  CHECK(sm::gemm_table_choice(zen4) == sm::gemm_provider::onednn);
  CHECK(sm::gemm_table_choice(haswell) == sm::gemm_provider::onednn);
  // AMD with AVX2: OpenBLAS on its matching kernels, before oneDNN.
  const auto a =
      sm::decide_gemm(std::nullopt, fake_machine(zen_avx2, true, "Zen", isa_level::avx2));
  CHECK(a.provider == sm::gemm_provider::openblas);
  CHECK(a.notes.empty());
  CHECK(sm::decide_gemm(std::nullopt, fake_machine(zen_avx2, true, "Haswell", isa_level::avx2))
            .provider == sm::gemm_provider::openblas);
  // ... never on a fallback OpenBLAS picked: oneDNN then, as elsewhere.
  CHECK(sm::decide_gemm(std::nullopt, fake_machine(zen_avx2, true, "Prescott", isa_level::avx2))
            .provider == sm::gemm_provider::onednn);
  // ... and not where the build has no OpenBLAS.
  auto no_blas = fake_machine(zen_avx2, true, "Zen", isa_level::avx2);
  no_blas.openblas = false;
  no_blas.openblas_core.clear();
  CHECK(sm::decide_gemm(std::nullopt, no_blas).provider == sm::gemm_provider::onednn);
  // Zen 4 and Intel: oneDNN.
  CHECK(sm::decide_gemm(std::nullopt, fake_machine(zen4, true, "Cooperlake", isa_level::avx512))
            .provider == sm::gemm_provider::onednn);
  CHECK(sm::decide_gemm(std::nullopt, fake_machine(haswell, true, "Haswell", isa_level::avx2))
            .provider == sm::gemm_provider::onednn);
  // Every row says what it rests on.
  for (const sm::gemm_table_row& row : sm::gemm_table) {
    CHECK(std::string_view(row.measured).size() > 20);
  }
}

TEST_CASE("STRATA_CPU_ISA caps the CPU strata sees to a class, and a wrong one is refused") {
  using strata::cpu_class;
  const strata::cpu_features amx_cpu{.avx2 = true,
                                     .avx512 = true,
                                     .avx512_bf16 = true,
                                     .avx512_fp16 = true,
                                     .amx_bf16 = true,
                                     .amx_fp16 = true,
                                     .vendor = strata::cpu_vendor::intel};
  CHECK(strata::class_of(amx_cpu) == cpu_class::amx);
  CHECK(strata::capped(amx_cpu, cpu_class::amx) == amx_cpu);
  const auto bf16 = strata::capped(amx_cpu, cpu_class::avx512_bf16);
  CHECK(strata::class_of(bf16) == cpu_class::avx512_bf16);
  CHECK_FALSE(bf16.avx512_fp16);
  CHECK_FALSE(bf16.amx_bf16);
  const auto avx512 = strata::capped(amx_cpu, cpu_class::avx512);
  CHECK(strata::class_of(avx512) == cpu_class::avx512);
  CHECK_FALSE(avx512.avx512_bf16);
  const auto avx2 = strata::capped(amx_cpu, cpu_class::avx2);
  CHECK(avx2 == strata::cpu_features{.avx2 = true, .vendor = strata::cpu_vendor::intel});
  CHECK(strata::class_of(strata::capped(amx_cpu, cpu_class::baseline)) == cpu_class::baseline);
  // A cap never adds units.
  CHECK(strata::capped(strata::cpu_features{.avx2 = true}, cpu_class::amx) ==
        strata::cpu_features{.avx2 = true});
  for (std::size_t i = 0; i < strata::cpu_class_names.size(); ++i) {
    CHECK(strata::parse_cpu_class(strata::cpu_class_names[i]) == static_cast<cpu_class>(i));
  }
  CHECK_FALSE(strata::parse_cpu_class("avx512bf16").has_value());
  CHECK(strata::cpu_class_openblas_core(cpu_class::avx2) == "Haswell");
  CHECK(strata::cpu_class_onednn_isa(cpu_class::avx2) == "AVX2");
  // Refusals name the key, what the CPU has and what would work.
  const strata::cpu_features zen4{.avx2 = true, .avx512 = true, .avx512_bf16 = true};
  CHECK_NOTHROW(strata::check_cpu_isa_cap("", zen4));
  CHECK_NOTHROW(strata::check_cpu_isa_cap("native", zen4));
  CHECK_NOTHROW(strata::check_cpu_isa_cap("avx2", zen4));
  CHECK_NOTHROW(strata::check_cpu_isa_cap("avx512_bf16", zen4));
  CHECK_THROWS_WITH_AS(strata::check_cpu_isa_cap("amx", zen4),
                       doctest::Contains("use one of baseline, avx2, avx512, avx512_bf16, or "
                                         "native"),
                       strata::config_error);
  CHECK_THROWS_WITH_AS(strata::check_cpu_isa_cap("avx-2", zen4),
                       doctest::Contains("STRATA_CPU_ISA"), strata::config_error);
  // This process: what it sees is the hardware capped by the environment's class, if any.
  const auto cap = strata::cpu_isa_cap();
  const auto hw = strata::detect_cpu_hardware();
  CHECK(strata::detect_cpu_features() == (cap ? strata::capped(hw, *cap) : hw));
  if (cap) {
    MESSAGE("this run is capped to STRATA_CPU_ISA=" << strata::to_string(*cap));
  }
}

TEST_CASE("gemm: auto takes oneDNN, then an OpenBLAS whose kernels fit the CPU, then Eigen") {
  using strata::isa_level;
  const strata::cpu_features avx512{.avx2 = true, .avx512 = true};
  const strata::cpu_features avx2{.avx2 = true};
  const strata::cpu_features old{};
  SUBCASE("oneDNN when the build has it, whatever OpenBLAS picked") {
    for (const char* core : {"SkylakeX", "Prescott", ""}) {
      const auto d =
          sm::decide_gemm(std::nullopt, fake_machine(avx512, true, core, isa_level::avx512));
      CHECK(d.provider == sm::gemm_provider::onednn);
      CHECK(d.kernel == "avx512_core");
      CHECK(d.notes.empty());
    }
  }
  SUBCASE("oneDNN below the CPU's ISA is used, and said") {
    auto env = fake_machine(avx512, true, "SkylakeX", isa_level::avx512);
    env.onednn_isa = "avx2";
    const auto d = sm::decide_gemm(std::nullopt, env);
    CHECK(d.provider == sm::gemm_provider::onednn);
    CHECK(has_note(d, {"oneDNN dispatches to its avx2 kernels", "AVX-512", "ONEDNN_MAX_CPU_ISA"}));
    CHECK(sm::onednn_isa_level("avx512_core_amx") == isa_level::avx512);
    CHECK(sm::onednn_isa_level("avx2_vnni") == isa_level::avx2);
    CHECK(sm::onednn_isa_level("sse41") == isa_level::baseline);
  }
  SUBCASE("OpenBLAS with kernels for the CPU's widest ISA") {
    const auto a =
        sm::decide_gemm(std::nullopt, fake_machine(avx512, false, "SkylakeX", isa_level::avx512));
    CHECK(a.provider == sm::gemm_provider::openblas);
    CHECK(a.kernel == "SkylakeX");
    CHECK(a.notes.empty());
    const auto b =
        sm::decide_gemm(std::nullopt, fake_machine(avx2, false, "Haswell", isa_level::avx2));
    CHECK(b.provider == sm::gemm_provider::openblas);
    // A core name OpenBLAS has and this table does not (another architecture): used.
    const auto c =
        sm::decide_gemm(std::nullopt, fake_machine(avx512, false, "NeoverseN1", isa_level::avx512));
    CHECK(c.provider == sm::gemm_provider::openblas);
    // Generic kernels on a CPU without AVX2 are that CPU's kernels.
    const auto e =
        sm::decide_gemm(std::nullopt, fake_machine(old, false, "Prescott", isa_level::baseline));
    CHECK(e.provider == sm::gemm_provider::openblas);
    CHECK(e.notes.empty());
  }
  SUBCASE("an OpenBLAS fallback is skipped, and the note says how to fix it") {
    const auto d =
        sm::decide_gemm(std::nullopt, fake_machine(avx512, false, "Prescott", isa_level::avx512));
    CHECK(d.provider == sm::gemm_provider::eigen);
    CHECK(d.kernel == "Eigen AVX-512");
    REQUIRE(d.notes.size() == 1);
    CHECK(has_note(d, {"Prescott", "SSE", "AVX-512", "not used", "OPENBLAS_CORETYPE=SkylakeX"}));
    // On an AVX2 CPU the fix names the AVX2 kernels; Haswell kernels on AVX-512 are a fallback.
    const auto h =
        sm::decide_gemm(std::nullopt, fake_machine(avx2, false, "Nehalem", isa_level::avx2));
    CHECK(h.provider == sm::gemm_provider::eigen);
    CHECK(has_note(h, {"Nehalem", "OPENBLAS_CORETYPE=Haswell"}));
    const auto w =
        sm::decide_gemm(std::nullopt, fake_machine(avx512, false, "Haswell", isa_level::avx512));
    CHECK(w.provider == sm::gemm_provider::eigen);
    CHECK(has_note(w, {"Haswell", "AVX2"}));
  }
  SUBCASE("Eigen compiled below the CPU is said, with the fix") {
    const auto d =
        sm::decide_gemm(std::nullopt, fake_machine(avx512, false, "", isa_level::baseline));
    CHECK(d.provider == sm::gemm_provider::eigen);
    CHECK(d.kernel == "Eigen SSE");
    CHECK(has_note(d, {"compiled for SSE", "-march=native", "libdnnl-dev"}));
    const auto both =
        sm::decide_gemm(std::nullopt, fake_machine(avx2, false, "Prescott", isa_level::baseline));
    CHECK(both.notes.size() == 2);
  }
  SUBCASE("a provider asked for by name is used, a fallback with its fix") {
    const auto env = fake_machine(avx512, true, "Prescott", isa_level::avx512);
    const auto d = sm::decide_gemm(sm::gemm_provider::openblas, env);
    CHECK(d.provider == sm::gemm_provider::openblas);
    CHECK(d.kernel == "Prescott");
    CHECK(has_note(d, {"Prescott", "set OPENBLAS_CORETYPE=SkylakeX", "gemm = \"auto\""}));
    CHECK(sm::decide_gemm(sm::gemm_provider::eigen, env).provider == sm::gemm_provider::eigen);
    CHECK(sm::decide_gemm(sm::gemm_provider::onednn, env).provider == sm::gemm_provider::onednn);
  }
  SUBCASE("a provider the build lacks is an error naming the package") {
    const auto env = fake_machine(avx512, false, "", isa_level::avx512);
    CHECK_THROWS_WITH_AS(sm::decide_gemm(sm::gemm_provider::onednn, env),
                         doctest::Contains("libdnnl-dev"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sm::decide_gemm(sm::gemm_provider::openblas, env),
                         doctest::Contains("libopenblas-dev"), std::invalid_argument);
  }
  SUBCASE("a build without Eigen's kernels (the default beside oneDNN or OpenBLAS)") {
    auto env = fake_machine(avx512, false, "Prescott", isa_level::avx512);
    env.eigen = false;
    CHECK_THROWS_WITH_AS(sm::decide_gemm(sm::gemm_provider::eigen, env),
                         doctest::Contains("-DSTRATA_GEMM_EIGEN=1"), std::invalid_argument);
    // A fallback OpenBLAS is all there is: it is used, and the note says how to fix it.
    const auto d = sm::decide_gemm(std::nullopt, env);
    CHECK(d.provider == sm::gemm_provider::openblas);
    CHECK(has_note(d, {"Prescott", "set OPENBLAS_CORETYPE=SkylakeX"}));
    env.openblas_core = "SkylakeX";
    CHECK(sm::decide_gemm(std::nullopt, env).notes.empty());
  }
  CHECK(sm::openblas_core_isa("skylakex") == isa_level::avx512);
  CHECK(sm::openblas_core_isa("Zen") == isa_level::avx2);
  CHECK(sm::openblas_core_isa("Prescott") == isa_level::baseline);
  CHECK_FALSE(sm::openblas_core_isa("ARMV8").has_value());
}

TEST_CASE("gemm: every provider, every transpose, alpha, beta and leading dimensions") {
  const std::size_t m = 13;
  const std::size_t n = 9;
  const std::size_t k = 21;
  const std::size_t pad = 3;  // leading dimensions wider than the rows
  const auto a_values = random_values((m + k) * (m + k + pad), 5);
  const auto b_values = random_values((n + k) * (n + k + pad), 6);
  const auto c_start = random_values(m * (n + pad), 7);
  for (const sm::gemm_provider p : sm::available_gemm_providers()) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f},
                                          std::pair{2.0f, 0.5f}, std::pair{-1.0f, 0.0f}}) {
          CAPTURE(sm::to_string(p));
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(alpha);
          CAPTURE(beta);
          const std::size_t lda = (ta ? m : k) + pad;
          const std::size_t ldb = (tb ? k : n) + pad;
          const std::size_t ldc = n + pad;
          std::vector<float> c = c_start;
          if (beta == 0.0f) {  // C is not read: NaN there must not reach the result
            for (std::size_t i = 0; i < m; ++i) {
              std::fill_n(c.begin() + static_cast<std::ptrdiff_t>(i * ldc), n,
                          std::numeric_limits<float>::quiet_NaN());
            }
          }
          sm::gemm_on(p, {.transpose_a = ta, .transpose_b = tb}, m, n, k, alpha, a_values.data(),
                      lda, b_values.data(), ldb, beta, c.data(), ldc);
          double worst = 0.0;
          for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
              double sum = 0.0;
              for (std::size_t l = 0; l < k; ++l) {
                const double av = ta ? a_values[l * lda + i] : a_values[i * lda + l];
                const double bv = tb ? b_values[j * ldb + l] : b_values[l * ldb + j];
                sum += av * bv;
              }
              const double expected =
                  alpha * sum +
                  (beta == 0.0f ? 0.0 : beta * static_cast<double>(c_start[i * ldc + j]));
              worst = std::max(worst, std::abs(expected - c[i * ldc + j]));
            }
            // The padding between rows is left alone.
            for (std::size_t j = n; j < ldc; ++j) {
              CHECK(c[i * ldc + j] == c_start[i * ldc + j]);
            }
          }
          CHECK(worst < 1e-4);
        }
      }
    }
    // k = 0: C = beta * C; m = 0 or n = 0: nothing.
    std::vector<float> c{1.0f, 2.0f};
    sm::gemm_on(p, {}, 1, 2, 0, 1.0f, a_values.data(), 1, b_values.data(), 2, 0.5f, c.data(), 2);
    CHECK(c == std::vector<float>{0.5f, 1.0f});
    sm::gemm_on(p, {}, 0, 2, 3, 1.0f, a_values.data(), 3, b_values.data(), 2, 0.0f, c.data(), 2);
    CHECK(c == std::vector<float>{0.5f, 1.0f});
  }
}

TEST_CASE("gemm_bias: the product plus a row, every provider and transpose, C not read") {
  const std::size_t m = 11;
  const std::size_t n = 7;
  const std::size_t k = 19;
  const std::size_t pad = 2;
  const auto a_values = random_values((m + k) * (m + k + pad), 15);
  const auto b_values = random_values((n + k) * (n + k + pad), 16);
  const auto bias = random_values(n, 17);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const sm::gemm_provider p : sm::available_gemm_providers()) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        CAPTURE(sm::to_string(p));
        CAPTURE(ta);
        CAPTURE(tb);
        const std::size_t lda = (ta ? m : k) + pad;
        const std::size_t ldb = (tb ? k : n) + pad;
        const std::size_t ldc = n + pad;
        std::vector<float> c(m * ldc, nan);
        for (std::size_t i = 0; i < m; ++i) {
          c[i * ldc + n] = 5.0f;  // padding: left alone
        }
        // The same answer on the cached primitive's second use; then with the ReLU epilogue.
        for (int use = 0; use < 4; ++use) {
          const bool relu = use >= 2;
          CAPTURE(relu);
          sm::gemm_bias_on(p, {.transpose_a = ta, .transpose_b = tb}, m, n, k, a_values.data(), lda,
                           b_values.data(), ldb, bias.data(), c.data(), ldc,
                           relu ? sm::gemm_epilogue::relu : sm::gemm_epilogue::none);
          double worst = 0.0;
          for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
              double sum = bias[j];
              for (std::size_t l = 0; l < k; ++l) {
                const double av = ta ? a_values[l * lda + i] : a_values[i * lda + l];
                const double bv = tb ? b_values[j * ldb + l] : b_values[l * ldb + j];
                sum += av * bv;
              }
              if (relu) {
                CHECK(c[i * ldc + j] >= 0.0f);
                sum = std::max(sum, 0.0);
              }
              worst = std::max(worst, std::abs(sum - c[i * ldc + j]));
            }
            CHECK(c[i * ldc + n] == 5.0f);
            CHECK(std::isnan(c[i * ldc + n + 1]));
          }
          CHECK(worst < 1e-4);
        }
      }
    }
    // The ReLU epilogue turns a NaN into +0, as relu{} does.
    const std::vector<float> nan_row = {nan, 1.0f, -1.0f, 2.0f};
    const std::vector<float> identity = {1.0f, 0.0f, 0.0f, 1.0f};
    const std::vector<float> shift = {0.0f, 5.0f};
    std::vector<float> relu_out(4, -1.0f);
    sm::gemm_bias_on(p, {}, 2, 2, 2, nan_row.data(), 2, identity.data(), 2, shift.data(),
                     relu_out.data(), 2, sm::gemm_epilogue::relu);
    CHECK(relu_out == std::vector<float>{0.0f, 0.0f, 0.0f, 7.0f});
    CHECK_FALSE(std::signbit(relu_out[0]));
    // k = 0: every row is the bias.
    std::vector<float> c(2 * n, nan);
    sm::gemm_bias_on(p, {}, 2, n, 0, a_values.data(), 1, b_values.data(), n, bias.data(), c.data(),
                     n);
    CHECK(std::vector<float>(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n)) == bias);
    CHECK(std::vector<float>(c.begin() + static_cast<std::ptrdiff_t>(n), c.end()) == bias);
  }
}

TEST_CASE(
    "gemm: bfloat16 products by capability: AMX-BF16 only; AVX512-BF16 measured for the log") {
  const strata::cpu_features amx{
      .avx2 = true, .avx512 = true, .avx512_bf16 = true, .amx_bf16 = true};
  const strata::cpu_features avx512_bf16{.avx2 = true, .avx512 = true, .avx512_bf16 = true};
  const strata::cpu_features no_units{.avx2 = true, .avx512 = true};
  CHECK(sm::bf16_products_automatic(amx));
  CHECK_FALSE(sm::bf16_products_automatic(avx512_bf16));
  CHECK_FALSE(sm::bf16_products_automatic(no_units));

  // This machine: the mode follows the CPU; the probe measures only where the log reports it.
  const auto cpu = strata::detect_cpu_features();
  if (!sm::gemm_compiled(sm::gemm_provider::onednn)) {
    CHECK_FALSE(sm::bf16_products(sm::gemm_provider::onednn));
    return;
  }
  CHECK(sm::bf16_products(sm::gemm_provider::onednn) == sm::bf16_products_automatic(cpu));
  const sm::bf16_probe_result& probe = sm::bf16_products_probe();
  CHECK(probe.measured == (cpu.avx512_bf16 && !cpu.amx_bf16));
  if (probe.measured) {
    CHECK(probe.bf16_gflops > 0.0);
    CHECK(probe.fp32_gflops > 0.0);
  }
}

TEST_CASE("gemm: bfloat16 products only on oneDNN, and refused in words where it has none") {
  struct restore {
    ~restore() { sm::set_bf16_products(sm::bf16_products_mode::automatic); }
  } restore_mode;
  sm::set_bf16_products(sm::bf16_products_mode::on);
  CHECK_FALSE(sm::bf16_products(sm::gemm_provider::openblas));
  CHECK_FALSE(sm::bf16_products(sm::gemm_provider::eigen));
  CHECK(sm::bf16_products(sm::gemm_provider::onednn) ==
        sm::gemm_compiled(sm::gemm_provider::onednn));
  if (sm::bf16_products_supported()) {
    CHECK(sm::gemm_compiled(sm::gemm_provider::onednn));
    CHECK(sm::bf16_products_refusal().find("has no bfloat16 matmul") != std::string::npos);
    return;
  }
  // Forced on where oneDNN cannot: a refusal naming what the CPU has and what would work, never
  // oneDNN's status code.
  const std::string why = sm::bf16_products_refusal();
  CHECK(why.find("bf16_products = auto or off") != std::string::npos);
  if (!sm::gemm_compiled(sm::gemm_provider::onednn)) {
    CHECK(why.find("libdnnl-dev") != std::string::npos);
    return;
  }
  CHECK(why.find("has no bfloat16 matmul on this CPU (") != std::string::npos);
  std::vector<float> a(16, 1.0f);
  std::vector<float> c(16);
  CHECK_THROWS_WITH_AS(sm::gemm_on(sm::gemm_provider::onednn, {.bfloat16_inputs = true}, 4, 4, 4,
                                   1.0f, a.data(), 4, a.data(), 4, 0.0f, c.data(), 4),
                       doctest::Contains("bf16_products = on"), std::invalid_argument);
}

STRATA_TEST_CASE_NEEDING(
    "gemm: bfloat16 inputs multiply in bfloat16 on oneDNN, accumulated in "
    "float32",
    sm::bf16_products_supported(), sm::bf16_products_refusal()) {
  struct restore {
    ~restore() { sm::set_bf16_products(sm::bf16_products_mode::automatic); }
  } restore_mode;
  const std::size_t m = 19;
  const std::size_t n = 23;
  const std::size_t k = 37;
  const std::size_t pad = 2;
  // bfloat16 values (what mixed<bfloat16> hands the layers), and one that is not: 1 + 2^-10
  // rounds to 1 in bfloat16.
  auto a = random_values((m + k) * (m + k + pad), 8);
  auto b = random_values((n + k) * (n + k + pad), 9);
  for (float& v : a) {
    v = static_cast<float>(strata::bfloat16(v));
  }
  for (float& v : b) {
    v = static_cast<float>(strata::bfloat16(v));
  }
  const float inexact = 1.0f + 1.0f / 1024.0f;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const float beta : {0.0f, 1.0f}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        const std::size_t lda = (ta ? m : k) + pad;
        const std::size_t ldb = (tb ? k : n) + pad;
        const std::size_t ldc = n + pad;
        std::vector<float> a_in = a;
        a_in[0] = inexact;  // A's first stored element, rounded to 1 by the bfloat16 product
        const auto c_start = random_values(m * ldc, 10);
        std::vector<float> c_bf16 = c_start;
        sm::set_bf16_products(sm::bf16_products_mode::on);
        sm::gemm_on(sm::gemm_provider::onednn,
                    {.transpose_a = ta, .transpose_b = tb, .bfloat16_inputs = true}, m, n, k, 1.0f,
                    a_in.data(), lda, b.data(), ldb, beta, c_bf16.data(), ldc);
        // Off: the float32 product of the same values, bit for bit as without the flag.
        sm::set_bf16_products(sm::bf16_products_mode::off);
        std::vector<float> c_off = c_start;
        std::vector<float> c_plain = c_start;
        sm::gemm_on(sm::gemm_provider::onednn,
                    {.transpose_a = ta, .transpose_b = tb, .bfloat16_inputs = true}, m, n, k, 1.0f,
                    a_in.data(), lda, b.data(), ldb, beta, c_off.data(), ldc);
        sm::gemm_on(sm::gemm_provider::onednn, {.transpose_a = ta, .transpose_b = tb}, m, n, k,
                    1.0f, a_in.data(), lda, b.data(), ldb, beta, c_plain.data(), ldc);
        CHECK(c_off == c_plain);
        double worst = 0.0;
        for (std::size_t i = 0; i < m; ++i) {
          for (std::size_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (std::size_t l = 0; l < k; ++l) {
              const std::size_t ai = ta ? l * lda + i : i * lda + l;
              const double av = ai == 0 ? 1.0 : a_in[ai];  // the product saw the rounded value
              const double bv = tb ? b[j * ldb + l] : b[l * ldb + j];
              sum += av * bv;
            }
            const double expected = sum + beta * static_cast<double>(c_start[i * ldc + j]);
            worst = std::max(worst, std::abs(expected - c_bf16[i * ldc + j]));
          }
          for (std::size_t j = n; j < ldc; ++j) {
            CHECK(c_bf16[i * ldc + j] == c_start[i * ldc + j]);
          }
        }
        CHECK(worst < 1e-4);
      }
    }
  }
  // A linear layer under mixed<bfloat16>'s storage: the same output in bfloat16 products as in
  // float32 ones (bfloat16 inputs and parameters), to float32 accumulation's rounding.
  const sm::linear l{.in = 40, .out = 12};
  const std::size_t batch = 6;
  auto x = random_values(batch * 40, 11);
  auto params = random_values(12 * 40 + 12, 12);
  for (float& v : x) {
    v = static_cast<float>(strata::bfloat16(v));
  }
  for (float& v : params) {
    v = static_cast<float>(strata::bfloat16(v));
  }
  const sm::gemm_scope use(sm::gemm_provider::onednn);
  std::vector<float> y_on(batch * 12);
  std::vector<float> y_off(batch * 12);
  for (const auto mode : {sm::bf16_products_mode::on, sm::bf16_products_mode::off}) {
    sm::set_bf16_products(mode);
    sm::forward_args args;
    args.batch = batch;
    args.in_shape = vec(40);
    args.out_shape = vec(12);
    args.input = x;
    args.output = mode == sm::bf16_products_mode::on ? y_on : y_off;
    args.params = params;
    args.storage = strata::dtype::bfloat16;
    l.forward(args);
  }
  for (std::size_t i = 0; i < y_on.size(); ++i) {
    CHECK(y_on[i] == doctest::Approx(y_off[i]).epsilon(1e-5));
  }
}

TEST_SUITE("timing") {
  // The table's row for this machine, against a measurement: the provider "auto" takes computes
  // the step's product forms within 10% of the fastest provider here (the best of three
  // measurements, 1 thread).
  TEST_CASE("gemm: the provider auto takes here is within 10% of the fastest one measured") {
    const std::vector<sm::gemm_provider> providers = sm::available_gemm_providers();
    if (providers.size() < 2) {
      MESSAGE("one GEMM provider in this build: nothing to choose between");
      CHECK(sm::decide_gemm(std::nullopt, sm::detect_gemm_environment()).provider ==
            providers.front());
      return;
    }
    sm::set_blas_threads(1);
    const sm::gemm_provider chosen =
        sm::decide_gemm(std::nullopt, sm::detect_gemm_environment()).provider;
    double share = 0.0;
    std::string measured;
    for (int attempt = 0; attempt < 3 && share < 0.9; ++attempt) {
      const auto speeds = sm::measure_gemm_providers(std::chrono::milliseconds(600));
      const double best = *std::max_element(speeds.begin(), speeds.end());
      share = std::max(share, speeds[static_cast<std::size_t>(chosen)] / best);
      measured.clear();
      for (const sm::gemm_provider p : providers) {
        measured += std::string(sm::to_string(p)) + " " +
                    std::to_string(speeds[static_cast<std::size_t>(p)]) + " GFLOP/s; ";
      }
    }
    CAPTURE(measured);
    CAPTURE(sm::to_string(chosen));
    CAPTURE(strata::describe(strata::detect_cpu_features()));
    CHECK(share >= 0.9);
  }
}

TEST_CASE("gemm: this machine's providers, the current one and its name") {
  const sm::gemm_environment env = sm::detect_gemm_environment();
  CHECK(env.onednn == sm::gemm_compiled(sm::gemm_provider::onednn));
  CHECK(env.openblas == sm::gemm_compiled(sm::gemm_provider::openblas));
  CHECK(env.openblas == !env.openblas_core.empty());
  CHECK(env.onednn == !env.onednn_isa.empty());
  // unit_model is compiled with STRATA_GEMM_EIGEN=1, so every provider is compared here.
  CHECK(sm::gemm_compiled(sm::gemm_provider::eigen));
  CHECK(env.eigen);
  const auto providers = sm::available_gemm_providers();
  REQUIRE_FALSE(providers.empty());
  CHECK(providers.back() == sm::gemm_provider::eigen);
  for (const sm::gemm_provider p : providers) {
    const sm::gemm_scope use(p);
    CHECK(sm::current_gemm() == p);
    CHECK(sm::blas_backend().starts_with(std::string(sm::to_string(p)) + " ("));
    CHECK(sm::measure_gemm(p, 32, 16, 24, std::chrono::milliseconds(1)) > 0.0);
  }
  if (!sm::gemm_compiled(sm::gemm_provider::onednn)) {
    CHECK_THROWS_AS(sm::use_gemm(sm::gemm_provider::onednn), std::invalid_argument);
  }
  // select_gemm makes the decision current.
  const sm::gemm_decision d = sm::select_gemm(std::nullopt);
  CHECK(sm::current_gemm() == d.provider);
  CHECK(d == sm::decide_gemm(std::nullopt, env));
}
