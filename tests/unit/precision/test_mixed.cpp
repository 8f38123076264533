// SPDX-License-Identifier: Apache-2.0
#include "strata/precision/mixed.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/batch/adaptive.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/round.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/gemm.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

#include "../common/blobs.hpp"
#include "unit/common/needs.hpp"

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace sm = strata::model;
namespace sp = strata::precision;
namespace st = strata::train;

namespace {

// Bits that cover every class of float: zeros, subnormals, normals near the 16-bit types'
// limits and rounding ties, infinities and NaNs, plus random patterns.
std::vector<float> probe_values() {
  std::vector<float> v;
  const std::uint32_t specials[] = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u,
      0x337fffffu, 0x387fc000u, 0x38800000u, 0x3f800000u, 0x3f801000u, 0x3f802000u, 0x3f803000u,
      0x3f808000u, 0x3f818000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u,
      0x7f7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u};
  for (const std::uint32_t b : specials) {
    v.push_back(std::bit_cast<float>(b));
    v.push_back(-std::bit_cast<float>(b));
  }
  strata::rng_stream rng = strata::rng_stream::for_sample(7, 0, 0);
  for (int i = 0; i < 200000; ++i) {
    v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng.next_u64())));
  }
  // Values in the range training produces.
  for (int i = 0; i < 50000; ++i) {
    v.push_back(rng.normal_float() * std::ldexp(1.0f, static_cast<int>(rng.next_u64() % 40) - 30));
  }
  return v;
}

bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

using strata::test::blobs;

auto small_model() {
  return strata::test::blobs_mlp();
}

strata::config::train_config base_config(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "mixed" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.epochs = 3;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  cfg.warmup_epochs = 0.5;
  return cfg;
}

bool representable(std::span<const float> values, strata::dtype type) {
  std::vector<float> copy(values.begin(), values.end());
  strata::round_through(copy, type);
  for (std::size_t i = 0; i < copy.size(); ++i) {
    if (!same_value(copy[i], values[i])) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("round_through equals a conversion to the 16-bit type and back") {
  const std::vector<float> values = probe_values();
  for (const strata::dtype type : {strata::dtype::float16, strata::dtype::bfloat16}) {
    std::vector<float> rounded = values;
    strata::round_through(rounded, type);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float want = type == strata::dtype::float16
                             ? static_cast<float>(strata::float16(values[i]))
                             : static_cast<float>(strata::bfloat16(values[i]));
      if (!same_value(rounded[i], want)) {
        if (wrong++ < 5) {
          INFO("value bits ", std::bit_cast<std::uint32_t>(values[i]));
          CHECK(std::bit_cast<std::uint32_t>(rounded[i]) == std::bit_cast<std::uint32_t>(want));
        }
      }
    }
    CHECK_MESSAGE(wrong == 0, strata::to_string(type));
  }
  // The software path agrees with whichever path round_through took.
  std::vector<float> portable = values;
  strata::detail::round_through_float16_portable(portable.data(), portable.data(), portable.size());
  std::vector<float> fast = values;
  strata::round_through(fast, strata::dtype::float16);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    differ += same_value(portable[i], fast[i]) ? 0 : 1;
  }
  CHECK(differ == 0);
  // The copying form (from one buffer into another, the source untouched) gives the in-place
  // form's values for every type.
  for (const strata::dtype type :
       {strata::dtype::float16, strata::dtype::bfloat16, strata::dtype::float32}) {
    std::vector<float> in_place = values;
    strata::round_through(in_place, type);
    std::vector<float> copied(values.size(), -1.0f);
    const std::vector<float> source = values;
    strata::round_through(std::span<const float>(source), copied, type);
    std::size_t apart = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      apart += same_value(in_place[i], copied[i]) && same_value(source[i], values[i]) ? 0 : 1;
    }
    CHECK_MESSAGE(apart == 0, strata::to_string(type));
  }
  std::vector<float> short_one(values.size() - 1);
  const std::string sizes = "from holds " + std::to_string(values.size()) + " floats, to holds " +
                            std::to_string(short_one.size());
  CHECK_THROWS_WITH_AS(
      strata::round_through(std::span<const float>(values), short_one, strata::dtype::bfloat16),
      doctest::Contains(sizes.c_str()), std::invalid_argument);
  MESSAGE("float16 rounding on F16C: ", strata::round_through_uses_f16c());
  // Overflow and float32 identity.
  std::vector<float> big = {70000.0f, -65520.0f, 65519.0f};
  strata::round_through(big, strata::dtype::float16);
  CHECK(std::isinf(big[0]));
  CHECK(std::isinf(big[1]));
  CHECK(big[2] == 65504.0f);
  std::vector<float> same = {0.1f};
  strata::round_through(same, strata::dtype::float32);
  CHECK(same[0] == 0.1f);
  CHECK_THROWS_WITH_AS(strata::round_through(same, strata::dtype::int32),
                       doctest::Contains("int32"), std::invalid_argument);
}

