// SPDX-License-Identifier: Apache-2.0
#pragma once

// Schedules checked and run without a model.
//
// check_lists(lists) names every way the lists are not one valid step: a micro-batch that does
// not pass forward and back through every stage exactly once, a backward before its forward,
// a weight pass before its input pass, a transfer without its counterpart or with the wrong
// peer, a pass before the receive of its input, the step missing or not last.
//
// simulate(lists, times) replays them as the executor does: each rank runs its list in order,
// a pass takes its duration, a send does not wait, a receive waits until its data has arrived
// (the send's time plus the transfer time). It reports when each pass ran, the makespan, each
// rank's busy time, the idle share (the bubble), the most micro-batches each rank held between
// forward and the end of their backward, and whether (and where) the ranks deadlock.

#include <algorithm>
#include <cstddef>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "strata/pipeline/schedule.hpp"

namespace strata::pipeline {

// Every problem of `lists` as a step, in words; empty when they are valid.
inline std::vector<std::string> check_lists(const schedule_lists& lists) {
  const schedule_shape& shape = lists.shape;
  std::vector<std::string> problems;
  const auto say = [&](int rank, std::size_t index, const std::string& what) {
    problems.push_back("rank " + std::to_string(rank) + ", action " + std::to_string(index) + ": " +
                       what);
  };
  if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks < 1) {
    problems.push_back("the shape " + to_string(shape) + " has a size below 1");
    return problems;
  }
  if (static_cast<int>(lists.ranks.size()) != shape.stages) {
    problems.push_back("lists for " + std::to_string(lists.ranks.size()) +
                       " ranks, the shape has " + std::to_string(shape.stages) + " stages");
    return problems;
  }
  const int last = shape.virtual_stages() - 1;
  // Per (virtual stage, micro-batch): where each kind of action sits in its rank's list.
  std::map<std::tuple<op, int, int>, std::vector<std::size_t>> at;
  for (int r = 0; r < shape.stages; ++r) {
    const auto& list = lists.ranks[static_cast<std::size_t>(r)];
    if (list.empty() || list.back().kind != op::step) {
      say(r, list.size(), "the list does not end with the step");
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      const action& a = list[i];
      if (a.kind == op::step) {
        if (i + 1 != list.size()) {
          say(r, i, "a step before the end of the list");
        }
        continue;
      }
      if (a.micro < 0 || a.micro >= shape.micro_batches || a.chunk < 0 || a.chunk >= shape.chunks) {
        say(r, i, to_string(a) + " is outside " + to_string(shape));
        continue;
      }
      const int s = shape.stage_of(r, a.chunk);
      int want_peer = -1;
      if (a.kind == op::send_activation) {
        want_peer = s < last ? shape.rank_of(s + 1) : -2;
      } else if (a.kind == op::recv_activation) {
        want_peer = s > 0 ? shape.rank_of(s - 1) : -2;
      } else if (a.kind == op::send_gradient) {
        want_peer = s > 0 ? shape.rank_of(s - 1) : -2;
      } else if (a.kind == op::recv_gradient) {
        want_peer = s < last ? shape.rank_of(s + 1) : -2;
      }
      if (want_peer == -2) {
        say(r, i, to_string(a) + ": stage " + std::to_string(s) + " has no such neighbour");
        continue;
      }
      if (a.peer != want_peer) {
        say(r, i,
            to_string(a) + ": the peer of stage " + std::to_string(s) + " is rank " +
                std::to_string(want_peer));
        continue;
      }
      at[{a.kind, s, a.micro}].push_back(i);
    }
  }
  if (!problems.empty()) {
    return problems;
  }
  const auto positions = [&](op k, int s, int i) -> const std::vector<std::size_t>& {
    static const std::vector<std::size_t> none;
    const auto it = at.find({k, s, i});
    return it == at.end() ? none : it->second;
  };
  const auto once = [&](op k, int s, int i, bool wanted) {
    const auto n = positions(k, s, i).size();
    if (n != (wanted ? 1u : 0u)) {
      problems.push_back("stage " + std::to_string(s) + ", micro-batch " + std::to_string(i) +
                         ": " + std::to_string(n) + " " + to_string(k) + " actions, expected " +
                         (wanted ? "1" : "0"));
      return false;
    }
    return true;
  };
  for (int s = 0; s <= last; ++s) {
    const int r = shape.rank_of(s);
    for (int i = 0; i < shape.micro_batches; ++i) {
      const auto where = [&](std::size_t index) {
        return "stage " + std::to_string(s) + " (rank " + std::to_string(r) + "), micro-batch " +
               std::to_string(i) + ", action " + std::to_string(index);
      };
      if (!once(op::forward, s, i, true)) {
        continue;
      }
      const std::size_t f = positions(op::forward, s, i)[0];
      const bool whole = !positions(op::backward, s, i).empty();
      std::size_t b = 0;
      if (whole) {
        if (!once(op::backward, s, i, true) || !once(op::backward_input, s, i, false) ||
            !once(op::backward_weight, s, i, false)) {
          continue;
        }
        b = positions(op::backward, s, i)[0];
      } else {
        if (!once(op::backward_input, s, i, true) || !once(op::backward_weight, s, i, true)) {
          continue;
        }
        b = positions(op::backward_input, s, i)[0];
        if (positions(op::backward_weight, s, i)[0] < b) {
          problems.push_back(where(positions(op::backward_weight, s, i)[0]) +
                             ": backward_weight before backward_input");
        }
      }
      if (b < f) {
        problems.push_back(where(b) + ": backward before forward");
      }
      // Transfers: one receive before the pass that reads it, one send after the pass that
      // makes it, each matched on the neighbour's rank by the lists' validity checks above.
      if (once(op::recv_activation, s, i, s > 0) && s > 0 &&
          positions(op::recv_activation, s, i)[0] > f) {
        problems.push_back(where(f) + ": forward before the receive of its input");
      }
      if (once(op::send_activation, s, i, s < last) && s < last &&
          positions(op::send_activation, s, i)[0] < f) {
        problems.push_back(where(f) + ": the activation sent before the forward made it");
      }
      if (once(op::recv_gradient, s, i, s < last) && s < last &&
          positions(op::recv_gradient, s, i)[0] > b) {
        problems.push_back(where(b) + ": backward before the receive of its gradient");
      }
      if (once(op::send_gradient, s, i, s > 0) && s > 0 &&
          positions(op::send_gradient, s, i)[0] < b) {
        problems.push_back(where(b) + ": the gradient sent before the backward made it");
      }
    }
  }
  return problems;
}

