// SPDX-License-Identifier: Apache-2.0
#include "strata/precision/loss_scaler.hpp"

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"

namespace {

using strata::precision::dynamic_loss_scaler;
using strata::precision::loss_scaler_config;
using strata::precision::loss_scaler_state;

// One step of a reference sequence: the flag fed to update() and the expected outcome.
struct expected_step {
  bool overflow = false;
  bool applied = false;
  double scale = 0.0;
  std::uint64_t growth_tracker = 0;
  std::uint32_t hysteresis_left = 0;
  std::uint64_t consecutive_skips = 0;
};

void run_reference(dynamic_loss_scaler& scaler, const std::vector<expected_step>& table) {
  std::uint64_t skipped = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    const expected_step& e = table[i];
    CAPTURE(i);
    const bool applied = scaler.update(e.overflow);
    skipped += e.overflow ? 1 : 0;
    CHECK(applied == e.applied);
    CHECK(scaler.scale() == e.scale);
    CHECK(scaler.scale_f() == static_cast<float>(e.scale));
    CHECK(scaler.state() == loss_scaler_state{.scale = e.scale,
                                              .growth_tracker = e.growth_tracker,
                                              .hysteresis_left = e.hysteresis_left,
                                              .consecutive_skips = e.consecutive_skips,
                                              .skipped_total = skipped,
                                              .steps = i + 1});
  }
}

// The message of the std::invalid_argument that `f` throws, or "" when it throws nothing.
std::string invalid_argument_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string config_error_message(const loss_scaler_config& c) {
  return invalid_argument_message([&] { dynamic_loss_scaler scaler(c); });
}

constexpr bool O = true;   // overflow
constexpr bool F = false;  // finite

}  // namespace

TEST_CASE("loss_scaler_config defaults are GradScaler's and print") {
  const loss_scaler_config c{};
  CHECK(c.initial_scale == 65536.0);
  CHECK(c.growth_factor == 2.0);
  CHECK(c.backoff_factor == 0.5);
  CHECK(c.growth_interval == 2000);
  CHECK(c.hysteresis == 1);
  CHECK(to_string(c) ==
        "loss_scaler_config{.initial_scale = 65536, .growth_factor = 2, .backoff_factor = 0.5, "
        ".growth_interval = 2000, .hysteresis = 1, .min_scale = 1, .max_scale = 1099511627776, "
        ".max_consecutive_skips = 20}");
  CHECK(c != loss_scaler_config{.hysteresis = 2});

  const dynamic_loss_scaler scaler;
  CHECK(scaler.config() == c);
  CHECK(scaler.state() == loss_scaler_state{});
  CHECK(to_string(scaler.state()) ==
        "loss_scaler_state{.scale = 65536, .growth_tracker = 0, .hysteresis_left = 1, "
        ".consecutive_skips = 0, .skipped_total = 0, .steps = 0}");
}

