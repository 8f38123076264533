// SPDX-License-Identifier: Apache-2.0
// The vision transformer's layers: linear and layer_norm over rows (tokens), patch_embedding,
// self_attention, residual, token_mean; each against central differences on every GEMM
// provider and against a direct computation; a small ViT as a sequential.
#include "strata/model/attention.hpp"
#include "strata/model/layer_norm.hpp"
#include "strata/model/linear.hpp"
#include "strata/model/patch_embedding.hpp"
#include "strata/model/residual.hpp"
#include "strata/model/token_mean.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/activations.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/sequential.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "unit/model/gradient_check.hpp"

namespace {

namespace sm = strata::model;
using sm::testing::check_gradients;
using strata::sample_shape;

constexpr sample_shape tokens(std::size_t t, std::size_t d) {
  return {.channels = 1, .height = t, .width = d};
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float range = 1.0f) {
  strata::rng_stream rng(seed);
  std::vector<float> values(n);
  for (float& v : values) {
    v = rng.uniform(-range, range);
  }
  return values;
}

std::size_t param_count(const std::vector<sm::param_spec>& specs) {
  std::size_t n = 0;
  for (const auto& s : specs) {
    n += s.elements();
  }
  return n;
}

// One forward of a layer with buffers from its traits.
template <class L>
std::vector<float> forward_of(const L& l, const sample_shape& in, std::size_t batch,
                              std::span<const float> input, std::span<const float> params) {
  using traits = sm::layer_traits<L>;
  const sample_shape out = traits::output_shape(l, in);
  std::vector<float> output(batch * out.elements(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> work(traits::workspace_elements(l, in, batch), -1.0f);
  traits::forward(l, {.batch = batch,
                      .in_shape = in,
                      .out_shape = out,
                      .input = input,
                      .output = output,
                      .params = params,
                      .workspace = work});
  return output;
}

template <class L>
std::string shape_error(const L& l, const sample_shape& in) {
  try {
    (void)l.output_shape(in);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST_CASE("linear and layer_norm over rows: each row as its own sample") {
  const sample_shape in = tokens(4, 5);
  const sm::linear lin{.in = 5, .out = 3};
  CHECK(lin.output_shape(in) == tokens(4, 3));
  CHECK(lin.output_shape({.channels = 1, .height = 1, .width = 5}) == tokens(1, 3));
  CHECK(lin.cost(in).forward_flops == doctest::Approx(4 * 2.0 * 15));
  CHECK(shape_error(lin, tokens(4, 6)).find("width 6") != std::string::npos);
  const sm::layer_norm norm{.features = 5};
  CHECK(norm.output_shape(in) == in);
  CHECK(norm.workspace_elements(in, 3) == 2 * 3 * 4);
  CHECK(shape_error(norm, tokens(4, 6)).find("features is 5") != std::string::npos);

  const std::size_t batch = 3;
  const auto x = random_values(batch * in.elements(), 11);
  const auto lp = random_values(param_count(lin.parameters(in)), 12);
  const auto np = random_values(param_count(norm.parameters(in)), 13);
  // A batch of 3 x 4 rows equals a batch of 12 one-row samples.
  const auto rows_lin = forward_of(lin, in, batch, x, lp);
  const auto flat_lin = forward_of(lin, tokens(1, 5), batch * 4, x, lp);
  const auto rows_norm = forward_of(norm, in, batch, x, np);
  const auto flat_norm = forward_of(norm, tokens(1, 5), batch * 4, x, np);
  REQUIRE(rows_lin.size() == flat_lin.size());
  for (std::size_t i = 0; i < rows_lin.size(); ++i) {
    CHECK(rows_lin[i] == doctest::Approx(flat_lin[i]).epsilon(1e-6));
  }
  CHECK(rows_norm == flat_norm);

  SUBCASE("central differences") {
    const auto a = check_gradients(lin, {.batch = 2, .in_shape = in});
    CHECK_MESSAGE(a.passed(), a.report());
    const auto b = check_gradients(norm, {.batch = 2, .in_shape = in});
    CHECK_MESSAGE(b.passed(), b.report());
  }
}

TEST_CASE("patch_embedding: tokens in row-major patch order, central differences") {
  const sm::patch_embedding embed{.patch = 2, .dim = 8, .positions = false};
  const sample_shape image{.channels = 2, .height = 4, .width = 6};
  CHECK(embed.output_shape(image) == tokens(6, 8));
  const auto specs = embed.parameters(image);
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].rows == 8);
  CHECK(specs[0].cols == 8);  // 2 channels x 2 x 2
  CHECK(shape_error(embed, {.channels = 1, .height = 5, .width = 6}).find("2x2 patches") !=
        std::string::npos);
  CHECK(sm::patch_embedding{.patch = 2, .dim = 3}.parameters(image).back().name == "positions");

  // Identity weights: token t's features are its patch's pixels, channel, row, column.
  std::vector<float> params(8 * 8 + 8, 0.0f);
  for (std::size_t i = 0; i < 8; ++i) {
    params[i * 8 + i] = 1.0f;
  }
  std::vector<float> x(image.elements());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(i);
  }
  const auto y = forward_of(embed, image, 1, x, params);
  // Token 4: patch row 1, column 1: pixels (2..3, 2..3) of each channel.
  const std::vector<float> token4(y.begin() + 4 * 8, y.begin() + 5 * 8);
  CHECK(token4 == std::vector<float>{14, 15, 20, 21, 38, 39, 44, 45});

  for (const bool positions : {false, true}) {
    CAPTURE(positions);
    const auto r =
        check_gradients(sm::patch_embedding{.patch = 2, .dim = 3, .positions = positions},
                        {.batch = 2, .in_shape = image});
    CHECK_MESSAGE(r.passed(), r.report());
  }
}

TEST_CASE("self_attention: a direct computation, central differences, shapes") {
  const std::size_t t = 5;
  const std::size_t d = 8;
  const sm::self_attention attn{.dim = d, .heads = 2};
  const sample_shape in = tokens(t, d);
  CHECK(attn.output_shape(in) == in);
  const auto specs = attn.parameters(in);
  REQUIRE(specs.size() == 8);
  CHECK(specs[0].name == "q_weight");
  CHECK(specs[6].name == "out_weight");
  CHECK(shape_error(attn, tokens(t, 6)).find("dim = 8") != std::string::npos);
  CHECK(shape_error(sm::self_attention{.dim = 8, .heads = 3}, in).find("multiple of heads") !=
        std::string::npos);

  const std::size_t batch = 2;
  const auto x = random_values(batch * in.elements(), 21);
  const auto p = random_values(param_count(specs), 22, 0.5f);
  const auto y = forward_of(attn, in, batch, x, p);
  // The same in double, written out.
  const auto at = [&](std::size_t tensor, std::size_t r, std::size_t c) {
    return static_cast<double>(p[tensor * d * d + r * d + c]);
  };
  const auto bias = [&](std::size_t which, std::size_t c) {
    return static_cast<double>(p[3 * d * d + which * d + c]);
  };
  const std::size_t hd = d / 2;
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<double> q(t * d), k(t * d), v(t * d), heads(t * d);
    for (std::size_t i = 0; i < t; ++i) {
      for (std::size_t o = 0; o < d; ++o) {
        double sq = bias(0, o), sk = bias(1, o), sv = bias(2, o);
        for (std::size_t j = 0; j < d; ++j) {
          const double xi = x[(b * t + i) * d + j];
          sq += at(0, o, j) * xi;
          sk += at(1, o, j) * xi;
          sv += at(2, o, j) * xi;
        }
        q[i * d + o] = sq;
        k[i * d + o] = sk;
        v[i * d + o] = sv;
      }
    }
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t i = 0; i < t; ++i) {
        std::vector<double> s(t);
        double top = -1e300;
        for (std::size_t j = 0; j < t; ++j) {
          double dot = 0.0;
          for (std::size_t c = 0; c < hd; ++c) {
            dot += q[i * d + h * hd + c] * k[j * d + h * hd + c];
          }
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          top = std::max(top, s[j]);
        }
        double sum = 0.0;
        for (double& e : s) {
          e = std::exp(e - top);
          sum += e;
        }
        for (std::size_t c = 0; c < hd; ++c) {
          double o = 0.0;
          for (std::size_t j = 0; j < t; ++j) {
            o += s[j] / sum * v[j * d + h * hd + c];
          }
          heads[i * d + h * hd + c] = o;
        }
      }
    }
    const double* out_w = nullptr;
    (void)out_w;
    for (std::size_t i = 0; i < t; ++i) {
      for (std::size_t o = 0; o < d; ++o) {
        double sum = p[4 * d * d + 3 * d + o];
        for (std::size_t j = 0; j < d; ++j) {
          sum += static_cast<double>(p[3 * d * d + 3 * d + o * d + j]) * heads[i * d + j];
        }
        CHECK(y[(b * t + i) * d + o] == doctest::Approx(sum).epsilon(1e-5));
      }
    }
  }

  const auto r = check_gradients(attn, {.batch = 2, .in_shape = in, .param_range = 0.5f});
  CHECK_MESSAGE(r.passed(), r.report());
  const auto one_head = check_gradients(sm::self_attention{.dim = 6, .heads = 1},
                                        {.batch = 1, .in_shape = tokens(3, 6)});
  CHECK_MESSAGE(one_head.passed(), one_head.report());
}

