// SPDX-License-Identifier: Apache-2.0
#pragma once

// The conformance suite of the batch_policy concept (batch/concepts.hpp): one test body run on
// every batch policy, shipped or a user's, through a recording step_runner that has no model
// behind it. It checks the written semantics:
//   - sizes: loader_batch() > 0, loader_batches(step) >= 1;
//   - coverage: each step's micro-steps since its last restart() are the step's samples exactly
//     once, in order, on contiguous slices, none larger than the workspace the policy asked for;
//   - last: at most one micro-step per step passes last = true, it is the step's final one, and
//     only inside the run() of the step's last loader batch;
//   - memory: under a runner whose micro-steps fail to allocate above a size, run() either
//     completes the step (every sample covered) or lets the memory_error out;
//   - determinism and state: two policies fed the same steps decide alike, and a policy
//     restored from another's state() decides as the writer does from then on.
// Failures are collected into a report (as the comm suite does), so one run lists all of them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance/findings.hpp"
#include "strata/batch/concepts.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"

namespace strata::conformance {

using batch_report = findings;

// A step_runner that records what the policy asks of it. Each micro-step reserves
// bytes_per_sample per sample from its own memory tracker (so that budgets and peaks are real)
// and fails to allocate when a slice has more than fail_above samples.
class recording_runner {
 public:
  struct call {
    std::vector<std::size_t> indices{};
    bool last = false;
    std::size_t capacity = 0;  // the workspace when it ran
  };

  std::size_t bytes_per_sample = 1000;
  std::size_t budget = std::size_t{1} << 30;
  std::size_t fail_above = std::numeric_limits<std::size_t>::max();
  std::size_t agree_cap = std::numeric_limits<std::size_t>::max();  // "another rank" proposes this

  std::uint64_t current_step = 0;
  bool in_last_run = false;  // set by the driver around the run() of a step's last batch
  std::vector<call> since_restart{};
  std::vector<std::vector<std::size_t>> slicings{};  // every micro-step's size, per step
  std::size_t last_flags = 0;
  bool workspace_set = false;
  std::vector<std::string> violations{};

  model::loss_result micro_step(const batch::samples& s, bool last) {
    if (!since_restart.empty() && since_restart.back().last) {
      violations.push_back("step " + std::to_string(current_step) +
                           ": a micro-step after the one with last = true");
    }
    if (last && !in_last_run) {
      violations.push_back("step " + std::to_string(current_step) +
                           ": last = true outside the run() of the step's last loader batch");
    }
    if (s.size == 0) {
      violations.push_back("step " + std::to_string(current_step) + ": an empty micro-step");
    }
    if (!workspace_set || capacity_ < s.size) {
      if (workspace_set) {
        violations.push_back("step " + std::to_string(current_step) + ": a micro-step of " +
                             std::to_string(s.size) + " samples in a workspace of " +
                             std::to_string(capacity_));
      }
      capacity_ = std::max(capacity_, s.size);  // the trainer grows it for a policy that asks none
    }
    if (s.size > fail_above) {
      throw memory_error({.space = "recording_runner",
                          .requested = s.size * bytes_per_sample,
                          .in_use = tracker_.stats().in_use,
                          .budget = fail_above * bytes_per_sample},
                         "a micro-step of " + std::to_string(s.size) + " samples");
    }
    tracker_.reserve(s.size * bytes_per_sample);
    tracker_.release(s.size * bytes_per_sample);
    since_restart.push_back(
        {.indices = {s.indices.begin(), s.indices.end()}, .last = last, .capacity = capacity_});
    step_sizes_.push_back(s.size);
    last_flags += last ? 1 : 0;
    model::loss_result r{};
    r.loss_sum = static_cast<double>(s.size);
    r.correct = s.size;
    r.samples = s.size;
    return r;
  }
  void restart() {
    since_restart.clear();
    step_sizes_.clear();
  }
  void set_workspace(std::size_t samples) {
    workspace_set = samples > 0;
    capacity_ = samples;
  }
  std::size_t workspace_capacity() const { return capacity_; }
  std::uint64_t step() const { return current_step; }
  std::size_t memory_budget() const { return budget; }
  memory_tracker& memory() { return tracker_; }
  std::size_t activation_bytes(std::size_t micro) const { return micro * bytes_per_sample; }
  std::size_t agree_min(std::size_t value) { return std::min(value, agree_cap); }
  void message(std::string line) { messages.push_back(std::move(line)); }

  // Called by the driver at a step's start and end.
  void start_step(std::uint64_t step) {
    current_step = step;
    since_restart.clear();
    step_sizes_.clear();
  }
  void end_step() { slicings.push_back(step_sizes_); }

  std::vector<std::string> messages{};

