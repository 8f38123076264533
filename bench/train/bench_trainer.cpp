// SPDX-License-Identifier: Apache-2.0
// How fast does the trainer train, and what does its machinery cost? The Fashion-MNIST MLP of
// example 01 (784-1024-1024-10, ReLU, dropout 0.1, SGD with Nesterov momentum) at batch 256,
// for each thread count, in one run:
//   - strata_fp32: strata's trainer (trainer::fit), float32, on the GEMM provider `--gemm` picks
//     (auto: what the trainer's default picks); strata_loop_fp32: a hand-written loop over the
//     same loader, layers, loss and optimizer (the policy and bookkeeping overhead);
//   - strata_bf16: the trainer with precision::bf16 (bfloat16 products where they are on);
//   - pytorch_fp32 and pytorch_bf16 (torch.autocast to bfloat16) on CPU at the same batch and
//     threads (OpenBLAS's threads included: OPENBLAS_NUM_THREADS), by bench/train/torch_mlp.py
//     when `import torch` works, with OPENBLAS_CORETYPE set right when this process's OpenBLAS
//     picked fallback kernels, the faster of two runs (OpenMP's threads spinning or sleeping
//     between parallel regions);
//   - limit_fp32: the step's GEMMs alone (forward, weight and input gradients at the model's
//     shapes) on the fastest provider, as samples/s: what no float32 trainer on these kernels
//     passes. Measured before and after each of the trainer's runs (the best of 8 rounds each
//     time; the row gives the median). The trainer's share of it is taken step by step, in one
//     more trainer run per repeat with one round of the products after each step, each step's
//     time against the rounds around it (the note and the JSON give the median and quartiles),
//     and run by run, each run's rate against the limits measured around it; both so that a
//     shared machine's drift hits the two sides of each ratio alike. limit_onednn,
//     limit_openblas, limit_eigen: each provider's own limit (its median), as a share of
//     limit_fp32, the one "auto" takes on this CPU marked (model::gemm_table). limit_bf16: the same
//     products in bfloat16 on oneDNN, where the CPU has bfloat16 units (AVX512-BF16 or
//     AMX-BF16), whether or not the trainer uses them (model::bf16_products); elsewhere the row
//     says why not.
// The first lines name the CPU (model, vector ISA), the vectors the program was compiled for and
// each provider's kernels.
//
//   build/bench/bench_trainer [--data-dir DIR] [--batch 256] [--steps 60] [--threads 1,2]
//                             [--repeats 3] [--gemm auto|onednn|openblas|eigen] [--no-bf16]
//                             [--no-torch] [--json FILE]
//
// Formulas: docs/benchmarks.md.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"
#include "../common/machine.hpp"
#include "../common/spawn.hpp"
#include "../common/torch.hpp"

#include "strata/data/idx.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/trainer.hpp"

namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string data_dir{sd::fashion_mnist_default_dir};
  std::string self;
  std::size_t batch = 256;
  std::size_t steps = 60;
  std::size_t warmup = 3;
  std::vector<int> threads{1, 2};
  std::size_t repeats = 3;
  bool torch = true;
  bool bf16 = true;
  std::string gemm = "auto";
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  o.self = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_trainer"); };
    if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--batch") {
      o.batch = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--threads") {
      o.threads = bench::comma_list<int>(value());
    } else if (a == "--repeats") {
      o.repeats = std::max<std::size_t>(1, std::stoul(value()));
    } else if (a == "--no-torch") {
      o.torch = false;
    } else if (a == "--no-bf16") {
      o.bf16 = false;
    } else if (a == "--gemm") {
      o.gemm = value();
      if (!strata::config::parse_enum<strata::config::gemm_kind>(o.gemm)) {
        std::fprintf(stderr, "bench_trainer: --gemm must be auto, onednn, openblas or eigen\n");
        std::exit(2);
      }
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_trainer [--data-dir DIR] [--batch N] [--steps N] [--threads a,b] "
                   "[--repeats N] [--gemm auto|onednn|openblas|eigen] [--no-bf16] [--no-torch] "
                   "[--json FILE]\n");
      std::exit(2);
    }
  }
  return o;
}