TEST_CASE("dynamic_loss_scaler follows the reference sequence with hysteresis 1") {
  dynamic_loss_scaler scaler(
      {.initial_scale = 8, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  // Growth after 3 finite steps in a row; every overflow halves (down to min_scale 1) and
  // restarts the growth count.
  const std::vector<expected_step> table = {
      // overflow, applied, scale, growth_tracker, hysteresis_left, consecutive_skips
      {F, true, 8, 1, 1, 0},   // step 0
      {F, true, 8, 2, 1, 0},   // 1
      {F, true, 16, 0, 1, 0},  // 2: third finite step grows
      {O, false, 8, 0, 1, 1},  // 3
      {F, true, 8, 1, 1, 0},   // 4
      {F, true, 8, 2, 1, 0},   // 5
      {O, false, 4, 0, 1, 1},  // 6: overflow one step before growth
      {F, true, 4, 1, 1, 0},   // 7
      {F, true, 4, 2, 1, 0},   // 8
      {F, true, 8, 0, 1, 0},   // 9
      {O, false, 4, 0, 1, 1},  // 10
      {O, false, 2, 0, 1, 2},  // 11
      {O, false, 1, 0, 1, 3},  // 12
      {O, false, 1, 0, 1, 4},  // 13: min_scale 1 holds
      {F, true, 1, 1, 1, 0},   // 14
      {F, true, 1, 2, 1, 0},   // 15
      {F, true, 2, 0, 1, 0},   // 16
  };
  run_reference(scaler, table);
}

TEST_CASE("dynamic_loss_scaler follows the reference sequence with hysteresis 2") {
  dynamic_loss_scaler scaler({.initial_scale = 8,
                              .growth_factor = 2,
                              .backoff_factor = 0.5,
                              .growth_interval = 3,
                              .hysteresis = 2});
  // Backoff on the second overflow in a row; a finite step refills the hysteresis; an overflow
  // that does not back off still restarts the growth count.
  const std::vector<expected_step> table = {
      {F, true, 8, 1, 2, 0},    // step 0
      {F, true, 8, 2, 2, 0},    // 1
      {F, true, 16, 0, 2, 0},   // 2: grows
      {O, false, 16, 0, 1, 1},  // 3: first overflow, no backoff
      {F, true, 16, 1, 2, 0},   // 4: refills the hysteresis
      {O, false, 16, 0, 1, 1},  // 5: first overflow again, no backoff
      {O, false, 8, 0, 2, 2},   // 6: second in a row backs off and refills
      {O, false, 8, 0, 1, 3},   // 7
      {O, false, 4, 0, 2, 4},   // 8
      {F, true, 4, 1, 2, 0},    // 9
      {F, true, 4, 2, 2, 0},    // 10
      {O, false, 4, 0, 1, 1},   // 11: restarts the growth count without backoff
      {F, true, 4, 1, 2, 0},    // 12
      {F, true, 4, 2, 2, 0},    // 13
      {F, true, 8, 0, 2, 0},    // 14
  };
  run_reference(scaler, table);
}

TEST_CASE("dynamic_loss_scaler clamps to min_scale and max_scale") {
  SUBCASE("max_scale, not a power of two") {
    dynamic_loss_scaler scaler({.initial_scale = 4, .growth_interval = 1, .max_scale = 10});
    CHECK(scaler.update(false));
    CHECK(scaler.scale() == 8);
    CHECK(scaler.update(false));
    CHECK(scaler.scale() == 10);
    CHECK(scaler.update(false));
    CHECK(scaler.scale() == 10);
    CHECK(scaler.state().growth_tracker == 0);
    CHECK_FALSE(scaler.update(true));
    CHECK(scaler.scale() == 5);
  }
  SUBCASE("min_scale, not a power of two") {
    dynamic_loss_scaler scaler({.initial_scale = 4, .growth_interval = 1, .min_scale = 3});
    CHECK_FALSE(scaler.update(true));
    CHECK(scaler.scale() == 3);
    CHECK_FALSE(scaler.update(true));
    CHECK(scaler.scale() == 3);
    CHECK(scaler.update(false));
    CHECK(scaler.scale() == 6);
  }
}

TEST_CASE("dynamic_loss_scaler aborts after max_consecutive_skips overflows in a row") {
  const loss_scaler_config config{.initial_scale = 8, .max_consecutive_skips = 3};
  SUBCASE("a finite step resets the count") {
    dynamic_loss_scaler scaler(config);
    for (int round = 0; round < 4; ++round) {
      CHECK_FALSE(scaler.update(true));
      CHECK_FALSE(scaler.update(true));
      CHECK(scaler.update(false));
    }
    CHECK(scaler.state().skipped_total == 8);
    CHECK(scaler.state().consecutive_skips == 0);
  }
  SUBCASE("the third in a row throws, naming step, scale and count") {
    dynamic_loss_scaler scaler(config);
    CHECK(scaler.update(false));       // step 0
    CHECK(scaler.update(false));       // step 1
    CHECK_FALSE(scaler.update(true));  // step 2: scale 4
    CHECK_FALSE(scaler.update(true));  // step 3: scale 2
    bool thrown = false;
    try {
      scaler.update(true);  // step 4: scale 1
    } catch (const strata::precision::loss_scale_error& e) {
      thrown = true;
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(e.step() == 4);
      CHECK(e.scale() == 1.0);
      CHECK(e.consecutive_skips() == 3);
      CHECK(what.find("3 consecutive steps") != std::string::npos);
      CHECK(what.find("steps 2 to 4") != std::string::npos);
      CHECK(what.find("at step 4") != std::string::npos);
      CHECK(what.find("loss scale 1 ") != std::string::npos);
      CHECK(what.find("learning rate") != std::string::npos);
      CHECK(what.find("bfloat16") != std::string::npos);
      CHECK(e.state() == scaler.state());
    }
    CHECK(thrown);
    CHECK(scaler.state() == loss_scaler_state{.scale = 1,
                                              .growth_tracker = 0,
                                              .hysteresis_left = 1,
                                              .consecutive_skips = 3,
                                              .skipped_total = 3,
                                              .steps = 5});
  }
  SUBCASE("the error is a strata::error") {
    dynamic_loss_scaler scaler({.max_consecutive_skips = 1});
    CHECK_THROWS_AS(scaler.update(true), strata::error);
  }
}

TEST_CASE("loss_scaler_state round-trips through JSON and restore continues identically") {
  const loss_scaler_config config{.initial_scale = 1024,
                                  .growth_factor = 3,
                                  .backoff_factor = 0.3,
                                  .growth_interval = 4,
                                  .hysteresis = 3,
                                  .min_scale = 0.1};
  const std::array<bool, 12> warmup = {F, F, O, F, F, F, F, O, O, O, O, F};
  dynamic_loss_scaler original(config);
  for (const bool overflow : warmup) {
    original.update(overflow);
  }
  // 1024 * 3 after four finite steps, * 0.3 on the third overflow in a row.
  CHECK(original.scale() == 1024.0 * 3.0 * 0.3);
  CHECK(original.state().hysteresis_left == 3);
  CHECK(original.state().growth_tracker == 1);

  const std::string text = to_json(original.state()).dump();
  const loss_scaler_state read =
      strata::precision::loss_scaler_state_from_json(nlohmann::json::parse(text));
  CHECK(read == original.state());

  dynamic_loss_scaler resumed(config);
  resumed.restore(read);
  CHECK(resumed.state() == original.state());
  const std::array<bool, 14> rest = {O, F, F, F, O, O, O, O, F, F, F, F, F, F};
  for (const bool overflow : rest) {
    CHECK(resumed.update(overflow) == original.update(overflow));
    CHECK(resumed.state() == original.state());
  }
  CHECK(resumed.state().steps == warmup.size() + rest.size());
}

TEST_CASE("dynamic_loss_scaler rejects an invalid config naming the field and value") {
  const auto check = [](const loss_scaler_config& c, const std::string& field,
                        const std::string& value) {
    const std::string message = config_error_message(c);
    CAPTURE(message);
    CHECK(message.find("loss_scaler_config." + field) != std::string::npos);
    CHECK(message.find("got " + value) != std::string::npos);
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  check({.initial_scale = 0}, "initial_scale", "0");
  check({.initial_scale = -2}, "initial_scale", "-2");
  check({.initial_scale = inf}, "initial_scale", "inf");
  check({.initial_scale = nan}, "initial_scale", "nan");
  check({.growth_factor = 1}, "growth_factor", "1");
  check({.growth_factor = inf}, "growth_factor", "inf");
  check({.backoff_factor = 0}, "backoff_factor", "0");
  check({.backoff_factor = 1}, "backoff_factor", "1");
  check({.backoff_factor = nan}, "backoff_factor", "nan");
  check({.growth_interval = 0}, "growth_interval", "0");
  check({.hysteresis = 0}, "hysteresis", "0");
  check({.initial_scale = 1, .min_scale = 0}, "min_scale", "0");
  check({.initial_scale = 1, .min_scale = 1e-300}, "min_scale", "1e-300");
  check({.max_scale = 1e300}, "max_scale", "1e+300");
  check({.initial_scale = 0.5}, "initial_scale", "0.5");  // below min_scale 1
  check({.initial_scale = 4, .max_scale = 2}, "initial_scale", "4");
  check({.max_consecutive_skips = 0}, "max_consecutive_skips", "0");
  CHECK(config_error_message({.initial_scale = 1, .min_scale = 1, .max_scale = 1}).empty());
}

TEST_CASE("restore and loss_scaler_state_from_json reject invalid states") {
  using strata::precision::loss_scaler_state_from_json;
  dynamic_loss_scaler scaler({.initial_scale = 8, .growth_interval = 3, .hysteresis = 2});
  const loss_scaler_state good{.scale = 16,
                               .growth_tracker = 2,
                               .hysteresis_left = 1,
                               .consecutive_skips = 1,
                               .skipped_total = 4,
                               .steps = 9};
  CHECK(invalid_argument_message([&] { scaler.restore(good); }).empty());

  const auto restore_error = [&](loss_scaler_state s) {
    return invalid_argument_message([&] { scaler.restore(s); });
  };
  const auto with = [&](auto member, auto value) {
    loss_scaler_state s = good;
    s.*member = value;
    return s;
  };
  CHECK(restore_error(with(&loss_scaler_state::scale, 0.0)).find("loss_scaler_state.scale") !=
        std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::scale, std::numeric_limits<double>::infinity()))
            .find("loss_scaler_state.scale") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::scale, 0.5)).find("min_scale") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::growth_tracker, std::uint64_t{3}))
            .find("loss_scaler_state.growth_tracker") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::hysteresis_left, std::uint32_t{0}))
            .find("loss_scaler_state.hysteresis_left") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::hysteresis_left, std::uint32_t{3}))
            .find("loss_scaler_state.hysteresis_left") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::consecutive_skips, std::uint64_t{5}))
            .find("loss_scaler_state.consecutive_skips") != std::string::npos);
  CHECK(restore_error(with(&loss_scaler_state::skipped_total, std::uint64_t{10}))
            .find("loss_scaler_state.skipped_total") != std::string::npos);
  CHECK(scaler.state() == good);  // a rejected state leaves the scaler as it was

  const nlohmann::json valid = to_json(good);
  CHECK(loss_scaler_state_from_json(valid) == good);
  const auto json_error = [](const nlohmann::json& j) {
    return invalid_argument_message([&] { loss_scaler_state_from_json(j); });
  };
  CHECK(json_error(nlohmann::json::array()).find("object") != std::string::npos);
  for (const char* field : {"scale", "growth_tracker", "hysteresis_left", "consecutive_skips",
                            "skipped_total", "steps"}) {
    CAPTURE(field);
    nlohmann::json missing = valid;
    missing.erase(field);
    const std::string message = json_error(missing);
    CHECK(message.find(std::string("'") + field + "' is missing") != std::string::npos);
    nlohmann::json wrong_type = valid;
    wrong_type[field] = "12";
    CHECK(json_error(wrong_type).find(std::string("'") + field + "'") != std::string::npos);
  }
  const auto changed = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json j = valid;
    j[field] = value;
    return json_error(j);
  };
  CHECK(changed("scale", nullptr).find("'scale'") != std::string::npos);  // how inf is dumped
  CHECK(changed("scale", -1.0).find("loss_scaler_state.scale") != std::string::npos);
  CHECK(changed("scale", 0).find("loss_scaler_state.scale") != std::string::npos);
  CHECK(changed("scale", 32).empty());  // an integer scale is a number
  CHECK(changed("steps", -1).find("'steps'") != std::string::npos);
  CHECK(changed("steps", 9.5).find("'steps'") != std::string::npos);
  CHECK(changed("steps", std::int64_t{9}).empty());  // a signed non-negative integer is fine
  CHECK(changed("hysteresis_left", std::uint64_t{1} << 32).find("'hysteresis_left'") !=
        std::string::npos);
  CHECK(changed("hysteresis_left", 0).find("hysteresis_left") != std::string::npos);
  CHECK(changed("consecutive_skips", 5).find("consecutive_skips") != std::string::npos);
  CHECK(changed("steps", 3).find("skipped_total") != std::string::npos);
  nlohmann::json extra = valid;
  extra["scael"] = 1.0;
  CHECK(json_error(extra).find("unknown field 'scael'") != std::string::npos);
}

