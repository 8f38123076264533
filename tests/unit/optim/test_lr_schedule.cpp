// SPDX-License-Identifier: Apache-2.0
#include "strata/optim/lr_schedule.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <variant>

namespace {

using strata::optim::any_lr_schedule;
using strata::optim::constant_lr;
using strata::optim::cosine_lr;
using strata::optim::lr_schedule_config;
using strata::optim::make_lr_schedule;
using strata::optim::step_lr;
using strata::optim::warmup;
using kind = lr_schedule_config::kind_type;

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

TEST_CASE("constant_lr gives its rate at every step") {
  const constant_lr s{.base_lr = 0.25};
  CHECK(s.lr(0) == 0.25);
  CHECK(s.lr(1) == 0.25);
  CHECK(s.lr(std::numeric_limits<std::uint64_t>::max()) == 0.25);
}

TEST_CASE("step_lr decays by gamma at each multiple of step_size") {
  const step_lr s{.base_lr = 0.8, .step_size = 3, .gamma = 0.5};
  CHECK(s.lr(0) == 0.8);
  CHECK(s.lr(2) == 0.8);
  CHECK(s.lr(3) == 0.4);
  CHECK(s.lr(5) == 0.4);
  CHECK(s.lr(6) == 0.2);
  CHECK(s.lr(9) == 0.1);
  CHECK(s.lr(30) == doctest::Approx(0.8 * std::pow(0.5, 10)));

  const step_lr tenth{.base_lr = 0.1, .step_size = 100, .gamma = 0.1};
  CHECK(tenth.lr(99) == 0.1);
  CHECK(tenth.lr(100) == doctest::Approx(0.01));
  CHECK(tenth.lr(250) == doctest::Approx(0.001));

  const step_lr flat{.base_lr = 0.3, .step_size = 1, .gamma = 1.0};
  CHECK(flat.lr(1000) == 0.3);
}

TEST_CASE("cosine_lr goes from base_lr to min_lr over total_steps and stays there") {
  const cosine_lr s{.base_lr = 0.1, .total_steps = 100, .min_lr = 0.001};
  CHECK(s.lr(0) == doctest::Approx(0.1));
  CHECK(s.lr(50) == doctest::Approx(0.0505));
  CHECK(s.lr(25) == doctest::Approx(0.001 + 0.099 * (1.0 + std::cos(std::numbers::pi / 4)) / 2));
  CHECK(s.lr(99) > s.lr(100));
  CHECK(s.lr(100) == 0.001);
  CHECK(s.lr(101) == 0.001);
  CHECK(s.lr(1'000'000) == 0.001);
  for (std::uint64_t step = 1; step <= 100; ++step) {
    CHECK(s.lr(step) < s.lr(step - 1));
  }

  const cosine_lr to_zero{.base_lr = 2.0, .total_steps = 4, .min_lr = 0.0};
  CHECK(to_zero.lr(0) == 2.0);
  CHECK(to_zero.lr(2) == doctest::Approx(1.0));
  CHECK(to_zero.lr(4) == 0.0);
}

TEST_CASE("warmup ramps linearly to the schedule's first rate, then shifts the schedule") {
  const warmup<cosine_lr> s{.warmup_steps = 4,
                            .after = {.base_lr = 0.2, .total_steps = 10, .min_lr = 0.0}};
  CHECK(s.lr(0) == doctest::Approx(0.05));
  CHECK(s.lr(1) == doctest::Approx(0.10));
  CHECK(s.lr(2) == doctest::Approx(0.15));
  CHECK(s.lr(3) == doctest::Approx(0.20));
  CHECK(s.lr(4) == s.after.lr(0));
  CHECK(s.lr(9) == s.after.lr(5));
  CHECK(s.lr(14) == 0.0);
  CHECK(s.lr(13) > 0.0);

  const warmup<step_lr> w{.warmup_steps = 2,
                          .after = {.base_lr = 1.0, .step_size = 3, .gamma = 0.5}};
  CHECK(w.lr(0) == 0.5);
  CHECK(w.lr(1) == 1.0);
  CHECK(w.lr(4) == 1.0);
  CHECK(w.lr(5) == 0.5);

  const warmup<constant_lr> none{.warmup_steps = 0, .after = {.base_lr = 0.3}};
  CHECK(none.lr(0) == 0.3);
}

TEST_CASE("make_lr_schedule builds each kind, with warmup when asked") {
  const any_lr_schedule c = make_lr_schedule({.kind = kind::constant, .lr = 0.3});
  CHECK(std::holds_alternative<constant_lr>(c.schedule()));
  CHECK(c.lr(7) == 0.3);

  const any_lr_schedule s =
      make_lr_schedule({.kind = kind::step, .lr = 0.8, .step_size = 3, .gamma = 0.5});
  CHECK(s.schedule() ==
        any_lr_schedule::variant_type(step_lr{.base_lr = 0.8, .step_size = 3, .gamma = 0.5}));
  CHECK(s.lr(3) == 0.4);

  const any_lr_schedule w = make_lr_schedule(
      {.kind = kind::cosine, .lr = 0.2, .warmup_steps = 3.6, .min_lr = 0.02, .total_steps = 10});
  const warmup<cosine_lr> want{.warmup_steps = 4,
                               .after = {.base_lr = 0.2, .total_steps = 10, .min_lr = 0.02}};
  REQUIRE(std::holds_alternative<warmup<cosine_lr>>(w.schedule()));
  CHECK(std::get<warmup<cosine_lr>>(w.schedule()) == want);
  for (std::uint64_t step = 0; step < 20; ++step) {
    CHECK(w.lr(step) == want.lr(step));
  }
  CHECK(w.lr(0) == doctest::Approx(0.05));
  CHECK(w.lr(14) == 0.02);

  // A warmup that rounds to 0 steps is no warmup.
  const any_lr_schedule tiny =
      make_lr_schedule({.kind = kind::step, .lr = 0.1, .warmup_steps = 0.4});
  CHECK(std::holds_alternative<step_lr>(tiny.schedule()));
}

TEST_CASE("make_lr_schedule rejects out-of-range numbers, naming the field and value") {
  const auto error = [](const lr_schedule_config& c) {
    return invalid_argument_text([&] { make_lr_schedule(c); });
  };
  const std::string negative_lr = error({.kind = kind::constant, .lr = -0.1});
  CHECK(contains(negative_lr, "lr_schedule_config.lr"));
  CHECK(contains(negative_lr, "-0.1"));
  CHECK(contains(error({.kind = kind::cosine, .lr = std::nan("")}), "lr_schedule_config.lr"));
  CHECK(contains(error({.kind = kind::constant, .lr = 0.1, .warmup_steps = -1.0}),
                 "lr_schedule_config.warmup_steps"));

  const std::string zero_step = error({.kind = kind::step, .lr = 0.1, .step_size = 0});
  CHECK(contains(zero_step, "lr_schedule_config.step_size"));
  CHECK(contains(zero_step, "got 0"));
  CHECK(contains(error({.kind = kind::step, .lr = 0.1, .gamma = 0.0}), "lr_schedule_config.gamma"));
  const std::string big_gamma = error({.kind = kind::step, .lr = 0.1, .gamma = 1.5});
  CHECK(contains(big_gamma, "lr_schedule_config.gamma"));
  CHECK(contains(big_gamma, "1.5"));

  const std::string high_min =
      error({.kind = kind::cosine, .lr = 0.1, .min_lr = 0.2, .total_steps = 10});
  CHECK(contains(high_min, "lr_schedule_config.min_lr"));
  CHECK(contains(high_min, "0.2"));
  CHECK(contains(error({.kind = kind::cosine, .lr = 0.1, .min_lr = -0.01, .total_steps = 10}),
                 "lr_schedule_config.min_lr"));
  const std::string no_total = error({.kind = kind::cosine, .lr = 0.1, .total_steps = 0});
  CHECK(contains(no_total, "lr_schedule_config.total_steps"));

  // Fields the kind does not use are not checked; the edges of the ranges are accepted.
  CHECK_NOTHROW(make_lr_schedule({.kind = kind::constant, .lr = 0.0, .step_size = 0}));
  CHECK_NOTHROW(make_lr_schedule({.kind = kind::step, .lr = 0.1, .gamma = 1.0, .total_steps = 0}));
  CHECK_NOTHROW(
      make_lr_schedule({.kind = kind::cosine, .lr = 0.1, .min_lr = 0.1, .total_steps = 1}));
}

TEST_CASE("any_lr_schedule validates schedules built directly") {
  CHECK(contains(invalid_argument_text([] { any_lr_schedule(step_lr{.step_size = 0}); }),
                 "step_lr.step_size"));
  CHECK(contains(invalid_argument_text([] {
                   any_lr_schedule(warmup<cosine_lr>{.warmup_steps = 5,
                                                     .after = {.base_lr = 0.1, .min_lr = 1.0}});
                 }),
                 "cosine_lr.min_lr"));
  CHECK(contains(invalid_argument_text([] { any_lr_schedule(constant_lr{.base_lr = -1.0}); }),
                 "constant_lr.base_lr"));
  CHECK(any_lr_schedule().lr(3) == constant_lr{}.lr(3));
}

TEST_CASE("describe and to_string print the numbers") {
  CHECK(constant_lr{.base_lr = 0.25}.describe() == "constant_lr{.base_lr = 0.25}");
  CHECK(step_lr{.base_lr = 0.1, .step_size = 30, .gamma = 0.5}.describe() ==
        "step_lr{.base_lr = 0.1, .step_size = 30, .gamma = 0.5}");
  CHECK(to_string(cosine_lr{.base_lr = 0.05, .total_steps = 900, .min_lr = 1e-05}) ==
        "cosine_lr{.base_lr = 0.05, .total_steps = 900, .min_lr = 1e-05}");
  const any_lr_schedule w = make_lr_schedule(
      {.kind = kind::cosine, .lr = 0.2, .warmup_steps = 7, .min_lr = 0.003, .total_steps = 123});
  CHECK(w.describe() ==
        "warmup{.warmup_steps = 7, .after = cosine_lr{.base_lr = 0.2, .total_steps = 123, "
        ".min_lr = 0.003}}");
  CHECK(to_string(w) == w.describe());

  const std::string config = to_string(lr_schedule_config{.kind = kind::step,
                                                          .lr = 0.4,
                                                          .warmup_steps = 2.5,
                                                          .step_size = 17,
                                                          .gamma = 0.3,
                                                          .min_lr = 0.01,
                                                          .total_steps = 99});
  for (const std::string part :
       {".kind = step", ".lr = 0.4", ".warmup_steps = 2.5", ".step_size = 17", ".gamma = 0.3",
        ".min_lr = 0.01", ".total_steps = 99"}) {
    CAPTURE(part);
    CHECK(contains(config, part));
  }
  CHECK(lr_schedule_config{} == lr_schedule_config{});
  CHECK(!(lr_schedule_config{} == lr_schedule_config{.kind = kind::cosine}));
}
