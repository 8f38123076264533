// SPDX-License-Identifier: Apache-2.0
// strata_demo: data-parallel training of a linear model with ranks as threads of one process,
// built from what the foundation provides: the configuration (TOML + command line), the
// per-sample counter RNG (augmentation independent of rank count), dtypes for the gradient
// exchange, and accounted host memory with an optional budget. It trains, then trains again on
// one rank and reports how far the two loss curves are apart ("same numbers, any layout").

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <thread>
#include <vector>

#include <strata/config.hpp>
#include <strata/core.hpp>

namespace {

namespace sc = strata::config;

constexpr std::size_t features = 32;
constexpr std::uint64_t samples = 16384;
constexpr std::uint32_t base_substream = 0;     // the clean sample
constexpr std::uint32_t augment_substream = 1;  // the per-epoch jitter
constexpr std::uint32_t shuffle_sample = 0;     // shuffle stream: sample index 0, substream 2
constexpr std::uint32_t shuffle_substream = 2;
constexpr double noise_floor = 0.01;  // variance of the label noise

// The model the data is drawn from.
float true_weight(std::size_t j) {
  return std::sin(static_cast<float>(j) + 1.0f);
}

// Sample i of epoch e: x ~ N(0, 1) fixed per sample, plus a jitter drawn per (seed, epoch, i);
// y = <w*, x> + noise. Any rank, any thread, the same numbers.
float make_sample(std::uint64_t seed, std::uint32_t epoch, std::uint64_t i, float* x) {
  auto clean = strata::rng_stream::for_sample(seed, 0, i, base_substream);
  auto jitter = strata::rng_stream::for_sample(seed, epoch, i, augment_substream);
  float y = 0.0f;
  for (std::size_t j = 0; j < features; ++j) {
    const float value = clean.normal_float();
    y += true_weight(j) * value;
    x[j] = value + 0.05f * jitter.normal_float();
  }
  return y + 0.1f * clean.normal_float();
}

// The gradient travels in the configured compute dtype and is summed in float.
float through_dtype(float value, sc::precision_dtype dtype) {
  switch (dtype) {
    case sc::precision_dtype::float16:
      return static_cast<float>(strata::float16(value));
    case sc::precision_dtype::bfloat16:
      return static_cast<float>(strata::bfloat16(value));
    case sc::precision_dtype::float32:
      break;
  }
  return value;
}

double learning_rate(const sc::train_config& cfg, double epoch_progress) {
  if (epoch_progress < cfg.warmup_epochs) {
    return cfg.lr * epoch_progress / cfg.warmup_epochs;
  }
  switch (cfg.lr_schedule) {
    case sc::lr_schedule_kind::constant:
      return cfg.lr;
    case sc::lr_schedule_kind::step:
      return cfg.lr * std::pow(cfg.lr_gamma,
                               std::floor(epoch_progress / static_cast<double>(cfg.lr_step_size)));
    case sc::lr_schedule_kind::cosine: {
      const double t = (epoch_progress - cfg.warmup_epochs) /
                       (static_cast<double>(cfg.epochs) - cfg.warmup_epochs);
      return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1.0 + std::cos(std::numbers::pi * t));
    }
  }
  return cfg.lr;
}

struct run_result {
  std::vector<double> epoch_loss;  // mean squared error over the data set after each epoch
  double weight_error = 0.0;       // |w - w*|
  double seconds = 0.0;
  std::size_t peak_bytes = 0;
  std::int64_t steps = 0;
};