 private:
  memory_tracker tracker_{"recording_runner"};
  std::size_t capacity_ = 0;
  std::vector<std::size_t> step_sizes_{};
};

// Runs `steps` optimizer steps of policy `p` from step `first` on `r` over a stream of samples
// numbered from `*next_index` (the samples' indices), checking coverage and `last` per step.
template <batch::batch_policy B>
void run_steps(B& p, recording_runner& r, std::uint64_t first, std::uint64_t steps,
               std::size_t* next_index, batch_report& rep, const std::string& who) {
  const std::size_t per = 3;  // input floats per sample
  for (std::uint64_t step = first; step < first + steps; ++step) {
    r.start_step(step);
    const std::size_t batches = p.loader_batches(step);
    rep.expect(batches >= 1, who + ": loader_batches(" + std::to_string(step) + ") is 0");
    std::vector<std::size_t> expected;
    model::loss_result total{};
    for (std::size_t k = 0; k < batches; ++k) {
      // The epoch's short last batch: every fifth step's last loader batch has 3 samples fewer.
      std::size_t n = p.loader_batch();
      if (k + 1 == batches && step % 5 == 4 && n > 3) {
        n -= 3;
      }
      std::vector<std::size_t> indices(n);
      std::iota(indices.begin(), indices.end(), *next_index);
      *next_index += n;
      std::vector<float> inputs(n * per, 0.5f);
      std::vector<std::int32_t> labels(n, 1);
      expected.insert(expected.end(), indices.begin(), indices.end());
      r.in_last_run = k + 1 == batches;
      const model::loss_result part = p.run(
          r, {.inputs = inputs, .labels = labels, .indices = indices, .size = n}, k + 1 == batches);
      total.loss_sum += part.loss_sum;
      total.correct += part.correct;
    }
    r.in_last_run = false;
    std::vector<std::size_t> seen;
    for (const auto& c : r.since_restart) {
      seen.insert(seen.end(), c.indices.begin(), c.indices.end());
    }
    rep.expect(seen == expected, who + ": step " + std::to_string(step) + " ran " +
                                     std::to_string(seen.size()) +
                                     " samples since its last restart, not its " +
                                     std::to_string(expected.size()) + " in order, once each");
    rep.expect(total.correct == expected.size(),
               who + ": step " + std::to_string(step) +
                   ": run() reported the loss of other samples than the step's");
    std::size_t lasts = 0;
    for (std::size_t i = 0; i < r.since_restart.size(); ++i) {
      lasts += r.since_restart[i].last ? 1 : 0;
      if (r.since_restart[i].last) {
        rep.expect(i + 1 == r.since_restart.size(),
                   who + ": step " + std::to_string(step) + ": last = true before the end");
      }
    }
    rep.expect(lasts <= 1, who + ": step " + std::to_string(step) + ": last = true twice");
    rep.expect(p.micro_batch() > 0, who + ": micro_batch() is 0 after a step");
    r.end_step();
  }
  for (const auto& v : r.violations) {
    rep.expect(false, who + ": " + v);
  }
  r.violations.clear();
}

// The suite: every check above on policy B made from `cfg`.
template <batch::batch_policy B>
batch_report check_batch_policy_semantics(const config::train_config& cfg) {
  batch_report rep;
  const std::string who(B::name);
  B::check_config(cfg);
  {
    const B p(cfg);
    rep.expect(p.loader_batch() > 0, who + ": loader_batch() is 0");
    for (const std::uint64_t s : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7},
                                  std::uint64_t{1000}, std::numeric_limits<std::uint64_t>::max()}) {
      rep.expect(p.loader_batches(s) >= 1,
                 who + ": loader_batches(" + std::to_string(s) + ") is 0");
    }
  }
  // Coverage, last, workspace; two policies fed alike decide alike.
  B a(cfg);
  B b(cfg);
  recording_runner ra;
  recording_runner rb;
  a.begin(ra);
  b.begin(rb);
  std::size_t ia = 0;
  std::size_t ib = 0;
  run_steps(a, ra, 0, 12, &ia, rep, who);
  run_steps(b, rb, 0, 12, &ib, rep, who);
  rep.expect(ra.slicings == rb.slicings, who + ": two policies fed the same steps cut them apart");

  // State: a policy restored from a's state decides as a does from here on.
  const nlohmann::json saved = a.state();
  B c(cfg);
  c.restore(nlohmann::json::parse(saved.dump()));  // through text, as a checkpoint keeps it
  recording_runner rc;
  c.begin(rc);
  ra.slicings.clear();
  std::size_t ic = ia;
  run_steps(a, ra, 12, 8, &ia, rep, who);
  run_steps(c, rc, 12, 8, &ic, rep, who);
  rep.expect(ra.slicings == rc.slicings,
             who +
                 ": a policy restored from state() cut the next steps otherwise than the one "
                 "that wrote it");

  // Memory: micro-steps above half a loader batch fail to allocate.
  {
    B d(cfg);
    recording_runner rd;
    rd.fail_above = std::max<std::size_t>(1, d.loader_batch() / 2);
    d.begin(rd);
    std::size_t id = 0;
    bool threw = false;
    try {
      run_steps(d, rd, 0, 3, &id, rep,
                who + " (allocations failing above " + std::to_string(rd.fail_above) + " samples)");
    } catch (const memory_error&) {
      threw = true;  // not recovered: the error comes out, no step is reported as done
    }
    rep.expect(threw || rd.slicings.size() == 3,
               who + ": under failing allocations run() neither finished nor threw");
  }
  return rep;
}

}  // namespace strata::conformance
