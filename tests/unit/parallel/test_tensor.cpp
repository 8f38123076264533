// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism (parallel/tensor.hpp, model::self_attention's heads): the layers pass the
// gradient check as a group of one; on 2 and 4 thread ranks a small vision transformer and a
// column -> row pair give tp 1's outputs, input gradients, parameter gradients (slice by slice)
// and losses over SGD steps, from the same initial slices; sizes that do not split are named.
#include "strata/parallel/tensor.hpp"

#include "strata/parallel/tensor_parallel.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/activations.hpp"
#include "strata/model/attention.hpp"
#include "strata/model/layer_norm.hpp"
#include "strata/model/linear.hpp"
#include "strata/model/param_store.hpp"
#include "strata/model/patch_embedding.hpp"
#include "strata/model/residual.hpp"
#include "strata/model/sequential.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/model/token_mean.hpp"
#include "strata/parallel/class_parallel.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/pipeline/one_f_one_b.hpp"
#include "strata/pipeline/zero_bubble_h1.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/trainer.hpp"
#include "unit/common/vit.hpp"
#include "unit/model/gradient_check.hpp"

namespace {

namespace sm = strata::model;
namespace sp = strata::parallel;
using strata::sample_shape;

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  strata::rng_stream rng(seed);
  std::vector<float> values(n);
  for (float& v : values) {
    v = rng.uniform(-1.0f, 1.0f);
  }
  return values;
}

auto small_vit() {
  constexpr std::size_t d = 16;
  return sm::sequential(
      sample_shape{.channels = 1, .height = 8, .width = 8},
      sm::patch_embedding{.patch = 4, .dim = d},
      sm::residual{sm::layer_norm{.features = d}, sm::self_attention{.dim = d, .heads = 4}},
      sm::residual{sm::layer_norm{.features = d}, sp::parallel_mlp{.dim = d, .hidden = 32}},
      sm::layer_norm{.features = d}, sm::token_mean{}, sm::linear{.in = d, .out = 4});
}

// A classifier of 8 classes split over the tensor group (its logits not gathered).
auto class_head() {
  return sm::sequential(sample_shape{.channels = 1, .height = 1, .width = 12},
                        sp::column_parallel_linear{.in = 12, .out = 8}, sm::gelu{},
                        sp::row_parallel_linear{.in = 8, .out = 6}, sm::gelu{},
                        sp::class_parallel_linear(6, 8));
}

auto column_row() {
  return sm::sequential(sample_shape{.channels = 1, .height = 1, .width = 12},
                        sp::column_parallel_linear{.in = 12, .out = 8}, sm::gelu{},
                        sp::row_parallel_linear{.in = 8, .out = 4});
}

// What one rank sees over a few SGD steps: every step's loss, and after the first step's
// backward the output, the input gradient and the parameter gradients (this rank's slices).
struct run_record {
  std::vector<double> losses;
  std::vector<float> logits;
  std::vector<float> grad_input;
  std::vector<float> grads;
  std::vector<float> initial;
};

template <class Model, class Loss = sm::softmax_cross_entropy>
run_record train(const Model& m, sm::tensor_context tensor, std::size_t batch, int steps) {
  auto params = m.make_params({.tensor = tensor.place});
  params.initialize(9);
  auto work = m.make_workspace(batch, {.tensor = tensor.place});
  const std::size_t classes = m.output_shape().elements();
  const auto x = random_values(batch * m.input_shape().elements(), 3);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    labels[i] = static_cast<std::int32_t>((i * 5 + 3) % classes);  // spread over the classes
  }
  std::vector<float> grad(batch * classes);
  const Loss loss;
  run_record out;
  out.initial.assign(params.values().begin(), params.values().end());
  for (int step = 0; step < steps; ++step) {
    const auto logits = m.forward(work, params, x, batch, {.training = true, .tensor = tensor});
    if (step == 0) {
      out.logits.assign(logits.begin(), logits.end());
    }
    const auto r = loss.evaluate({.batch = batch,
                                  .classes = classes,
                                  .logits = logits,
                                  .labels = labels,
                                  .grad_logits = grad,
                                  .grad_scale = 1.0f / static_cast<float>(batch),
                                  .tensor = tensor});
    out.losses.push_back(r.loss_sum / static_cast<double>(batch));
    params.zero_grads();
    m.backward(work, params, grad);
    if (step == 0) {
      const auto g = std::as_const(params).grads();
      out.grads.assign(g.begin(), g.end());
    }
    auto values = params.values();
    const auto g = std::as_const(params).grads();
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] -= 0.1f * g[i];
    }
  }
  return out;
}