// Trains with `ranks` threads; each rank takes its slice of every global batch.
run_result train(const sc::train_config& cfg, std::int64_t ranks) {
  const auto micro = static_cast<std::size_t>(cfg.batch_size_per_gpu);
  const auto accumulation = static_cast<std::size_t>(cfg.gradient_accumulation_steps);
  const std::size_t global_batch = micro * accumulation * static_cast<std::size_t>(ranks);
  const std::size_t steps_per_epoch = samples / global_batch;
  if (steps_per_epoch == 0) {
    throw strata::config_error({.key = "batch_size_per_gpu"},
                               "batch_size_per_gpu x gradient_accumulation_steps x world_size = " +
                                   std::to_string(global_batch) + " exceeds the demo's " +
                                   std::to_string(samples) + " samples");
  }
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  const auto n_ranks = static_cast<std::size_t>(ranks);

  strata::host host;
  host.memory().reset_peak();
  auto weights = strata::buffer<float>::zeroed(features);
  auto grads = strata::buffer<float>::zeroed(features * n_ranks);  // one slot per rank
  auto losses = strata::buffer<double>::zeroed(n_ranks);
  std::vector<std::uint64_t> order(samples);
  run_result result;
  std::barrier sync(ranks);
  const auto start = std::chrono::steady_clock::now();

  auto rank_main = [&](std::size_t rank) {
    auto x = strata::buffer<float>::zeroed(features * micro);
    auto y = strata::buffer<float>::zeroed(micro);
    float* my_grad = grads.data() + rank * features;
    for (std::int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
      const auto e = static_cast<std::uint32_t>(epoch);
      if (rank == 0) {
        std::iota(order.begin(), order.end(), std::uint64_t{0});
        auto shuffler = strata::rng_stream::for_sample(seed, e, shuffle_sample, shuffle_substream);
        strata::shuffle(order.begin(), order.end(), shuffler);
      }
      sync.arrive_and_wait();
      for (std::size_t step = 0; step < steps_per_epoch; ++step) {
        std::fill(my_grad, my_grad + features, 0.0f);
        for (std::size_t k = 0; k < accumulation; ++k) {
          // This rank's micro-batch k of the global batch.
          const std::size_t first = step * global_batch + (k * n_ranks + rank) * micro;
          for (std::size_t b = 0; b < micro; ++b) {
            y[b] = make_sample(seed, e, order[first + b], x.data() + b * features);
          }
          for (std::size_t b = 0; b < micro; ++b) {
            const float* xb = x.data() + b * features;
            float residual = -y[b];
            for (std::size_t j = 0; j < features; ++j) {
              residual += weights[j] * xb[j];
            }
            const float scale = 2.0f * residual / static_cast<float>(global_batch);
            for (std::size_t j = 0; j < features; ++j) {
              my_grad[j] += scale * xb[j];
            }
          }
        }
        sync.arrive_and_wait();  // every slot written
        const double progress =
            static_cast<double>(epoch) + static_cast<double>(step) / steps_per_epoch;
        const auto lr = static_cast<float>(learning_rate(cfg, progress));
        // Every rank sums the slots in rank order, so every rank holds the same weights; rank 0
        // writes them back after the barrier below guarantees everyone has read them.
        std::vector<float> update(features);
        for (std::size_t j = 0; j < features; ++j) {
          float sum = 0.0f;
          for (std::size_t r = 0; r < n_ranks; ++r) {
            sum += through_dtype(grads[r * features + j], cfg.mixed_precision_dtype);
          }
          update[j] = weights[j] - lr * sum;
        }
        sync.arrive_and_wait();  // every rank has read weights and slots
        if (rank == 0) {
          std::copy(update.begin(), update.end(), weights.data());
          ++result.steps;
        }
        sync.arrive_and_wait();
      }
      // Loss over the clean data set, split across ranks.
      double loss = 0.0;
      std::vector<float> xs(features);
      for (std::uint64_t i = rank; i < samples; i += n_ranks) {
        auto clean = strata::rng_stream::for_sample(seed, 0, i, base_substream);
        float target = 0.0f;
        float prediction = 0.0f;
        for (std::size_t j = 0; j < features; ++j) {
          const float value = clean.normal_float();
          target += true_weight(j) * value;
          prediction += weights[j] * value;
        }
        target += 0.1f * clean.normal_float();
        loss += static_cast<double>(prediction - target) * (prediction - target);
      }
      losses[rank] = loss;
      sync.arrive_and_wait();
      if (rank == 0) {
        double total = 0.0;
        for (std::size_t r = 0; r < n_ranks; ++r) {
          total += losses[r];
        }
        result.epoch_loss.push_back(total / static_cast<double>(samples));
      }
      sync.arrive_and_wait();
    }
  };

  std::vector<std::jthread> threads;
  for (std::size_t r = 1; r < n_ranks; ++r) {
    threads.emplace_back(rank_main, r);
  }
  rank_main(0);
  threads.clear();

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::size_t j = 0; j < features; ++j) {
    const double d = weights[j] - true_weight(j);
    result.weight_error += d * d;
  }
  result.weight_error = std::sqrt(result.weight_error);
  result.peak_bytes = host.memory().stats().peak;
  return result;
}