// How long each action takes in a simulation (any unit).
struct action_times {
  double forward = 1.0;
  double backward_input = 1.0;   // B; a whole backward takes backward_input + backward_weight
  double backward_weight = 1.0;  // W
  double transfer = 0.0;         // from a send to the data's arrival
  // Per virtual stage: its passes take this multiple of the times above (empty: all 1).
  std::vector<double> stage_scale{};

  double of(op k, int stage) const {
    const double scale = stage < static_cast<int>(stage_scale.size())
                             ? stage_scale[static_cast<std::size_t>(stage)]
                             : 1.0;
    switch (k) {
      case op::forward:
        return forward * scale;
      case op::backward:
        return (backward_input + backward_weight) * scale;
      case op::backward_input:
        return backward_input * scale;
      case op::backward_weight:
        return backward_weight * scale;
      default:
        return 0.0;
    }
  }
};

// One pass as it ran.
struct timed_action {
  int rank = 0;
  action what{};
  double begin = 0.0;
  double end = 0.0;
};

struct simulation {
  bool deadlocked = false;
  std::string stuck{};  // a deadlock: each rank that waits and the receive it waits at
  double makespan = 0.0;
  std::vector<double> busy{};          // per rank: time spent in passes
  std::vector<int> peak_in_flight{};   // per rank: most (micro-batch, chunk)s held at once
  std::vector<timed_action> passes{};  // every pass, in the order they were run
  // The share of the ranks' time spent idle: 1 - sum(busy) / (ranks x makespan).
  double bubble() const {
    if (busy.empty() || makespan <= 0.0) {
      return 0.0;
    }
    const double work = std::accumulate(busy.begin(), busy.end(), 0.0);
    return 1.0 - work / (static_cast<double>(busy.size()) * makespan);
  }
};

// Runs `lists` with `times`. The lists should pass check_lists first.
inline simulation simulate(const schedule_lists& lists, const action_times& times = {}) {
  const schedule_shape& shape = lists.shape;
  const auto p = lists.ranks.size();
  simulation out;
  out.busy.assign(p, 0.0);
  out.peak_in_flight.assign(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<std::size_t> next(p, 0);
  std::vector<int> in_flight(p, 0);
  // (is a gradient, receiving virtual stage, micro-batch) -> arrival time
  std::map<std::tuple<bool, int, int>, double> arrivals;
  bool moved = true;
  while (moved) {
    moved = false;
    for (std::size_t r = 0; r < p; ++r) {
      const auto& list = lists.ranks[r];
      while (next[r] < list.size()) {
        const action& a = list[next[r]];
        const int s = shape.stage_of(static_cast<int>(r), a.chunk);
        if (a.kind == op::recv_activation || a.kind == op::recv_gradient) {
          const auto it = arrivals.find({a.kind == op::recv_gradient, s, a.micro});
          if (it == arrivals.end()) {
            break;
          }
          clock[r] = std::max(clock[r], it->second);
        } else if (a.kind == op::send_activation) {
          arrivals[{false, s + 1, a.micro}] = clock[r] + times.transfer;
        } else if (a.kind == op::send_gradient) {
          arrivals[{true, s - 1, a.micro}] = clock[r] + times.transfer;
        } else if (computes(a.kind)) {
          const double d = times.of(a.kind, s);
          out.passes.push_back(
              {.rank = static_cast<int>(r), .what = a, .begin = clock[r], .end = clock[r] + d});
          clock[r] += d;
          out.busy[r] += d;
          if (a.kind == op::forward) {
            out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++in_flight[r]);
          } else if (a.kind == op::backward || a.kind == op::backward_weight) {
            --in_flight[r];
          }
        }
        ++next[r];
        moved = true;
      }
    }
  }
  for (std::size_t r = 0; r < p; ++r) {
    out.makespan = std::max(out.makespan, clock[r]);
    if (next[r] < lists.ranks[r].size()) {
      out.deadlocked = true;
      out.stuck += (out.stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                   " waits at action " + std::to_string(next[r]) + " (" +
                   to_string(lists.ranks[r][next[r]]) + ")";
    }
  }
  return out;
}

}  // namespace strata::pipeline
