// SPDX-License-Identifier: Apache-2.0
// The shipped schedules and a user's, through the schedule conformance suite (p = 1..8,
// m = 1..32), and what each promises: the bubble, the activations in flight, the exact lists of
// small cases, the text timeline.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

#include "conformance/pipeline_schedule.hpp"
#include "strata/pipeline.hpp"

namespace sp = strata::pipeline;

namespace {

// A user's schedule, written outside the library: 1F1B with twice the warm-up forwards (more
// activations held, a stage never waits for its first gradient while it could run forward).
// snippet-begin: user_schedule
struct eager_1f1b {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "eager_1f1b";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;

  constexpr sp::schedule_lists lists(sp::schedule_shape shape) const {
    if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks != 1) {
      throw std::invalid_argument("eager_1f1b: cannot schedule " + sp::to_string(shape));
    }
    const int p = shape.stages;
    const int m = shape.micro_batches;
    std::vector<std::vector<sp::action>> compute(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& list = compute[static_cast<std::size_t>(r)];
      const int warmup = std::min(2 * (p - r - 1), m);
      for (int i = 0; i < warmup; ++i) {
        list.push_back(sp::forward(i));
      }
      for (int i = 0; i < m - warmup; ++i) {
        list.push_back(sp::forward(warmup + i));
        list.push_back(sp::backward(i));
      }
      for (int i = m - warmup; i < m; ++i) {
        list.push_back(sp::backward(i));
      }
    }
    return sp::with_transfers(shape, compute);
  }
};
// snippet-end: user_schedule

// A wrong one: the last stage runs every forward before its backwards, the others alternate
// forward and backward from the first micro-batch, so stage 0 waits for a gradient the last
// stage sends only after a forward stage 0 has not run.
struct impatient {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "impatient";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;

  sp::schedule_lists lists(sp::schedule_shape shape) const {
    if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks != 1) {
      throw std::invalid_argument("impatient: cannot schedule " + sp::to_string(shape));
    }
    std::vector<std::vector<sp::action>> compute(static_cast<std::size_t>(shape.stages));
    for (int r = 0; r < shape.stages; ++r) {
      auto& list = compute[static_cast<std::size_t>(r)];
      for (int i = 0; i < shape.micro_batches; ++i) {
        list.push_back(sp::forward(i));
        if (r + 1 < shape.stages) {
          list.push_back(sp::backward(i));
        }
      }
      if (r + 1 == shape.stages) {
        for (int i = 0; i < shape.micro_batches; ++i) {
          list.push_back(sp::backward(i));
        }
      }
    }
    return sp::with_transfers(shape, compute);
  }
};

template <class S>
double bubble(int p, int m, const sp::action_times& times = {}) {
  return sp::simulate(S{}.lists(sp::shape_for<S>(p, m)), times).bubble();
}

template <class S>
std::vector<int> peaks(int p, int m) {
  return sp::simulate(S{}.lists(sp::shape_for<S>(p, m))).peak_in_flight;
}

// Pass times of one chunk: a stage's work split over its chunks.
template <class S>
sp::action_times per_chunk() {
  const double v = S::chunks;
  return {.forward = 1.0 / v, .backward_input = 1.0 / v, .backward_weight = 1.0 / v};
}

template <class S>
void expect_conforms() {
  const auto r = strata::conformance::run_schedule_suite<S>();
  INFO(S::name);
  for (const std::string& f : r.failures) {
    INFO(f);
    CHECK(false);
  }
  CHECK(r.ok());
  CHECK(r.checks > 32 * 8 * 5);
}

}  // namespace

TEST_CASE("every shipped schedule and a user's pass the conformance suite for p 1..8, m 1..32") {
  expect_conforms<sp::gpipe>();
  expect_conforms<sp::one_f_one_b>();
  expect_conforms<sp::interleaved_1f1b<2>>();
  expect_conforms<sp::interleaved_1f1b<3>>();
  expect_conforms<sp::interleaved_1f1b<4>>();
  expect_conforms<sp::zero_bubble_h1>();
  // snippet-begin: conformance
  expect_conforms<eager_1f1b>();  // run_schedule_suite<eager_1f1b>(), every failure listed
  // snippet-end: conformance
}