TEST_CASE("residual: y = x + f(x), inner parameters by name, central differences") {
  const sample_shape in = tokens(3, 6);
  const sm::residual block{sm::layer_norm{.features = 6}, sm::linear{.in = 6, .out = 4}, sm::gelu{},
                           sm::linear{.in = 4, .out = 6}};
  CHECK(block.output_shape(in) == in);
  const auto specs = block.parameters(in);
  REQUIRE(specs.size() == 6);
  CHECK(specs[0].name == "0.weight");
  CHECK(specs[2].name == "1.weight");
  CHECK(specs[4].name == "3.weight");
  CHECK(sm::to_string(block).rfind("residual{layer_norm{", 0) == 0);
  const sm::residual narrowing{sm::linear{.in = 6, .out = 4}};
  CHECK(shape_error(narrowing, in).find("the same shape") != std::string::npos);

  // A zero linear inside: the identity.
  const sm::residual zero{sm::linear{.in = 6, .out = 6}};
  const auto x = random_values(2 * in.elements(), 31);
  const std::vector<float> none(6 * 6 + 6, 0.0f);
  CHECK(forward_of(zero, in, 2, x, none) == x);

  const auto r = check_gradients(block, {.batch = 2, .in_shape = in});
  CHECK_MESSAGE(r.passed(), r.report());
  const auto attention_half = check_gradients(
      sm::residual{sm::layer_norm{.features = 6}, sm::self_attention{.dim = 6, .heads = 2}},
      {.batch = 2, .in_shape = in, .param_range = 0.5f});
  CHECK_MESSAGE(attention_half.passed(), attention_half.report());
}