TEST_CASE("all_finite and unscale_and_check find NaN and inf anywhere") {
  using strata::precision::all_finite;
  using strata::precision::unscale_and_check;
  const float bad_values[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{16},
                              std::size_t{37}, std::size_t{1000003}}) {
    CAPTURE(n);
    std::vector<float> values(n);
    const auto fill = [&] {
      for (std::size_t i = 0; i < n; ++i) {
        values[i] = static_cast<float>(i % 1000) - 500.0f;
      }
    };
    fill();
    CHECK(all_finite(values));
    CHECK(unscale_and_check(values, 4.0));
    fill();
    // Every position of the short ranges; first, middle and last of the long one.
    std::vector<std::size_t> positions;
    if (n <= 64) {
      for (std::size_t i = 0; i < n; ++i) {
        positions.push_back(i);
      }
    } else {
      positions = {0, n / 2, n - 1};
    }
    for (const std::size_t pos : positions) {
      for (const float bad : bad_values) {
        CAPTURE(pos);
        CAPTURE(bad);
        values[pos] = bad;
        CHECK_FALSE(all_finite(values));
        // From one buffer into another: the same verdict, the source untouched.
        std::vector<float> into(n);
        CHECK_FALSE(unscale_and_check(std::span<const float>(values), into, 4.0));
        CHECK(std::isnan(values[pos]) == std::isnan(bad));
        CHECK_FALSE(unscale_and_check(values, 4.0));
        fill();
      }
    }
    CHECK(all_finite(values));
    // The copying form writes what the in-place form writes.
    std::vector<float> into(n, -1.0f);
    CHECK(unscale_and_check(std::span<const float>(values), into, 4.0));
    CHECK(unscale_and_check(values, 4.0));
    CHECK(into == values);
  }
  std::vector<float> three(3);
  const std::vector<float> four(4);
  CHECK_THROWS_WITH_AS(unscale_and_check(std::span<const float>(four), three, 1.0),
                       "unscale_and_check: to must be 4 floats, as from, got 3 floats",
                       std::invalid_argument);
}

