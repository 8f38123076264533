// SPDX-License-Identifier: Apache-2.0
#pragma once

// Finite-difference checks of a layer's backward, for any type satisfying strata::model::layer
// (reached only through layer_traits, as containers reach it).
//
//   const auto result = strata::model::testing::check_gradients(
//       strata::model::linear{.in = 5, .out = 3},
//       {.batch = 2, .in_shape = {.channels = 1, .height = 1, .width = 5}});
//   CHECK_MESSAGE(result.passed(), result.report());
//
// With random inputs x, parameters p and upstream weights r (from config.seed), the scalar is
// L(x, p) = sum_i y_i r_i over the forward output y, so backward runs with grad_output = r and
// must give dL/dx in grad_input and dL/dp added into grads. Each probed derivative is compared
// with the central difference (L(v + h) - L(v - h)) / (2h), L summed in double, h the float step
// actually taken, as |analytic - numeric| <= absolute_tolerance + relative_tolerance *
// max(|analytic|, |numeric|). Besides the derivatives it checks the rest of the contract:
//   - forward writes all of output (pre-filled with NaN) and is bit-for-bit repeatable;
//   - backward writes all of grad_input (pre-filled with NaN) and ADDS into grads (pre-filled
//     with config.grad_prefill; a second backward must add the same amount again);
//   - backward accepts an empty grad_input and then gives the same parameter gradients;
//   - a layer that declares writes_grads writes, over NaN, what it adds into zeros.
// Forward runs again before every backward, with the same args, so a backward that consumes its
// workspace is not penalised. The whole check runs once on every GEMM provider of the build
// (model/gemm.hpp: oneDNN, OpenBLAS, Eigen), each problem prefixed with the provider's name; probes
// counts one run's derivatives, mismatches the most of any provider. Layers with kinks (relu at 0,
// max-pool ties) need inputs away from them: set input_min_magnitude, or pass the input explicitly.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/gemm.hpp"

namespace strata::model::testing {

struct gradient_check_config {
  std::size_t batch = 2;
  sample_shape in_shape{};
  std::uint64_t seed = 1;            // inputs, parameters and upstream weights
  float input_range = 1.0f;          // random inputs in [-input_range, input_range] ...
  float input_min_magnitude = 0.0f;  // ... with |x| at least this (keeps them off kinks at 0)
  float param_range = 1.0f;          // random parameters in [-param_range, param_range]
  std::vector<float> input{};        // if not empty: the input (batch x in elements)
  std::vector<float> params{};       // if not empty: the parameters (parameters() layout)
  double epsilon = 1e-3;             // the finite-difference step
  double relative_tolerance = 1e-2;
  double absolute_tolerance = 1e-3;
  std::size_t max_probes = 0;  // per tensor (input, each parameter), evenly spaced; 0: all
  float grad_prefill = 0.5f;   // what grads hold before backward (checks that it adds)
  bool training = true;
  layer_rng_key rng{.seed = 11, .step = 3, .layer = 2};

  friend bool operator==(const gradient_check_config&, const gradient_check_config&) = default;
};

inline std::string to_string(const gradient_check_config& c) {
  return "gradient_check_config{.batch = " + std::to_string(c.batch) +
         ", .in_shape = " + strata::to_string(c.in_shape) + ", .seed = " + std::to_string(c.seed) +
         ", .epsilon = " + std::to_string(c.epsilon) + "}";
}

struct gradient_check_result {
  std::size_t probes = 0;      // derivatives compared
  std::size_t mismatches = 0;  // of those, outside the tolerance
  double worst = 0.0;          // largest |analytic - numeric| / allowed; at most 1 when all match
  std::vector<std::string> problems{};  // the first few mismatches and contract violations

  bool passed() const { return problems.empty(); }