TEST_CASE("convert_floats equals the element conversions, both ways, at every length") {
  const std::vector<float> values = probe_values();
  // Lengths around the 8-wide F16C blocks, and every probe value at once.
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                              std::size_t{9}, std::size_t{17}, values.size()}) {
    INFO("n = ", n);
    std::vector<strata::float16> half(n + 1, strata::float16::from_bits(0x1234));
    std::vector<strata::bfloat16> brain(n + 1, strata::bfloat16::from_bits(0x1234));
    strata::convert_floats(values.data(), half.data(), n);
    strata::convert_floats(values.data(), brain.data(), n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const strata::float16 h(values[i]);
      const bool nan = std::isnan(values[i]);
      wrong += nan ? (strata::isnan(half[i]) ? 0 : 1) : (half[i].bits() == h.bits() ? 0 : 1);
      wrong += brain[i].bits() == strata::bfloat16(values[i]).bits() ? 0 : 1;
    }
    CHECK(wrong == 0);
    // Nothing written past n.
    CHECK(half[n].bits() == 0x1234);
    CHECK(brain[n].bits() == 0x1234);
  }
  // Every float16 and bfloat16 bit pattern back to float.
  std::vector<strata::float16> all_half(65536);
  std::vector<strata::bfloat16> all_brain(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    all_half[b] = strata::float16::from_bits(static_cast<std::uint16_t>(b));
    all_brain[b] = strata::bfloat16::from_bits(static_cast<std::uint16_t>(b));
  }
  std::vector<float> wide(65536);
  strata::convert_floats(all_half.data(), wide.data(), wide.size());
  std::size_t wrong = 0;
  for (std::size_t b = 0; b < wide.size(); ++b) {
    wrong += same_value(wide[b], static_cast<float>(all_half[b])) ? 0 : 1;
  }
  strata::convert_floats(all_brain.data(), wide.data(), wide.size());
  for (std::size_t b = 0; b < wide.size(); ++b) {
    wrong += same_value(wide[b], static_cast<float>(all_brain[b])) ? 0 : 1;
  }
  CHECK(wrong == 0);
  // The forms with the type at run time (wire buffers) give the same bits.
  std::vector<std::uint16_t> bits(values.size());
  std::vector<strata::float16> typed(values.size());
  strata::convert_floats(values.data(), bits.data(), values.size(), strata::dtype::float16);
  strata::convert_floats(values.data(), typed.data(), values.size());
  std::vector<float> back(values.size());
  strata::convert_floats(bits.data(), back.data(), values.size(), strata::dtype::float16);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    differ += bits[i] == typed[i].bits() ? 0 : 1;
    differ += same_value(back[i], static_cast<float>(typed[i])) ? 0 : 1;
  }
  strata::convert_floats(values.data(), bits.data(), values.size(), strata::dtype::bfloat16);
  for (std::size_t i = 0; i < values.size(); ++i) {
    differ += bits[i] == strata::bfloat16(values[i]).bits() ? 0 : 1;
  }
  CHECK(differ == 0);
  CHECK_THROWS_WITH_AS(
      strata::convert_floats(values.data(), bits.data(), 1, strata::dtype::float32),
      doctest::Contains("float32"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(strata::convert_floats(bits.data(), back.data(), 1, strata::dtype::int32),
                       doctest::Contains("int32"), std::invalid_argument);
}

TEST_CASE("sequential stores activations and input gradients in the storage type") {
  const auto model = small_model();
  auto params = model.make_params();
  params.initialize(3);
  auto work = model.make_workspace(16);
  std::vector<float> input(16 * 8);
  for (std::size_t i = 0; i < input.size(); ++i) {
    input[i] = 0.37f * static_cast<float>(i % 11) - 1.3f;
  }
  const auto out = model.forward(work, params, input, 16,
                                 {.training = true, .storage = strata::dtype::bfloat16});
  CHECK(representable(out, strata::dtype::bfloat16));
  const std::vector<float> plain(out.begin(), out.end());
  const auto full = model.forward(work, params, input, 16, {.training = true});
  bool differs = false;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    differs = differs || plain[i] != full[i];
  }
  CHECK(differs);  // the rounding is real
}