auto make_mlp() {
  constexpr auto relu = sm::fused_activation::relu;
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 28, .width = 28},
                        sm::flatten{},
                        sm::linear{.in = 784, .out = 1024, .activation = relu, .dropout = 0.1},
                        sm::linear{.in = 1024, .out = 1024, .activation = relu, .dropout = 0.1},
                        sm::linear{.in = 1024, .out = 10});
}

auto augmentation() {
  return sd::compose{sd::horizontal_flip{.probability = 0.5}, sd::fashion_mnist_normalize()};
}

strata::config::train_config run_config(const options& o, const std::filesystem::path& dir) {
  strata::config::train_config cfg;
  cfg.blas_threads = strata::model::blas_threads();  // the row's thread count, set before
  cfg.epochs = 1;
  cfg.batch_size_per_gpu = static_cast<std::int64_t>(o.batch);
  cfg.loader_workers = 0;
  cfg.max_train_samples = static_cast<std::int64_t>((o.steps + o.warmup) * o.batch);
  cfg.max_eval_samples = static_cast<std::int64_t>(o.batch);
  cfg.checkpoint_dir = dir.string();
  cfg.checkpoint_interval = 0;
  cfg.resume = strata::config::resume_mode::never;
  cfg.lr_schedule = strata::config::lr_schedule_kind::constant;
  cfg.warmup_epochs = 0.0;
  cfg.gemm = *strata::config::parse_enum<strata::config::gemm_kind>(o.gemm);
  return cfg;
}

// Samples/s over the steps after the warm-up, from the time each step ended.
double rate_of(const std::vector<clock_type::time_point>& ends, const options& o) {
  const double seconds =
      std::chrono::duration<double>(ends[o.warmup + o.steps - 1] - ends[o.warmup - 1]).count();
  return static_cast<double>(o.steps * o.batch) / seconds;
}

// One step's products of the MLP at `batch` on provider p: forward x W^T + b (with the hidden
// layers' ReLU as the product's epilogue), weight gradients dy^T x (written: the step's first
// backward) and input gradients dy W (none for the first layer, whose input needs none), as the
// reference linear layer calls them. The buffers are made once: round() times one round (as
// between two of the trainer's steps), best() the best of several.
class step_products {
 public:
  step_products(sm::gemm_provider p, std::size_t batch, bool bf16 = false)
      : provider_(p), batch_(batch), bf16_(bf16) {}

  // Seconds of one round of the step's products.
  double round() {
    struct layer_shape {
      std::size_t in;
      std::size_t out;
      bool input_grad;
      sm::gemm_epilogue epilogue;
    };
    const layer_shape layers[] = {{784, 1024, false, sm::gemm_epilogue::relu},
                                  {1024, 1024, true, sm::gemm_epilogue::relu},
                                  {1024, 10, true, sm::gemm_epilogue::none}};
    const auto start = clock_type::now();
    for (const layer_shape& l : layers) {
      sm::gemm_bias_on(provider_, {.transpose_b = true, .bfloat16_inputs = bf16_}, batch_, l.out,
                       l.in, x_.data(), l.in, w_.data(), l.in, bias_.data(), y_.data(), l.out,
                       l.epilogue);
      sm::gemm_on(provider_, {.transpose_a = true, .bfloat16_inputs = bf16_}, l.out, l.in, batch_,
                  1.0f, y_.data(), l.out, x_.data(), l.in, 0.0f, dw_.data(), l.in);
      if (l.input_grad) {
        sm::gemm_on(provider_, {.bfloat16_inputs = bf16_}, batch_, l.in, l.out, 1.0f, y_.data(),
                    l.out, w_.data(), l.in, 0.0f, x_.data(), l.in);
      }
    }
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }

  // The best of `rounds` rounds.
  double best(int rounds) {
    double best = 1e30;
    for (int r = 0; r < rounds; ++r) {
      best = std::min(best, round());
    }
    return best;
  }

  sm::gemm_provider provider() const noexcept { return provider_; }

 private:
  sm::gemm_provider provider_;
  std::size_t batch_;
  bool bf16_;
  std::vector<float> x_ = std::vector<float>(batch_ * 1024, 0.5f);
  std::vector<float> w_ = std::vector<float>(1024 * 1024, 0.25f);
  std::vector<float> y_ = std::vector<float>(batch_ * 1024);
  std::vector<float> dw_ = std::vector<float>(1024 * 1024);
  std::vector<float> bias_ = std::vector<float>(1024, 0.125f);
};