TEST_CASE("token_mean: the mean of the rows, central differences") {
  const sm::token_mean pool;
  CHECK(pool.output_shape(tokens(4, 3)) == tokens(1, 3));
  const std::vector<float> x{1, 2, 3, 5, 6, 7, 0, 0, 0, 2, 4, 6};
  CHECK(forward_of(pool, tokens(4, 3), 1, x, {}) == std::vector<float>{2, 3, 4});
  const auto r = check_gradients(pool, {.batch = 2, .in_shape = tokens(4, 3)});
  CHECK_MESSAGE(r.passed(), r.report());
}

TEST_CASE("a small vision transformer as a sequential learns a fixed batch") {
  const sample_shape image{.channels = 1, .height = 8, .width = 8};
  const std::size_t d = 16;
  const auto block = [&] {
    return sm::residual{sm::layer_norm{.features = d}, sm::self_attention{.dim = d, .heads = 2}};
  };
  const auto mlp = [&] {
    return sm::residual{sm::layer_norm{.features = d}, sm::linear{.in = d, .out = 2 * d},
                        sm::gelu{}, sm::linear{.in = 2 * d, .out = d}};
  };
  sm::sequential vit(image, sm::patch_embedding{.patch = 4, .dim = d}, block(), mlp(), block(),
                     mlp(), sm::layer_norm{.features = d}, sm::token_mean{},
                     sm::linear{.in = d, .out = 4});
  CHECK(vit.output_shape() == tokens(1, 4));
  auto params = vit.make_params();
  params.initialize(5);
  const std::size_t batch = 8;
  auto work = vit.make_workspace(batch);
  const auto x = random_values(batch * image.elements(), 41);
  const std::vector<std::int32_t> labels{0, 1, 2, 3, 3, 2, 1, 0};
  const sm::softmax_cross_entropy loss;
  std::vector<float> grad(batch * 4);
  double first = 0.0;
  double last = 0.0;
  for (int step = 0; step < 40; ++step) {
    const auto logits = vit.forward(work, params, x, batch, {.training = true});
    const auto r = loss.evaluate({.batch = batch,
                                  .classes = 4,
                                  .logits = logits,
                                  .labels = labels,
                                  .grad_logits = grad,
                                  .grad_scale = 1.0f / batch});
    (step == 0 ? first : last) = r.loss_sum / batch;
    params.zero_grads();
    vit.backward(work, params, grad);
    auto values = params.values();
    const auto grads = std::as_const(params).grads();
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] -= 0.05f * grads[i];
    }
  }
  CAPTURE(first);
  CHECK(last < 0.2 * first);
}

TEST_CASE("sequential: parameters, workspace and run for different tensor-parallel places") {
  const sample_shape in = tokens(4, 8);
  sm::sequential m(in, sm::self_attention{.dim = 8, .heads = 2});
  auto split = m.make_params({.tensor = {.rank = 1, .size = 2}});
  auto whole = m.make_params();
  CHECK(split.parameter_count() < whole.parameter_count());
  auto work = m.make_workspace(2);
  const std::vector<float> x(2 * in.elements(), 0.5f);
  CHECK_THROWS_WITH_AS(
      (void)m.forward(work, split, x, 2, {}),
      doctest::Contains("run for tensor-parallel rank 0 of 1, but the workspace is "
                        "for rank 0 of 1 and the parameters for rank 1 of 2"),
      std::invalid_argument);
  CHECK_NOTHROW((void)m.forward(work, whole, x, 2, {}));
}