namespace {

// bfloat16 training against float32 under each of `modes` (the second, if any, compared with
// the first step by step).
void check_bf16_training(const std::vector<strata::model::bf16_products_mode>& modes) {
  auto cfg = base_config("bf16");
  const blobs train{.n = 512};
  const blobs test{.n = 256, .salt = 1};
  st::trainer<decltype(small_model()), sp::fp32> full(small_model(), cfg,
                                                      {.print_progress = false});
  const st::fit_summary f = full.fit(train, sd::identity{}, test, sd::identity{});
  struct restore {
    ~restore() { strata::model::set_bf16_products(strata::model::bf16_products_mode::automatic); }
  } restore_mode;
  std::vector<float> first_losses;
  std::string first_hash;
  for (const auto mode : modes) {
    CAPTURE(static_cast<int>(mode));
    strata::model::set_bf16_products(mode);
    cfg = base_config("bf16");
    cfg.mixed_precision_dtype = strata::config::precision_dtype::bfloat16;
    cfg.gemm = mode == strata::model::bf16_products_mode::on ? strata::config::gemm_kind::onednn
                                                             : strata::config::gemm_kind::automatic;
    st::trainer<decltype(small_model()), sp::bf16> half(small_model(), cfg,
                                                        {.print_progress = false});
    std::size_t steps = 0;
    half.on_gradients([&](std::uint64_t, std::span<float> grads) {
      CHECK(representable(grads, strata::dtype::bfloat16));
      ++steps;
    });
    std::vector<float> losses;
    half.on_step([&](const st::step_metrics& m) { losses.push_back(static_cast<float>(m.loss)); });
    const st::fit_summary h = half.fit(train, sd::identity{}, test, sd::identity{});
    CHECK(steps == h.steps);
    CHECK(half.skipped_steps() == 0);
    CHECK(half.loss_scale() == 1.0);
    // The master weights took float32 updates: they are not all bfloat16 values.
    CHECK_FALSE(representable(half.params().values(), strata::dtype::bfloat16));
    CHECK(f.params_xxh3 != h.params_xxh3);
    CHECK(h.test_accuracy > 0.9);
    CHECK(std::abs(h.test_accuracy - f.test_accuracy) <= 0.02);
    // bfloat16 products against float32 ones on the same bfloat16 values: the first step's
    // loss agrees closely (only the model's input is rounded in addition), later ones drift
    // apart by bfloat16 rounding only.
    if (first_losses.empty()) {
      first_losses = losses;
      first_hash = h.params_xxh3;
    } else {
      CHECK(h.params_xxh3 != first_hash);  // the products did run in bfloat16
      REQUIRE(losses.size() == first_losses.size());
      CHECK(losses[0] == doctest::Approx(first_losses[0]).epsilon(1e-2));
      CHECK(losses.back() == doctest::Approx(first_losses.back()).epsilon(0.2));
    }
  }
}

}  // namespace