// The slices rank `place` holds of the whole store's values `whole_values` (a tp 1 store's).
std::vector<float> slices_of(const sm::param_store& whole, std::span<const float> whole_values,
                             const sm::param_store& part) {
  std::vector<float> out(part.size(), 0.0f);
  for (std::size_t i = 0; i < part.entries().size(); ++i) {
    const sm::param_entry& e = part.entries()[i];
    const sm::param_entry& w = whole.entries()[i];
    sm::param_store::copy_slice(e, whole_values.subspan(w.offset, w.spec.elements()),
                                std::span<float>(out).subspan(e.offset, e.spec.elements()));
  }
  return out;
}

void check_close(std::span<const float> got, std::span<const float> want, double tolerance,
                 const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    const double allowed = tolerance * (1.0 + std::abs(static_cast<double>(want[i])));
    worst = std::max(worst, diff);
    bad += diff > allowed ? 1 : 0;
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size()
                               << " elements differ, largest difference " << worst);
}

// The logits a rank of a class-parallel output holds: its classes' columns, zeros elsewhere.
std::vector<float> own_classes(const std::vector<float>& logits, std::size_t classes, int rank,
                               int tp) {
  std::vector<float> out(logits.size(), 0.0f);
  const std::size_t part = classes / static_cast<std::size_t>(tp);
  const std::size_t first = static_cast<std::size_t>(rank) * part;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (i % classes >= first && i % classes < first + part) {
      out[i] = logits[i];
    }
  }
  return out;
}

template <class Model, class Loss = sm::softmax_cross_entropy>
void check_tensor_parallel_equals_one(const Model& m, int tp) {
  constexpr bool split_logits = std::is_same_v<Loss, sp::class_parallel_cross_entropy>;
  const std::size_t batch = 4;
  const int steps = 5;
  const run_record one = train<Model, Loss>(m, {}, batch, steps);
  const auto whole = m.make_params();
  std::mutex mu;
  std::vector<run_record> ranks(static_cast<std::size_t>(tp));
  strata::comm::threads::run(tp, [&](strata::comm::threads& group) {
    sp::comm_tensor_group<strata::comm::threads> tensor(group);
    run_record r = train<Model, Loss>(m, tensor.context(), batch, steps);
    const std::lock_guard lock(mu);
    ranks[static_cast<std::size_t>(group.rank())] = std::move(r);
  });
  for (int rank = 0; rank < tp; ++rank) {
    CAPTURE(rank);
    const auto part = m.make_params(
        {.tensor = {.rank = static_cast<std::size_t>(rank), .size = static_cast<std::size_t>(tp)}});
    const run_record& r = ranks[static_cast<std::size_t>(rank)];
    // The same initial model, sliced.
    CHECK(r.initial == slices_of(whole, one.initial, part));
    check_close(
        r.logits,
        split_logits ? own_classes(one.logits, m.output_shape().elements(), rank, tp) : one.logits,
        1e-5, "logits");
    check_close(r.grads, slices_of(whole, one.grads, part), 1e-5, "parameter gradients");
    REQUIRE(r.losses.size() == one.losses.size());
    for (std::size_t s = 0; s < r.losses.size(); ++s) {
      CHECK(r.losses[s] == doctest::Approx(one.losses[s]).epsilon(1e-5));
    }
  }
  CHECK(one.losses.back() < one.losses.front());
}

// snippet-begin: user_layer
// A user's tensor-parallel layer, written outside the library against requirement 10:
// y = x W^T with W (out x in) split by rows. Each rank computes its outputs, the group
// all-gathers them; backward, each rank's part of the input gradient is all-reduced.
struct user_split_linear {
  using layer_category = sm::layer_tag;
  std::size_t in = 0;
  std::size_t out = 0;

