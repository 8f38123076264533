// SPDX-License-Identifier: Apache-2.0
#pragma once

// The step executor: the part of a training step that belongs to the parallel policy. The
// trainer runs the loop (epochs, loader, forward and backward through the batch policy,
// evaluation, metrics, checkpoint cadence and files); at the points where ranks meet it calls
// the executor that the parallel policy names (`typename P::executor`), built from a
// step_context: the communicator, the parameter stores, the optimizer, the configuration and the
// precision policy's operations. An executor never sees the trainer.
//
// In the order of one fit():
//   shards(cfg, world)   static: how many equal shards the flat parameters are padded to
//   E(context)           collective: after every rank holds the same initial parameters
//   group()              the ranks that train together (the step's totals, the checkpoint
//                        barrier); null on one rank
//   data_shard()         which shard of the training samples this rank reads: {shards, index}
//   serves(), serve(s)   a rank that serves instead of training (dedicated parameter servers)
//   begin_fit()          the bucket reducer that backward starts, or null
//   synchronize(args)    after a step's last backward: gradients made the ones to apply, and
//                        the step's loss, accuracy and samples summed over group()
//   any_rank_nonfinite   the skip vote over every rank that holds parameters
//   owned()              the range of the flat gradients this rank applies
//   update(lr), skipped() the step applied, or skipped on every rank
//   state_blobs(step),   the optimizer state (and anything else the policy needs) as named
//   restore(read)        blobs: collective; rank 0's are written
//   end_fit(step)        after the last step
//
// Optional: optimizer_blobs() names the blobs that hold this rank's optimizer state and the
// shards of its flat parameters each holds, one after another (a blob read back under another
// layout is rebuilt from them: train/reshard.hpp). It counts only where declared in the class
// that declares state_blobs and restore (described_optimizer_blobs): an executor that writes
// blobs of its own and inherits local_executor's "rank-0.optimizer.bin, all of it" describes
// nothing, and its checkpoints resume under their own layout only.
//
// local_executor is the one-rank behaviour (parallel::single_rank's executor) and the base to
// derive a policy's executor from: a derived class declares what it changes and inherits the
// rest.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/memory.hpp"
#include "strata/model/param_store.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/precision/mixed.hpp"

namespace strata::parallel {

class bucket_reducer;  // bucket_reducer.hpp: what backward starts as it completes gradient buckets

// The precision policy's operations an executor may need.
struct precision_ops {
  // The gradients as the compute type holds them (rounded through it; identity in float32).
  std::function<void(std::span<float>)> round;
  // Whether gradients (scaled, as the compute type holds them) are all finite.
  std::function<bool(std::span<const float>)> finite;
  // Gradients scaled by `scale` unscaled into float32 in place; false when not all finite.
  std::function<bool(std::span<float>, double)> to_master;
  bool skips_steps = true;         // the policy skips steps whose gradients are not finite
  dtype compute = dtype::float32;  // the compute copy's type
};

// The operations of precision policy `p` (precision/concepts.hpp); `p` outlives them.
template <class Precision>
precision_ops precision_ops_of(Precision& p) {
  return {.round = [&p](std::span<float> g) { p.store(g); },
          .finite = [&p](std::span<const float> g) { return p.finite(g); },
          .to_master = [&p](std::span<float> g, double scale) { return p.to_master(g, scale); },
          .skips_steps = Precision::skips_steps,
          .compute = Precision::compute_dtype};
}

// What the trainer hands an executor.
struct step_context {
  comm::any_comm* comm = nullptr;  // every rank of the job; null on one rank
  model::param_store& master;      // float32 parameters and the gradients the update reads
  model::param_store& compute;     // the parameters forward and backward run on (== master in fp32)
  optim::any_optimizer& optimizer;  // its step count is the trainer's to save
  const config::train_config& cfg;
  precision_ops precision;
};

// A step's loss sum, correct predictions and samples.
struct step_totals {
  double loss_sum = 0.0;
  double correct = 0.0;
  double samples = 0.0;
  friend bool operator==(const step_totals&, const step_totals&) = default;
};

struct sync_args {
  std::uint64_t step = 0;
  double lr = 0.0;
  double loss_scale = 1.0;
  step_totals mine{};       // this rank's
  bool overlapped = false;  // the step's last backward started begin_fit()'s buckets
};

struct sync_result {
  step_totals all{};                 // over group() (this rank's where ranks do not wait)
  double comm_seconds = 0.0;         // the step's communication, blocked_in_backward included
  double blocked_in_backward = 0.0;  // of the compute time, what was spent in blocking launches
};

// Which shard of the training samples a rank reads.
struct data_shard_of {
  int shards = 1;
  int index = 0;
  friend bool operator==(const data_shard_of&, const data_shard_of&) = default;
};

// A named part of a checkpoint.
struct state_blob {
  std::string name;
  std::span<const std::byte> bytes;
};

// A blob of optimizer state: the state of each shard [first, first + size) of a rank's flat
// parameters in turn, each laid out as update_shard keeps it (a tensor's piece inside the shard
// takes state_per_parameter() x its length floats at (piece start - first) x that count, slot s
// of its element j at s x length + j).
struct optimizer_blob {
  std::string name;
  std::vector<std::pair<std::size_t, std::size_t>> shards;  // {first, size}, in the blob's order

