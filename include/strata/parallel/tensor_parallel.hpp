// SPDX-License-Identifier: Apache-2.0
#pragma once

// parallel::tensor<Inner>: tensor parallelism composed with another parallel policy, the dp x tp
// x pp mesh of one trainer.
//
//   trainer<Model, parallel::tensor<parallel::data<>>>                         // dp x tp
//   trainer<Model, parallel::tensor<parallel::pipeline<pipeline::one_f_one_b>>>  // dp x tp x pp
//
// The job's ranks are laid out as parallel/mesh.hpp says (tensor groups of consecutive
// positions, node by node): arrange() renumbers the communicator by mesh position before the
// trainer uses it. Each rank's tensor group runs the model's tensor-parallel layers
// (requirement 10 of model/concepts.hpp): the trainer makes the rank's parameter slices and
// workspaces for its place in the group and hands the layers the group (tensor_context). The
// ranks of one tensor index form the world of the Inner policy's executor, which does with them
// what it does with a whole job: a data-parallel executor averages gradients over the replicas,
// a pipeline sends activations between stages. A rank's peers there hold the same slices, so
// nothing of Inner changes; the executor sees a configuration of world_size / tp ranks and
// tensor_parallel_size 1.
//
// Beyond Inner: the skip vote (float16) is also taken over the tensor group; group() is the whole
// job (the trainer's rank 0 writes the checkpoints; every rank waits for them); checkpoints hold
// every tensor rank's blobs, tensor rank t's under the prefix "tp-<t>." (t > 0), so the same
// layout resumes; the summary's params_xxh3 hashes the whole parameters, assembled from the
// slices, so it equals that of a run with tensor_parallel_size 1 on the same model.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/digest.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/mesh.hpp"
#include "strata/parallel/passes.hpp"
#include "strata/parallel/tensor.hpp"
#include "strata/precision/mixed.hpp"

namespace strata::parallel {

template <class Policy>
class tensor_executor;

namespace detail {

// "tensor<INNER>", as a constant.
template <std::size_t N>
struct tensor_text {
  char data[N + 1]{};
  constexpr std::string_view view() const { return {data, N}; }
};

template <class Inner>
constexpr auto tensor_name() {
  constexpr std::size_t n = std::string_view("tensor<").size() + Inner::name.size() + 1;
  tensor_text<n> t{};
  std::size_t at = 0;
  for (char c : std::string_view("tensor<")) {
    t.data[at++] = c;
  }
  for (char c : Inner::name) {
    t.data[at++] = c;
  }
  t.data[at] = '>';
  return t;
}

template <class Inner>
inline constexpr auto tensor_name_v = tensor_name<Inner>();

// The inner policy's keys, declared again by the composition.
template <class Inner>
struct tensor_policy_keys {};
template <class Inner>
requires requires {
  Inner::config_keys;
}
struct tensor_policy_keys<Inner> {
  static constexpr auto config_keys = Inner::config_keys;
};

// The configuration the inner policy runs: the ranks of one tensor index.
inline config::train_config tensor_inner_config(const config::train_config& cfg) {
  config::train_config inner = cfg;
  const std::int64_t tp = cfg.tensor_parallel_size < 1 ? 1 : cfg.tensor_parallel_size;
  inner.world_size = cfg.world_size / tp;
  inner.tensor_parallel_size = 1;
  return inner;
}

// What a tensor executor builds before its inner executor: the groups and the inner
// configuration, which the inner executor's context refers to.
struct tensor_groups {
  config::train_config inner_cfg;
  mutable std::optional<comm::any_comm> world{};  // the whole job, by mesh position (a handle)
  std::optional<comm::any_comm> rest{};           // the ranks of this rank's tensor index
  std::optional<comm::any_comm> tensor{};
  std::unique_ptr<comm_tensor_group<comm::any_comm>> tensor_comm{};
  int tp = 1;
  int tensor_rank = 0;

  explicit tensor_groups(const step_context& c) : inner_cfg(tensor_inner_config(c.cfg)) {
    if (c.comm == nullptr) {
      throw std::invalid_argument("parallel::tensor: needs a communicator");
    }
    tp = static_cast<int>(c.cfg.tensor_parallel_size);
    world = *c.comm;
    const int position = c.comm->rank();
    tensor_rank = position % tp;
    rest.emplace(c.comm->split(tensor_rank, position / tp));
    tensor.emplace(c.comm->split(position / tp, tensor_rank));
    tensor_comm = std::make_unique<comm_tensor_group<comm::any_comm>>(*tensor);
  }