  sample_shape output_shape(const sample_shape&) const {
    return {.channels = 1, .height = 1, .width = out};
  }
  std::vector<sm::param_spec> parameters(const sample_shape&) const {
    return {{.name = "weight",
             .rows = out,
             .cols = in,
             .init = sm::init_kind::xavier_uniform,
             .fan_in = in,
             .fan_out = out,
             .weight_decay = true,
             .split = sm::tensor_split::rows}};
  }
  // Room for every rank's outputs, gathered.
  std::size_t workspace_elements(const sample_shape&, std::size_t batch,
                                 const sm::tensor_place&) const {
    return batch * out;
  }
  void forward(const sm::forward_args& a) const {
    const std::size_t part = out / a.tensor.place.size;  // this rank's rows of W
    std::vector<float> mine(a.batch * part, 0.0f);
    for (std::size_t b = 0; b < a.batch; ++b) {
      for (std::size_t o = 0; o < part; ++o) {
        for (std::size_t i = 0; i < in; ++i) {
          mine[b * part + o] += a.params[o * in + i] * a.input[b * in + i];
        }
      }
    }
    a.tensor.all_gather(mine, a.workspace);  // rank 0's block first
    for (std::size_t k = 0; k < a.tensor.place.size; ++k) {
      for (std::size_t b = 0; b < a.batch; ++b) {
        for (std::size_t o = 0; o < part; ++o) {
          a.output[b * out + k * part + o] = a.workspace[(k * a.batch + b) * part + o];
        }
      }
    }
  }
  void backward(const sm::backward_args& a) const {
    const std::size_t part = out / a.tensor.place.size;
    const std::size_t first = a.tensor.place.rank * part;
    std::fill(a.grad_input.begin(), a.grad_input.end(), 0.0f);
    for (std::size_t b = 0; b < a.batch; ++b) {
      for (std::size_t o = 0; o < part; ++o) {
        const float g = a.grad_output[b * out + first + o];
        for (std::size_t i = 0; i < in; ++i) {
          a.grads[o * in + i] += g * a.input[b * in + i];
          if (!a.grad_input.empty()) {
            a.grad_input[b * in + i] += g * a.params[o * in + i];
          }
        }
      }
    }
    if (!a.grad_input.empty()) {
      a.tensor.all_reduce_sum(a.grad_input);
    }
  }
};
// snippet-end: user_layer

auto user_model() {
  return sm::sequential(sample_shape{.channels = 1, .height = 1, .width = 6},
                        sm::linear{.in = 6, .out = 6}, user_split_linear{.in = 6, .out = 8},
                        sm::gelu{}, sm::linear{.in = 8, .out = 4});
}

}  // namespace

static_assert(sm::check_layer<user_split_linear>());

TEST_CASE("tensor-parallel layers as a group of one: central differences") {
  using sm::testing::check_gradients;
  const sample_shape tokens{.channels = 1, .height = 3, .width = 6};
  const auto column = check_gradients(sp::column_parallel_linear{.in = 6, .out = 4},
                                      {.batch = 2, .in_shape = tokens});
  CHECK_MESSAGE(column.passed(), column.report());
  const auto row =
      check_gradients(sp::row_parallel_linear{.in = 6, .out = 5}, {.batch = 2, .in_shape = tokens});
  CHECK_MESSAGE(row.passed(), row.report());
  const auto mlp =
      check_gradients(sp::parallel_mlp{.dim = 6, .hidden = 8}, {.batch = 2, .in_shape = tokens});
  CHECK_MESSAGE(mlp.passed(), mlp.report());
  const auto user =
      check_gradients(user_split_linear{.in = 5, .out = 4},
                      {.batch = 3, .in_shape = {.channels = 1, .height = 1, .width = 5}});
  CHECK_MESSAGE(user.passed(), user.report());
}

TEST_CASE("tensor parallelism: tp 2 and 4 give tp 1's model, outputs, gradients and losses") {
  for (const int tp : {2, 4}) {
    CAPTURE(tp);
    SUBCASE("a small vision transformer (heads and MLP split)") {
      check_tensor_parallel_equals_one(small_vit(), tp);
    }
    SUBCASE("column then row parallel linear") {
      check_tensor_parallel_equals_one(column_row(), tp);
    }
    SUBCASE("a user's layer (requirement 10)") {
      check_tensor_parallel_equals_one(user_model(), tp);
    }
    SUBCASE("a class-parallel output and its cross-entropy") {
      check_tensor_parallel_equals_one<decltype(class_head()), sp::class_parallel_cross_entropy>(
          class_head(), tp);
    }
  }
}