  friend bool operator==(const optimizer_blob&, const optimizer_blob&) = default;
};

// Fills `into` from the checkpoint's blob `name` (its size must match, else checkpoint_error).
using blob_reader = std::function<void(std::string_view name, std::span<float> into)>;

// One optimizer update per parameter tensor at rate lr, on the piece of each tensor inside the
// shard [first, first + size) of the flat parameters, with the shard's optimizer state (laid
// out by offset within the shard).
inline void update_shard(optim::any_optimizer& optimizer, model::param_store& params,
                         std::span<float> state, std::size_t first, std::size_t size, double lr) {
  optimizer.begin_step();
  const std::size_t per = optimizer.state_per_parameter();
  const std::span<float> values = params.values();
  const std::span<const float> grads = std::as_const(params).grads();
  const std::size_t last = first + size;
  for (const model::param_entry& e : params.entries()) {
    const std::size_t lo = std::max(e.offset, first);
    const std::size_t hi = std::min(e.offset + e.spec.elements(), last);
    if (lo >= hi) {
      continue;
    }
    const std::size_t n = hi - lo;
    optimizer.update({.params = values.subspan(lo, n),
                      .grads = grads.subspan(lo, n),
                      .state = state.subspan((lo - first) * per, n * per),
                      .lr = lr,
                      .weight_decay = e.spec.weight_decay});
  }
}

// Each rank applies its own gradients to its whole parameters with its whole optimizer state;
// with a communicator, only the step's totals and the skip vote cross ranks. parallel::
// single_rank's executor, and the base of the others.
class local_executor {
 public:
  explicit local_executor(const step_context& c) : ctx_(c) {
    if (c.comm != nullptr) {
      group_ = *c.comm;
    }
    allocate_state(c.master.size());
  }

  static int shards(const config::train_config&, int) { return 1; }

  comm::any_comm* group() const noexcept { return group_ ? &*group_ : nullptr; }

  // The training samples are cut into `shards` and this rank reads shard `index`: one per rank
  // of group() here. Ranks that share their samples (the stages of one pipeline, say) return
  // the same shard.
  data_shard_of data_shard() const noexcept {
    return group_ ? data_shard_of{.shards = group_->size(), .index = group_->rank()}
                  : data_shard_of{};
  }

  bool serves() const noexcept { return false; }
  std::uint64_t serve(std::uint64_t) {
    throw std::logic_error("parallel executor: serve() on a rank that does not serve");
  }

  bucket_reducer* begin_fit() { return nullptr; }

  sync_result synchronize(const sync_args& a) {
    sync_result r{.all = a.mine};
    if (group_) {
      double totals[3] = {a.mine.loss_sum, a.mine.correct, a.mine.samples};
      group_->all_reduce(totals, totals, 3, dtype::float64, comm::reduce_op::sum);
      r.all = {.loss_sum = totals[0], .correct = totals[1], .samples = totals[2]};
    }
    return r;
  }

  bool any_rank_nonfinite(bool local) {
    return group_ ? precision::any_rank_overflowed(*group_, local) : local;
  }

  std::pair<std::size_t, std::size_t> owned() const noexcept { return {0, ctx_.master.size()}; }

  void update(double lr) {
    update_shard(ctx_.optimizer, ctx_.master, state_.span(), 0, ctx_.master.size(), lr);
  }
  void skipped() {}

