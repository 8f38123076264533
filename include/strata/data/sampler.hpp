// SPDX-License-Identifier: Apache-2.0
#pragma once

// distributed_sampler: which dataset samples a rank reads, in which order, each epoch.
//
// Each epoch the sampler lays out one global order of the dataset (a Fisher-Yates shuffle drawn
// from the stream keyed by (seed, epoch), or 0..n-1 unshuffled), makes its length a multiple of
// the rank count (pad: repeat samples from the start of the order; drop: cut the tail), and
// gives rank r the positions r, r + R, r + 2R, ... of it. So every rank has the same count, the
// ranks' sequences together cover the epoch's order once, and rank r's k-th batch of b samples
// is exactly rank r's share of the one-rank batch k of R * b samples: N ranks with B/N each see
// the samples one rank with B sees.
//
// The order depends on (seed, epoch, dataset size, ranks) only, never on threads or timing, and
// a sampler resumes at any (epoch, position) in O(n) for the shuffle plus O(1) for the position.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/rng.hpp"

namespace strata::data {

// What to do with the samples beyond a multiple of the rank count.
enum class remainder_policy {
  pad,   // repeat samples from the start of the epoch's order: every sample is seen
  drop,  // leave them out this epoch (a shuffled order leaves out different ones each epoch)
};

inline std::string to_string(remainder_policy p) {
  return p == remainder_policy::pad ? "pad" : "drop";
}

struct sampler_config {
  std::size_t dataset_size = 0;
  int ranks = 1;
  int rank = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  remainder_policy remainder = remainder_policy::pad;

  friend bool operator==(const sampler_config&, const sampler_config&) = default;
};

inline std::string to_string(const sampler_config& c) {
  return "sampler_config{.dataset_size = " + std::to_string(c.dataset_size) +
         ", .ranks = " + std::to_string(c.ranks) + ", .rank = " + std::to_string(c.rank) +
         ", .seed = " + std::to_string(c.seed) + ", .shuffle = " + (c.shuffle ? "true" : "false") +
         ", .remainder = " + to_string(c.remainder) + "}";
}

// Where a sampler stands: resume with distributed_sampler::restore.
struct sampler_state {
  std::uint32_t epoch = 0;
  std::size_t position = 0;  // samples of this rank's epoch already handed out

  friend bool operator==(const sampler_state&, const sampler_state&) = default;
};

class distributed_sampler {
 public:
  // The substream of the shuffle's stream; the sample index is one no dataset reaches.
  static constexpr std::uint64_t shuffle_stream_index = rng_stream::max_sample_index;

  explicit distributed_sampler(sampler_config config) : config_(config) {
    if (config_.ranks < 1) {
      throw std::invalid_argument("distributed_sampler: ranks must be at least 1, got " +
                                  std::to_string(config_.ranks));
    }
    if (config_.rank < 0 || config_.rank >= config_.ranks) {
      throw std::invalid_argument("distributed_sampler: rank " + std::to_string(config_.rank) +
                                  " is outside 0.." + std::to_string(config_.ranks - 1));
    }
    if (config_.dataset_size > rng_stream::max_sample_index) {
      throw std::invalid_argument("distributed_sampler: dataset_size " +
                                  std::to_string(config_.dataset_size) + " exceeds 2^48 - 1");
    }
    set_epoch(0);
  }

  const sampler_config& config() const noexcept { return config_; }

  // Samples each rank gets per epoch (the same for every rank).
  std::size_t samples_per_rank() const noexcept {
    const auto n = config_.dataset_size;
    const auto r = static_cast<std::size_t>(config_.ranks);
    if (config_.remainder == remainder_policy::pad) {
      return n == 0 ? 0 : (n + r - 1) / r;
    }
    return n / r;
  }

  // Samples all ranks together get per epoch.
  std::size_t total_samples() const noexcept {
    return samples_per_rank() * static_cast<std::size_t>(config_.ranks);
  }

  // Starts `epoch` with `position` samples of this rank's share already handed out.
  void set_epoch(std::uint32_t epoch, std::size_t position = 0) {
    if (position > samples_per_rank()) {
      throw std::invalid_argument("distributed_sampler: position " + std::to_string(position) +
                                  " is past the epoch's " + std::to_string(samples_per_rank()) +
                                  " samples per rank");
    }
    if (!order_valid_ || order_epoch_ != epoch) {
      build_order(epoch);
    }
    state_ = {.epoch = epoch, .position = position};
  }

  void restore(const sampler_state& state) { set_epoch(state.epoch, state.position); }
  const sampler_state& state() const noexcept { return state_; }
  std::uint32_t epoch() const noexcept { return state_.epoch; }
  std::size_t position() const noexcept { return state_.position; }

  // The dataset index of this rank's k-th sample of the current epoch (k < samples_per_rank()).
  std::size_t index_at(std::size_t k) const {
    check_position(k);
    return order_[global_position(k) % order_.size()];
  }

  // Whether this rank's k-th sample is a repeat added by remainder_policy::pad.
  bool is_padding(std::size_t k) const {
    check_position(k);
    return global_position(k) >= config_.dataset_size;
  }

  // The next sample of this rank, or nothing at the end of the epoch.
  std::optional<std::size_t> next() {
    if (state_.position >= samples_per_rank()) {
      return std::nullopt;
    }
    return index_at(state_.position++);
  }

  // This rank's whole epoch, in order.
  std::vector<std::size_t> epoch_indices() const {
    std::vector<std::size_t> out(samples_per_rank());
    for (std::size_t k = 0; k < out.size(); ++k) {
      out[k] = index_at(k);
    }
    return out;
  }

 private:
  std::size_t global_position(std::size_t k) const noexcept {
    return k * static_cast<std::size_t>(config_.ranks) + static_cast<std::size_t>(config_.rank);
  }

  void check_position(std::size_t k) const {
    if (k >= samples_per_rank()) {
      throw std::out_of_range("distributed_sampler: position " + std::to_string(k) +
                              " is past the epoch's " + std::to_string(samples_per_rank()) +
                              " samples per rank");
    }
  }

  void build_order(std::uint32_t epoch) {
    order_.resize(config_.dataset_size);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    if (config_.shuffle) {
      rng_stream rng = rng_stream::for_sample(config_.seed, epoch, shuffle_stream_index);
      strata::shuffle(order_.begin(), order_.end(), rng);
    }
    order_epoch_ = epoch;
    order_valid_ = true;
  }

  sampler_config config_;
  sampler_state state_{};
  std::vector<std::size_t> order_{};
  std::uint32_t order_epoch_ = 0;
  bool order_valid_ = false;
};

}  // namespace strata::data