TEST_CASE("tensor parallelism: the input gradient is whole on every rank") {
  // A model whose first layer is tensor-parallel needs the gradient of its input only when
  // asked: drive the layer alone on 2 ranks and compare with the unsplit layer.
  const sp::row_parallel_linear layer{.in = 8, .out = 3};
  const sample_shape in{.channels = 1, .height = 1, .width = 8};
  const std::size_t batch = 3;
  const auto x = random_values(batch * 8, 5);
  const auto dy = random_values(batch * 3, 6);
  const auto specs = layer.parameters(in);
  const sm::param_store whole({"0"}, {specs});
  std::vector<float> p = random_values(whole.size(), 7);
  const auto run = [&](sm::tensor_context ctx, std::span<const float> params) {
    std::vector<float> y(batch * 3), dx(batch * 8), g(params.size(), 0.0f);
    std::vector<float> work(layer.workspace_elements(in, batch, ctx.place));
    layer.forward({.batch = batch,
                   .in_shape = in,
                   .out_shape = layer.output_shape(in),
                   .input = x,
                   .output = y,
                   .params = params,
                   .workspace = work,
                   .tensor = ctx});
    layer.backward({.batch = batch,
                    .in_shape = in,
                    .out_shape = layer.output_shape(in),
                    .input = x,
                    .output = y,
                    .grad_output = dy,
                    .grad_input = dx,
                    .params = params,
                    .grads = g,
                    .workspace = work,
                    .tensor = ctx});
    return std::pair{y, dx};
  };
  const auto [y1, dx1] = run({}, p);
  std::mutex mu;
  strata::comm::threads::run(2, [&](strata::comm::threads& group) {
    sp::comm_tensor_group<strata::comm::threads> tensor(group);
    const auto ctx = tensor.context();
    const sm::param_store part({"0"}, {specs}, {.tensor = ctx.place});
    const auto mine = slices_of(whole, p, part);
    const auto [y, dx] = run(ctx, mine);
    const std::lock_guard lock(mu);
    check_close(y, y1, 1e-5, "output");
    check_close(dx, dx1, 1e-5, "input gradient");
  });
}

TEST_CASE("tensor parallelism: sizes that do not split name the layer or the parameter") {
  const sm::self_attention attn{.dim = 12, .heads = 3};
  CHECK_THROWS_WITH_AS((void)attn.workspace_elements({.channels = 1, .height = 2, .width = 12}, 1,
                                                     {.rank = 0, .size = 2}),
                       doctest::Contains("3 heads do not split over tensor_parallel_size = 2"),
                       std::invalid_argument);
  const sp::parallel_mlp mlp{.dim = 4, .hidden = 6};
  const sample_shape in{.channels = 1, .height = 1, .width = 4};
  CHECK_THROWS_WITH_AS(
      sm::param_store({"0"}, {mlp.parameters(in)}, {.tensor = {.rank = 0, .size = 4}}),
      doctest::Contains("parameter 'up_weight' has 6 rows, not a multiple of "
                        "tensor_parallel_size = 4"),
      std::invalid_argument);
}

// ---- through the trainer: the dp x tp x pp mesh -------------------------------------------------

namespace {

namespace st = strata::train;
namespace fs = std::filesystem;

using strata::test::blob_images;
using strata::test::image_vit;
using vit_t = decltype(image_vit());

strata::config::train_config mesh_config(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "tensor" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  return cfg;
}

// Rank 0's step losses, the test accuracy, and every tensor whole (assembled from the slices,
// checked alike on every rank that holds it).
struct mesh_outcome {
  std::vector<double> losses;
  double test_accuracy = 0.0;
  std::string digest;
  std::map<std::string, std::vector<float>> tensors;
};

template <class Trainer>
st::fit_summary fit_images(Trainer& t, std::vector<double>* losses) {
  if (losses != nullptr) {
    t.on_step([losses](const st::step_metrics& m) { losses->push_back(m.loss); });
  }
  return t.fit(blob_images{.n = 384}, strata::data::identity{}, blob_images{.n = 128, .salt = 1},
               strata::data::identity{});
}

// Adds rank's slices into the whole tensors (a tensor another rank placed must agree where
// both hold it).
void place_slices(const sm::param_store& p, std::map<std::string, std::vector<float>>& whole,
                  std::map<std::string, std::vector<char>>& placed) {
  for (const sm::param_entry& e : p.entries()) {
    auto& w = whole[e.name];
    auto& done = placed[e.name];
    w.resize(e.global.elements(), 0.0f);
    done.resize(e.global.elements(), 0);
    std::vector<float> mine(e.global.elements(), std::numeric_limits<float>::quiet_NaN());
    sm::param_store::place_slice(e, p.value(e.name), mine);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      if (std::isnan(mine[i])) {
        continue;
      }
      if (done[i] != 0) {
        CHECK(w[i] == mine[i]);
      }
      w[i] = mine[i];
      done[i] = 1;
    }
  }
}

mesh_outcome one_rank_vit(strata::config::train_config cfg) {
  mesh_outcome out;
  st::trainer<vit_t> t(image_vit(), cfg, {.print_progress = false});
  const auto summary = fit_images(t, &out.losses);
  out.test_accuracy = summary.test_accuracy;
  out.digest = summary.params_xxh3;
  std::map<std::string, std::vector<char>> placed;
  place_slices(t.params(), out.tensors, placed);
  return out;
}