double step_gemm_seconds(sm::gemm_provider p, std::size_t batch, bool bf16 = false) {
  return step_products(p, batch, bf16).best(8);
}

// The trainer's steps and the limit's rounds one for one: after each step (on_step) one round
// of the step's products. Step i's share of the limit is the mean of the rounds just before and
// after it over the step's own time (from the end of the round before to its end), so that drift
// on a shared machine, which moves within seconds, hits both sides of each ratio alike.
struct interleaved {
  step_products* limit = nullptr;
  std::vector<double> shares;  // one per timed step
};

// The run's samples/s; with `with_limit`, its steps' shares instead (the rate of a run slowed by
// the rounds between its steps means nothing: returns 0).
template <class... Policies>
double run_trainer(const sd::idx_dataset& train, const options& o,
                   interleaved* with_limit = nullptr) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_bench_trainer";
  std::filesystem::remove_all(dir);
  auto cfg = run_config(o, dir);
  if constexpr ((std::is_same_v<Policies, strata::precision::bf16> || ...)) {
    cfg.mixed_precision_dtype = strata::config::precision_dtype::bfloat16;
  }
  st::trainer<decltype(make_mlp()), Policies...> t(make_mlp(), cfg, {.print_progress = false});
  std::vector<clock_type::time_point> ends;
  std::vector<clock_type::time_point> resumed;  // after each step's limit round
  std::vector<double> rounds;
  t.on_step([&](const st::step_metrics&) {
    ends.push_back(clock_type::now());
    if (with_limit != nullptr) {
      rounds.push_back(with_limit->limit->round());
      resumed.push_back(clock_type::now());
    }
  });
  t.fit(train, augmentation(), train, sd::fashion_mnist_normalize());
  std::filesystem::remove_all(dir);
  if (with_limit != nullptr) {
    for (std::size_t i = o.warmup; i < o.warmup + o.steps; ++i) {
      const double step = std::chrono::duration<double>(ends[i] - resumed[i - 1]).count();
      with_limit->shares.push_back(0.5 * (rounds[i - 1] + rounds[i]) / step);
    }
    return 0.0;
  }
  return rate_of(ends, o);
}

// The same steps written by hand over the same pieces.
double run_loop(const sd::idx_dataset& train, const options& o) {
  const auto cfg = run_config(o, "unused");
  const sd::subset<sd::idx_dataset> view(train, static_cast<std::size_t>(cfg.max_train_samples));
  sd::prefetch_loader loader(view, augmentation(),
                             sd::distributed_sampler({.dataset_size = view.size(), .seed = 42}),
                             {.batch_size = o.batch, .workers = 0, .seed = 42});
  const auto model = make_mlp();
  auto params = model.make_params();
  params.initialize(42);
  auto work = model.make_workspace(o.batch);
  strata::optim::any_optimizer optimizer = strata::optim::make_optimizer(
      {.kind = strata::optim::optimizer_choice::kind_type::sgd,
       .sgd = {.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4},
       .adamw = {}});
  std::vector<float> state(params.size() * optimizer.state_per_parameter());
  std::vector<float> grad(o.batch * 10);
  const sm::softmax_cross_entropy loss;
  std::vector<clock_type::time_point> ends;
  loader.start_epoch(0);
  std::uint32_t step = 0;
  while (auto b = loader.next()) {
    params.zero_grads();
    const auto logits = model.forward(work, params, b->inputs, b->size,
                                      {.training = true,
                                       .seed = 42,
                                       .step = step,
                                       .sample_ids = std::span<const std::uint64_t>(b->indices)});
    loss.evaluate({.batch = b->size,
                   .classes = 10,
                   .logits = logits,
                   .labels = b->labels,
                   .grad_logits = std::span<float>(grad.data(), b->size * 10),
                   .grad_scale = 1.0f / static_cast<float>(b->size)});
    model.backward(work, params, std::span<const float>(grad.data(), b->size * 10));
    optimizer.begin_step();
    const std::size_t per = optimizer.state_per_parameter();
    for (const auto& e : params.entries()) {
      const std::size_t n = e.spec.elements();
      optimizer.update({.params = params.values().subspan(e.offset, n),
                        .grads = std::as_const(params).grads().subspan(e.offset, n),
                        .state = std::span<float>(state).subspan(e.offset * per, n * per),
                        .lr = 0.05,
                        .weight_decay = e.spec.weight_decay});
    }
    ++step;
    ends.push_back(clock_type::now());
  }
  return rate_of(ends, o);
}