int run(const sc::train_config& cfg) {
  if (cfg.communication_backend != sc::comm_backend_kind::threads) {
    throw strata::config_error({.key = "communication_backend"},
                               "this demo runs its ranks as threads of one process; "
                               "communication_backend = " +
                                   std::string(sc::to_string(cfg.communication_backend)) +
                                   " is not available in it (use \"threads\")");
  }
  std::optional<strata::scoped_budget> budget;
  if (cfg.memory_budget_mb > 0) {
    budget.emplace(strata::host{}.memory(),
                   static_cast<std::size_t>(cfg.memory_budget_mb) * 1024 * 1024);
  }
  std::printf(
      "strata demo: linear regression, %llu samples x %zu features, %lld rank(s) as "
      "threads, batch %lld x %lld accumulation x %lld ranks, gradients in %s, lr %s\n",
      static_cast<unsigned long long>(samples), features, static_cast<long long>(cfg.world_size),
      static_cast<long long>(cfg.batch_size_per_gpu),
      static_cast<long long>(cfg.gradient_accumulation_steps),
      static_cast<long long>(cfg.world_size),
      std::string(sc::to_string(cfg.mixed_precision_dtype)).c_str(),
      std::string(sc::to_string(cfg.lr_schedule)).c_str());

  const auto parallel = train(cfg, cfg.world_size);
  for (std::size_t e = 0; e < parallel.epoch_loss.size(); ++e) {
    std::printf("epoch %2zu  loss %.6f\n", e + 1, parallel.epoch_loss[e]);
  }
  const double throughput = static_cast<double>(parallel.steps) *
                            static_cast<double>(cfg.batch_size_per_gpu *
                                                cfg.gradient_accumulation_steps * cfg.world_size) /
                            parallel.seconds;
  std::printf(
      "result: final loss %.6f, |w - w*| = %.4f, %.0f samples/s, %.3f s, peak host memory "
      "%zu bytes\n",
      parallel.epoch_loss.back(), parallel.weight_error, throughput, parallel.seconds,
      parallel.peak_bytes);

  if (cfg.world_size > 1) {
    // One rank with the same global batch: B = world_size x batch_size_per_gpu.
    auto single_cfg = cfg;
    single_cfg.batch_size_per_gpu = cfg.batch_size_per_gpu * cfg.world_size;
    single_cfg.world_size = 1;
    const auto single = train(single_cfg, 1);
    double worst = 0.0;
    for (std::size_t e = 0; e < single.epoch_loss.size(); ++e) {
      worst = std::max(worst, std::abs(single.epoch_loss[e] - parallel.epoch_loss[e]) /
                                  std::max(single.epoch_loss[e], 1e-12));
    }
    std::printf(
        "same numbers, any layout: 1 rank x batch %lld vs %lld ranks x batch %lld, largest "
        "relative loss difference %.2e\n",
        static_cast<long long>(single_cfg.batch_size_per_gpu),
        static_cast<long long>(cfg.world_size), static_cast<long long>(cfg.batch_size_per_gpu),
        worst);
    if (worst > 1e-3) {
      std::printf("FAILED: the layouts disagree by more than 1e-3\n");
      return 1;
    }
  }
  // Before training the loss is |w*|^2 + noise (about 16); the noise floor is 0.1^2 = 0.01.
  const bool converged = parallel.epoch_loss.back() < 2.0 * noise_floor;
  std::printf("%s\n", converged ? "converged to the noise floor"
                                : "FAILED: the loss is not within 2x of the noise floor 0.01");
  return converged ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  sc::train_config defaults;
  defaults.world_size = 2;
  defaults.epochs = 5;
  defaults.batch_size_per_gpu = 32;
  defaults.lr = 0.05;
  defaults.momentum = 0.0;
  sc::cli parser("strata_demo: data-parallel linear regression with ranks as threads", defaults);
  return sc::run_main(argc, argv, parser, [](const sc::train_config& cfg) {
    try {
      return run(cfg);
    } catch (const strata::memory_error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  });
}