template <class Policy>
mesh_outcome mesh_vit(int ranks, strata::config::train_config cfg) {
  cfg.world_size = ranks;
  mesh_outcome out;
  std::map<std::string, std::vector<char>> placed;
  std::mutex lock;
  // snippet-begin: mesh
  // world_size = 4, tensor_parallel_size = 2 (Policy = parallel::tensor<parallel::data<>>: dp 2
  // x tp 2), or with pipeline_parallel_size = 2 parallel::tensor<parallel::pipeline<...>>
  strata::comm::threads::run(ranks, [&](strata::comm::threads& c) {
    st::trainer<vit_t, Policy> t(image_vit(), cfg, strata::comm::any_comm(c),
                                 {.print_progress = false});
    // snippet-end: mesh
    std::vector<double> losses;
    const auto summary = fit_images(t, c.rank() == 0 ? &losses : nullptr);
    const std::lock_guard guard(lock);
    if (c.rank() == 0) {
      out.losses = losses;
      out.test_accuracy = summary.test_accuracy;
      out.digest = summary.params_xxh3;
    }
    place_slices(t.params(), out.tensors, placed);
  });
  for (const auto& [name, done] : placed) {
    CAPTURE(name);
    CHECK(std::count(done.begin(), done.end(), 0) == 0);  // every element held by some rank
  }
  return out;
}

void check_same(const mesh_outcome& a, const mesh_outcome& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(a.losses[i] == doctest::Approx(b.losses[i]).epsilon(1e-5));
  }
  CHECK(a.test_accuracy == b.test_accuracy);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, values] : a.tensors) {
    CAPTURE(name);
    check_close(values, b.tensors.at(name), 1e-4, "parameters");
  }
}

}  // namespace

TEST_CASE("mesh through the trainer: dp x tp x pp layouts of 4 thread ranks train the ViT as one") {
  auto cfg = mesh_config("one");
  cfg.batch_size_per_gpu = 64;
  const mesh_outcome one = one_rank_vit(cfg);
  CHECK(one.losses.back() < one.losses.front());
  SUBCASE("tp 4") {
    auto c = mesh_config("tp4");
    c.batch_size_per_gpu = 64;
    c.tensor_parallel_size = 4;
    const mesh_outcome m = mesh_vit<sp::tensor<sp::data<>>>(4, c);
    check_same(m, one);
    // The digest of the whole parameters: one rank's, when the parameters are its bits.
    CHECK(m.digest.size() == 16);
  }
  SUBCASE("dp 2 x tp 2") {
    auto c = mesh_config("dp2tp2");
    c.tensor_parallel_size = 2;
    check_same(mesh_vit<sp::tensor<sp::data<>>>(4, c), one);
  }
  // tp 2 x pp 2 under a schedule (its type and its config value), batch 64 in `micro` pieces.
  const auto tp2_pp2 = [&]<class Schedule>(std::type_identity<Schedule>, const std::string& name,
                                           strata::config::pipeline_schedule_kind kind,
                                           std::int64_t micro) {
    auto c = mesh_config(name);
    c.batch_size_per_gpu = 64;
    c.tensor_parallel_size = 2;
    c.pipeline_parallel_size = 2;
    c.micro_batches = micro;
    c.pipeline_schedule = kind;
    check_same(mesh_vit<sp::tensor<sp::pipeline<Schedule>>>(4, c), one);
  };
  SUBCASE("tp 2 x pp 2") {
    tp2_pp2(std::type_identity<strata::pipeline::one_f_one_b>{}, "tp2pp2",
            strata::config::pipeline_schedule_kind::one_f_one_b, 2);
  }
  SUBCASE("tp 2 x pp 2 under ZB-H1 (the input and weight gradients in separate passes)") {
    tp2_pp2(std::type_identity<strata::pipeline::zero_bubble_h1>{}, "tp2pp2zb",
            strata::config::pipeline_schedule_kind::zero_bubble_h1, 4);
  }
  SUBCASE("dp 2 x tp 2 with ZeRO-1 replicas (each shards its tensor slices' optimizer state)") {
    auto c = mesh_config("dp2tp2zero1");
    c.tensor_parallel_size = 2;
    c.zero_stage = 1;
    check_same(mesh_vit<sp::tensor<sp::zero1>>(4, c), one);
  }
}

TEST_CASE("mesh through the trainer: tp 2 x dp 2 resumes bit for bit") {
  auto cfg = mesh_config("resume");
  cfg.world_size = 4;
  cfg.tensor_parallel_size = 2;
  using policy = sp::tensor<sp::data<>>;
  const mesh_outcome whole = mesh_vit<policy>(4, cfg);
  // Stopped mid-epoch (6 steps an epoch), then resumed by new trainers.
  auto first = mesh_config("resume_parts");
  first.world_size = 4;
  first.tensor_parallel_size = 2;
  first.max_steps = 4;
  (void)mesh_vit<policy>(4, first);
  first.max_steps = 0;
  first.resume = strata::config::resume_mode::required;
  const mesh_outcome rest = mesh_vit<policy>(4, first);
  REQUIRE(rest.losses.size() + 4 == whole.losses.size());
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    CHECK(rest.losses[i] == whole.losses[4 + i]);
  }
  CHECK(rest.digest == whole.digest);
  CHECK(rest.tensors == whole.tensors);
}

