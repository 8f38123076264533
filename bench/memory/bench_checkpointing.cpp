// SPDX-License-Identifier: Apache-2.0
// What does activation checkpointing save and cost? A 16-layer MLP (16 x (linear width x
// width, relu), then a linear to 10 classes: 33 sequential layers) at batch 256: the
// activation memory of the workspace and the time of one forward + backward, for segments of
// k sequential layers against keeping everything (k = 0, the baseline, measured in the same
// run). Segments of 4 MLP layers are k = 8 (each MLP layer is a linear and a relu).
//
//   build/bench/bench_checkpointing [--width 512] [--batch 256] [--steps 10] [--json FILE]
//
// The #wrong column counts gradient elements that differ in any bit from the baseline's.
// Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"

#include "strata/core/rng.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"

namespace sm = strata::model;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::size_t width = 512;
  std::size_t batch = 256;
  std::size_t steps = 10;
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_checkpointing"); };
    if (a == "--width") {
      o.width = std::stoul(value());
    } else if (a == "--batch") {
      o.batch = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_checkpointing [--width N] [--batch N] [--steps N] "
                   "[--json FILE]\n");
      std::exit(2);
    }
  }
  return o;
}

template <std::size_t... I>
auto make_mlp(std::size_t width, std::index_sequence<I...>) {
  // Each MLP layer: a linear and a relu, expanded 16 times.
  auto block = [&](std::size_t) {
    return std::tuple(sm::linear{.in = width, .out = width}, sm::relu{});
  };
  return std::apply(
      [&](auto... layers) {
        return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = width},
                              layers..., sm::linear{.in = width, .out = 10});
      },
      std::tuple_cat(block(I)...));
}

struct result {
  std::size_t activation_floats = 0;
  double step_seconds = 0.0;
  std::vector<float> grads;
};

template <class Model>
result run(const Model& model, const options& o, std::size_t k, const std::vector<float>& input,
           const std::vector<float>& grad_out) {
  auto params = model.make_params();
  params.initialize(1);
  auto w = model.make_workspace(o.batch, {.checkpoint_every = k});
  result r;
  r.activation_floats = w.activation_floats();
  std::vector<double> times;
  for (std::size_t s = 0; s < o.steps + 2; ++s) {
    params.zero_grads();
    const auto begin = clock_type::now();
    model.forward(w, params, input, o.batch, {.training = true, .seed = 1, .step = 0});
    model.backward(w, params, grad_out);
    if (s >= 2) {
      times.push_back(std::chrono::duration<double>(clock_type::now() - begin).count());
    }
  }
  std::sort(times.begin(), times.end());
  r.step_seconds = times[times.size() / 2];
  r.grads.assign(params.grads().begin(), params.grads().end());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const auto model = make_mlp(o.width, std::make_index_sequence<16>{});
  strata::rng_stream rng(3);
  std::vector<float> input(o.batch * o.width);
  for (float& x : input) {
    x = rng.uniform(-1.0f, 1.0f);
  }
  std::vector<float> grad_out(o.batch * 10);
  for (float& x : grad_out) {
    x = rng.uniform(-0.1f, 0.1f);
  }
  const result base = run(model, o, 0, input, grad_out);
  std::printf("# 16-layer MLP, width %zu, batch %zu, %zu sequential layers; median of %zu steps\n",
              o.width, o.batch, model.layer_count, o.steps);
  std::printf("# baseline: k = 0 (every activation kept), %.1f MiB, %.2f ms per step\n",
              static_cast<double>(base.activation_floats) * 4.0 / (1 << 20),
              base.step_seconds * 1e3);
  std::printf("%4s %14s %11s %12s %11s %7s\n", "k", "activ(MiB)", "saved", "step(ms)", "time",
              "#wrong");
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k : {0u, 2u, 4u, 8u, 16u}) {
    const result r = k == 0 ? base : run(model, o, k, input, grad_out);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < r.grads.size(); ++i) {
      wrong += r.grads[i] != base.grads[i] ? 1 : 0;
    }
    const double saved = 1.0 - static_cast<double>(r.activation_floats) /
                                   static_cast<double>(base.activation_floats);
    const double more_time = r.step_seconds / base.step_seconds - 1.0;
    std::printf("%4zu %14.1f %10.1f%% %12.2f %+10.1f%% %7zu\n", k,
                static_cast<double>(r.activation_floats) * 4.0 / (1 << 20), saved * 100.0,
                r.step_seconds * 1e3, more_time * 100.0, wrong);
    rows.push_back({{"k", k},
                    {"activation_bytes", r.activation_floats * 4},
                    {"saved", saved},
                    {"step_ms", r.step_seconds * 1e3},
                    {"more_time", more_time},
                    {"wrong", wrong}});
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path)
        << nlohmann::json{{"width", o.width}, {"batch", o.batch}, {"rows", rows}}.dump(2) << "\n";
  }
  return 0;
}
