// SPDX-License-Identifier: Apache-2.0
#pragma once

// Stage balancing: which consecutive layers each pipeline stage holds.
//
// balance(problem) cuts n layers into p non-empty runs of consecutive layers so that the slowest
// stage (the sum of its layers' forward + backward time) is as fast as it can be, with every
// stage's memory within the cap: its layers' fixed bytes (parameters, gradients, optimizer
// state) plus their activation bytes times the micro-batches the stage holds at once (which
// depends on the stage and the schedule: p - r for 1F1B's stage r, m for GPipe). The optimum is
// exact (dynamic programming over the cut points, O(p n^2)). Ties between equally fast splits
// are broken towards less memory on the largest stage (a preference of the search, not a
// guaranteed minimum), then towards the earliest cuts.
//
// A split the user gives (check_split) is checked the same way. Either throws
// std::invalid_argument naming the stage and its bytes when no split fits.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::pipeline {

struct partition_problem {
  int stages = 1;
  std::vector<double> layer_seconds{};                // forward + backward of one micro-batch
  std::vector<std::size_t> layer_fixed_bytes{};       // parameters, gradients, optimizer state
  std::vector<std::size_t> layer_activation_bytes{};  // kept per micro-batch in flight
  // in_flight[r]: micro-batches stage r holds at once (empty: 1 for every stage).
  std::vector<std::size_t> in_flight{};
  std::size_t memory_cap = 0;  // bytes per stage; 0: no cap
};

// boundaries[r] is the first layer of stage r; boundaries[p] == n.
struct partition {
  std::vector<std::size_t> boundaries{};
  std::vector<double> stage_seconds{};
  std::vector<std::size_t> stage_bytes{};

  double slowest() const {
    return stage_seconds.empty() ? 0.0
                                 : *std::max_element(stage_seconds.begin(), stage_seconds.end());
  }
  std::size_t layers(int stage) const {
    return boundaries[static_cast<std::size_t>(stage) + 1] -
           boundaries[static_cast<std::size_t>(stage)];
  }
  friend bool operator==(const partition&, const partition&) = default;
};

inline std::string to_string(const partition& p) {
  std::string s;
  for (std::size_t r = 0; r + 1 < p.boundaries.size(); ++r) {
    s += (r == 0 ? "" : ", ") + std::string("stage ") + std::to_string(r) + ": layers " +
         std::to_string(p.boundaries[r]) + ".." + std::to_string(p.boundaries[r + 1] - 1);
  }
  return s;
}

namespace detail {

inline void check_problem(const partition_problem& pb) {
  const std::size_t n = pb.layer_seconds.size();
  if (pb.stages < 1) {
    throw std::invalid_argument("pipeline partition: " + std::to_string(pb.stages) +
                                " stages; at least 1 is needed");
  }
  if (pb.layer_fixed_bytes.size() != n || pb.layer_activation_bytes.size() != n) {
    throw std::invalid_argument("pipeline partition: " + std::to_string(n) + " layer times but " +
                                std::to_string(pb.layer_fixed_bytes.size()) + " fixed and " +
                                std::to_string(pb.layer_activation_bytes.size()) +
                                " activation sizes");
  }
  if (n < static_cast<std::size_t>(pb.stages)) {
    throw std::invalid_argument("pipeline partition: " + std::to_string(n) +
                                " layers cannot fill " + std::to_string(pb.stages) +
                                " stages (each needs a layer)");
  }
  if (!pb.in_flight.empty() && pb.in_flight.size() != static_cast<std::size_t>(pb.stages)) {
    throw std::invalid_argument("pipeline partition: in_flight has " +
                                std::to_string(pb.in_flight.size()) + " entries for " +
                                std::to_string(pb.stages) + " stages");
  }
}

inline std::size_t in_flight_of(const partition_problem& pb, std::size_t stage) {
  return pb.in_flight.empty() ? 1 : pb.in_flight[stage];
}

// Bytes of layers [a, b) as stage r.
inline std::size_t bytes_of(const partition_problem& pb, std::size_t r, std::size_t a,
                            std::size_t b) {
  std::size_t fixed = 0;
  std::size_t act = 0;
  for (std::size_t i = a; i < b; ++i) {
    fixed += pb.layer_fixed_bytes[i];
    act += pb.layer_activation_bytes[i];
  }
  return fixed + act * in_flight_of(pb, r);
}

inline double seconds_of(const partition_problem& pb, std::size_t a, std::size_t b) {
  double s = 0.0;
  for (std::size_t i = a; i < b; ++i) {
    s += pb.layer_seconds[i];
  }
  return s;
}

inline partition measure(const partition_problem& pb, std::vector<std::size_t> boundaries) {
  partition out{.boundaries = std::move(boundaries), .stage_seconds = {}, .stage_bytes = {}};
  for (std::size_t r = 0; r + 1 < out.boundaries.size(); ++r) {
    out.stage_seconds.push_back(seconds_of(pb, out.boundaries[r], out.boundaries[r + 1]));
    out.stage_bytes.push_back(bytes_of(pb, r, out.boundaries[r], out.boundaries[r + 1]));
  }
  return out;
}

// The split that minimises key(stage r, layers [a, b)) over stages under `fits`, ties broken by
// the second key; returns boundaries, or empty when nothing fits.
template <class Primary, class Secondary, class Fits>
std::vector<std::size_t> best_split(const partition_problem& pb, Primary primary,
                                    Secondary secondary, Fits fits) {
  const std::size_t n = pb.layer_seconds.size();
  const auto p = static_cast<std::size_t>(pb.stages);
  struct cell {
    double first = std::numeric_limits<double>::infinity();
    double second = std::numeric_limits<double>::infinity();
    std::size_t from = 0;
  };
  // best[r][b]: stages 0..r holding layers [0, b).
  std::vector<std::vector<cell>> best(p, std::vector<cell>(n + 1));
  for (std::size_t b = 1; b <= n; ++b) {
    if (fits(0, 0, b)) {
      best[0][b] = {primary(0, 0, b), secondary(0, 0, b), 0};
    }
  }
  for (std::size_t r = 1; r < p; ++r) {
    for (std::size_t b = r + 1; b <= n; ++b) {
      for (std::size_t a = r; a < b; ++a) {
        const cell& before = best[r - 1][a];
        if (before.first == std::numeric_limits<double>::infinity() || !fits(r, a, b)) {
          continue;
        }
        const cell c{std::max(before.first, primary(r, a, b)),
                     std::max(before.second, secondary(r, a, b)), a};
        cell& here = best[r][b];
        if (c.first < here.first || (c.first == here.first && c.second < here.second)) {
          here = c;
        }
      }
    }
  }
  if (best[p - 1][n].first == std::numeric_limits<double>::infinity()) {
    return {};
  }
  std::vector<std::size_t> boundaries(p + 1, 0);
  boundaries[p] = n;
  for (std::size_t r = p - 1, b = n; r > 0; --r) {
    b = best[r][b].from;
    boundaries[r] = b;
  }
  return boundaries;
}

// The error for a cap nothing fits: the split with the smallest peak memory, and its largest
// stage.
[[noreturn]] inline void does_not_fit(const partition_problem& pb) {
  const auto bytes = [&](std::size_t r, std::size_t a, std::size_t b) {
    return static_cast<double>(bytes_of(pb, r, a, b));
  };
  const auto leanest = measure(
      pb, best_split(pb, bytes, bytes, [](std::size_t, std::size_t, std::size_t) { return true; }));
  const auto worst = static_cast<std::size_t>(
      std::max_element(leanest.stage_bytes.begin(), leanest.stage_bytes.end()) -
      leanest.stage_bytes.begin());
  throw std::invalid_argument(
      "pipeline partition: the model does not fit " + std::to_string(pb.stages) +
      " stages of at most " + std::to_string(pb.memory_cap) +
      " bytes: in the split with the least memory (" + to_string(leanest) + "), stage " +
      std::to_string(worst) + " needs " + std::to_string(leanest.stage_bytes[worst]) + " bytes");
}

}  // namespace detail