  step_context inner_context(const step_context& c) {
    return {.comm = &*rest,
            .master = c.master,
            .compute = c.compute,
            .optimizer = c.optimizer,
            .cfg = inner_cfg,
            .precision = c.precision};
  }

  // Blob names of tensor rank t: "tp-<t>." before the inner executor's (none for t = 0).
  std::string prefix() const {
    return tensor_rank == 0 ? std::string() : "tp-" + std::to_string(tensor_rank) + ".";
  }
};

}  // namespace detail

template <class Inner>
struct tensor : detail::tensor_policy_keys<Inner> {
  static_assert(check_parallel_policy<Inner>());
  static_assert(Inner::distributed,
                "parallel::tensor<Inner>: Inner must span ranks (parallel::data<...> or "
                "parallel::pipeline<...>)");
  using policy_category = parallel_policy_tag;
  using inner_policy = Inner;
  static constexpr std::string_view name = detail::tensor_name_v<Inner>.view();
  static constexpr bool distributed = true;
  using executor = tensor_executor<tensor>;

  // tensor_parallel_size divides world_size (the mesh's product is the config's, naming the
  // three sizes); Inner checks the rest on the ranks of one tensor index.
  static void check_config(const config::train_config& cfg, int world, int rank) {
    if (cfg.world_size != world) {
      throw config_error({.key = "world_size", .file = {}, .line = 0, .column = 0},
                         "rank " + std::to_string(rank) + ": the communicator has " +
                             std::to_string(world) + " ranks, world_size is " +
                             std::to_string(cfg.world_size));
    }
    (void)mesh_shape_of(cfg);
    const auto tp = static_cast<int>(cfg.tensor_parallel_size);
    Inner::check_config(detail::tensor_inner_config(cfg), world / tp, rank / tp);
  }
};

template <class Policy>
class tensor_executor : private detail::tensor_groups, public Policy::inner_policy::executor {
  using base = typename Policy::inner_policy::executor;

 public:
  explicit tensor_executor(const step_context& c)
      : detail::tensor_groups(c), base(inner_context(c)), master_(&c.master) {}

  // Renumbers the job's communicator by mesh position (collective).
  static comm::any_comm arrange(comm::any_comm& job, const config::train_config& cfg) {
    const mesh_shape shape = mesh_shape_of(cfg);
    std::vector<std::int64_t> nodes(static_cast<std::size_t>(job.size()));
    const auto mine = static_cast<std::int64_t>(this_node_id());
    job.all_gather(&mine, nodes.data(), 1, dtype::int64);
    const mesh_layout layout(shape, std::vector<std::uint64_t>(nodes.begin(), nodes.end()));
    return job.split(0, layout.position_of_rank(job.rank()));
  }

  static int shards(const config::train_config& cfg, int world) {
    return base::shards(detail::tensor_inner_config(cfg),
                        world / static_cast<int>(cfg.tensor_parallel_size));
  }

  // This rank's place in its tensor group (its rank is its mesh position: arrange()).
  static model::tensor_place tensor_place(const config::train_config& cfg, int, int rank) {
    const auto tp = static_cast<std::size_t>(cfg.tensor_parallel_size);
    return {.rank = static_cast<std::size_t>(rank) % tp, .size = tp};
  }

  // A pipeline inside: the layers of this rank's stage.
  static std::vector<model::layer_range> rank_layers(const model_outline& m,
                                                     const config::train_config& cfg, int world,
                                                     int rank) requires
      requires(const config::train_config& c) {
    base::rank_layers(m, c, world, rank);
  }
  {
    const int tp = static_cast<int>(cfg.tensor_parallel_size);
    return base::rank_layers(m, detail::tensor_inner_config(cfg), world / tp, rank / tp);
  }
  static std::size_t measures_layers(const config::train_config& cfg) requires
      requires(const config::train_config& c) {
    base::measures_layers(c);
  }
  { return base::measures_layers(detail::tensor_inner_config(cfg)); }

  // The tensor ranks hold different slices: nobody broadcasts rank 0's.
  static constexpr bool shares_initial_params = true;

  comm::any_comm* group() const noexcept { return &*world; }

