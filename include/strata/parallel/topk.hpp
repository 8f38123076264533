// SPDX-License-Identifier: Apache-2.0
#pragma once

// Top-k gradient sparsification with error feedback, and its all-gather exchange.
//
// Each rank sends only the k = floor(ratio x n) entries of largest magnitude of its gradient (at
// least one), as (index, value) pairs. What it did not send is not lost: the rank keeps it as its
// residual and adds it to the next step's gradient before choosing again (error feedback), so
// every gradient contribution is applied eventually. The pairs of different ranks name different
// indices, so they cannot be summed by an all-reduce: they travel by all-gather (or to the
// parameter server, parallel/ps/exchange.hpp), and every rank adds all ranks' pairs up in
// rank order, which gives the same sum on every rank.
//
//   parallel::topk_compressor tk(params.size(), 0.01);
//   ... backward ...
//   parallel::topk_all_gather(comm, tk, params.grads(), loss_scale);   // grads := the average
//
// `scale` is the factor the gradients carry (a mixed-precision loss scale, else 1): the residual
// is kept unscaled, so a scale that changes between steps does not change what it is worth.
// With ratio 1 every entry is sent and the result equals a dense average (up to the order of the
// float additions). Selection is deterministic: ties in magnitude go to the lower index, and a
// NaN counts as an infinite magnitude (so that a non-finite gradient travels and a
// mixed-precision check sees it).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/core/dtype.hpp"

namespace strata::parallel {

// How many of n entries top-k with `ratio` sends: floor(ratio x n), at least 1 (0 when n is 0),
// at most n. Rounding down keeps the bytes sent at or under the ratio.
inline std::size_t topk_count(std::size_t n, double ratio) {
  if (n == 0) {
    return 0;
  }
  if (!(ratio > 0.0) || ratio > 1.0) {
    throw std::invalid_argument("parallel::topk_count: ratio " + std::to_string(ratio) +
                                " is not in (0, 1] (config key topk_ratio)");
  }
  const auto k = static_cast<std::size_t>(std::floor(ratio * static_cast<double>(n)));
  return std::clamp<std::size_t>(k, 1, n);
}

// One rank's top-k state: the residual of error feedback and the selection scratch.
class topk_compressor {
 public:
  topk_compressor() = default;
  // `counted`: the entries k is counted from (the parameters without the padding at the end of
  // a store padded to equal shards, so that padding does not change what is sent); n if 0.
  topk_compressor(std::size_t n, double ratio, std::size_t counted = 0)
      : residual_(n, 0.0f), k_(std::min(n, topk_count(counted > 0 ? counted : n, ratio))) {
    if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw std::invalid_argument("parallel::topk_compressor: " + std::to_string(n) +
                                  " gradients do not fit the 31-bit indices of the wire format");
    }
  }

  std::size_t size() const noexcept { return residual_.size(); }
  std::size_t k() const noexcept { return k_; }

  // What was not sent so far, unscaled (kept per rank; checkpoints save it).
  std::span<float> residual() noexcept { return residual_; }
  std::span<const float> residual() const noexcept { return residual_; }

