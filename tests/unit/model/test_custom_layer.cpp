// SPDX-License-Identifier: Apache-2.0
// A user's own layers over the user's own kernels, as docs/model.md shows them: one without
// parameters, one with a parameter, and a type that cannot be changed joining through the traits.
// Each is gradient-checked alone and inside a sequential with linear layers, and trained.
#include "strata/model/concepts.hpp"
#include "strata/model/gemm.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"
#include "unit/model/gradient_check.hpp"

namespace sm = strata::model;

namespace {

// snippet-begin: layer
// The user's kernels: plain functions over raw arrays (they could as well launch a GPU kernel
// or call another library). y = tanh(alpha x); dy/dx = alpha (1 - y^2).
void scaled_tanh_forward(const float* in, float* out, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = std::tanh(alpha * in[i]);
  }
}
void scaled_tanh_backward(const float* out, const float* grad_out, float* grad_in, std::size_t n,
                          float alpha) {
  for (std::size_t i = 0; i < n; ++i) {
    grad_in[i] = grad_out[i] * alpha * (1.0f - out[i] * out[i]);
  }
}

// The layer around them: no parameters, no saved state (backward reads forward's output).
struct scaled_tanh {
  using layer_category = strata::model::layer_tag;  // 1. opt in

  float alpha = 1.0f;

  // 2. the output shape for an input shape; numbers it cannot take throw, in words
  strata::sample_shape output_shape(const strata::sample_shape& in) const {
    if (!(alpha > 0.0f)) {
      throw std::invalid_argument("scaled_tanh: alpha must be > 0, got " + std::to_string(alpha));
    }
    return in;
  }

  // 3. forward writes all of args.output (batch x elements, one flat array)
  void forward(const strata::model::forward_args& args) const {
    scaled_tanh_forward(args.input.data(), args.output.data(), args.input.size(), alpha);
  }

  // 4. backward writes args.grad_input unless it is empty; with no parameters nothing is added
  void backward(const strata::model::backward_args& args) const {
    if (args.grad_input.empty()) {
      return;
    }
    scaled_tanh_backward(args.output.data(), args.grad_output.data(), args.grad_input.data(),
                         args.grad_input.size(), alpha);
  }

  friend bool operator==(const scaled_tanh&, const scaled_tanh&) = default;
};

std::string to_string(const scaled_tanh& l) {
  return "scaled_tanh{.alpha = " + std::to_string(l.alpha) + "}";
}

static_assert(strata::model::check_layer<scaled_tanh>());
// snippet-end: layer

// snippet-begin: parameter_layer
// The user's kernels for y[r][f] = gain[f] * x[r][f] over `rows` samples of `features` values.
void scale_forward(const float* x, const float* gain, float* y, std::size_t rows,
                   std::size_t features) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t f = 0; f < features; ++f) {
      y[r * features + f] = gain[f] * x[r * features + f];
    }
  }
}
// Adds dL/dgain into grad_gain; writes dL/dx into grad_x unless it is null.
void scale_backward(const float* x, const float* gain, const float* grad_y, float* grad_x,
                    float* grad_gain, std::size_t rows, std::size_t features) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t f = 0; f < features; ++f) {
      const std::size_t i = r * features + f;
      grad_gain[f] += grad_y[i] * x[i];
      if (grad_x != nullptr) {
        grad_x[i] = grad_y[i] * gain[f];
      }
    }
  }
}

// A learned gain per feature: one parameter tensor, "gain".
struct scale {
  using layer_category = strata::model::layer_tag;

  std::size_t features = 0;  // must equal the input's elements()

  strata::sample_shape output_shape(const strata::sample_shape& in) const {
    if (features == 0 || in.elements() != features) {
      throw std::invalid_argument("scale: features is " + std::to_string(features) +
                                  ", the input " + strata::to_string(in) + " has " +
                                  std::to_string(in.elements()) + " elements");
    }
    return in;
  }

  // 5. the parameters, in the order they lie in args.params and args.grads
  std::vector<strata::model::param_spec> parameters(const strata::sample_shape&) const {
    return {{.name = "gain",
             .rows = 1,
             .cols = features,
             .init = strata::model::init_kind::ones,
             .fan_in = features,
             .fan_out = features,
             .weight_decay = false}};
  }