  model::tensor_context tensor_context() { return tensor_comm->context(); }

  bool any_rank_nonfinite(bool local) {
    const bool inner = base::any_rank_nonfinite(local);
    return precision::any_rank_overflowed(*tensor, inner);
  }

  // Collective. The inner executor's blobs; the writer's tensor group gathers its members'
  // (their master parameters too: the trainer writes rank 0's) under their prefixes.
  std::vector<state_blob> state_blobs(std::uint64_t step) {
    std::vector<state_blob> out = base::state_blobs(step);
    held_.clear();
    names_.clear();
    if (rest->rank() != 0) {
      return out;  // not in the writer's tensor group
    }
    constexpr int tag = 21;
    if (tensor_rank != 0) {
      std::vector<state_blob> mine = out;
      mine.push_back({.name = std::string(params_name()),
                      .bytes = std::as_bytes(std::as_const(*master_).values())});
      auto count = static_cast<std::int64_t>(mine.size());
      tensor->send(&count, 1, dtype::int64, 0, tag);
      for (const state_blob& b : mine) {
        const std::int64_t sizes[2] = {static_cast<std::int64_t>(b.name.size()),
                                       static_cast<std::int64_t>(b.bytes.size())};
        tensor->send(sizes, 2, dtype::int64, 0, tag);
        tensor->send(b.name.data(), b.name.size(), dtype::uint8, 0, tag);
        tensor->send(b.bytes.data(), b.bytes.size(), dtype::uint8, 0, tag);
      }
      return out;
    }
    for (int t = 1; t < tp; ++t) {
      std::int64_t count = 0;
      tensor->recv(&count, 1, dtype::int64, t, tag);
      for (std::int64_t i = 0; i < count; ++i) {
        std::int64_t sizes[2] = {0, 0};
        tensor->recv(sizes, 2, dtype::int64, t, tag);
        std::string name(static_cast<std::size_t>(sizes[0]), '\0');
        tensor->recv(name.data(), name.size(), dtype::uint8, t, tag);
        auto& bytes = held_.emplace_back(static_cast<std::size_t>(sizes[1]));
        tensor->recv(bytes.data(), bytes.size(), dtype::uint8, t, tag);
        names_.push_back("tp-" + std::to_string(t) + "." + name);
      }
    }
    // Names and bytes are complete: point the blobs at them.
    for (std::size_t i = 0; i < held_.size(); ++i) {
      out.push_back({.name = names_[i], .bytes = std::span<const std::byte>(held_[i])});
    }
    names_.clear();
    return out;
  }

  void restore(const blob_reader& read) {
    const std::string p = prefix();
    base::restore(
        [&](std::string_view name, std::span<float> into) { read(p + std::string(name), into); });
  }

  // The inner executor's, under this tensor rank's prefix (none where it describes none: its
  // blobs then resume under this layout only).
  std::vector<optimizer_blob> optimizer_blobs() const {
    std::vector<optimizer_blob> out = described_optimizer_blobs(static_cast<const base&>(*this))
                                          .value_or(std::vector<optimizer_blob>{});
    for (optimizer_blob& b : out) {
      b.name = prefix() + b.name;
    }
    return out;
  }

  // The blob this rank's master parameters are read from.
  std::string params_blob() const { return prefix() + std::string(params_name()); }

  // Collective: the whole parameters (every tensor rank's slices together), hashed as the inner
  // executor hashes a rank's.
  std::string params_digest(std::span<const float> mine) {
    std::vector<float> all(mine.size() * static_cast<std::size_t>(tp));
    tensor->all_gather(mine.data(), all.data(), mine.size(), dtype::float32);
    const std::vector<float> whole =
        model::gather_whole_values(*master_, all, static_cast<std::size_t>(tp));
    if constexpr (requires(base & b) { b.params_digest(std::span<const float>(whole)); }) {
      return base::params_digest(whole);
    } else {
      return xxh3_hex(whole);
    }
  }

 private:
  std::string params_name() const {
    if constexpr (requires(const base& b) {
                    { b.params_blob() } -> std::convertible_to<std::string>;
                  }) {
      return base::params_blob();
    } else {
      return "rank-0.params.bin";
    }
  }

  model::param_store* master_;
  std::vector<std::vector<std::byte>> held_{};
  std::vector<std::string> names_{};
};

}  // namespace strata::parallel
