// SPDX-License-Identifier: Apache-2.0
#pragma once

// interleaved_1f1b<V>: each rank holds V chunks of the model (virtual stage s = chunk * p + rank,
// so a micro-batch passes every rank V times) and runs 1F1B over them. Micro-batches go in rounds
// of p (the last round may be smaller): a rank runs a round's forwards through chunk 0, then
// through chunk 1, ..., and the backwards through the chunks in reverse. Rank r first runs
// 2 (p - r - 1) + (V - 1) p forwards (all of them when there are no more), then alternates one
// forward and one backward, then drains. Each pass is 1/V of a stage's work, so the fill and
// drain shrink V times: with equal times the idle share is (p - 1) / (V m + p - 1) when m is a
// multiple of p. The price: V times as many transfers, and more activations in flight.

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/shape_check.hpp"

namespace strata::pipeline {

template <int V>
struct interleaved_1f1b {
  static_assert(V >= 1, "PipelineSchedule: interleaved_1f1b<V> needs V >= 1 chunks per rank");
  using policy_category = pipeline_schedule_tag;
  static constexpr std::string_view name = "interleaved_1f1b";
  static constexpr int chunks = V;
  static constexpr bool splits_backward = false;

  constexpr schedule_lists lists(schedule_shape shape) const {
    detail::check_shape(shape, chunks, name);
    const int p = shape.stages;
    const int m = shape.micro_batches;
    // The (micro-batch, chunk) order of a rank's forwards and of its backwards.
    std::vector<std::pair<int, int>> forwards;
    std::vector<std::pair<int, int>> backwards;
    for (int first = 0; first < m; first += p) {
      const int round = std::min(p, m - first);
      for (int c = 0; c < V; ++c) {
        for (int j = 0; j < round; ++j) {
          forwards.push_back({first + j, c});
          backwards.push_back({first + j, V - 1 - c});
        }
      }
    }
    const int total = m * V;
    std::vector<int> warmup(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      warmup[static_cast<std::size_t>(r)] = std::min(2 * (p - r - 1) + (V - 1) * p, total);
    }
    // With a last round smaller than p, a rank can need the gradient of a chunk whose forward
    // input it has not sent yet: such a rank runs one more forward first, until nothing waits
    // for ever (every rank running all its forwards first, as GPipe, never does).
    for (;;) {
      schedule_lists out = with_transfers(shape, order(p, total, warmup, forwards, backwards));
      const std::vector<std::size_t> reached = reachable(out);
      bool stuck = false;
      for (int r = 0; r < p; ++r) {
        const auto& list = out.ranks[static_cast<std::size_t>(r)];
        const std::size_t at = reached[static_cast<std::size_t>(r)];
        if (at < list.size() && list[at].kind == op::recv_gradient &&
            warmup[static_cast<std::size_t>(r)] < total) {
          ++warmup[static_cast<std::size_t>(r)];
          stuck = true;
        }
      }
      if (!stuck) {
        return out;
      }
    }
  }

 private:
  // The compute lists: warmup[r] forwards on rank r, then forward and backward in turn, then the
  // backwards left.
  static constexpr std::vector<std::vector<action>> order(
      int p, int total, const std::vector<int>& warmup,
      const std::vector<std::pair<int, int>>& forwards,
      const std::vector<std::pair<int, int>>& backwards) {
    std::vector<std::vector<action>> compute(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& list = compute[static_cast<std::size_t>(r)];
      int f = 0;
      int b = 0;
      for (; f < warmup[static_cast<std::size_t>(r)]; ++f) {
        list.push_back(forward(forwards[f].first, forwards[f].second));
      }
      for (; f < total; ++f, ++b) {
        list.push_back(forward(forwards[f].first, forwards[f].second));
        list.push_back(backward(backwards[b].first, backwards[b].second));
      }
      for (; b < total; ++b) {
        list.push_back(backward(backwards[b].first, backwards[b].second));
      }
    }
    return compute;
  }
};

}  // namespace strata::pipeline
