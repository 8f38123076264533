// SPDX-License-Identifier: Apache-2.0
#pragma once

// A pipeline schedule as data. The model is cut into S = p x v consecutive stages ("virtual
// stages"): p ranks each hold v chunks, and virtual stage s = chunk * p + rank (so with v = 1,
// stage s is rank s; with v > 1 a micro-batch visits every rank v times, as interleaved 1F1B
// has it). A step's samples are cut into m micro-batches. A schedule gives each rank the ordered
// list of what it does in one step: forward or backward of micro-batch i through one of its
// chunks, the sends and receives at the stage boundaries, and the optimizer step at the end.
//
// The lists are computed by constexpr functions (so at compile time where p, m and v are
// constants) and the same lists drive the executor (parallel/pipeline.hpp), the tests, the
// simulator (pipeline/simulate.hpp) and the printed timeline (pipeline/timeline.hpp).
//
// What an action means on rank r (stage s = chunk * p + r):
//   forward i           run micro-batch i forward through the chunk; keep what backward needs
//   backward i          its whole backward: input gradient and parameter gradients
//   backward_input i    the input-gradient pass alone (B of a split backward)
//   backward_weight i   the parameter-gradient pass (W), after backward_input
//   send_activation i   hand the chunk's output for i to stage s + 1 (non-blocking)
//   recv_activation i   the chunk's input for i, from stage s - 1 (waits for it)
//   send_gradient i     hand the gradient of the chunk's input to stage s - 1 (non-blocking)
//   recv_gradient i     the gradient of the chunk's output, from stage s + 1 (waits for it)
//   step                the optimizer step, once, after everything else
// with_transfers() adds the sends and receives to lists of compute actions, so a schedule only
// orders the compute.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::pipeline {

enum class op : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
  step,
};

constexpr const char* to_string(op k) noexcept {
  switch (k) {
    case op::forward:
      return "forward";
    case op::backward:
      return "backward";
    case op::backward_input:
      return "backward_input";
    case op::backward_weight:
      return "backward_weight";
    case op::send_activation:
      return "send_activation";
    case op::recv_activation:
      return "recv_activation";
    case op::send_gradient:
      return "send_gradient";
    case op::recv_gradient:
      return "recv_gradient";
    case op::step:
      return "step";
  }
  return "?";
}

// Whether an action computes (forward or a backward pass) rather than moves data.
constexpr bool computes(op k) noexcept {
  return k == op::forward || k == op::backward || k == op::backward_input ||
         k == op::backward_weight;
}

// One entry of a rank's list. `chunk` is this rank's chunk the action belongs to; `peer` the rank
// sent to or received from (-1 for compute and step).
struct action {
  op kind = op::step;
  int micro = 0;
  int chunk = 0;
  int peer = -1;

  friend constexpr bool operator==(const action&, const action&) = default;
};

inline std::string to_string(const action& a) {
  std::string s = to_string(a.kind);
  if (a.kind == op::step) {
    return s;
  }
  s += " " + std::to_string(a.micro);
  if (a.chunk != 0) {
    s += " chunk " + std::to_string(a.chunk);
  }
  if (a.peer >= 0) {
    s += (a.kind == op::send_activation || a.kind == op::send_gradient ? " to " : " from ");
    s += std::to_string(a.peer);
  }
  return s;
}

// The sizes a schedule is made for: p ranks (stages), m micro-batches, v chunks per rank.
struct schedule_shape {
  int stages = 1;
  int micro_batches = 1;
  int chunks = 1;

  constexpr int virtual_stages() const noexcept { return stages * chunks; }
  constexpr int stage_of(int rank, int chunk) const noexcept { return chunk * stages + rank; }
  constexpr int rank_of(int stage) const noexcept { return stage % stages; }
  constexpr int chunk_of(int stage) const noexcept { return stage / stages; }

  friend constexpr bool operator==(const schedule_shape&, const schedule_shape&) = default;
};

inline std::string to_string(const schedule_shape& s) {
  return "schedule_shape{.stages = " + std::to_string(s.stages) +
         ", .micro_batches = " + std::to_string(s.micro_batches) +
         ", .chunks = " + std::to_string(s.chunks) + "}";
}