TEST_CASE("bfloat16 training keeps float32 master weights and learns like float32") {
  // Emulated: float32 products on bfloat16 values.
  check_bf16_training({strata::model::bf16_products_mode::off});
}

// With oneDNN's bfloat16 products (forced on: this CPU may emulate the units it lacks), against
// the emulated products.
STRATA_TEST_CASE_NEEDING(
    "bfloat16 training on oneDNN's bfloat16 products learns like the "
    "emulated products",
    strata::model::bf16_products_supported(), strata::model::bf16_products_refusal()) {
  check_bf16_training(
      {strata::model::bf16_products_mode::off, strata::model::bf16_products_mode::on});
}

TEST_CASE("bf16_products = on that cannot run is a config_error naming the key, before training") {
  namespace sm = strata::model;
  struct restore {
    ~restore() { sm::set_bf16_products(sm::bf16_products_mode::automatic); }
  } restore_mode;
  auto cfg = base_config("bf16_refused");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::bfloat16;
  cfg.bf16_products = strata::config::bf16_products_kind::on;
  using half_trainer = st::trainer<decltype(small_model()), sp::bf16>;
  if (!sm::bf16_products_supported()) {
    // This CPU or build (or its cap, STRATA_CPU_ISA): the reason and what would work.
    CHECK_THROWS_WITH_AS(half_trainer(small_model(), cfg, {.print_progress = false}),
                         doctest::Contains("bf16_products = auto or off"), strata::config_error);
    try {
      half_trainer t(small_model(), cfg, {.print_progress = false});
    } catch (const strata::config_error& e) {
      CHECK(e.key() == "bf16_products");
    }
  } else {
    // On oneDNN it runs, and gemm = auto takes oneDNN for it.
    half_trainer t(small_model(), cfg, {.print_progress = false});
    CHECK(sm::current_gemm() == sm::gemm_provider::onednn);
    CHECK(sm::bf16_products(sm::current_gemm()));
  }
  // Another provider named with it is refused, whatever the CPU.
  if (sm::gemm_compiled(sm::gemm_provider::openblas)) {
    cfg.gemm = strata::config::gemm_kind::openblas;
    CHECK_THROWS_WITH_AS(half_trainer(small_model(), cfg, {.print_progress = false}),
                         doctest::Contains("bf16_products"), strata::config_error);
  }
}

TEST_CASE("the log's first lines say how 16-bit products run on this CPU, and why") {
  namespace sm = strata::model;
  const strata::config::train_config cfg;
  const sm::gemm_decision d = st::detail::choose_gemm(cfg);
  const auto precision_lines = [&](std::string_view storage) {
    std::vector<std::string> found;
    for (const std::string& line : st::detail::compute_log(d, 8, 32, 16, storage)) {
      if (line.starts_with("precision: ")) {
        found.push_back(line);
      }
    }
    return found;
  };
  CHECK(precision_lines("float32").empty());
  const auto bf16 = precision_lines("bfloat16");
  REQUIRE(bf16.size() == 1);
  CAPTURE(bf16[0]);
  const auto cpu = strata::detect_cpu_features();
  if (sm::bf16_products(d.provider)) {
    CHECK(bf16[0].starts_with("precision: bfloat16 products on oneDNN ("));
  } else if (d.provider == sm::gemm_provider::onednn && cpu.avx512_bf16 && !cpu.amx_bf16) {
    // The units are there without AMX: float32 products, with what the probe measured.
    CHECK(bf16[0].starts_with("precision: bfloat16 products on oneDNN measured "));
    CHECK(bf16[0].find("so the products run in float32") != std::string::npos);
  } else {
    CHECK(bf16[0].starts_with("precision: bfloat16 is emulated"));
  }
  const auto fp16 = precision_lines("float16");
  REQUIRE(fp16.size() == 1);
  CHECK(fp16[0].starts_with("precision: float16 is emulated"));
  CAPTURE(fp16[0]);
  if (cpu.amx_fp16) {
    CHECK(fp16[0].find("this CPU has AMX-FP16, which") != std::string::npos);
  } else if (cpu.avx512_fp16) {
    CHECK(fp16[0].find("whose float16 products accumulate in float16") != std::string::npos);
  } else {
    CHECK(fp16[0].find("this CPU has no AVX512-FP16 or AMX-FP16") != std::string::npos);
  }
  // Off: the emulated line whatever the CPU has.
  struct restore {
    ~restore() { sm::set_bf16_products(sm::bf16_products_mode::automatic); }
  } restore_mode;
  sm::set_bf16_products(sm::bf16_products_mode::off);
  const auto off = precision_lines("bfloat16");
  REQUIRE(off.size() == 1);
  CHECK(off[0].starts_with("precision: bfloat16 is emulated"));
}