  std::string report() const {
    std::string text = std::to_string(probes) + " derivatives probed, " +
                       std::to_string(mismatches) + " mismatched, worst error / allowed " +
                       std::to_string(worst);
    for (const std::string& p : problems) {
      text += "\n  " + p;
    }
    return text;
  }
};

namespace detail {

inline constexpr std::size_t max_problems = 12;

inline void note(gradient_check_result& result, std::string problem) {
  if (result.problems.size() < max_problems) {
    result.problems.push_back(std::move(problem));
  }
}

inline void fill_uniform(std::span<float> values, rng_stream rng, float range,
                         float min_magnitude) {
  for (float& v : values) {
    const float magnitude = rng.uniform(min_magnitude, range);
    v = rng.uniform_float() < 0.5f ? -magnitude : magnitude;
  }
}

inline std::vector<std::size_t> probe_indices(std::size_t n, std::size_t max_probes) {
  std::vector<std::size_t> indices;
  if (max_probes == 0 || n <= max_probes) {
    for (std::size_t i = 0; i < n; ++i) {
      indices.push_back(i);
    }
  } else {
    for (std::size_t k = 0; k < max_probes; ++k) {
      indices.push_back(k * n / max_probes);
    }
  }
  return indices;
}

inline std::string describe(const char* tensor, std::size_t index) {
  return std::string(tensor) + "[" + std::to_string(index) + "]";
}

}  // namespace detail

namespace detail {

template <layer L>
gradient_check_result check_gradients_once(const L& l, const gradient_check_config& config) {
  using traits = layer_traits<L>;
  gradient_check_result result{};

  const sample_shape in_shape = config.in_shape;
  const sample_shape out_shape = traits::output_shape(l, in_shape);
  const std::vector<param_spec> specs = traits::parameters(l, in_shape);
  const std::size_t batch = config.batch;
  const std::size_t in_size = batch * in_shape.elements();
  const std::size_t out_size = batch * out_shape.elements();
  std::size_t param_size = 0;
  for (const param_spec& s : specs) {
    param_size += s.elements();
  }
  const std::size_t workspace_size = traits::workspace_elements(l, in_shape, batch);

  std::vector<float> input(in_size);
  std::vector<float> params(param_size);
  std::vector<float> upstream(out_size);
  if (config.input.empty()) {
    detail::fill_uniform(input, rng_stream::for_sample(config.seed, 0, 0, 0), config.input_range,
                         config.input_min_magnitude);
  } else if (config.input.size() == in_size) {
    input = config.input;
  } else {
    detail::note(result, "config.input holds " + std::to_string(config.input.size()) +
                             " floats, expected " + std::to_string(in_size));
    return result;
  }
  if (config.params.empty()) {
    detail::fill_uniform(params, rng_stream::for_sample(config.seed, 0, 1, 0), config.param_range,
                         0.0f);
  } else if (config.params.size() == param_size) {
    params = config.params;
  } else {
    detail::note(result, "config.params holds " + std::to_string(config.params.size()) +
                             " floats, expected " + std::to_string(param_size));
    return result;
  }
  detail::fill_uniform(upstream, rng_stream::for_sample(config.seed, 0, 2, 0), 1.0f, 0.0f);

  constexpr float unwritten = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> output(out_size);
  std::vector<float> workspace(workspace_size);

  const auto run_forward = [&](std::span<float> out) {
    traits::forward(l, forward_args{.batch = batch,
                                    .in_shape = in_shape,
                                    .out_shape = out_shape,
                                    .input = input,
                                    .output = out,
                                    .params = params,
                                    .workspace = workspace,
                                    .training = config.training,
                                    .rng = config.rng,
                                    .sample_ids = {}});
  };
  const auto loss = [&]() {
    run_forward(output);
    double sum = 0.0;
    for (std::size_t i = 0; i < out_size; ++i) {
      sum += static_cast<double>(output[i]) * static_cast<double>(upstream[i]);
    }
    return sum;
  };
  // Forward, then backward into the given buffers.
  const auto run_backward = [&](std::span<float> grad_input, std::span<float> grads,
                                bool write = false) {
    run_forward(output);
    traits::backward(l, backward_args{.batch = batch,
                                      .in_shape = in_shape,
                                      .out_shape = out_shape,
                                      .input = input,
                                      .output = output,
                                      .grad_output = upstream,
                                      .grad_input = grad_input,
                                      .params = params,
                                      .grads = grads,
                                      .workspace = workspace,
                                      .write_grads = write});
  };

  // Forward writes everything, deterministically.
  std::fill(output.begin(), output.end(), unwritten);
  run_forward(output);
  std::vector<float> again(out_size, -7.0f);
  run_forward(again);
  for (std::size_t i = 0; i < out_size; ++i) {
    if (std::isnan(output[i])) {
      detail::note(result, "forward left " + detail::describe("output", i) + " unwritten (NaN)");
    } else if (std::bit_cast<std::uint32_t>(output[i]) != std::bit_cast<std::uint32_t>(again[i])) {
      detail::note(result, "forward is not repeatable at " + detail::describe("output", i) + ": " +
                               std::to_string(output[i]) + " then " + std::to_string(again[i]));
    }
  }

  // Backward: grad_input written, grads added to (twice), grad_input optional.
  std::vector<float> grad_input(in_size, unwritten);
  std::vector<float> grads(param_size, config.grad_prefill);
  run_backward(grad_input, grads);
  std::vector<float> param_grad(param_size);
  for (std::size_t i = 0; i < param_size; ++i) {
    param_grad[i] = grads[i] - config.grad_prefill;
  }
  std::vector<float> twice = grads;
  std::vector<float> second_grad_input(in_size, unwritten);
  run_backward(second_grad_input, twice);
  for (std::size_t i = 0; i < param_size; ++i) {
    const double added = static_cast<double>(twice[i]) - grads[i];
    const double allowed = 1e-5 * (std::abs(config.grad_prefill) + 2.0 * std::abs(param_grad[i]));
    if (!(std::abs(added - param_grad[i]) <= allowed)) {
      detail::note(result, "backward does not add into grads: a second backward changed " +
                               detail::describe("grads", i) + " by " + std::to_string(added) +
                               ", the first by " + std::to_string(param_grad[i]));
    }
  }
  std::vector<float> without_input(param_size, config.grad_prefill);
  run_backward({}, without_input);
  for (std::size_t i = 0; i < param_size; ++i) {
    const double allowed = 1e-6 * (std::abs(config.grad_prefill) + std::abs(param_grad[i]));
    if (!(std::abs(static_cast<double>(without_input[i]) - grads[i]) <= allowed)) {
      detail::note(result, "backward with an empty grad_input gives " +
                               detail::describe("grads", i) + " = " +
                               std::to_string(without_input[i]) + ", with one " +
                               std::to_string(grads[i]));
    }
  }

  // Requirement 8: a layer that writes its gradients when asked gives, over NaN, the values it
  // adds into zeros: the same bits, but for the sign of a zero (a product whose terms are all
  // zero may be -0 written, and is +0 added to +0).
  if constexpr (strata::model::layer_writes_grads<L>()) {
    std::vector<float> added(param_size, 0.0f);
    run_backward(second_grad_input, added);
    std::vector<float> written(param_size, unwritten);
    run_backward(second_grad_input, written, true);
    for (std::size_t i = 0; i < param_size; ++i) {
      const bool zeros = written[i] == 0.0f && added[i] == 0.0f;
      if (!zeros &&
          std::bit_cast<std::uint32_t>(written[i]) != std::bit_cast<std::uint32_t>(added[i])) {
        detail::note(result, "backward with write_grads gives " + detail::describe("grads", i) +
                                 " = " + std::to_string(written[i]) + ", added into zeros " +
                                 std::to_string(added[i]));
      }
    }
  }

  // Central differences.
  const auto compare = [&](float* value, float analytic, const std::string& name) {
    const float original = *value;
    const auto step = static_cast<float>(config.epsilon);
    const float up = original + step;
    const float down = original - step;
    *value = up;
    const double loss_up = loss();
    *value = down;
    const double loss_down = loss();
    *value = original;
    const double numeric =
        (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
    const double error = std::abs(static_cast<double>(analytic) - numeric);
    const double allowed = config.absolute_tolerance +
                           config.relative_tolerance *
                               std::max(std::abs(static_cast<double>(analytic)), std::abs(numeric));
    ++result.probes;
    const double ratio = error / allowed;
    if (!(ratio <= 1.0)) {
      ++result.mismatches;
      detail::note(result, name + ": backward " + std::to_string(analytic) +
                               ", central difference " + std::to_string(numeric));
    }
    if (!(ratio <= result.worst)) {
      result.worst = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
    }
  };

  for (const std::size_t i : detail::probe_indices(in_size, config.max_probes)) {
    compare(&input[i], grad_input[i], detail::describe("grad_input", i));
  }
  std::size_t offset = 0;
  for (const param_spec& spec : specs) {
    for (const std::size_t i : detail::probe_indices(spec.elements(), config.max_probes)) {
      compare(&params[offset + i], param_grad[offset + i], detail::describe(spec.name.c_str(), i));
    }
    offset += spec.elements();
  }
  return result;
}

}  // namespace detail

template <layer L>
gradient_check_result check_gradients(const L& l, const gradient_check_config& config) {
  gradient_check_result all{};
  for (const gemm_provider p : available_gemm_providers()) {
    const gemm_scope use(p);
    const gradient_check_result one = detail::check_gradients_once(l, config);
    all.probes = one.probes;  // the same derivatives on every provider
    all.mismatches = std::max(all.mismatches, one.mismatches);
    all.worst = std::max(all.worst, one.worst);
    for (const std::string& problem : one.problems) {
      detail::note(all, std::string("[") + to_string(p) + "] " + problem);
    }
  }
  return all;
}

}  // namespace strata::model::testing