  // 7. the cost of one sample: a multiply per element forward, three backward
  strata::model::layer_cost cost(const strata::sample_shape& in) const {
    const auto n = static_cast<double>(in.elements());
    return {.forward_flops = n,
            .backward_flops = 3.0 * n,
            .activation_bytes = in.elements() * sizeof(float)};
  }

  void forward(const strata::model::forward_args& args) const {
    scale_forward(args.input.data(), args.params.data(), args.output.data(), args.batch, features);
  }

  // ADD into args.grads (micro-batches accumulate); grad_input only when it is wanted.
  void backward(const strata::model::backward_args& args) const {
    float* grad_x = args.grad_input.empty() ? nullptr : args.grad_input.data();
    scale_backward(args.input.data(), args.params.data(), args.grad_output.data(), grad_x,
                   args.grads.data(), args.batch, features);
  }

  friend bool operator==(const scale&, const scale&) = default;
};

std::string to_string(const scale& l) {
  return "scale{.features = " + std::to_string(l.features) + "}";
}

static_assert(strata::model::check_layer<scale>());
// snippet-end: parameter_layer

// scale that bounds its gradients (requirement 11): gain_f moves by a sum over the batch of
// dy x, so by at most batch max|dy| max|x| (twice that for the sums' rounding); infinity when
// either holds an inf or a NaN.
struct bounded_scale : scale {
  void backward(const strata::model::backward_args& args) const {
    scale::backward(args);
    if (args.grad_bound == nullptr) {
      return;
    }
    const auto largest = [](std::span<const float> v) {
      double m = 0.0;
      for (const float f : v) {
        m = std::isfinite(f) ? std::max(m, static_cast<double>(std::abs(f)))
                             : std::numeric_limits<double>::infinity();
      }
      return m;
    };
    *args.grad_bound =
        2.0 * static_cast<double>(args.batch) * largest(args.grad_output) * largest(args.input);
  }
};
static_assert(strata::model::check_layer<bounded_scale>());

}  // namespace

// snippet-begin: traits
// A type from elsewhere that cannot be changed: its own names, its own integer type, no tag.
// y = limit x / (limit + |x|), which approaches +-limit smoothly.
namespace legacy {
struct soft_clip {
  float limit = 1.0f;

  void apply(const float* x, float* y, long n) const {
    for (long i = 0; i < n; ++i) {
      y[i] = limit * x[i] / (limit + std::abs(x[i]));
    }
  }
  void apply_gradient(const float* x, const float* dy, float* dx, long n) const {
    for (long i = 0; i < n; ++i) {
      const float d = limit + std::abs(x[i]);
      dx[i] = dy[i] * limit * limit / (d * d);
    }
  }
};
}  // namespace legacy

// It opts in here instead of with a tag ...
template <>
inline constexpr bool strata::model::enable_layer<legacy::soft_clip> = true;

// ... and the traits adapt it (names inside are looked up in strata::model). A specialization
// replaces the primary template, so it also states the members the primary would have
// defaulted: parameters, workspace_elements and cost.
template <>
struct strata::model::layer_traits<legacy::soft_clip> {
  static sample_shape output_shape(const legacy::soft_clip& l, const sample_shape& in) {
    if (!(l.limit > 0.0f)) {
      throw std::invalid_argument("soft_clip: limit must be > 0, got " + std::to_string(l.limit));
    }
    return in;
  }
  static void forward(const legacy::soft_clip& l, const forward_args& args) {
    l.apply(args.input.data(), args.output.data(), static_cast<long>(args.input.size()));
  }
  static void backward(const legacy::soft_clip& l, const backward_args& args) {
    if (!args.grad_input.empty()) {
      l.apply_gradient(args.input.data(), args.grad_output.data(), args.grad_input.data(),
                       static_cast<long>(args.input.size()));
    }
  }
  static std::vector<param_spec> parameters(const legacy::soft_clip&, const sample_shape&) {
    return {};
  }
  static std::size_t workspace_elements(const legacy::soft_clip&, const sample_shape&,
                                        std::size_t) {
    return 0;
  }
  static layer_cost cost(const legacy::soft_clip&, const sample_shape& in) {
    const auto n = static_cast<double>(in.elements());
    return {.forward_flops = 4.0 * n,
            .backward_flops = 6.0 * n,
            .activation_bytes = in.elements() * sizeof(float)};
  }
};