TEST_CASE("the log says how the threads share the CPUs when loader workers outnumber them") {
  using st::detail::threads_note;
  // Room for everything, or no workers: nothing to say.
  CHECK(threads_note(8, 2, 2, 2, 10).empty());
  CHECK(threads_note(2, 1, 2, 0, 10).empty());
  // Example 01 on 2 CPUs: 2 GEMM threads and a worker.
  const std::string two = threads_note(2, 1, 2, 1, 10);
  CHECK(two ==
        "threads: 1 rank(s) x (2 GEMM + 1 loader) threads on 2 usable CPU(s): the loader "
        "workers run at nice +10, below the products, and take the CPU time the products "
        "leave (a loader that falls behind shows as data time in the epoch lines); "
        "blas_threads 1 would give the workers CPUs of their own, for a loader that needs them");
  // 4 thread ranks of 1 GEMM thread and 2 workers each on 4 CPUs: at least 1 GEMM thread.
  CHECK(threads_note(4, 4, 1, 2, 10)
            .ends_with("blas_threads 1 would give the workers CPUs of their own, for a loader "
                       "that needs them"));
  // GEMM threads below the CPUs, but the workers on top overflow them.
  CHECK(threads_note(4, 1, 3, 2, 10).ends_with("; blas_threads and loader_workers set the split"));
  CHECK(threads_note(2, 1, 2, 1, 0).find("compete with the products at the same priority") !=
        std::string::npos);
}

TEST_CASE("float16 with injected overflows skips those steps bit for bit and recovers") {
  auto cfg = base_config("fp16-inject");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  cfg.loss_scale_growth_interval = 10;
  const blobs train{.n = 512};
  const blobs test{.n = 256, .salt = 1};
  using trainer_t = st::trainer<decltype(small_model()), sp::fp16>;
  trainer_t t(small_model(), cfg, {.print_progress = false});
  const std::vector<std::uint64_t> inject = {3, 4, 20, 33};  // 3 and 4: two in a row
  std::vector<std::string> params_after;
  std::vector<st::step_metrics> steps;
  t.on_gradients([&](std::uint64_t step, std::span<float> grads) {
    for (const std::uint64_t s : inject) {
      if (s == step) {
        grads[step % grads.size()] = step == 4 ? std::numeric_limits<float>::quiet_NaN()
                                               : std::numeric_limits<float>::infinity();
      }
    }
  });
  t.on_step([&](const st::step_metrics& m) {
    steps.push_back(m);
    params_after.push_back(st::xxh3_hex(t.params().values()));
  });
  const st::fit_summary s = t.fit(train, sd::identity{}, test, sd::identity{});
  REQUIRE(steps.size() == 48);
  CHECK(t.skipped_steps() == inject.size());
  double scale = 65536.0;
  std::uint64_t growth = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const bool injected = std::find(inject.begin(), inject.end(), i) != inject.end();
    INFO("step ", i);
    CHECK(steps[i].skipped == injected);
    CHECK(steps[i].loss_scale == scale);
    if (injected) {
      // Parameters untouched (and, below, Adam's step count).
      CHECK(params_after[i] == (i == 0 ? params_after[i] : params_after[i - 1]));
      scale *= 0.5;
      growth = 0;
    } else {
      if (i > 0) {
        CHECK(params_after[i] != params_after[i - 1]);
      }
      if (++growth == 10) {
        scale *= 2.0;
        growth = 0;
      }
    }
  }
  CHECK(t.loss_scale() == scale);
  CHECK(s.test_accuracy > 0.9);

  // The same run without faults: Adam's bias correction saw 4 steps fewer in the faulty run, so
  // the two differ, but both learn.
  cfg = base_config("fp16-clean");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  cfg.loss_scale_growth_interval = 10;
  trainer_t clean(small_model(), cfg, {.print_progress = false});
  const st::fit_summary c = clean.fit(train, sd::identity{}, test, sd::identity{});
  CHECK(c.params_xxh3 != s.params_xxh3);
  CHECK(std::abs(c.test_accuracy - s.test_accuracy) <= 0.03);
}