TEST_CASE("the conformance suite catches a schedule that deadlocks") {
  const auto r =
      strata::conformance::run_schedule_suite<impatient>({.max_stages = 3, .max_micro_batches = 3});
  CHECK_FALSE(r.ok());
  bool deadlock = false;
  for (const std::string& f : r.failures) {
    deadlock = deadlock || f.starts_with("impatient p 2 m 2: deadlocks: rank 0 waits at action");
  }
  CHECK(deadlock);
}

TEST_CASE(
    "gpipe and 1f1b idle (p - 1) / (m + p - 1) of the step, with any forward/backward ratio") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const double theory = static_cast<double>(p - 1) / (m + p - 1);
      INFO("p " << p << " m " << m);
      CHECK(bubble<sp::gpipe>(p, m) == doctest::Approx(theory).epsilon(1e-12));
      CHECK(bubble<sp::one_f_one_b>(p, m) == doctest::Approx(theory).epsilon(1e-12));
      const sp::action_times slow_backward{
          .forward = 1.0, .backward_input = 1.5, .backward_weight = 1.5};
      CHECK(bubble<sp::one_f_one_b>(p, m, slow_backward) == doctest::Approx(theory).epsilon(1e-12));
    }
  }
}

TEST_CASE("activations in flight: m for gpipe, at most p (p - r on stage r) for 1f1b and zb-h1") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      INFO("p " << p << " m " << m);
      const auto g = peaks<sp::gpipe>(p, m);
      const auto o = peaks<sp::one_f_one_b>(p, m);
      const auto z = peaks<sp::zero_bubble_h1>(p, m);
      for (int r = 0; r < p; ++r) {
        CHECK(g[static_cast<std::size_t>(r)] == m);
        CHECK(o[static_cast<std::size_t>(r)] == std::min(p - r, m));
        CHECK(z[static_cast<std::size_t>(r)] <= std::min(p, m));
      }
    }
  }
}

TEST_CASE("interleaved 1f1b: (p - 1) / (v m + p - 1) when p divides m, falling with v") {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 32; m += p) {
      INFO("p " << p << " m " << m);
      const double one = bubble<sp::one_f_one_b>(p, m);
      const double two =
          bubble<sp::interleaved_1f1b<2>>(p, m, per_chunk<sp::interleaved_1f1b<2>>());
      const double three =
          bubble<sp::interleaved_1f1b<3>>(p, m, per_chunk<sp::interleaved_1f1b<3>>());
      CHECK(two == doctest::Approx(static_cast<double>(p - 1) / (2 * m + p - 1)).epsilon(1e-12));
      CHECK(three == doctest::Approx(static_cast<double>(p - 1) / (3 * m + p - 1)).epsilon(1e-12));
      CHECK(two < one);
      CHECK(three < two);
    }
  }
}

TEST_CASE("zero bubble h1 idles at most (p - 1) / (3m) with equal F, B and W times") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      INFO("p " << p << " m " << m);
      const double zb = bubble<sp::zero_bubble_h1>(p, m);
      // With one micro-batch the chain F x p, B x p, W alone takes 2p + 1 units of 3p of work
      // per rank: no schedule idles less than 1 - 3 / (2p + 1); only p = 2 is above the bound.
      const double floor_one = m == 1 ? 1.0 - 3.0 / (2.0 * p + 1.0) : 0.0;
      CHECK(zb <= std::max(static_cast<double>(p - 1) / (3.0 * m), floor_one) + 1e-12);
      if (p > 1 && m >= p) {
        const double two =
            bubble<sp::interleaved_1f1b<2>>(p, m, per_chunk<sp::interleaved_1f1b<2>>());
        if (m % p == 0) {
          CHECK(zb < two);
        }
        CHECK(zb < bubble<sp::one_f_one_b>(p, m));
      }
    }
  }
}

