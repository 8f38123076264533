// SPDX-License-Identifier: Apache-2.0
#pragma once

// A simulated (or measured) run of a schedule as text: one row per rank, one cell per time unit,
// each cell the pass that ran in it ("F3" forward of micro-batch 3, "B3" its whole backward or
// its input-gradient pass, "W3" the weight pass; ":1" after the number: chunk 1) or "." idle.
//
//   gpipe, 2 stages, 3 micro-batches: makespan 8, bubble 25.0%
//   rank 0 | F0 F1 F2 .  .  B0 B0 B1 B1 B2 B2 |
//   ...

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/simulate.hpp"

namespace strata::pipeline {

// The cell label of a pass.
inline std::string pass_label(const action& a) {
  char letter = 'F';
  if (a.kind == op::backward || a.kind == op::backward_input) {
    letter = 'B';
  } else if (a.kind == op::backward_weight) {
    letter = 'W';
  }
  std::string s(1, letter);
  s += std::to_string(a.micro);
  if (a.chunk != 0) {
    s += ":" + std::to_string(a.chunk);
  }
  return s;
}

struct timeline_config {
  double unit = 0.0;  // the time one cell stands for; 0: the shortest pass
};

// The text timeline of `run`, headed by `title`.
inline std::string text_timeline(std::string_view title, const schedule_shape& shape,
                                 const simulation& run, timeline_config config = {}) {
  double unit = config.unit;
  if (unit <= 0.0) {
    unit = 0.0;
    for (const timed_action& t : run.passes) {
      const double d = t.end - t.begin;
      if (d > 0.0 && (unit == 0.0 || d < unit)) {
        unit = d;
      }
    }
    if (unit == 0.0) {
      unit = 1.0;
    }
  }
  const auto cells = static_cast<std::size_t>(std::ceil(run.makespan / unit - 1e-9));
  std::size_t width = 1;
  std::vector<std::vector<std::string>> grid(static_cast<std::size_t>(shape.stages),
                                             std::vector<std::string>(cells, "."));
  for (const timed_action& t : run.passes) {
    const std::string label = pass_label(t.what);
    width = std::max(width, label.size());
    const auto first = static_cast<std::size_t>(std::llround(t.begin / unit));
    const auto last = static_cast<std::size_t>(std::llround(t.end / unit));
    for (std::size_t c = first; c < last && c < cells; ++c) {
      grid[static_cast<std::size_t>(t.rank)][c] = label;
    }
  }
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "%.1f%%", 100.0 * run.bubble());
  char makespan[32];
  std::snprintf(makespan, sizeof makespan, "%g", run.makespan);
  std::string out = std::string(title) + ", " + std::to_string(shape.stages) + " stages, " +
                    std::to_string(shape.micro_batches) + " micro-batches" +
                    (shape.chunks > 1 ? ", " + std::to_string(shape.chunks) + " chunks" : "") +
                    ": makespan " + makespan + ", bubble " + bubble + "\n";
  const std::size_t rank_width = std::to_string(shape.stages - 1).size();
  for (std::size_t r = 0; r < grid.size(); ++r) {
    std::string name = std::to_string(r);
    name.insert(0, rank_width - name.size(), ' ');
    out += "rank " + name + " |";
    for (const std::string& cell : grid[r]) {
      out += " " + cell + std::string(width - cell.size(), ' ');
    }
    out += " |\n";
  }
  return out;
}

}  // namespace strata::pipeline