TEST_CASE("mesh through the trainer: the whole parameters' digest equals one rank's store") {
  // tp 2 alone (dp 1): the slices together are one rank's store of the same values.
  auto cfg = mesh_config("digest");
  cfg.tensor_parallel_size = 2;
  cfg.epochs = 1;
  const mesh_outcome m = mesh_vit<sp::tensor<sp::data<>>>(2, cfg);
  const vit_t model = image_vit();
  auto store = model.make_params();
  for (const auto& e : store.entries()) {
    const auto& v = m.tensors.at(e.name);
    std::copy(v.begin(), v.end(), store.value(e.name).begin());
  }
  CHECK(m.digest == strata::xxh3_hex(store.values()));
}

namespace {

// A layout of the ViT's run: ranks (1: the single-rank trainer), sizes and the batch per rank
// that keeps 64 samples a step.
struct vit_layout {
  int ranks = 1;
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::size_t batch = 64;
};

strata::config::train_config under(strata::config::train_config cfg, const vit_layout& l) {
  cfg.tensor_parallel_size = l.tp;
  cfg.pipeline_parallel_size = l.pp;
  cfg.batch_size_per_gpu = l.batch;
  cfg.zero_stage = 0;
  if (l.pp > 1) {
    cfg.micro_batches = 2;
    cfg.pipeline_schedule = strata::config::pipeline_schedule_kind::one_f_one_b;
  }
  return cfg;
}

template <class Policy>
mesh_outcome run_under(const vit_layout& l, strata::config::train_config cfg) {
  cfg = under(cfg, l);
  if constexpr (std::is_same_v<Policy, sp::single_rank>) {
    return one_rank_vit(cfg);
  } else {
    if constexpr (std::is_same_v<Policy, sp::zero1>) {
      cfg.zero_stage = 1;
    }
    return mesh_vit<Policy>(l.ranks, cfg);
  }
}

// AdamW keeps two floats of state per parameter, SGD with momentum one.
strata::config::train_config with_optimizer(strata::config::train_config cfg, bool adamw) {
  if (adamw) {
    cfg.optimizer = strata::config::optimizer_kind::adamw;
    cfg.lr = 0.01;
    // The keys' bias has no gradient but rounding (softmax ignores a shift of every key); AdamW
    // with a tiny eps turns that noise, which differs with the layout's sums, into full steps.
    cfg.adam_eps = 1e-3;
  }
  return cfg;
}

const mesh_outcome& reference_vit(bool adamw) {
  static const mesh_outcome sgd = one_rank_vit(under(mesh_config("reshard_one"), {}));
  static const mesh_outcome adam =
      one_rank_vit(under(with_optimizer(mesh_config("reshard_one_adamw"), true), {}));
  return adamw ? adam : sgd;
}

// A checkpoint of layout From loads under layout To: the parameters bit for bit after
// gathering (a finished run resumed: nothing trained), and a run stopped mid-epoch continues
// under To with one rank's losses and parameters.
template <class From, class To>
void check_resharded(const std::string& name, const vit_layout& from, const vit_layout& to,
                     bool adamw = false) {
  const mesh_outcome& one = reference_vit(adamw);
  auto cfg = with_optimizer(mesh_config("reshard_" + name), adamw);
  cfg.run_name = "vit";  // the layout may change under a named run
  auto finished = cfg;
  finished.epochs = 1;
  finished.checkpoint_dir += "-finished";
  const mesh_outcome saved = run_under<From>(from, finished);
  finished.resume = strata::config::resume_mode::required;
  const mesh_outcome loaded = run_under<To>(to, finished);
  CHECK(loaded.losses.empty());
  CHECK(loaded.tensors == saved.tensors);

  auto stopped = cfg;
  stopped.max_steps = 4;  // of 6 an epoch
  (void)run_under<From>(from, stopped);
  cfg.resume = strata::config::resume_mode::required;
  const mesh_outcome rest = run_under<To>(to, cfg);
  REQUIRE(rest.losses.size() + 4 == one.losses.size());
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(rest.losses[i] == doctest::Approx(one.losses[4 + i]).epsilon(1e-5));
  }
  CHECK(rest.test_accuracy == one.test_accuracy);
  REQUIRE(rest.tensors.size() == one.tensors.size());
  for (const auto& [tensor, values] : rest.tensors) {
    CAPTURE(tensor);
    check_close(values, one.tensors.at(tensor), 1e-4, "parameters");
  }
}