TEST_CASE("a skipped step leaves parameters and optimizer state bit-identical, also on resume") {
  // Run A: 48 steps with an overflow at step 17. Run B: stop after 20 steps (max_steps), then
  // run C resumes it: C's final parameters equal A's, so the scaler state and the skip count went
  // through the checkpoint.
  const blobs train{.n = 512};
  const blobs test{.n = 256, .salt = 1};
  using trainer_t = st::trainer<decltype(small_model()), sp::fp16>;
  auto inject = [](trainer_t& t) {
    t.on_gradients([](std::uint64_t step, std::span<float> grads) {
      if (step == 17) {
        grads[0] = std::numeric_limits<float>::infinity();
      }
    });
  };
  auto cfg = base_config("fp16-resume-a");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  trainer_t a(small_model(), cfg, {.print_progress = false});
  inject(a);
  const st::fit_summary ra = a.fit(train, sd::identity{}, test, sd::identity{});
  CHECK(a.skipped_steps() == 1);
  CHECK(a.loss_scale() == 32768.0);

  cfg = base_config("fp16-resume-b");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  cfg.max_steps = 20;
  {
    trainer_t b(small_model(), cfg, {.print_progress = false});
    inject(b);
    const st::fit_summary rb = b.fit(train, sd::identity{}, test, sd::identity{});
    CHECK(rb.stopped_by_max_steps);
    CHECK(b.skipped_steps() == 1);
  }
  cfg.max_steps = 0;
  trainer_t c(small_model(), cfg, {.print_progress = false});
  inject(c);
  const st::fit_summary rc = c.fit(train, sd::identity{}, test, sd::identity{});
  CHECK_FALSE(rc.resumed_from.empty());
  CHECK(c.skipped_steps() == 1);
  CHECK(c.loss_scale() == a.loss_scale());
  CHECK(rc.params_xxh3 == ra.params_xxh3);
}

TEST_CASE("float16 aborts after too many overflows in a row, naming the step and scale") {
  auto cfg = base_config("fp16-abort");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.loss_scale_max_skips = 3;
  st::trainer<decltype(small_model()), sp::fp16> t(small_model(), cfg, {.print_progress = false});
  t.on_gradients([](std::uint64_t step, std::span<float> grads) {
    if (step >= 5) {
      grads[1] = std::numeric_limits<float>::quiet_NaN();
    }
  });
  CHECK_THROWS_WITH_AS(t.fit(blobs{}, sd::identity{}, blobs{.n = 64, .salt = 1}, sd::identity{}),
                       doctest::Contains("aborting at step 7 with loss scale 8192"),
                       strata::precision::loss_scale_error);
}