  // Adds scale x residual to `grads` (in place), chooses the k entries of largest magnitude and
  // appends them to `pairs` as (index, value bits) int32 pairs in increasing index order; the
  // residual becomes what was not chosen, divided by scale. grads keeps the corrected gradient.
  void select(std::span<float> grads, float scale, std::vector<std::int32_t>& pairs) {
    if (grads.size() != residual_.size()) {
      throw std::invalid_argument("parallel::topk_compressor: " + std::to_string(grads.size()) +
                                  " gradients, but the compressor was made for " +
                                  std::to_string(residual_.size()));
    }
    const std::size_t n = grads.size();
    pairs.reserve(pairs.size() + 2 * k_);
    auto take = [&](std::size_t i) {
      pairs.push_back(static_cast<std::int32_t>(i));
      pairs.push_back(std::bit_cast<std::int32_t>(grads[i]));
      residual_[i] = 0.0f;
    };
    if (k_ == n) {
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] += scale * residual_[i];
        take(i);
      }
      return;
    }
    magnitude_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      grads[i] += scale * residual_[i];
      magnitude_[i] = key(grads[i]);
    }
    // The k-th largest magnitude: entries above it are taken, entries equal to it by lowest
    // index until k are. Found among the candidates above a bound estimated from an evenly
    // spaced sample (about 1.5 k of them), or among all entries when the bound leaves fewer
    // than k: the result is the same either way.
    const float threshold = kth_largest();
    std::size_t above = 0;
    for (const float m : candidates_) {
      above += m > threshold ? 1 : 0;
    }
    std::size_t equal_quota = k_ - above;
    // Everything into the residual first (one vectorisable pass), then the chosen out of it.
    if (scale == 1.0f) {
      std::copy(grads.begin(), grads.end(), residual_.begin());
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        residual_[i] = grads[i] / scale;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float m = magnitude_[i];
      if (m >= threshold) {
        if (m > threshold) {
          take(i);
        } else if (equal_quota > 0) {
          --equal_quota;
          take(i);
        }
      }
    }
  }

 private:
  // The k-th largest of magnitude_; leaves in candidates_ every magnitude at or above it.
  float kth_largest() {
    const std::size_t n = magnitude_.size();
    constexpr std::size_t sample_size = 65536;
    if (n >= 4 * sample_size && k_ * 8 < n) {
      sample_.resize(sample_size);
      const std::size_t stride = n / sample_size;
      for (std::size_t j = 0; j < sample_size; ++j) {
        sample_[j] = magnitude_[j * stride];
      }
      // The sample's r-th largest, r about 1.5 times the share k / n of the sample.
      const std::size_t r = std::min(sample_size - 1, k_ * sample_size * 3 / (2 * n) + 16);
      std::nth_element(sample_.begin(), sample_.begin() + static_cast<std::ptrdiff_t>(r),
                       sample_.end(), std::greater<float>());
      const float bound = sample_[r];
      candidates_.clear();
      for (const float m : magnitude_) {
        if (m >= bound) {
          candidates_.push_back(m);
        }
      }
      if (candidates_.size() >= k_) {
        std::nth_element(candidates_.begin(),
                         candidates_.begin() + static_cast<std::ptrdiff_t>(k_ - 1),
                         candidates_.end(), std::greater<float>());
        return candidates_[k_ - 1];
      }
    }
    candidates_.assign(magnitude_.begin(), magnitude_.end());
    std::nth_element(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k_ - 1),
                     candidates_.end(), std::greater<float>());
    return candidates_[k_ - 1];
  }

  // The ordering key: the magnitude, NaN as infinity.
  static float key(float v) noexcept {
    const float m = std::fabs(v);
    return m == m ? m : std::numeric_limits<float>::infinity();
  }

  std::vector<float> residual_{};
  std::size_t k_ = 0;
  std::vector<float> magnitude_{};   // the corrected gradients' ordering keys
  std::vector<float> sample_{};      // the evenly spaced sample of them
  std::vector<float> candidates_{};  // those at or above the sample's bound
};

// Adds (index, value bits) pairs into `dense` (`dense` covers indices [first, first + size)).
inline void add_topk_pairs(std::span<const std::int32_t> pairs, std::span<float> dense,
                           std::size_t first = 0) {
  for (std::size_t p = 0; p + 1 < pairs.size(); p += 2) {
    const auto index = static_cast<std::size_t>(pairs[p]) - first;
    dense[index] += std::bit_cast<float>(pairs[p + 1]);
  }
}

// The all-gather exchange: every rank selects its top-k (with error feedback), all ranks' pairs
// are gathered, and `grads` becomes their sum over the ranks in rank order divided by the number
// of ranks: the same average on every rank. Collective. Bytes on the wire per rank: the k pairs
// of 8 bytes (a dense float32 all-reduce moves about 8 bytes per entry over a ring).
inline void topk_all_gather(comm::any_comm comm, topk_compressor& tk, std::span<float> grads,
                            float scale, std::vector<std::int32_t>& mine,
                            std::vector<std::int32_t>& all) {
  mine.clear();
  tk.select(grads, scale, mine);
  const auto ranks = static_cast<std::size_t>(comm.size());
  all.resize(mine.size() * ranks);
  comm.all_gather(mine.data(), all.data(), mine.size(), dtype::int32);
  std::fill(grads.begin(), grads.end(), 0.0f);
  add_topk_pairs(all, grads);
  const auto n = static_cast<float>(ranks);
  for (float& g : grads) {
    g /= n;
  }
}

}  // namespace strata::parallel