TEST_CASE("all_finite and unscale_and_check keep extreme finite values finite") {
  using strata::precision::all_finite;
  using strata::precision::unscale_and_check;
  constexpr float max = std::numeric_limits<float>::max();
  constexpr float denorm = std::numeric_limits<float>::denorm_min();
  std::vector<float> values(40, 1.0f);
  values[0] = max;
  values[5] = -max;
  values[17] = denorm;
  values[33] = -denorm;
  values[39] = -0.0f;
  CHECK(all_finite(values));
  CHECK(unscale_and_check(values, 65536.0));
  CHECK(values[0] == max / 65536.0f);
  CHECK(values[17] == 0.0f);  // underflows to zero, still finite
  // A finite gradient that the unscale overflows (scale < 1) is reported.
  std::vector<float> big = {1.0f, max, 2.0f};
  CHECK_FALSE(unscale_and_check(big, 0.5));
  CHECK(big[0] == 2.0f);
  CHECK(big[2] == 4.0f);  // the whole range is processed

  CHECK_THROWS_AS(unscale_and_check(values, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(unscale_and_check(values, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(unscale_and_check(values, std::numeric_limits<double>::infinity()),
                  std::invalid_argument);
  CHECK_THROWS_AS(unscale_and_check(values, 1e-300), std::invalid_argument);  // 1/scale is inf
}

TEST_CASE("unscale_and_check multiplies by the float reciprocal of the scale") {
  using strata::precision::unscale_and_check;
  const double scale = 3.0;
  const float inv = static_cast<float>(1.0 / scale);
  std::vector<float> input(1000);
  for (std::size_t i = 0; i < input.size(); ++i) {
    input[i] = 1.0f + static_cast<float>(i) * 0.37f;
  }
  std::vector<float> output = input;
  CHECK(unscale_and_check(output, scale));
  std::size_t differs_from_division = 0;
  for (std::size_t i = 0; i < input.size(); ++i) {
    CAPTURE(i);
    CHECK(std::bit_cast<std::uint32_t>(output[i]) == std::bit_cast<std::uint32_t>(input[i] * inv));
    differs_from_division += output[i] != input[i] / 3.0f ? 1 : 0;
  }
  // The inputs tell multiplication by the reciprocal from division apart.
  CHECK(differs_from_division > 0);
}