static_assert(strata::model::check_layer<legacy::soft_clip>());
// snippet-end: traits

namespace {

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace st = strata::train;
using sm::testing::check_gradients;

constexpr strata::sample_shape features8{.channels = 1, .height = 1, .width = 8};

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  strata::rng_stream rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    x = rng.uniform(-1.0f, 1.0f);
  }
  return v;
}

// The largest |analytic - numeric| / allowed over every parameter of `model` (at most 1 when
// all agree), for L = sum(output * weights) on a random batch: model.backward's parameter
// gradients against central differences. The parameters in front of a layer see its grad_input.
template <class Model>
double model_gradient_error(const Model& model, std::uint64_t seed) {
  constexpr std::size_t batch = 3;
  auto params = model.make_params();
  params.initialize(seed);
  auto work = model.make_workspace(batch);
  const auto input = random_floats(batch * model.input_shape().elements(), seed + 1);
  const auto weights = random_floats(batch * model.output_shape().elements(), seed + 2);
  const auto objective = [&]() {
    const auto out = model.forward(work, params, input, batch, {.training = false});
    double sum = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      sum += static_cast<double>(out[i]) * weights[i];
    }
    return sum;
  };
  params.zero_grads();
  model.forward(work, params, input, batch, {.training = false});
  model.backward(work, params, weights);
  const std::vector<float> analytic(params.grads().begin(), params.grads().end());
  double worst = 0.0;
  const float eps = 1e-2f;
  for (const sm::param_entry& e : params.entries()) {
    for (std::size_t i = 0; i < e.spec.elements(); ++i) {
      float& p = params.values()[e.offset + i];
      const float saved = p;
      p = saved + eps;
      const double up = objective();
      p = saved - eps;
      const double down = objective();
      p = saved;
      const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
      const double a = analytic[e.offset + i];
      const double allowed = 2e-3 + 2e-2 * std::max(std::abs(a), std::abs(numeric));
      worst = std::max(worst, std::abs(a - numeric) / allowed);
    }
  }
  return worst;
}

// Four Gaussian blobs in 8 dimensions, one per class; sample i is fixed by i.
struct blobs {
  using dataset_category = sd::dataset_tag;

  std::size_t n = 512;
  std::uint64_t salt = 0;

  std::size_t size() const { return n; }
  strata::sample_shape shape() const { return features8; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 4);
    strata::rng_stream rng = strata::rng_stream::for_sample(7 + salt, 0, i);
    for (std::size_t e = 0; e < 8; ++e) {
      const float centre = (e % 4 == static_cast<std::size_t>(label)) ? 2.0f : 0.0f;
      out[e] = centre + 0.7f * rng.normal_float();
    }
    return label;
  }
};

}  // namespace

TEST_CASE("a parameter-free layer over the user's kernel: shape, values, gradients") {
  const scaled_tanh layer{.alpha = 1.5f};
  CHECK(layer.output_shape(features8) == features8);
  CHECK(to_string(layer) == "scaled_tanh{.alpha = 1.500000}");
  CHECK(sm::layer_traits<scaled_tanh>::parameters(layer, features8).empty());
  CHECK(sm::layer_traits<scaled_tanh>::workspace_elements(layer, features8, 4) == 0);
  CHECK(sm::layer_traits<scaled_tanh>::cost(layer, features8).activation_bytes == 8 * 4);
  CHECK_THROWS_WITH_AS(scaled_tanh{.alpha = 0.0f}.output_shape(features8),
                       doctest::Contains("scaled_tanh: alpha must be > 0"), std::invalid_argument);

  const std::vector<float> in{-2.0f, -0.5f, 0.0f, 1.0f};
  std::vector<float> out(4);
  layer.forward({.batch = 1,
                 .in_shape = {1, 1, 4},
                 .out_shape = {1, 1, 4},
                 .input = in,
                 .output = out,
                 .params = {},
                 .workspace = {},
                 .training = true,
                 .rng = {},
                 .sample_ids = {}});
  for (std::size_t i = 0; i < in.size(); ++i) {
    CHECK(out[i] == doctest::Approx(std::tanh(1.5 * in[i])));
  }

  const auto result = check_gradients(layer, {.batch = 3, .in_shape = {2, 3, 4}});
  CHECK_MESSAGE(result.passed(), result.report());
  CHECK(result.probes == 3 * 24);

  const auto model = sm::sequential(features8, sm::linear{.in = 8, .out = 6}, layer,
                                    sm::linear{.in = 6, .out = 3});
  CHECK(model.output_shape() == strata::sample_shape{1, 1, 3});
  CHECK(model_gradient_error(model, 21) <= 1.0);
}

