// SPDX-License-Identifier: Apache-2.0
#include "strata/model/sequential.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/model/layers.hpp"

namespace sm = strata::model;

namespace {

auto tiny() {
  return sm::sequential(strata::sample_shape{.channels = 2, .height = 3, .width = 3}, sm::flatten{},
                        sm::linear{.in = 18, .out = 7}, sm::gelu{}, sm::dropout{.rate = 0.25},
                        sm::linear{.in = 7, .out = 3});
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  strata::rng_stream rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    x = rng.uniform(-1.0f, 1.0f);
  }
  return v;
}

// sum(output * weights) for the model at its current parameters.
double objective(const auto& model, sm::sequential_workspace& w, const sm::param_store& params,
                 const std::vector<float>& input, std::size_t batch,
                 const std::vector<float>& weights) {
  const auto out = model.forward(w, params, input, batch, {.training = true, .seed = 5, .step = 2});
  double sum = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    sum += static_cast<double>(out[i]) * weights[i];
  }
  return sum;
}

}  // namespace

static_assert(sm::model<decltype(tiny())>);
static_assert(sm::check_model<decltype(tiny())>());
static_assert(!sm::model<sm::linear>);

TEST_CASE("shapes, parameters and costs come from the layers") {
  const auto model = tiny();
  CHECK(model.input_shape() == strata::sample_shape{2, 3, 3});
  CHECK(model.output_shape() == strata::sample_shape{1, 1, 3});
  CHECK(model.shapes()[2] == strata::sample_shape{1, 1, 7});
  const auto params = model.make_params();
  CHECK(params.parameter_count() == 18 * 7 + 7 + 7 * 3 + 3);
  CHECK(params.entry("1.weight").spec.rows == 7);
  CHECK(params.entry("4.bias").spec.cols == 3);
  CHECK(params.group_values(0).empty());
  CHECK(model.total_cost().forward_flops ==
        doctest::Approx(2.0 * 18 * 7 + 2.0 * 7 * 3 + 9.0 * 7 + 1.0 * 7));
  CHECK(model.workspace_floats(4) == model.make_workspace(4).floats());
  CHECK_THROWS_WITH_AS(sm::sequential(strata::sample_shape{1, 1, 5}, sm::linear{.in = 4, .out = 2}),
                       doctest::Contains("layer 0 (input 1x1x5)"), std::invalid_argument);
}