// Every rank's list for one step: ranks[r] is rank r's.
struct schedule_lists {
  schedule_shape shape{};
  std::vector<std::vector<action>> ranks{};

  friend constexpr bool operator==(const schedule_lists&, const schedule_lists&) = default;
};

// The lists of compute actions `compute` (ranks[r]: rank r's forward and backward passes in
// order, without transfers) with each transfer put where its data is made or needed: a receive
// right before the pass that reads it, a send right after the pass that makes it; then the step.
constexpr schedule_lists with_transfers(schedule_shape shape,
                                        const std::vector<std::vector<action>>& compute) {
  schedule_lists out{.shape = shape, .ranks = {}};
  const int last = shape.virtual_stages() - 1;
  for (int r = 0; r < static_cast<int>(compute.size()); ++r) {
    std::vector<action> list;
    for (const action& a : compute[r]) {
      const int s = shape.stage_of(r, a.chunk);
      const bool is_forward = a.kind == op::forward;
      const bool starts_backward = a.kind == op::backward || a.kind == op::backward_input;
      if (is_forward && s > 0) {
        list.push_back({op::recv_activation, a.micro, a.chunk, shape.rank_of(s - 1)});
      }
      if (starts_backward && s < last) {
        list.push_back({op::recv_gradient, a.micro, a.chunk, shape.rank_of(s + 1)});
      }
      list.push_back({a.kind, a.micro, a.chunk, -1});
      if (is_forward && s < last) {
        list.push_back({op::send_activation, a.micro, a.chunk, shape.rank_of(s + 1)});
      }
      if (starts_backward && s > 0) {
        list.push_back({op::send_gradient, a.micro, a.chunk, shape.rank_of(s - 1)});
      }
    }
    list.push_back({op::step, 0, 0, -1});
    out.ranks.push_back(std::move(list));
  }
  return out;
}

// How far each rank gets through `lists` when every receive waits for its send and sends never
// wait (durations do not matter): position[r] == lists.ranks[r].size() for every rank unless
// the lists deadlock, and then the ranks that stop short wait at the receive they stop at.
// (constexpr: schedules use it to check their own lists.)
constexpr std::vector<std::size_t> reachable(const schedule_lists& lists) {
  const schedule_shape& shape = lists.shape;
  const int stages = shape.virtual_stages();
  const auto slot = [&](bool gradient, int stage, int micro) {
    return (static_cast<std::size_t>(gradient) * static_cast<std::size_t>(stages) +
            static_cast<std::size_t>(stage)) *
               static_cast<std::size_t>(shape.micro_batches) +
           static_cast<std::size_t>(micro);
  };
  std::vector<char> arrived(
      2 * static_cast<std::size_t>(stages) * static_cast<std::size_t>(shape.micro_batches), 0);
  std::vector<std::size_t> next(lists.ranks.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t r = 0; r < lists.ranks.size(); ++r) {
      const auto& list = lists.ranks[r];
      for (; next[r] < list.size(); ++next[r], moved = true) {
        const action& a = list[next[r]];
        const int s = shape.stage_of(static_cast<int>(r), a.chunk);
        if (a.kind == op::recv_activation || a.kind == op::recv_gradient) {
          if (arrived[slot(a.kind == op::recv_gradient, s, a.micro)] == 0) {
            break;
          }
        } else if (a.kind == op::send_activation && s + 1 < stages) {
          arrived[slot(false, s + 1, a.micro)] = 1;
        } else if (a.kind == op::send_gradient && s > 0) {
          arrived[slot(true, s - 1, a.micro)] = 1;
        }
      }
    }
  }
  return next;
}

// Shorthands for schedules that build compute lists.
constexpr action forward(int micro, int chunk = 0) noexcept {
  return {op::forward, micro, chunk, -1};
}
constexpr action backward(int micro, int chunk = 0) noexcept {
  return {op::backward, micro, chunk, -1};
}
constexpr action backward_input(int micro, int chunk = 0) noexcept {
  return {op::backward_input, micro, chunk, -1};
}
constexpr action backward_weight(int micro, int chunk = 0) noexcept {
  return {op::backward_weight, micro, chunk, -1};
}

}  // namespace strata::pipeline