using tp_dp = sp::tensor<sp::data<>>;
using tp_pp = sp::tensor<sp::pipeline<strata::pipeline::one_f_one_b>>;

}  // namespace

TEST_CASE("checkpoints across layouts: saved under one mesh, resumed under another") {
  const vit_layout one_rank{};
  SUBCASE("dp 2 x tp 2 -> dp 4") {
    check_resharded<tp_dp, sp::data<>>("dp2tp2_dp4", {.ranks = 4, .tp = 2, .batch = 32},
                                       {.ranks = 4, .batch = 16});
  }
  SUBCASE("tp 2 x pp 2 -> one rank") {
    check_resharded<tp_pp, sp::single_rank>("tp2pp2_one", {.ranks = 4, .tp = 2, .pp = 2}, one_rank);
  }
  SUBCASE("zero1 over 4 ranks -> one rank") {
    check_resharded<sp::zero1, sp::single_rank>("zero1_one", {.ranks = 4, .batch = 16}, one_rank);
  }
  SUBCASE("one rank -> tp 2 x pp 2") {
    check_resharded<sp::single_rank, tp_pp>("one_tp2pp2", one_rank, {.ranks = 4, .tp = 2, .pp = 2});
  }
  SUBCASE("dp 4 -> tp 4, and with AdamW zero1 -> dp 2 x tp 2") {
    check_resharded<sp::data<>, tp_dp>("dp4_tp4", {.ranks = 4, .batch = 16}, {.ranks = 4, .tp = 4});
    check_resharded<sp::zero1, tp_dp>("zero1_dp2tp2", {.ranks = 4, .batch = 16},
                                      {.ranks = 4, .tp = 2, .batch = 32}, true);
  }
}