  std::vector<state_blob> state_blobs(std::uint64_t) {
    return {{.name = "rank-0.optimizer.bin", .bytes = std::as_bytes(std::as_const(state_).span())}};
  }
  void restore(const blob_reader& read) { read("rank-0.optimizer.bin", state_.span()); }
  std::vector<optimizer_blob> optimizer_blobs() const {
    return {{.name = "rank-0.optimizer.bin", .shards = {{0, ctx_.master.size()}}}};
  }

  void end_fit(std::uint64_t) {}

 protected:
  // The optimizer state of `shard` parameters, zeroed.
  void allocate_state(std::size_t shard) {
    state_ = buffer<float>(shard * ctx_.optimizer.state_per_parameter(),
                           {.alignment = 64, .zero_fill = true});
  }
  const config::train_config& cfg() const noexcept { return ctx_.cfg; }

  step_context ctx_;
  mutable std::optional<comm::any_comm> group_{};  // a handle: collectives are not const
  buffer<float> state_{};
};

namespace detail {
template <class T>
struct member_of;
template <class R, class C, class... A>
struct member_of<R (C::*)(A...)> {
  using type = C;
};
template <class R, class C, class... A>
struct member_of<R (C::*)(A...) const> {
  using type = C;
};
template <auto M>
using declared_in = typename member_of<decltype(M)>::type;
}  // namespace detail

// E's optimizer_blobs() where the class that declares it also declares state_blobs and restore
// (the blobs it describes are the ones it writes); nullopt otherwise: not described.
template <class E>
std::optional<std::vector<optimizer_blob>> described_optimizer_blobs(const E& e) {
  if constexpr (requires {
                  { e.optimizer_blobs() } -> std::convertible_to<std::vector<optimizer_blob>>;
                  &E::optimizer_blobs;
                  &E::state_blobs;
                  &E::restore;
                }) {
    using declares = detail::declared_in<&E::optimizer_blobs>;
    if constexpr (std::is_same_v<declares, detail::declared_in<&E::state_blobs>> &&
                  std::is_same_v<declares, detail::declared_in<&E::restore>>) {
      return e.optimizer_blobs();
    }
  }
  return std::nullopt;
}

// The requirements on a parallel policy's executor E (parallel/concepts.hpp, requirement 4).
// 1.
template <class E>
concept executor_constructible = std::constructible_from<E, const step_context&>;
// 2.
template <class E>
concept executor_lays_out = requires(const config::train_config& c, int world) {
  { E::shards(c, world) } -> std::convertible_to<int>;
};
// 3.
template <class E>
concept executor_has_roles = requires(E& e, std::uint64_t step) {
  { e.group() } -> std::convertible_to<comm::any_comm*>;
  { e.data_shard() } -> std::convertible_to<data_shard_of>;
  { e.serves() } -> std::convertible_to<bool>;
  { e.serve(step) } -> std::convertible_to<std::uint64_t>;
};
// 4.
template <class E>
concept executor_synchronizes = requires(E& e, const sync_args& a, bool local) {
  { e.begin_fit() } -> std::convertible_to<bucket_reducer*>;
  { e.synchronize(a) } -> std::same_as<sync_result>;
  { e.any_rank_nonfinite(local) } -> std::convertible_to<bool>;
};
// 5.
template <class E>
concept executor_updates = requires(E& e, const E& ce, double lr) {
  { ce.owned() } -> std::convertible_to<std::pair<std::size_t, std::size_t>>;
  e.update(lr);
  e.skipped();
};
// 6.
template <class E>
concept executor_checkpoints = requires(E& e, std::uint64_t step, const blob_reader& read) {
  { e.state_blobs(step) } -> std::convertible_to<std::vector<state_blob>>;
  e.restore(read);
  e.end_fit(step);
};

// Optional (not part of step_executor): where declared, optimizer_blobs() is const and gives
// std::vector<optimizer_blob>.
template <class E>
concept executor_describes_state = (!requires(E & e) { e.optimizer_blobs(); }) ||
                                   requires(const E& e) {
  { e.optimizer_blobs() } -> std::same_as<std::vector<optimizer_blob>>;
};

template <class E>
concept step_executor =
    executor_constructible<E> && executor_lays_out<E> && executor_has_roles<E> &&
    executor_synchronizes<E> && executor_updates<E> && executor_checkpoints<E>;

}  // namespace strata::parallel