// A user's layer whose products go through strata's GEMM seam (model/gemm.hpp), so that they
// run on whichever provider the process chose: y = x P for a square P without bias, and a
// variant whose backward forgets the transpose of dx = dy P^T.
template <bool Correct>
struct gemm_projection {
  using layer_category = strata::model::layer_tag;

  std::size_t features = 0;

  strata::sample_shape output_shape(const strata::sample_shape& in) const {
    if (features == 0 || in.elements() != features) {
      throw std::invalid_argument("gemm_projection: features must equal the input's elements");
    }
    return {.channels = 1, .height = 1, .width = features};
  }

  std::vector<strata::model::param_spec> parameters(const strata::sample_shape&) const {
    return {{.name = "p",
             .rows = features,
             .cols = features,
             .init = strata::model::init_kind::kaiming_uniform,
             .fan_in = features,
             .fan_out = features,
             .weight_decay = true}};
  }

  void forward(const strata::model::forward_args& args) const {
    const std::size_t f = features;
    strata::model::gemm({}, args.batch, f, f, 1.0f, args.input.data(), f, args.params.data(), f,
                        0.0f, args.output.data(), f);
  }

  void backward(const strata::model::backward_args& args) const {
    const std::size_t f = features;
    // dP += x^T dy
    strata::model::gemm({.transpose_a = true}, f, f, args.batch, 1.0f, args.input.data(), f,
                        args.grad_output.data(), f, 1.0f, args.grads.data(), f);
    if (!args.grad_input.empty()) {
      strata::model::gemm({.transpose_b = Correct}, args.batch, f, f, 1.0f, args.grad_output.data(),
                          f, args.params.data(), f, 0.0f, args.grad_input.data(), f);
    }
  }

  friend bool operator==(const gemm_projection&, const gemm_projection&) = default;
};

TEST_CASE("a user's layer on strata's GEMM seam passes the gradient check on every provider") {
  const auto good =
      check_gradients(gemm_projection<true>{.features = 5}, {.batch = 3, .in_shape = {1, 1, 5}});
  CHECK_MESSAGE(good.passed(), good.report());
  CHECK(good.probes == 3 * 5 + 5 * 5);
  // The wrong backward fails on every provider, each named in the report.
  const auto bad = check_gradients(gemm_projection<false>{.features = 5},
                                   {.batch = 3, .in_shape = {1, 1, 5}, .max_probes = 2});
  CHECK_FALSE(bad.passed());
  for (const strata::model::gemm_provider p : strata::model::available_gemm_providers()) {
    CHECK(bad.report().find(std::string("[") + to_string(p) + "] grad_input") != std::string::npos);
  }
}