TEST_CASE("checkpoints across layouts: what cannot move is refused by name") {
  auto cfg = mesh_config("reshard_refused");
  cfg.run_name = "vit";
  cfg.epochs = 1;
  (void)run_under<tp_dp>({.ranks = 4, .tp = 2, .batch = 32}, cfg);
  cfg.epochs = 2;
  cfg.resume = strata::config::resume_mode::required;
  const fs::path manifest = fs::path(cfg.checkpoint_dir) / "vit" / "epoch-1" / "manifest.json";
  const auto rewrite = [&](const auto& change) {
    nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
    change(m.at("state").at("tensors"));
    std::ofstream(manifest) << m.dump();
  };
  const auto error_under_dp4 = [&](auto c) {
    try {
      (void)run_under<sp::data<>>({.ranks = 4, .batch = 16}, c);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SUBCASE("another batch over the data-parallel ranks names batch_size_per_gpu") {
    auto c = cfg;
    c.epochs = 2;
    const std::string m = [&] {
      try {
        (void)run_under<sp::data<>>({.ranks = 4, .batch = 8}, c);
      } catch (const strata::config_error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    CHECK(m.find("batch_size_per_gpu") != std::string::npos);
    CHECK(m.find("took 64 samples per loader batch") != std::string::npos);
  }
  SUBCASE("a tensor the manifest does not have names the parameter") {
    rewrite([](nlohmann::json& t) {
      for (auto& store : t.at("stores")) {
        for (auto& e : store) {
          if (e.at(0) == "3.1.out_weight") {
            e.at(0) = "3.1.renamed";
          }
        }
      }
    });
    const std::string m = error_under_dp4(cfg);
    CHECK(m.find("checkpoint error") != std::string::npos);
    CHECK(m.find("parameter 3.1.out_weight") != std::string::npos);
    CHECK(m.find("is not in the checkpoint") != std::string::npos);
  }
  SUBCASE("a file the manifest does not describe stays with its layout") {
    rewrite([](nlohmann::json& t) { t.at("files").erase("tp-1.rank-0.optimizer.bin"); });
    const std::string m = error_under_dp4(cfg);
    CHECK(m.find("tp-1.rank-0.optimizer.bin holds state of the layout that wrote it") !=
          std::string::npos);
  }
  SUBCASE("a slice missing from every file names the parameter") {
    rewrite([](nlohmann::json& t) {
      for (auto& store : t.at("stores")) {
        for (auto& e : store) {
          if (e.at(0) == "1.1.q_weight") {
            e.at(5) = e.at(5).get<std::size_t>() - 1;  // one row short
          }
        }
      }
    });
    const std::string m = error_under_dp4(cfg);
    CHECK(m.find("elements of parameter 1.1.q_weight") != std::string::npos);
  }
}

namespace {

// image_vit with its classifier split by classes over the tensor group.
auto class_parallel_vit() {
  constexpr std::size_t d = 16;
  return sm::sequential(
      sample_shape{.channels = 1, .height = 4, .width = 4},
      sm::patch_embedding{.patch = 2, .dim = d},
      sm::residual{sm::layer_norm{.features = d}, sm::self_attention{.dim = d, .heads = 4}},
      sm::residual{sm::layer_norm{.features = d}, sp::parallel_mlp{.dim = d, .hidden = 32}},
      sm::layer_norm{.features = d}, sm::token_mean{}, sp::class_parallel_linear(d, 4));
}

}  // namespace

TEST_CASE("a class-parallel output through the trainer: dp 2 x tp 2 trains as one rank") {
  using model_t = decltype(class_parallel_vit());
  using loss = sp::class_parallel_cross_entropy;
  auto cfg = mesh_config("class_parallel_one");
  cfg.batch_size_per_gpu = 64;
  mesh_outcome one;
  {
    st::trainer<model_t, loss> t(class_parallel_vit(), cfg, {.print_progress = false});
    const auto summary = fit_images(t, &one.losses);
    one.test_accuracy = summary.test_accuracy;
    std::map<std::string, std::vector<char>> placed;
    place_slices(t.params(), one.tensors, placed);
  }
  CHECK(one.losses.back() < one.losses.front());
  auto c = mesh_config("class_parallel_dp2tp2");
  c.world_size = 4;
  c.tensor_parallel_size = 2;
  mesh_outcome mesh;
  std::map<std::string, std::vector<char>> placed;
  std::mutex lock;
  strata::comm::threads::run(4, [&](strata::comm::threads& group) {
    st::trainer<model_t, sp::tensor<sp::data<>>, loss> t(
        class_parallel_vit(), c, strata::comm::any_comm(group), {.print_progress = false});
    std::vector<double> losses;
    const auto summary = fit_images(t, group.rank() == 0 ? &losses : nullptr);
    const std::lock_guard guard(lock);
    if (group.rank() == 0) {
      mesh.losses = losses;
      mesh.test_accuracy = summary.test_accuracy;
    }
    place_slices(t.params(), mesh.tensors, placed);
  });
  check_same(mesh, one);
}

TEST_CASE("class-parallel cross-entropy: bad input is named, like softmax_cross_entropy's") {
  const sp::class_parallel_cross_entropy loss;
  const std::vector<float> logits(6, 0.0f);
  const std::vector<std::int32_t> labels{0, 3};
  CHECK_THROWS_WITH_AS(
      loss.evaluate({.batch = 2, .classes = 3, .logits = logits, .labels = labels}),
      doctest::Contains("label of sample 1 is 3"), std::invalid_argument);
  // On two ranks, 3 classes do not split.
  strata::comm::threads::run(2, [&](strata::comm::threads& group) {
    sp::comm_tensor_group<strata::comm::threads> tensor(group);
    const std::vector<std::int32_t> fine{0, 1};
    CHECK_THROWS_WITH_AS(loss.evaluate({.batch = 2,
                                        .classes = 3,
                                        .logits = logits,
                                        .labels = fine,
                                        .tensor = tensor.context()}),
                         doctest::Contains("classes"), std::invalid_argument);
  });
}

TEST_CASE("estimate_memory for a rank of a tensor group: the slices and workspace it holds") {
  const auto m = small_vit();
  const std::size_t batch = 8;
  std::size_t previous = 0;
  for (const std::size_t tp : {1, 4, 2}) {
    CAPTURE(tp);
    for (std::size_t rank = 0; rank < tp; ++rank) {
      const sm::tensor_place place{.rank = rank, .size = tp};
      const auto e =
          st::estimate_memory(m, batch, {.optimizer_state_per_parameter = 2, .tensor = place});
      CHECK(e.parameter_count == m.make_params({.tensor = place}).size());
      CHECK(e.optimizer_state == (e.parameter_count * 2 * sizeof(float) + 63) / 64 * 64);
      const std::size_t logits_bytes = (batch * 4 * sizeof(float) + 63) / 64 * 64;
      CHECK(e.activations ==
            m.make_workspace(batch, {.tensor = place}).floats() * sizeof(float) + logits_bytes);
      if (tp == 4) {
        previous = e.parameter_count;
      }
      if (tp == 2) {
        CHECK(e.parameter_count > previous);  // half the split tensors, not a quarter
      }
    }
  }
  CHECK(st::estimate_memory(m, batch, {.tensor = {.rank = 0, .size = 2}}).parameter_count <
        st::estimate_memory(m, batch).parameter_count);
}
