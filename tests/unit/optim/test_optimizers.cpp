// SPDX-License-Identifier: Apache-2.0
#include "strata/optim/any_optimizer.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/optim/adamw.hpp"
#include "strata/optim/sgd.hpp"

namespace {

using strata::optim::adamw;
using strata::optim::adamw_config;
using strata::optim::any_optimizer;
using strata::optim::make_optimizer;
using strata::optim::optimizer_choice;
using strata::optim::sgd;
using strata::optim::sgd_config;
using strata::optim::update_args;

constexpr std::size_t count = 37;  // odd, so vectorized loops also run their scalar tail
constexpr int steps = 8;

std::vector<float> initial_params(std::size_t n = count) {
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(std::cos(0.37 * static_cast<double>(i)) * 1.5);
  }
  return p;
}

// The gradient of step `step` (1-based): varied signs and magnitudes, with a few exact zeros.
std::vector<float> gradient(int step, std::size_t n = count) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = i % 11 == 5 ? 0.0f
                       : static_cast<float>(std::sin(0.9 * static_cast<double>(i) + 1.7 * step) *
                                            (0.2 + 0.1 * static_cast<double>(i % 4)));
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first element farther than `relative` (of max(|want|, 1)) from the double reference, or
// "" when every element is close.
std::string mismatch(const std::vector<float>& got, const std::vector<double>& want,
                     double relative = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::fmax(std::fabs(want[i]), 1.0);
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= relative * scale)) {
      std::array<char, 96> text{};
      std::snprintf(text.data(), text.size(), "element %zu: got %.9g, want %.17g", i,
                    static_cast<double>(got[i]), want[i]);
      return text.data();
    }
  }
  return "";
}

// Runs `steps` steps of an optimizer over one range; returns the parameters, state in `state`.
template <class Optimizer>
std::vector<float> run(Optimizer& o, std::vector<float>& state, int first_step, int last_step,
                       std::vector<float> params, double lr = 0.1, bool weight_decay = true) {
  for (int step = first_step; step <= last_step; ++step) {
    o.begin_step();
    const std::vector<float> g = gradient(step, params.size());
    o.update(update_args{
        .params = params, .grads = g, .state = state, .lr = lr, .weight_decay = weight_decay});
  }
  return params;
}

template <class Optimizer>
std::vector<float> run_fresh(Optimizer o, double lr = 0.1, bool weight_decay = true) {
  std::vector<float> state(o.state_per_parameter() * count, 0.0f);
  return run(o, state, 1, steps, initial_params(), lr, weight_decay);
}

