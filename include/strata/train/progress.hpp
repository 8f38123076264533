// SPDX-License-Identifier: Apache-2.0
#pragma once

// Progress of a training run, printed by rank 0 only: a live bar when the output is a terminal
// (epoch, step, loss, samples/s, ETA), a log line every N steps otherwise.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "strata/train/metrics.hpp"

namespace strata::train {

struct progress_config {
  bool enabled = true;            // false on ranks other than 0
  std::uint64_t log_every = 100;  // steps between lines when not a terminal
  int terminal = -1;              // 1 / 0: force; -1: ask isatty
  std::FILE* out = nullptr;       // nullptr: stdout

  friend bool operator==(const progress_config&, const progress_config&) = default;
};

class progress {
 public:
  explicit progress(progress_config config = {}) : config_(config) {
    out_ = config_.out != nullptr ? config_.out : stdout;
    tty_ = config_.terminal >= 0 ? config_.terminal == 1 : ::isatty(::fileno(out_)) == 1;
  }

  bool is_terminal() const noexcept { return tty_; }

  // steps_in_epoch: the epoch's step count; remaining_steps: steps left in the whole run.
  void step(const step_metrics& m, std::uint64_t steps_in_epoch, std::uint64_t total_epochs,
            std::uint64_t remaining_steps) {
    if (!config_.enabled) {
      return;
    }
    const double per_step =
        m.samples_per_second > 0.0 ? static_cast<double>(m.samples) / m.samples_per_second : 0.0;
    smoothed_ = smoothed_ == 0.0 ? per_step : 0.95 * smoothed_ + 0.05 * per_step;
    const double eta = smoothed_ * static_cast<double>(remaining_steps);
    if (tty_) {
      const std::uint64_t done = m.epoch_step + 1;
      const int width = 24;
      const int filled = steps_in_epoch == 0 ? 0 : static_cast<int>(done * width / steps_in_epoch);
      std::string bar(static_cast<std::size_t>(filled), '#');
      bar.resize(width, '.');
      std::fprintf(out_, "\repoch %llu/%llu [%s] %llu/%llu loss %.4f  %.0f samples/s  ETA %s   ",
                   static_cast<unsigned long long>(m.epoch + 1),
                   static_cast<unsigned long long>(total_epochs), bar.c_str(),
                   static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(steps_in_epoch), m.loss, m.samples_per_second,
                   clock_text(eta).c_str());
      std::fflush(out_);
    } else if (config_.log_every > 0 && (m.step + 1) % config_.log_every == 0) {
      std::fprintf(out_,
                   "epoch %llu step %llu/%llu loss %.4f acc %.3f lr %.4g %.0f samples/s ETA %s\n",
                   static_cast<unsigned long long>(m.epoch + 1),
                   static_cast<unsigned long long>(m.epoch_step + 1),
                   static_cast<unsigned long long>(steps_in_epoch), m.loss, m.accuracy, m.lr,
                   m.samples_per_second, clock_text(eta).c_str());
      std::fflush(out_);
    }
  }

  void epoch(const epoch_metrics& m, std::uint64_t total_epochs) {
    if (!config_.enabled) {
      return;
    }
    if (tty_) {
      std::fputc('\r', out_);
    }
    std::fprintf(out_,
                 "epoch %llu/%llu: train loss %.4f acc %.4f | test loss %.4f acc %.4f | %.0f "
                 "samples/s, %.1f s (data %.1f s, compute %.1f s, comm %.1f s)\n",
                 static_cast<unsigned long long>(m.epoch + 1),
                 static_cast<unsigned long long>(total_epochs), m.train_loss, m.train_accuracy,
                 m.test_loss, m.test_accuracy, m.samples_per_second, m.seconds, m.data_seconds,
                 m.compute_seconds, m.comm_seconds);
    std::fflush(out_);
  }

  void message(const std::string& text) {
    if (!config_.enabled) {
      return;
    }
    if (tty_) {
      std::fputc('\r', out_);
    }
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
  }

  static std::string clock_text(double seconds) {
    if (!(seconds >= 0.0) || seconds > 1e7) {
      return "?";
    }
    const auto s = static_cast<long long>(seconds + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
    return text;
  }

 private:
  progress_config config_;
  std::FILE* out_ = nullptr;
  bool tty_ = false;
  double smoothed_ = 0.0;
};

}  // namespace strata::train