TEST_CASE("forward is the layers in order; backward matches finite differences") {
  const auto model = tiny();
  auto params = model.make_params();
  params.initialize(11);
  const std::size_t batch = 3;
  auto w = model.make_workspace(4);
  const auto input = random_floats(batch * 18, 1);
  const auto weights = random_floats(batch * 3, 2);

  // Forward by hand through the same layers.
  const auto out = model.forward(w, params, input, batch, {.training = false});
  std::vector<float> h(batch * 7);
  const sm::linear first{.in = 18, .out = 7};
  const std::vector<float> first_params(params.group_values(1).begin(),
                                        params.group_values(1).end());
  sm::forward_args a;
  a.batch = batch;
  a.in_shape = {1, 1, 18};
  a.out_shape = {1, 1, 7};
  a.input = input;
  a.output = h;
  a.params = first_params;
  first.forward(a);
  std::vector<float> g(h.size());
  a.in_shape = a.out_shape;
  a.input = h;
  a.output = g;
  a.params = {};
  sm::gelu{}.forward(a);
  std::vector<float> o(batch * 3);
  a.out_shape = {1, 1, 3};
  a.input = g;
  a.output = o;
  a.params = params.group_values(4);
  sm::linear{.in = 7, .out = 3}.forward(a);
  CHECK(std::vector<float>(out.begin(), out.end()) == o);  // dropout is off in evaluation

  // Backward (training, dropout on) against central differences on every parameter.
  params.zero_grads();
  const auto trained =
      model.forward(w, params, input, batch, {.training = true, .seed = 5, .step = 2});
  std::vector<float> grad_out(weights.begin(), weights.end());
  REQUIRE(trained.size() == grad_out.size());
  model.backward(w, params, grad_out);
  const std::vector<float> analytic(params.grads().begin(), params.grads().end());
  const float eps = 1e-2f;
  std::size_t checked = 0;
  for (const auto& e : params.entries()) {
    for (std::size_t i = 0; i < e.spec.elements(); i += 3) {
      float& p = params.values()[e.offset + i];
      const float saved = p;
      p = saved + eps;
      const double up = objective(model, w, params, input, batch, weights);
      p = saved - eps;
      const double down = objective(model, w, params, input, batch, weights);
      p = saved;
      const double numeric = (up - down) / (2.0 * eps);
      CHECK(analytic[e.offset + i] == doctest::Approx(numeric).epsilon(2e-2).scale(1e-2));
      ++checked;
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("backward adds, and misuse is refused with the numbers") {
  const auto model = tiny();
  auto params = model.make_params();
  params.initialize(3);
  auto w = model.make_workspace(2);
  const auto input = random_floats(2 * 18, 4);
  std::vector<float> grad_out(2 * 3, 1.0f);
  CHECK_THROWS_AS(model.backward(w, params, grad_out), std::logic_error);
  model.forward(w, params, input, 2);
  model.backward(w, params, grad_out);
  const std::vector<float> once(params.grads().begin(), params.grads().end());
  model.forward(w, params, input, 2);
  model.backward(w, params, grad_out);
  for (std::size_t i = 0; i < once.size(); ++i) {
    CHECK(params.grads()[i] == doctest::Approx(2.0 * once[i]));
  }
  CHECK_THROWS_WITH_AS(model.forward(w, params, input, 3),
                       doctest::Contains("batch 3 is outside 1..2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(model.forward(w, params, std::vector<float>(5), 1),
                       doctest::Contains("input has 5 floats"), std::invalid_argument);
  CHECK_THROWS_AS(model.backward(w, params, std::vector<float>(5)), std::invalid_argument);
}

TEST_CASE("activation checkpointing keeps segment ends only and gives the same gradients") {
  // 4 x (linear, relu, dropout) + linear: 13 layers.
  const auto model =
      sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 24},
                     sm::linear{.in = 24, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
                     sm::linear{.in = 32, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
                     sm::linear{.in = 32, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
                     sm::linear{.in = 32, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
                     sm::linear{.in = 32, .out = 5});
  const std::size_t batch = 6;
  const auto input = random_floats(batch * 24, 7);
  const auto grad_out = random_floats(batch * 5, 8);
  const sm::run_options options{.training = true, .seed = 3, .step = 9, .sample_ids = {}};

  auto reference = model.make_params();
  reference.initialize(5);
  auto plain = model.make_workspace(batch);
  const auto out_plain = model.forward(plain, reference, input, batch, options);
  const std::vector<float> logits(out_plain.begin(), out_plain.end());
  model.backward(plain, reference, grad_out);
  const std::vector<float> grads(reference.grads().begin(), reference.grads().end());

  for (std::size_t k : {1u, 2u, 3u, 4u, 13u, 20u}) {
    CAPTURE(k);
    auto params = model.make_params();
    params.initialize(5);
    auto w = model.make_workspace(batch, {.checkpoint_every = k});
    CHECK(model.workspace_floats(batch, {.checkpoint_every = k}) == w.floats());
    const auto out = model.forward(w, params, input, batch, options);
    CHECK(std::vector<float>(out.begin(), out.end()) == logits);
    model.backward(w, params, grad_out);
    CHECK(std::vector<float>(params.grads().begin(), params.grads().end()) == grads);  // bits
    if (k >= 2 && k <= 4) {
      CHECK(w.activation_floats() < plain.activation_floats());
    }
  }
  // Segments of 3: ends 2, 5, 8, 11, 12 kept, plus two inner output slots.
  const auto w3 = model.make_workspace(batch, {.checkpoint_every = 3});
  CHECK(w3.activation_floats() < plain.activation_floats() * 7 / 10);
}

TEST_CASE(
    "linear's fused ReLU and dropout in a model: as the layers; recomputation gives the same "
    "bits") {
  constexpr auto relu = sm::fused_activation::relu;
  const strata::sample_shape in{.channels = 1, .height = 1, .width = 24};
  const auto separate = sm::sequential(
      in, sm::linear{.in = 24, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
      sm::linear{.in = 32, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.2},
      sm::linear{.in = 32, .out = 32, .bias = false}, sm::relu{}, sm::linear{.in = 32, .out = 5});
  const auto fused = sm::sequential(
      in, sm::linear{.in = 24, .out = 32, .activation = relu}, sm::dropout{.rate = 0.2},
      sm::linear{.in = 32, .out = 32, .activation = relu}, sm::dropout{.rate = 0.2},
      sm::linear{.in = 32, .out = 32, .bias = false, .activation = relu},
      sm::linear{.in = 32, .out = 5});
  // The dropouts fused too (linear's .dropout).
  const auto fused_dropout =
      sm::sequential(in, sm::linear{.in = 24, .out = 32, .activation = relu, .dropout = 0.2},
                     sm::linear{.in = 32, .out = 32, .activation = relu, .dropout = 0.2},
                     sm::linear{.in = 32, .out = 32, .bias = false, .activation = relu},
                     sm::linear{.in = 32, .out = 5});
  const std::size_t batch = 6;
  const auto input = random_floats(batch * 24, 17);
  const auto grad_out = random_floats(batch * 5, 18);
  // A fused model against the separate layers. Its dropouts sit at other layer indices (so
  // draw other masks in training): the two are compared in evaluation, where dropout is the
  // identity, and the fused one with its own recomputation in both. `activations` compares the
  // two workspaces' activation floats (fused, separate).
  const auto check_fused = [&](const auto& fused_model, auto activations) {
    for (const bool training : {false, true}) {
      CAPTURE(training);
      const sm::run_options options{.training = training, .seed = 3, .step = 9, .sample_ids = {}};
      auto a = separate.make_params();
      a.initialize(5);
      auto b = fused_model.make_params();
      b.initialize(5);
      REQUIRE(std::vector<float>(a.values().begin(), a.values().end()) ==
              std::vector<float>(b.values().begin(), b.values().end()));
      auto wa = separate.make_workspace(batch);
      auto wb = fused_model.make_workspace(batch);
      activations(wb.activation_floats(), wa.activation_floats());
      const auto ya = separate.forward(wa, a, input, batch, options);
      const auto yb = fused_model.forward(wb, b, input, batch, options);
      b.zero_grads();
      fused_model.backward(wb, b, grad_out);
      if (!training) {
        for (std::size_t i = 0; i < ya.size(); ++i) {
          CHECK(yb[i] == doctest::Approx(ya[i]).epsilon(1e-6));
        }
        separate.backward(wa, a, grad_out);
        for (std::size_t i = 0; i < a.grads().size(); ++i) {
          CHECK(b.grads()[i] == doctest::Approx(a.grads()[i]).epsilon(1e-5));
        }
      }
      // Recomputing the fused model's segments gives its own bits.
      const std::vector<float> logits(yb.begin(), yb.end());
      const std::vector<float> grads(b.grads().begin(), b.grads().end());
      for (std::size_t k : {1u, 2u, 3u}) {
        CAPTURE(k);
        auto params = fused_model.make_params();
        params.initialize(5);
        auto w = fused_model.make_workspace(batch, {.checkpoint_every = k});
        const auto out = fused_model.forward(w, params, input, batch, options);
        CHECK(std::vector<float>(out.begin(), out.end()) == logits);
        fused_model.backward(w, params, grad_out);
        CHECK(std::vector<float>(params.grads().begin(), params.grads().end()) == grads);
      }
    }
  };
  // The fused linear's workspace (the masked gradient) takes what relu's output took.
  check_fused(fused, [](std::size_t f, std::size_t s) { CHECK(f == s); });
  // With the dropouts fused, no dropout outputs or masks are kept.
  check_fused(fused_dropout, [](std::size_t f, std::size_t s) { CHECK(f < s); });
}

TEST_CASE("discarded gradients: backward writes them, whatever the memory held") {
  // linear writes its gradients (writes_grads); layer_norm adds, so sequential zeroes its range
  // first. Both must give the bits that zero_grads() + backward gives, and a second backward
  // (the next micro-batch) must add to them as before.
  static_assert(sm::layer_writes_grads<sm::linear>());
  static_assert(!sm::layer_writes_grads<sm::layer_norm>());
  const auto model = sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 12},
                                    sm::linear{.in = 12, .out = 9}, sm::layer_norm{.features = 9},
                                    sm::relu{}, sm::linear{.in = 9, .out = 4});
  const std::size_t batch = 5;
  auto params = model.make_params();
  params.initialize(3);
  auto w = model.make_workspace(batch);
  const auto input = random_floats(batch * 12, 4);
  const auto grad_out = random_floats(batch * 4, 5);
  const auto run = [&] {
    (void)model.forward(w, params, input, batch, {.training = true, .seed = 5, .step = 1});
    model.backward(w, params, grad_out);
  };
  params.zero_grads();
  run();
  const std::vector<float> once(params.grads().begin(), params.grads().end());
  run();
  const std::vector<float> twice(params.grads().begin(), params.grads().end());

  // NaN everywhere, the alignment padding between the layers' groups too.
  for (float& g : params.grads()) {
    g = std::numeric_limits<float>::quiet_NaN();
  }
  params.discard_grads();
  CHECK(params.grads_discarded());
  run();
  CHECK_FALSE(params.grads_discarded());
  CHECK(std::vector<float>(params.grads().begin(), params.grads().end()) == once);
  run();
  CHECK(std::vector<float>(params.grads().begin(), params.grads().end()) == twice);

  // Discarded and read before any backward: zeros, as zero_grads() would have left them.
  params.discard_grads();
  for (const float g : std::as_const(params).grads()) {
    CHECK(g == 0.0f);
  }
  CHECK_FALSE(params.grads_discarded());
  run();
  CHECK(std::vector<float>(params.grads().begin(), params.grads().end()) == once);
}

TEST_CASE("the gradients' bound: what the layers report, unknown once anything else writes") {
  const double inf = std::numeric_limits<double>::infinity();
  constexpr auto relu = sm::fused_activation::relu;
  const auto model =
      sm::sequential(strata::sample_shape{.channels = 1, .height = 2, .width = 6}, sm::flatten{},
                     sm::linear{.in = 12, .out = 9, .activation = relu, .dropout = 0.25},
                     sm::relu{}, sm::linear{.in = 9, .out = 4});
  const std::size_t batch = 3;
  auto params = model.make_params();
  params.initialize(3);
  auto w = model.make_workspace(batch);
  auto input = random_floats(batch * 12, 4);
  const auto grad_out = random_floats(batch * 4, 5);
  const auto run = [&] {
    (void)model.forward(w, params, input, batch, {.training = true, .seed = 5, .step = 1});
    model.backward(w, params, grad_out);
  };
  const auto largest = [&] {
    float m = 0.0f;
    for (const float g : std::as_const(params).grads()) {
      m = std::isfinite(g) ? std::max(m, std::abs(g)) : std::numeric_limits<float>::infinity();
    }
    return static_cast<double>(m);
  };
  CHECK(params.grad_bound() == inf);  // a new store: nothing known
  params.discard_grads();
  CHECK(params.grad_bound() == 0.0);
  run();
  const double once = params.grad_bound();
  CHECK(once > 0.0);
  CHECK(params.grads_certainly_finite());
  CHECK(largest() <= once);
  run();  // the next micro-batch adds: the bounds add
  CHECK(params.grad_bound() > once);
  CHECK(largest() <= params.grad_bound());
  (void)std::as_const(params).grads();  // reading keeps it
  CHECK(params.grads_certainly_finite());
  (void)params.grads();  // taken to write: unknown
  CHECK(params.grad_bound() == inf);
  CHECK_FALSE(params.grads_certainly_finite());
  params.zero_grads();
  CHECK(params.grad_bound() == 0.0);

  // An inf in the input: no bound, and the gradients are indeed not all finite.
  input[7] = std::numeric_limits<float>::infinity();
  params.discard_grads();
  run();
  CHECK_FALSE(params.grads_certainly_finite());
  CHECK(largest() == static_cast<double>(std::numeric_limits<float>::infinity()));

  // A layer that reports nothing (layer_norm) leaves the whole store unknown; split backward,
  // whose weight passes come later, too.
  const auto normed = sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 6},
                                     sm::linear{.in = 6, .out = 5}, sm::layer_norm{.features = 5},
                                     sm::linear{.in = 5, .out = 2});
  auto p2 = normed.make_params();
  p2.initialize(1);
  auto w2 = normed.make_workspace(batch);
  const auto x2 = random_floats(batch * 6, 6);
  const auto g2 = random_floats(batch * 2, 7);
  p2.discard_grads();
  (void)normed.forward(w2, p2, x2, batch, {.training = true});
  normed.backward(w2, p2, g2);
  CHECK(p2.grad_bound() == inf);
  const auto plain = sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 6},
                                    sm::linear{.in = 6, .out = 5}, sm::linear{.in = 5, .out = 2});
  auto p3 = plain.make_params();
  p3.initialize(1);
  auto w3 = plain.make_workspace(batch, {.split_backward = true});
  p3.discard_grads();
  (void)plain.forward(w3, p3, x2, batch, {.training = true});
  plain.backward(w3, p3, g2);
  plain.backward_weight(w3, p3);
  CHECK(p3.grad_bound() == inf);
  auto w4 = plain.make_workspace(batch);
  p3.discard_grads();
  (void)plain.forward(w4, p3, x2, batch, {.training = true});
  plain.backward(w4, p3, g2);
  CHECK(p3.grads_certainly_finite());
}

// A pipeline's view: the model cut into runs of layers, each with its own workspace and a store of
// its layers only, chained by hand, computes the whole model's output and gradients bit for bit,
// with the backward whole or split into input and weight passes.
TEST_CASE("layer ranges chained give the whole model's output and gradients, bit for bit") {
  const auto model =
      sm::sequential(strata::sample_shape{.channels = 1, .height = 4, .width = 4}, sm::flatten{},
                     sm::linear{.in = 16, .out = 12}, sm::relu{}, sm::dropout{.rate = 0.2},
                     sm::linear{.in = 12, .out = 9}, sm::gelu{}, sm::linear{.in = 9, .out = 5});
  const std::size_t batch = 6;
  const auto input = random_floats(batch * 16, 21);
  const auto grad_out = random_floats(batch * 5, 22);
  const std::vector<std::uint64_t> ids = {3, 9, 27, 81, 243, 729};
  const sm::run_options options{.training = true, .seed = 7, .step = 3, .sample_ids = ids};

  auto whole = model.make_params();
  whole.initialize(11);
  auto w = model.make_workspace(batch);
  const auto out = model.forward(w, whole, input, batch, options);
  const std::vector<float> expected_out(out.begin(), out.end());
  whole.discard_grads();
  model.backward(w, whole, grad_out);

  for (const bool split : {false, true}) {
    INFO("split_backward " << split);
    // Rank 0 holds layers 0..2 and 5..6 (two chunks), rank 1 layers 3..4: as interleaved.
    const std::vector<sm::layer_range> mine = {{0, 3}, {5, 7}};
    const std::vector<sm::layer_range> theirs = {{3, 5}};
    auto p0 = model.make_params({}, mine);
    auto p1 = model.make_params({}, theirs);
    p0.initialize(11);
    p1.initialize(11);
    // The parts start as the whole: the same names, the same values.
    for (const auto* part : {&p0, &p1}) {
      for (const auto& e : part->entries()) {
        const auto a = part->value(e.name);
        const auto b = whole.value(e.name);
        CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
      }
    }
    const sm::workspace_config config{.split_backward = split};
    auto w0a = model.make_workspace(batch, config, mine[0], 0);
    auto w1 = model.make_workspace(batch, config, theirs[0], 0);
    auto w0b = model.make_workspace(batch, config, mine[1], 3);
    // Each range's input stays alive until its backward, as a received activation does.
    const auto h1 = model.forward(w0a, p0, input, batch, options);
    const std::vector<float> in1(h1.begin(), h1.end());
    const auto h2 = model.forward(w1, p1, in1, batch, options);
    const std::vector<float> in2(h2.begin(), h2.end());
    const auto y = model.forward(w0b, p0, in2, batch, options);
    CHECK(std::vector<float>(y.begin(), y.end()) == expected_out);
    p0.discard_grads();
    p1.discard_grads();
    model.backward(w0b, p0, grad_out);
    const std::vector<float> g2(w0b.grad_input().begin(), w0b.grad_input().end());
    model.backward(w1, p1, g2);
    const std::vector<float> g1(w1.grad_input().begin(), w1.grad_input().end());
    model.backward(w0a, p0, g1);
    CHECK(w0a.grad_input().empty());  // nothing in front of layer 0 has parameters
    if (split) {
      // Weight passes in any order after their input passes.
      model.backward_weight(w0a, p0);
      model.backward_weight(w1, p1);
      model.backward_weight(w0b, p0);
      CHECK_THROWS_AS(model.backward_weight(w0b, p0), std::logic_error);
    }
    for (const auto* part : {&p0, &p1}) {
      for (const auto& e : part->entries()) {
        const auto a = const_cast<sm::param_store*>(part)->grad(e.name);
        const auto b = whole.grad(e.name);
        INFO(e.name);
        CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
      }
    }
  }
  CHECK_THROWS_WITH(
      model.make_workspace(batch, {.checkpoint_every = 2, .split_backward = true}, {0, 7}, 0),
      "sequential: split_backward keeps every layer's input for the weight pass; it "
      "does not go with checkpoint_every = 2");
  CHECK_THROWS_WITH(model.make_params({}, std::vector<sm::layer_range>{{4, 9}}),
                    "sequential: layers [4, 9) are not a run of the model's 7 layers");
}