TEST_CASE("the lists of small cases, exactly") {
  using sp::op;
  const sp::schedule_lists l = sp::one_f_one_b{}.lists({.stages = 2, .micro_batches = 3});
  const std::vector<sp::action> rank0 = {
      {op::forward, 0, 0, -1},      {op::send_activation, 0, 0, 1},
      {op::forward, 1, 0, -1},      {op::send_activation, 1, 0, 1},
      {op::recv_gradient, 0, 0, 1}, {op::backward, 0, 0, -1},
      {op::forward, 2, 0, -1},      {op::send_activation, 2, 0, 1},
      {op::recv_gradient, 1, 0, 1}, {op::backward, 1, 0, -1},
      {op::recv_gradient, 2, 0, 1}, {op::backward, 2, 0, -1},
      {op::step, 0, 0, -1}};
  CHECK(l.ranks[0] == rank0);
  const std::vector<sp::action> rank1 = {{op::recv_activation, 0, 0, 0},
                                         {op::forward, 0, 0, -1},
                                         {op::backward, 0, 0, -1},
                                         {op::send_gradient, 0, 0, 0},
                                         {op::recv_activation, 1, 0, 0},
                                         {op::forward, 1, 0, -1},
                                         {op::backward, 1, 0, -1},
                                         {op::send_gradient, 1, 0, 0},
                                         {op::recv_activation, 2, 0, 0},
                                         {op::forward, 2, 0, -1},
                                         {op::backward, 2, 0, -1},
                                         {op::send_gradient, 2, 0, 0},
                                         {op::step, 0, 0, -1}};
  CHECK(l.ranks[1] == rank1);
  // Interleaved: stage 1 of chunk 0 (rank 1) sends to rank 0's chunk 1.
  const sp::schedule_lists i =
      sp::interleaved_1f1b<2>{}.lists({.stages = 2, .micro_batches = 2, .chunks = 2});
  CHECK(std::find(i.ranks[1].begin(), i.ranks[1].end(), sp::action{op::send_activation, 0, 0, 0}) !=
        i.ranks[1].end());
  CHECK(std::find(i.ranks[0].begin(), i.ranks[0].end(), sp::action{op::recv_activation, 0, 1, 1}) !=
        i.ranks[0].end());
}

TEST_CASE("the text timeline shows each pass where it ran") {
  const auto l = sp::gpipe{}.lists({.stages = 2, .micro_batches = 2});
  const std::string t = sp::text_timeline("gpipe", l.shape, sp::simulate(l));
  CHECK(t ==
        "gpipe, 2 stages, 2 micro-batches: makespan 9, bubble 33.3%\n"
        "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1 |\n"
        "rank 1 | .  F0 F1 B0 B0 B1 B1 .  .  |\n");
}

TEST_CASE("check_lists names what is wrong") {
  using sp::op;
  sp::schedule_lists l = sp::gpipe{}.lists({.stages = 2, .micro_batches = 2});
  // Drop rank 1's receive of micro-batch 1.
  auto& r1 = l.ranks[1];
  r1.erase(std::find(r1.begin(), r1.end(), sp::action{op::recv_activation, 1, 0, 0}));
  const auto problems = sp::check_lists(l);
  REQUIRE_FALSE(problems.empty());
  CHECK(problems.front() == "stage 1, micro-batch 1: 0 recv_activation actions, expected 1");
  // A wrong peer.
  sp::schedule_lists w = sp::gpipe{}.lists({.stages = 3, .micro_batches = 1});
  w.ranks[0][1].peer = 2;
  CHECK(sp::check_lists(w).front() ==
        "rank 0, action 1: send_activation 0 to 2: the peer of stage 0 is rank 1");
}
