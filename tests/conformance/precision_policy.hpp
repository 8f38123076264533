// SPDX-License-Identifier: Apache-2.0
#pragma once

// The conformance suite of the precision_policy concept (precision/concepts.hpp): one test body
// run on every precision policy, shipped or a user's, on a parameter store and without a model
// or a trainer. It checks the written semantics:
//   - parameters: after refresh() the compute parameters are the master's rounded through
//     compute_dtype (the master itself when the policy keeps no copy);
//   - gradients: store() leaves values compute_dtype holds, and is idempotent;
//   - decisions: with finite gradients and a vote of "none", finish() applies and the master
//     gradients are the compute gradients / loss_scale(); a policy that skips steps calls the
//     vote exactly once, with whether its own gradients are finite, and skips whenever the vote
//     says some rank found a non-finite one (its own being finite or not); one that does not
//     skip applies every step; to_master() and finite() agree with that;
//   - state: a policy restored from state() (through its text) has the writer's loss scale and
//     decides as the writer does on the same votes.
// Failures are collected into a report, so that one run lists all of them.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance/findings.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/round.hpp"
#include "strata/model/param_store.hpp"
#include "strata/precision/concepts.hpp"

namespace strata::conformance {

using precision_report = findings;

// The suite: policy P made from `cfg`, on stores that make_store() returns (alike each call).
template <precision::precision_policy P, class Make>
precision_report check_precision_policy_semantics(const config::train_config& cfg,
                                                  Make make_store) {
  precision_report rep;
  const std::string who(P::name);
  P::check_config(cfg);
  model::param_store master = make_store();
  master.initialize(7);
  P p(cfg);
  p.prepare(make_store);

  // Parameters.
  p.refresh(std::as_const(master));
  {
    std::vector<float> want(master.values().begin(), master.values().end());
    round_through(std::span<float>(want), P::compute_dtype);
    const std::span<const float> got = std::as_const(p.compute(master)).values();
    rep.expect(std::vector<float>(got.begin(), got.end()) == want,
               who +
                   ": after refresh() the compute parameters are not the master's rounded "
                   "through the compute type");
    rep.expect(P::has_compute_copy || &p.compute(master) == &master,
               who + ": has_compute_copy is false, but compute() is not the master");
    rep.expect(!P::has_compute_copy || &p.compute(master) != &master,
               who + ": has_compute_copy is true, but compute() is the master");
  }

  // Gradients: store() rounds, and again changes nothing.
  const std::size_t n = master.size();
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 97) - 48) + 1.2345e-5f;
  }
  {
    std::vector<float> rounded = g;
    p.store(rounded);
    std::vector<float> twice = rounded;
    p.store(twice);
    rep.expect(twice == rounded, who + ": store() is not idempotent");
    std::vector<float> held = rounded;
    round_through(std::span<float>(held), P::compute_dtype);
    rep.expect(held == rounded, who + ": store() leaves values the compute type does not hold");
  }

  // One decision: the compute gradients g x loss_scale (stored), a vote that answers `verdict`
  // (or, when echo, what the policy reports), and what finish() did.
  struct decision {
    bool applied = false;
    int votes = 0;
    bool reported_nonfinite = false;
    std::vector<float> master_grads{};
  };
  // The compute gradients g x loss_scale, stored; with `poison` an inf at n / 2.
  const auto compute_grads = [&](P& q, bool poison) -> model::param_store& {
    model::param_store& compute = q.compute(master);
    std::span<float> cg = compute.grads();
    const auto scale = static_cast<float>(q.loss_scale());
    for (std::size_t i = 0; i < n; ++i) {
      cg[i] = g[i] * scale;
    }
    q.store(cg);
    if (poison) {
      cg[n / 2] = std::numeric_limits<float>::infinity();
    }
    return compute;
  };
  const auto decide = [&](P& q, std::uint64_t step, bool poison, bool verdict, bool echo) {
    model::param_store& compute = compute_grads(q, poison);
    decision d;
    d.applied = q.finish(step, std::as_const(compute).grads(), master.grads(), [&](bool mine) {
      ++d.votes;
      d.reported_nonfinite = mine;
      return echo ? mine : verdict;
    });
    d.master_grads.assign(master.grads().begin(), master.grads().end());
    return d;
  };

  const double scale = p.loss_scale();
  rep.expect(scale > 0.0 && std::isfinite(scale), who + ": loss_scale() is not finite and > 0");
  rep.expect(P::scales_loss || scale == 1.0, who + ": scales_loss is false but the scale is not 1");
  {
    const decision d = decide(p, 0, false, false, false);
    rep.expect(d.applied, who + ": finite gradients and a vote of none, but the step is skipped");
    std::vector<float> want(n);
    const std::span<const float> cg = std::as_const(p.compute(master)).grads();
    const auto inv = static_cast<float>(1.0 / scale);
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = P::has_compute_copy ? cg[i] * inv : cg[i];
    }
    rep.expect(d.master_grads == want,
               who + ": the master gradients are not the compute gradients / loss_scale()");
    if (P::skips_steps) {
      rep.expect(d.votes == 1, who + ": skips_steps, but the vote was called " +
                                   std::to_string(d.votes) + " times (once on every step)");
      rep.expect(!d.reported_nonfinite, who + ": reported its finite gradients as non-finite");
    }
    rep.expect(p.finite(std::as_const(master).grads()),
               who + ": finite() says finite gradients are not");
  }
  {
    const decision d = decide(p, 1, false, true, false);  // another rank found an inf
    rep.expect(!P::skips_steps || !d.applied,
               who +
                   ": the vote said another rank's gradients were not finite, but this rank "
                   "applied the step (the ranks would part)");
    rep.expect(P::skips_steps || d.applied, who + ": skips_steps is false but a step was skipped");
  }
  {
    const decision d = decide(p, 2, true, false, true);  // its own inf, the vote echoes it
    rep.expect(!P::skips_steps || (d.reported_nonfinite && !d.applied),
               who + ": an inf in its own gradients was neither reported to the vote nor skipped");
    std::vector<float> bad(n, 1.0f);
    bad[n / 3] = std::numeric_limits<float>::quiet_NaN();
    rep.expect(!P::skips_steps || !p.finite(bad), who + ": finite() did not see a NaN");
    rep.expect(!P::skips_steps || !p.to_master(bad, 1.0), who + ": to_master() did not see a NaN");
  }
  // A policy that takes the trainer's facts (requirement 6's fifth argument): told the gradients
  // are finite, it applies them as without the facts and still votes once; told nothing, it
  // still finds its own inf.
  if constexpr (precision::takes_gradient_facts<P, precision::vote_archetype>) {
    const auto told = [&](bool certainly_finite, bool poison) {
      model::param_store& compute = compute_grads(p, poison);
      decision d;
      d.applied = p.finish(
          7, std::as_const(compute).grads(), master.grads(),
          [&](bool mine) {
            ++d.votes;
            d.reported_nonfinite = mine;
            return mine;
          },
          precision::gradient_facts{.certainly_finite = certainly_finite});
      return d;
    };
    const decision sure = told(true, false);
    rep.expect(sure.applied && !sure.reported_nonfinite,
               who +
                   ": told its finite gradients were finite, it skipped the step or reported "
                   "them non-finite");
    rep.expect(!P::skips_steps || sure.votes == 1,
               who + ": told the gradients were finite, it did not vote exactly once");
    const decision unsure = told(false, true);
    rep.expect(!P::skips_steps || (unsure.reported_nonfinite && !unsure.applied),
               who + ": told nothing of its gradients, it missed its own inf");
  }
  {
    std::vector<float> scaled(n);
    for (std::size_t i = 0; i < n; ++i) {
      scaled[i] = g[i] * 4.0f;
    }
    p.store(scaled);
    std::vector<float> want = scaled;
    const bool finite = p.to_master(scaled, 4.0);
    rep.expect(finite, who + ": to_master() refused finite gradients");
    if (P::has_compute_copy) {
      for (float& w : want) {
        w *= 0.25f;
      }
      rep.expect(scaled == want, who + ": to_master() did not unscale by the given scale");
    }
  }

  // State: a restored policy has the scale and decides alike on the same votes.
  {
    P q(cfg);
    q.prepare(make_store);
    q.restore(nlohmann::json::parse(p.state().dump()));
    rep.expect(q.loss_scale() == p.loss_scale(),
               who + ": a policy restored from state() has another loss scale");
    const bool votes[] = {false, true, false, false, true, true, false, false, false};
    std::uint64_t step = 3;
    for (const bool v : votes) {
      const decision a = decide(p, step, false, v, false);
      const decision b = decide(q, step, false, v, false);
      rep.expect(a.applied == b.applied && p.loss_scale() == q.loss_scale(),
                 who + ": at step " + std::to_string(step) +
                     " a policy restored from state() decided otherwise than the writer");
      ++step;
    }
  }
  return rep;
}

}  // namespace strata::conformance