// PyTorch's run of the row (bench/common/torch.hpp: OpenBLAS on the row's threads, the faster
// of OpenMP spinning or sleeping); its JSON line with "wait_policy".
std::optional<nlohmann::json> run_torch(const options& o, int threads, bool bf16,
                                        const std::string& coretype) {
  const std::filesystem::path script =
      std::filesystem::path(STRATA_SOURCE_DIR) / "bench" / "train" / "torch_mlp.py";
  // Debian's interpreter first: python3-torch installs into /usr/lib/python3.
  const std::string python =
      std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  return bench::run_torch_best(python + " " + script.string() + (bf16 ? " --bf16" : "") +
                                   " --threads " + std::to_string(threads) + " --batch " +
                                   std::to_string(o.batch) + " --steps " + std::to_string(o.steps) +
                                   " --repeats " + std::to_string(o.repeats) + " 2>/dev/null",
                               threads, coretype);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const sd::idx_dataset train = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
  const sm::gemm_environment env = sm::detect_gemm_environment();
  st::detail::choose_gemm(run_config(o, "unused"));  // the hand loop's provider: the trainer's
  std::printf(
      "# MLP 784-1024-1024-10 training on Fashion-MNIST, batch %zu, %zu timed steps after "
      "%zu, median of %zu runs\n",
      o.batch, o.steps, o.warmup, o.repeats);
  std::printf("# CPU: %s; %s\n", bench::cpu_model().c_str(), strata::describe(env.cpu).c_str());
  std::printf(
      "# built for %s vectors%s%s\n", strata::to_string(strata::compiled_isa()),
      strata::compiled_isa() < strata::widest_isa(env.cpu) ? ": " : "",
      strata::compiled_isa_note(strata::compiled_isa(), strata::widest_isa(env.cpu)).c_str());
  for (const sm::gemm_provider p : sm::available_gemm_providers()) {
    std::printf("# provider %s\n", sm::describe(sm::decide_gemm(p, env), env).c_str());
  }
  const sm::gemm_provider auto_provider = sm::decide_gemm(std::nullopt, env).provider;
  std::printf("# auto takes %s on this CPU (%s %s)\n", sm::to_string(auto_provider),
              strata::to_string(env.cpu.vendor),
              std::string(strata::to_string(strata::class_of(env.cpu))).c_str());
  // What OpenBLAS would need to use its proper kernels (for PyTorch's run too, if it uses it).
  const std::string coretype = bench::openblas_coretype_fix(env);
  if (!coretype.empty()) {
    std::printf("# OpenBLAS picked %s kernels here: PyTorch runs with %s\n",
                env.openblas_core.c_str(), coretype.c_str());
  }
  std::printf("%-14s %8s %14s %10s  %s\n", "config", "threads", "samples/s", "vs torch", "note");
  nlohmann::json rows = nlohmann::json::array();
  const auto row = [&](const char* config, int threads, std::optional<double> rate,
                       std::optional<double> versus, const std::string& note) {
    nlohmann::json r{{"config", config}, {"threads", threads}};
    r["samples_per_s"] = rate ? nlohmann::json(*rate) : nlohmann::json(nullptr);
    if (versus) {
      r["vs_pytorch"] = *versus;
    }
    if (!note.empty()) {
      r["note"] = note;
    }
    char rate_text[32] = "n/a";
    char versus_text[32] = "";
    if (rate) {
      std::snprintf(rate_text, sizeof rate_text, "%.0f", *rate);
    }
    if (versus) {
      std::snprintf(versus_text, sizeof versus_text, "%.2fx", *versus);
    }
    std::printf("%-14s %8d %14s %10s  %s\n", config, threads, rate_text, versus_text, note.c_str());
    rows.push_back(std::move(r));
  };
  for (int t : o.threads) {
    strata::model::set_blas_threads(t);
    // Alternate the runs so that drift on a shared machine hits them alike.
    std::vector<double> trainer_rates;
    std::vector<double> loop_rates;
    std::vector<double> bf16_rates;
    // The fp32 GEMM limit on the fastest provider, measured between the runs too.
    std::vector<double> limit_rates;
    std::array<std::vector<double>, 3> provider_rates;  // each provider's limit, by gemm_provider
    std::string limit_provider;
    sm::gemm_provider fastest = sm::current_gemm();
    const auto measure_limit = [&] {
      double best = 1e30;
      for (const sm::gemm_provider p : sm::available_gemm_providers()) {
        const double seconds = step_gemm_seconds(p, o.batch);
        provider_rates[static_cast<std::size_t>(p)].push_back(static_cast<double>(o.batch) /
                                                              seconds);
        if (seconds < best) {
          best = seconds;
          limit_provider = sm::to_string(p);
          fastest = p;
        }
      }
      limit_rates.push_back(static_cast<double>(o.batch) / best);
      return limit_rates.back();
    };
    // The trainer's share of the limit, run by run: its rate over the mean of the limits
    // measured just before and just after it, so that the machine's speed drifting between
    // runs (by a third on a shared host) moves both sides of each ratio alike. And step by
    // step: one more trainer run with a limit round after each step (interleaved), whose
    // steps' shares are what the row reports (their median and quartiles).
    std::vector<double> shares;
    interleaved steps;
    for (std::size_t r = 0; r < o.repeats; ++r) {
      loop_rates.push_back(run_loop(train, o));
      const double before = measure_limit();
      trainer_rates.push_back(run_trainer<>(train, o));
      const double after = measure_limit();
      shares.push_back(trainer_rates.back() / (0.5 * (before + after)));
      step_products limit(fastest, o.batch);
      steps.limit = &limit;
      run_trainer<>(train, o, &steps);
      if (o.bf16) {
        bf16_rates.push_back(run_trainer<strata::precision::bf16>(train, o));
      }
    }
    const std::string provider = sm::describe(sm::decide_gemm(sm::current_gemm(), env), env);
    const double trainer_rate = median(trainer_rates);
    const double loop_rate = median(loop_rates);
    const auto torch = o.torch ? run_torch(o, t, false, coretype) : std::nullopt;
    const auto torch_bf16 = o.torch && o.bf16 ? run_torch(o, t, true, coretype) : std::nullopt;
    const auto rate_of_torch = [](const std::optional<nlohmann::json>& j) -> std::optional<double> {
      if (!j) {
        return std::nullopt;
      }
      return j->at("samples_per_s").get<double>();
    };
    const auto torch_rate = rate_of_torch(torch);
    const auto torch_bf16_rate = rate_of_torch(torch_bf16);
    const auto versus = [](double a, std::optional<double> b) -> std::optional<double> {
      return b ? std::optional<double>(a / *b) : std::nullopt;
    };
    const double limit = median(limit_rates);
    std::sort(steps.shares.begin(), steps.shares.end());
    const auto quantile = [&](double q) {
      return steps
          .shares[static_cast<std::size_t>(q * static_cast<double>(steps.shares.size() - 1))];
    };
    char share[160];
    std::snprintf(share, sizeof share,
                  "; %.1f%% of limit_fp32 step by step (quartiles %.1f-%.1f%%), %.1f%% run by run "
                  "(%.1f-%.1f%%)",
                  100.0 * quantile(0.5), 100.0 * quantile(0.25), 100.0 * quantile(0.75),
                  100.0 * median(shares), 100.0 * *std::min_element(shares.begin(), shares.end()),
                  100.0 * *std::max_element(shares.begin(), shares.end()));
    row("strata_fp32", t, trainer_rate, versus(trainer_rate, torch_rate), provider + share);
    rows.back()["share_of_limit_fp32"] = quantile(0.5);
    rows.back()["share_of_limit_fp32_quartiles"] = {quantile(0.25), quantile(0.75)};
    rows.back()["share_of_limit_fp32_run_by_run"] = median(shares);
    char overhead[64];
    std::snprintf(overhead, sizeof overhead, "the trainer's overhead over it: %.1f%%",
                  100.0 * (loop_rate / trainer_rate - 1.0));
    row("strata_loop_fp32", t, loop_rate, versus(loop_rate, torch_rate), overhead);
    const bool bf16_products = sm::bf16_products(sm::current_gemm());
    // bfloat16 products are possible here (oneDNN and a CPU with bfloat16 units), whether or
    // not the automatic mode chose them.
    const bool bf16_units =
        sm::gemm_compiled(sm::gemm_provider::onednn) && (env.cpu.avx512_bf16 || env.cpu.amx_bf16);
    if (o.bf16) {
      const double bf16_rate = median(bf16_rates);
      std::string note = "bfloat16 emulated: float32 products on rounded values";
      if (bf16_products) {
        note = "bfloat16 products on oneDNN";
      } else if (bf16_units && sm::current_gemm() == sm::gemm_provider::onednn) {
        const sm::bf16_probe_result& probe = sm::bf16_products_probe();
        char text[160];
        std::snprintf(text, sizeof text,
                      "float32 products on bfloat16 values (no AMX); oneDNN's bfloat16 products "
                      "measured %.0f against %.0f GFLOP/s",
                      probe.bf16_gflops, probe.fp32_gflops);
        note = text;
      }
      row("strata_bf16", t, bf16_rate, versus(bf16_rate, torch_bf16_rate), note);
    }
    row("pytorch_fp32", t, torch_rate, std::nullopt,
        torch ? "torch " + torch->at("torch").get<std::string>() + ", OpenMP wait policy " +
                    torch->at("wait_policy").get<std::string>()
              : std::string(o.torch ? "python3 cannot import torch (Debian: python3-torch)"
                                    : "--no-torch"));
    if (o.bf16) {
      row("pytorch_bf16", t, torch_bf16_rate, std::nullopt,
          torch_bf16 ? "torch.autocast(cpu, bfloat16), OpenMP wait policy " +
                           torch_bf16->at("wait_policy").get<std::string>()
                     : std::string(o.torch ? "not run" : "--no-torch"));
    }
    row("limit_fp32", t, limit, std::nullopt,
        "the step's GEMMs alone on the fastest provider, " + limit_provider);
    // Each provider's limit (the median of its measurements), against the fastest's: whether
    // the provider "auto" takes on this CPU (model::gemm_table) is the fastest here.
    for (const sm::gemm_provider p : sm::available_gemm_providers()) {
      const auto& rates = provider_rates[static_cast<std::size_t>(p)];
      const double rate = median(rates);
      const std::string name = std::string("limit_") + sm::to_string(p);
      char share_of_best[96];
      std::snprintf(share_of_best, sizeof share_of_best, "%.1f%% of limit_fp32",
                    100.0 * rate / limit);
      row(name.c_str(), t, rate, std::nullopt,
          sm::describe(sm::decide_gemm(p, env), env) + ", " + share_of_best +
              (p == auto_provider ? "; auto's choice on this CPU" : ""));
    }
    if (o.bf16) {
      if (bf16_units) {
        // The products in bfloat16 even where the automatic mode keeps them in float32.
        const sm::bf16_products_mode mode = sm::bf16_products_setting();
        sm::set_bf16_products(sm::bf16_products_mode::on);
        std::vector<double> rates;
        for (std::size_t r = 0; r < o.repeats; ++r) {
          rates.push_back(static_cast<double>(o.batch) /
                          step_gemm_seconds(sm::gemm_provider::onednn, o.batch, true));
        }
        sm::set_bf16_products(mode);
        row("limit_bf16", t, median(rates), std::nullopt,
            std::string("the step's bfloat16 products alone on onednn") +
                (bf16_products ? "" : " (the trainer multiplies in float32 here)"));
      } else {
        row("limit_bf16", t, std::nullopt, std::nullopt,
            "no bfloat16 products here: they need oneDNN and AVX512-BF16 or AMX-BF16");
      }
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << nlohmann::json{{"batch", o.batch},
                                                 {"cpu", bench::cpu_model()},
                                                 {"isa", strata::describe(env.cpu)},
                                                 {"rows", rows}}
                                      .dump(2)
                               << "\n";
  }
  return 0;
}