// The fastest split of pb's layers into pb.stages stages within pb.memory_cap.
inline partition balance(const partition_problem& pb) {
  detail::check_problem(pb);
  const auto seconds = [&](std::size_t, std::size_t a, std::size_t b) {
    return detail::seconds_of(pb, a, b);
  };
  const auto bytes = [&](std::size_t r, std::size_t a, std::size_t b) {
    return static_cast<double>(detail::bytes_of(pb, r, a, b));
  };
  const auto fits = [&](std::size_t r, std::size_t a, std::size_t b) {
    return pb.memory_cap == 0 || detail::bytes_of(pb, r, a, b) <= pb.memory_cap;
  };
  std::vector<std::size_t> boundaries = detail::best_split(pb, seconds, bytes, fits);
  if (boundaries.empty()) {
    detail::does_not_fit(pb);
  }
  return detail::measure(pb, std::move(boundaries));
}

// The split the user gives as layers per stage, checked against pb: one count per stage, each at
// least 1, adding up to the layers; every stage within the cap (else the stage and its bytes).
inline partition check_split(const partition_problem& pb,
                             const std::vector<std::size_t>& layers_per_stage) {
  detail::check_problem(pb);
  const std::size_t n = pb.layer_seconds.size();
  if (layers_per_stage.size() != static_cast<std::size_t>(pb.stages)) {
    throw std::invalid_argument("pipeline partition: a split of " +
                                std::to_string(layers_per_stage.size()) + " stages for " +
                                std::to_string(pb.stages) + " stages");
  }
  std::vector<std::size_t> boundaries{0};
  for (std::size_t r = 0; r < layers_per_stage.size(); ++r) {
    if (layers_per_stage[r] == 0) {
      throw std::invalid_argument("pipeline partition: stage " + std::to_string(r) +
                                  " of the split has no layer");
    }
    boundaries.push_back(boundaries.back() + layers_per_stage[r]);
  }
  if (boundaries.back() != n) {
    throw std::invalid_argument("pipeline partition: the split holds " +
                                std::to_string(boundaries.back()) + " layers, the model has " +
                                std::to_string(n));
  }
  partition out = detail::measure(pb, std::move(boundaries));
  for (std::size_t r = 0; r < out.stage_bytes.size(); ++r) {
    if (pb.memory_cap != 0 && out.stage_bytes[r] > pb.memory_cap) {
      throw std::invalid_argument("pipeline partition: stage " + std::to_string(r) + " (layers " +
                                  std::to_string(out.boundaries[r]) + ".." +
                                  std::to_string(out.boundaries[r + 1] - 1) + ") needs " +
                                  std::to_string(out.stage_bytes[r]) + " bytes, over the cap of " +
                                  std::to_string(pb.memory_cap));
    }
  }
  return out;
}

}  // namespace strata::pipeline