TEST_CASE("a layer with a parameter: spec, initialisation, gradients added") {
  const scale layer{.features = 6};
  const auto specs = sm::layer_traits<scale>::parameters(layer, {1, 1, 6});
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].name == "gain");
  CHECK(specs[0].elements() == 6);
  CHECK_FALSE(specs[0].weight_decay);
  CHECK(sm::layer_traits<scale>::cost(layer, {1, 1, 6}).backward_flops == 18.0);
  CHECK(to_string(layer) == "scale{.features = 6}");
  CHECK(layer.output_shape({2, 1, 3}) == strata::sample_shape{2, 1, 3});
  CHECK_THROWS_WITH_AS(layer.output_shape(features8),
                       doctest::Contains("scale: features is 6, the input 1x1x8 has 8 elements"),
                       std::invalid_argument);

  // check_gradients pre-fills the gradients, so a backward that overwrote them would fail.
  const auto result = check_gradients(layer, {.batch = 4, .in_shape = {1, 1, 6}});
  CHECK_MESSAGE(result.passed(), result.report());
  CHECK(result.probes == 4 * 6 + 6);

  const auto model = sm::sequential(features8, sm::linear{.in = 8, .out = 6}, layer,
                                    sm::linear{.in = 6, .out = 3});
  auto params = model.make_params();
  params.initialize(5);
  CHECK(params.entry("1.gain").spec == specs[0]);
  for (const float g : params.value("1.gain")) {
    CHECK(g == 1.0f);  // init_kind::ones
  }
  CHECK(model.total_cost().forward_flops == doctest::Approx(2.0 * 8 * 6 + 6 + 2.0 * 6 * 3));
  CHECK(model_gradient_error(model, 22) <= 1.0);
  // A layer that says nothing of its gradients leaves the store's bound unknown; one that
  // bounds them (bounded_scale) lets the bound through, and the gradients are within it.
  const auto bounded =
      sm::sequential(features8, sm::linear{.in = 8, .out = 6}, bounded_scale{{.features = 6}},
                     sm::linear{.in = 6, .out = 3});
  for (const bool bounds : {false, true}) {
    const std::string which = bounds ? "bounded_scale" : "scale";
    INFO(which);
    auto p = bounds ? bounded.make_params() : model.make_params();
    p.initialize(5);
    const std::size_t batch = 4;
    strata::rng_stream rng(8);
    std::vector<float> x(batch * 8);
    std::vector<float> dy(batch * 3);
    for (float& v : x) {
      v = rng.uniform(-1.0f, 1.0f);
    }
    for (float& v : dy) {
      v = rng.uniform(-1.0f, 1.0f);
    }
    const auto backward = [&](const auto& m) {
      auto w = m.make_workspace(batch);
      p.discard_grads();
      (void)m.forward(w, p, x, batch, {.training = true});
      m.backward(w, p, dy);
    };
    if (bounds) {
      backward(bounded);
    } else {
      backward(model);
    }
    CHECK(p.grads_certainly_finite() == bounds);
    for (const float g : std::as_const(p).grads()) {
      CHECK(std::abs(g) <= p.grad_bound());
    }
  }
}

TEST_CASE("a type that cannot be changed joins through enable_layer and layer_traits") {
  static_assert(sm::layer<legacy::soft_clip>);
  static_assert(!sm::declares_layer_tag<legacy::soft_clip>);
  const legacy::soft_clip clip{.limit = 2.0f};
  using traits = sm::layer_traits<legacy::soft_clip>;
  CHECK(traits::output_shape(clip, features8) == features8);
  CHECK_THROWS_WITH_AS(traits::output_shape(legacy::soft_clip{.limit = -1.0f}, features8),
                       doctest::Contains("soft_clip: limit must be > 0"), std::invalid_argument);

  const auto result =
      check_gradients(clip, {.batch = 3, .in_shape = features8, .input_range = 4.0f});
  CHECK_MESSAGE(result.passed(), result.report());
  CHECK(result.probes == 3 * 8);

  const auto model =
      sm::sequential(features8, sm::linear{.in = 8, .out = 6}, clip, sm::linear{.in = 6, .out = 3});
  CHECK(model.costs()[1] == traits::cost(clip, {1, 1, 6}));
  CHECK(model_gradient_error(model, 23) <= 1.0);
}

TEST_CASE("the three user layers train with the trainer") {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "custom_layer" / "train";
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.epochs = 3;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.warmup_epochs = 0.5;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "checkpoints").string();
  cfg.resume = strata::config::resume_mode::never;

  const auto model = sm::sequential(
      features8, sm::linear{.in = 8, .out = 16}, scaled_tanh{.alpha = 1.0f}, scale{.features = 16},
      legacy::soft_clip{.limit = 2.0f}, sm::linear{.in = 16, .out = 4});
  st::trainer run(model, cfg, {.print_progress = false});
  std::vector<double> losses;
  run.on_step([&](const st::step_metrics& m) { losses.push_back(m.loss); });
  const auto summary =
      run.fit(blobs{.n = 512}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});

  REQUIRE(losses.size() == 3 * 16);
  double first = 0.0;
  double last = 0.0;
  for (std::size_t i = 0; i < 8; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  CHECK(last < 0.5 * first);
  CHECK(summary.test_accuracy > 0.9);
  // The gain was trained: it no longer holds its initial ones.
  bool moved = false;
  for (const float g : std::as_const(run.params()).value("2.gain")) {
    moved = moved || std::abs(g - 1.0f) > 1e-3f;
  }
  CHECK(moved);
}