TEST_CASE("a precision policy and a different mixed_precision_dtype are refused by key") {
  auto cfg = base_config("refused");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  CHECK_THROWS_WITH_AS((st::trainer<decltype(small_model()), sp::bf16>(small_model(), cfg,
                                                                       {.print_progress = false})),
                       doctest::Contains("mixed_precision_dtype"), strata::config_error);
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float32;
  CHECK_THROWS_WITH_AS((st::trainer<decltype(small_model()), sp::fp16>(small_model(), cfg,
                                                                       {.print_progress = false})),
                       doctest::Contains("float16"), strata::config_error);
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.loss_scale_min = 1e6;
  CHECK_THROWS_WITH_AS((st::trainer<decltype(small_model()), sp::fp16>(small_model(), cfg,
                                                                       {.print_progress = false})),
                       doctest::Contains("loss_scale_min"), strata::config_error);
}

TEST_CASE("a precision policy goes into the trainer by name; the configuration names its type") {
  auto model = small_model();
  auto cfg = base_config("by-name");
  // snippet-begin: policies
  cfg.mixed_precision_dtype = strata::config::precision_dtype::bfloat16;  // cfg: a train_config
  strata::train::trainer<decltype(model), strata::precision::bf16> run(model, cfg);

  // float16 with the dynamic loss scaler, beside another family's policy (in any order)
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  cfg.adaptive_batch = true;  // batch::adaptive, too, must be named by the configuration
  strata::train::trainer<decltype(model), strata::precision::fp16, strata::batch::adaptive> run16(
      model, cfg);
  // snippet-end: policies
  CHECK(run.loss_scale() == 1.0);  // bf16: no loss scaler
  CHECK(run16.loss_scale() == cfg.loss_scale_initial);
  CHECK(run.skipped_steps() == 0);
  CHECK(run16.skipped_steps() == 0);
  // Both keep float32 master weights, initialised alike.
  CHECK(std::ranges::equal(run.params().values(), run16.params().values()));
}

TEST_CASE("an overflow on one rank makes every rank skip with the same scale") {
  // Two ranks, each with its own gradients and scaler; rank 1 alone overflows at steps 2 and 5.
  std::vector<sp::loss_scaler_state> final_states(2);
  std::vector<std::vector<bool>> applied(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& comm) {
    sp::dynamic_loss_scaler scaler({.growth_interval = 3});
    const int r = comm.rank();
    for (std::uint64_t step = 0; step < 8; ++step) {
      std::vector<float> grads(64, 0.25f * static_cast<float>(r + 1));
      if (r == 1 && (step == 2 || step == 5)) {
        grads[7] = std::numeric_limits<float>::infinity();
      }
      // snippet-begin: any_rank_overflowed
      const bool finite = strata::precision::unscale_and_check(grads, scaler.scale());
      const bool overflow = strata::precision::any_rank_overflowed(comm, !finite);
      const bool apply = scaler.update(overflow);  // the same on every rank: step or skip
      // snippet-end: any_rank_overflowed
      applied[static_cast<std::size_t>(r)].push_back(apply);
    }
    final_states[static_cast<std::size_t>(r)] = scaler.state();
  });
  const std::vector<bool> want = {true, true, false, true, true, false, true, true};
  CHECK(applied[0] == want);
  CHECK(applied[1] == want);
  CHECK(final_states[0] == final_states[1]);
  CHECK(final_states[0].skipped_total == 2);
}

TEST_CASE("bfloat16 without a scaler aborts after loss_scale_max_skips non-finite steps") {
  auto cfg = base_config("bf16-abort");
  cfg.mixed_precision_dtype = strata::config::precision_dtype::bfloat16;
  cfg.loss_scale_max_skips = 4;
  st::trainer<decltype(small_model()), sp::bf16> t(small_model(), cfg, {.print_progress = false});
  t.on_gradients([](std::uint64_t step, std::span<float> grads) {
    if (step == 2 || step >= 6) {
      grads[3] = std::numeric_limits<float>::infinity();
    }
  });
  CHECK_THROWS_WITH_AS(t.fit(blobs{}, sd::identity{}, blobs{.n = 64, .salt = 1}, sd::identity{}),
                       doctest::Contains("4 consecutive steps (steps 6 to 9)"), strata::error);
  // Steps 2, 6, 7 and 8 were skipped; step 9 stopped training (as fp16's scaler stops it).
  CHECK(t.skipped_steps() == 4);
}