// PyTorch's SGD (dampening 0) in double, with its first-step buffer initialisation.
std::vector<double> sgd_reference(const sgd_config& c, double lr, bool weight_decay) {
  const std::vector<float> p0 = initial_params();
  std::vector<double> p(p0.begin(), p0.end());
  std::vector<double> buf(count, 0.0);
  for (int step = 1; step <= steps; ++step) {
    const std::vector<float> grad = gradient(step);
    for (std::size_t i = 0; i < count; ++i) {
      double g = grad[i];
      if (weight_decay) {
        g += c.weight_decay * p[i];
      }
      if (c.momentum > 0.0) {
        buf[i] = step == 1 ? g : c.momentum * buf[i] + g;
        g = c.nesterov ? g + c.momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
  return p;
}

// AdamW in double, written from the paper's formulas.
std::vector<double> adamw_reference(const adamw_config& c, double lr, bool weight_decay,
                                    int last_step = steps) {
  const std::vector<float> p0 = initial_params();
  std::vector<double> p(p0.begin(), p0.end());
  std::vector<double> m(count, 0.0);
  std::vector<double> v(count, 0.0);
  for (int t = 1; t <= last_step; ++t) {
    const std::vector<float> grad = gradient(t);
    for (std::size_t i = 0; i < count; ++i) {
      const double g = grad[i];
      if (weight_decay) {
        p[i] -= lr * c.weight_decay * p[i];
      }
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
      const double mhat = m[i] / (1.0 - std::pow(c.beta1, t));
      const double vhat = v[i] / (1.0 - std::pow(c.beta2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
  return p;
}

std::string invalid_argument_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("sgd matches PyTorch's update in double: plain, momentum, nesterov, weight decay") {
  const sgd_config configs[] = {
      {.momentum = 0.0, .nesterov = false, .weight_decay = 0.0},
      {.momentum = 0.9, .nesterov = false, .weight_decay = 0.0},
      {.momentum = 0.9, .nesterov = true, .weight_decay = 0.0},
      {.momentum = 0.0, .nesterov = false, .weight_decay = 0.05},
      {.momentum = 0.8, .nesterov = true, .weight_decay = 0.05},
  };
  for (const sgd_config& c : configs) {
    CAPTURE(to_string(c));
    const std::vector<float> got = run_fresh(sgd(c), 0.1);
    CHECK(mismatch(got, sgd_reference(c, 0.1, true)) == "");
    // The parameters moved, so the comparison above is not of unchanged values.
    CHECK(mismatch(got, sgd_reference(c, 0.0, true)) != "");
  }
}

TEST_CASE("sgd variants differ from each other, so the reference comparisons can fail") {
  const sgd_config plain{.momentum = 0.0};
  const sgd_config heavy{.momentum = 0.9};
  const sgd_config nesterov{.momentum = 0.9, .nesterov = true};
  const sgd_config decayed{.momentum = 0.9, .nesterov = true, .weight_decay = 0.05};
  CHECK(mismatch(run_fresh(sgd(heavy)), sgd_reference(plain, 0.1, true)) != "");
  CHECK(mismatch(run_fresh(sgd(nesterov)), sgd_reference(heavy, 0.1, true)) != "");
  CHECK(mismatch(run_fresh(sgd(decayed)), sgd_reference(nesterov, 0.1, true)) != "");
}

TEST_CASE("sgd's first step with momentum equals a plain step (buffer = gradient)") {
  std::vector<float> p_momentum = initial_params();
  std::vector<float> p_plain = initial_params();
  std::vector<float> state(count, 0.0f);
  std::vector<float> none;
  sgd with_momentum({.momentum = 0.9});
  sgd plain({.momentum = 0.0});
  with_momentum.begin_step();
  plain.begin_step();
  const std::vector<float> g = gradient(1);
  with_momentum.update({.params = p_momentum, .grads = g, .state = state, .lr = 0.1});
  plain.update({.params = p_plain, .grads = g, .state = none, .lr = 0.1});
  CHECK(same_bits(p_momentum, p_plain));
  CHECK(same_bits(state, g));
}

TEST_CASE("sgd skips weight decay on ranges without it") {
  const sgd_config decayed{.momentum = 0.9, .nesterov = true, .weight_decay = 0.05};
  const sgd_config undecayed{.momentum = 0.9, .nesterov = true, .weight_decay = 0.0};
  const std::vector<float> got = run_fresh(sgd(decayed), 0.1, false);
  CHECK(same_bits(got, run_fresh(sgd(undecayed), 0.1, true)));
  CHECK(mismatch(got, sgd_reference(decayed, 0.1, false)) == "");
  CHECK(!same_bits(got, run_fresh(sgd(decayed), 0.1, true)));
}

TEST_CASE("sgd state size, step count and description") {
  CHECK(sgd({.momentum = 0.0}).state_per_parameter() == 0);
  CHECK(sgd({.momentum = 0.5}).state_per_parameter() == 1);
  sgd o({.momentum = 0.5, .nesterov = true, .weight_decay = 0.0005});
  CHECK(o.step_count() == 0);
  o.begin_step();
  o.begin_step();
  CHECK(o.step_count() == 2);
  o.set_step_count(12345678901ULL);
  CHECK(o.step_count() == 12345678901ULL);
  o.begin_step();
  CHECK(o.step_count() == 12345678902ULL);
  CHECK(o.describe() == "sgd{.momentum = 0.5, .nesterov = true, .weight_decay = 5e-04}");
  CHECK(to_string(o.config()) ==
        "sgd_config{.momentum = 0.5, .nesterov = true, .weight_decay = 5e-04}");
}

TEST_CASE("adamw matches the formulas in double over several steps") {
  const adamw_config configs[] = {
      {},
      {.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1},
      {.beta1 = 0.0, .beta2 = 0.5, .eps = 1e-3, .weight_decay = 0.0},
  };
  for (const adamw_config& c : configs) {
    CAPTURE(to_string(c));
    const std::vector<float> got = run_fresh(adamw(c), 0.01);
    CHECK(mismatch(got, adamw_reference(c, 0.01, true)) == "");
    CHECK(mismatch(got, adamw_reference(c, 0.0, true)) != "");
  }
}

TEST_CASE("adamw's bias correction makes the first step lr * g / (|g| + eps)") {
  adamw o({.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0});
  std::vector<float> p = initial_params();
  std::vector<float> state(2 * count, 0.0f);
  const std::vector<float> g = gradient(1);
  o.begin_step();
  o.update({.params = p, .grads = g, .state = state, .lr = 0.01});
  const std::vector<float> p0 = initial_params();
  for (std::size_t i = 0; i < count; ++i) {
    const double g_i = g[i];
    const double want = p0[i] - 0.01 * g_i / (std::fabs(g_i) + 1e-8);
    CHECK(static_cast<double>(p[i]) == doctest::Approx(want).epsilon(1e-6));
    // Slot 0 is m = (1 - beta1) g, slot 1 is v = (1 - beta2) g^2.
    CHECK(static_cast<double>(state[i]) == doctest::Approx(0.1 * g_i).epsilon(1e-6));
    CHECK(static_cast<double>(state[count + i]) ==
          doctest::Approx(0.001 * g_i * g_i).epsilon(1e-6));
  }
}

TEST_CASE("adamw's weight decay is decoupled and skipped on ranges without it") {
  const adamw_config decayed{.weight_decay = 0.1};
  const adamw_config undecayed{.weight_decay = 0.0};
  // Decoupled: the moments see only the gradient, so they are the same with and without decay.
  adamw a(decayed);
  adamw b(undecayed);
  std::vector<float> state_a(2 * count, 0.0f);
  std::vector<float> state_b(2 * count, 0.0f);
  const std::vector<float> pa = run(a, state_a, 1, steps, initial_params(), 0.01, true);
  const std::vector<float> pb = run(b, state_b, 1, steps, initial_params(), 0.01, true);
  CHECK(same_bits(state_a, state_b));
  CHECK(!same_bits(pa, pb));
  CHECK(mismatch(pa, adamw_reference(decayed, 0.01, true)) == "");

  const std::vector<float> skipped = run_fresh(adamw(decayed), 0.01, false);
  CHECK(same_bits(skipped, pb));
  CHECK(mismatch(skipped, adamw_reference(decayed, 0.01, false)) == "");
}

TEST_CASE("splitting the parameters into ranges gives the same bits as one range") {
  const auto check_split = [](auto optimizer, std::size_t split) {
    CAPTURE(split);
    const std::size_t slots = optimizer.state_per_parameter();
    auto whole = optimizer;
    auto parts = optimizer;
    std::vector<float> p_whole = initial_params();
    std::vector<float> p_parts = initial_params();
    std::vector<float> s_whole(slots * count, 0.0f);
    std::vector<float> s_first(slots * split, 0.0f);
    std::vector<float> s_second(slots * (count - split), 0.0f);
    for (int step = 1; step <= steps; ++step) {
      const std::vector<float> g = gradient(step);
      const std::span<const float> gs(g);
      const std::span<float> ps(p_parts);
      whole.begin_step();
      whole.update({.params = p_whole, .grads = g, .state = s_whole, .lr = 0.05});
      parts.begin_step();
      // The second range first: order does not matter either.
      parts.update(
          {.params = ps.subspan(split), .grads = gs.subspan(split), .state = s_second, .lr = 0.05});
      parts.update(
          {.params = ps.first(split), .grads = gs.first(split), .state = s_first, .lr = 0.05});
    }
    CHECK(same_bits(p_whole, p_parts));
    // Each range's state is the matching shard of every slot of the whole state.
    for (std::size_t s = 0; s < slots; ++s) {
      for (std::size_t i = 0; i < count; ++i) {
        const float part =
            i < split ? s_first[s * split + i] : s_second[s * (count - split) + (i - split)];
        CHECK(std::memcmp(&part, &s_whole[s * count + i], sizeof(float)) == 0);
      }
    }
  };
  for (const std::size_t split : {std::size_t{1}, std::size_t{13}, std::size_t{32}}) {
    check_split(sgd({.momentum = 0.9, .nesterov = true, .weight_decay = 0.01}), split);
    check_split(adamw({.weight_decay = 0.05}), split);
  }
}

TEST_CASE("a range longer than the update's cache block gives the bits of its short pieces") {
  // The updates run in blocks of a few thousand elements: a long range must index parameters,
  // gradients and every state slot across block boundaries exactly as pieces shorter than one.
  const std::size_t n = 5000;
  const std::size_t piece = 999;
  const auto check = [&](auto optimizer) {
    const std::size_t slots = optimizer.state_per_parameter();
    auto whole = optimizer;
    auto parts = optimizer;
    std::vector<float> p_whole = initial_params(n);
    std::vector<float> p_parts = initial_params(n);
    std::vector<float> s_whole(slots * n, 0.0f);
    std::vector<std::vector<float>> s_parts;
    for (std::size_t at = 0; at < n; at += piece) {
      s_parts.emplace_back(slots * std::min(piece, n - at), 0.0f);
    }
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> g = gradient(step, n);
      const std::span<const float> gs(g);
      const std::span<float> ps(p_parts);
      whole.begin_step();
      whole.update({.params = p_whole, .grads = g, .state = s_whole, .lr = 0.05});
      parts.begin_step();
      for (std::size_t at = 0, k = 0; at < n; at += piece, ++k) {
        const std::size_t len = std::min(piece, n - at);
        parts.update({.params = ps.subspan(at, len),
                      .grads = gs.subspan(at, len),
                      .state = s_parts[k],
                      .lr = 0.05});
      }
    }
    CHECK(same_bits(p_whole, p_parts));
    for (std::size_t s = 0; s < slots; ++s) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t k = i / piece;
        const std::size_t len = std::min(piece, n - k * piece);
        const float part = s_parts[k][s * len + (i - k * piece)];
        CHECK(std::memcmp(&part, &s_whole[s * n + i], sizeof(float)) == 0);
      }
    }
  };
  check(sgd({.momentum = 0.9, .nesterov = true, .weight_decay = 0.01}));
  check(sgd({.momentum = 0.0, .weight_decay = 0.01}));
  check(adamw({.weight_decay = 0.05}));
}

TEST_CASE("adamw resumed from its state buffer and step count continues bit for bit") {
  const adamw_config c{.beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.02};
  const int stop = 5;

  adamw uninterrupted(c);
  std::vector<float> state_u(2 * count, 0.0f);
  const std::vector<float> want = run(uninterrupted, state_u, 1, steps, initial_params(), 0.01);

  adamw first(c);
  std::vector<float> state(2 * count, 0.0f);
  const std::vector<float> saved_params = run(first, state, 1, stop, initial_params(), 0.01);
  const std::vector<float> saved_state = state;
  const std::uint64_t saved_count = first.step_count();
  CHECK(saved_count == static_cast<std::uint64_t>(stop));

  adamw resumed(c);
  resumed.set_step_count(saved_count);
  CHECK(resumed.step_count() == saved_count);
  std::vector<float> restored_state = saved_state;
  const std::vector<float> got = run(resumed, restored_state, stop + 1, steps, saved_params, 0.01);
  CHECK(same_bits(got, want));
  CHECK(same_bits(restored_state, state_u));
  CHECK(resumed.step_count() == uninterrupted.step_count());

  // Without the step count the bias correction restarts and the result differs.
  adamw forgetful(c);
  std::vector<float> forgetful_state = saved_state;
  const std::vector<float> wrong =
      run(forgetful, forgetful_state, stop + 1, steps, saved_params, 0.01);
  CHECK(!same_bits(wrong, want));
}

TEST_CASE("optimizers reject invalid configs, naming the field") {
  CHECK(contains(invalid_argument_text([] { sgd({.momentum = -0.1}); }), "sgd_config.momentum"));
  CHECK(contains(invalid_argument_text([] { sgd({.momentum = 1.0}); }), "sgd_config.momentum"));
  CHECK(contains(invalid_argument_text([] { sgd({.momentum = std::nan("")}); }),
                 "sgd_config.momentum"));
  CHECK(contains(invalid_argument_text([] { sgd({.weight_decay = -1e-4}); }),
                 "sgd_config.weight_decay"));
  CHECK(contains(
      invalid_argument_text([] { sgd({.weight_decay = std::numeric_limits<double>::infinity()}); }),
      "sgd_config.weight_decay"));
  const std::string nesterov =
      invalid_argument_text([] { sgd({.momentum = 0.0, .nesterov = true}); });
  CHECK(contains(nesterov, "sgd_config.nesterov"));
  CHECK(contains(nesterov, ".momentum = 0"));
  CHECK_NOTHROW(sgd({.momentum = 0.0, .weight_decay = 0.0}));
  CHECK_NOTHROW(sgd({.momentum = 0.99, .nesterov = true, .weight_decay = 1.0}));

  CHECK(contains(invalid_argument_text([] { adamw({.beta1 = 1.0}); }), "adamw_config.beta1"));
  CHECK(contains(invalid_argument_text([] { adamw({.beta1 = -0.5}); }), "adamw_config.beta1"));
  CHECK(contains(invalid_argument_text([] { adamw({.beta2 = 1.0}); }), "adamw_config.beta2"));
  CHECK(contains(invalid_argument_text([] { adamw({.eps = 0.0}); }), "adamw_config.eps"));
  CHECK(contains(invalid_argument_text([] { adamw({.weight_decay = -0.01}); }),
                 "adamw_config.weight_decay"));
  CHECK_NOTHROW(adamw({.beta1 = 0.0, .beta2 = 0.0, .eps = 1e-12, .weight_decay = 0.0}));

  CHECK(contains(invalid_argument_text([] {
                   make_optimizer(
                       {.kind = optimizer_choice::kind_type::adamw, .adamw = {.beta2 = 2.0}});
                 }),
                 "adamw_config.beta2"));
  // The unused config is not checked.
  CHECK_NOTHROW(make_optimizer(
      {.kind = optimizer_choice::kind_type::adamw, .sgd = {.momentum = 5.0}, .adamw = {}}));
}

TEST_CASE("optimizers reject ranges whose sizes do not match") {
  std::vector<float> p(4, 1.0f);
  std::vector<float> g(4, 1.0f);
  std::vector<float> short_g(3, 1.0f);
  std::vector<float> state(8, 0.0f);
  std::vector<float> short_state(7, 0.0f);
  sgd s({.momentum = 0.9});
  adamw a;
  a.begin_step();
  CHECK(contains(invalid_argument_text([&] {
                   s.update({.params = p, .grads = short_g, .state = std::span(state).first(4)});
                 }),
                 "update_args.grads"));
  CHECK(
      contains(invalid_argument_text([&] { s.update({.params = p, .grads = g, .state = state}); }),
               "update_args.state"));
  CHECK(contains(
      invalid_argument_text([&] { a.update({.params = p, .grads = g, .state = short_state}); }),
      "update_args.state"));
  CHECK(contains(
      invalid_argument_text([&] { a.update({.params = p, .grads = short_g, .state = state}); }),
      "update_args.grads"));
  adamw unstarted;
  CHECK_THROWS_AS(unstarted.update({.params = p, .grads = g, .state = state}), std::logic_error);
  CHECK(p == std::vector<float>(4, 1.0f));
}

TEST_CASE("any_optimizer matches the concrete optimizers bit for bit") {
  const sgd_config sc{.momentum = 0.9, .nesterov = true, .weight_decay = 0.01};
  const adamw_config ac{.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05};

  any_optimizer as = make_optimizer({.kind = optimizer_choice::kind_type::sgd, .sgd = sc});
  any_optimizer aa =
      make_optimizer({.kind = optimizer_choice::kind_type::adamw, .sgd = {}, .adamw = ac});
  CHECK(as.kind() == optimizer_choice::kind_type::sgd);
  CHECK(aa.kind() == optimizer_choice::kind_type::adamw);
  CHECK(as.state_per_parameter() == 1);
  CHECK(aa.state_per_parameter() == 2);
  CHECK(as.describe() == sgd(sc).describe());
  CHECK(aa.describe() == adamw(ac).describe());

  for (const bool decay : {true, false}) {
    CHECK(same_bits(run_fresh(as, 0.05, decay), run_fresh(sgd(sc), 0.05, decay)));
    CHECK(same_bits(run_fresh(aa, 0.05, decay), run_fresh(adamw(ac), 0.05, decay)));
  }
  CHECK(!same_bits(run_fresh(as, 0.05), run_fresh(aa, 0.05)));

  aa.begin_step();
  aa.begin_step();
  CHECK(aa.step_count() == 2);
  aa.set_step_count(40);
  CHECK(aa.step_count() == 40);
  CHECK(std::get<adamw>(aa.optimizer()).step_count() == 40);
}

TEST_CASE("optimizer configs print every number") {
  const std::string text = to_string(optimizer_choice{
      .kind = optimizer_choice::kind_type::adamw,
      .sgd = {.momentum = 0.95, .nesterov = true, .weight_decay = 0.0005},
      .adamw = {.beta1 = 0.85, .beta2 = 0.995, .eps = 1e-8, .weight_decay = 0.02}});
  for (const std::string part :
       {".kind = adamw", ".momentum = 0.95", ".nesterov = true", ".weight_decay = 5e-04",
        ".beta1 = 0.85", ".beta2 = 0.995", ".eps = 1e-08", ".weight_decay = 0.02"}) {
    CAPTURE(part);
    CHECK(contains(text, part));
  }
  CHECK(adamw().describe() ==
        "adamw{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-08, .weight_decay = 0.01}");
  CHECK(optimizer_choice{} == optimizer_choice{});
  CHECK(!(optimizer_choice{} == optimizer_choice{.kind = optimizer_choice::kind_type::adamw}));
}
