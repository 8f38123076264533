// SPDX-License-Identifier: Apache-2.0
#pragma once

// Per-step and per-epoch measurements of a training run, and the JSONL file they go to.

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"

namespace strata::train {

// One optimizer step.
struct step_metrics {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;        // global optimizer step, from 0
  std::uint64_t epoch_step = 0;  // batch number within the epoch
  std::size_t samples = 0;       // in this step (all ranks)
  double loss = 0.0;             // mean over the step's samples
  double accuracy = 0.0;         // share of the step's samples classified right
  double lr = 0.0;
  double data_seconds = 0.0;     // waiting for the batch
  double compute_seconds = 0.0;  // forward, backward, optimizer
  double comm_seconds = 0.0;     // gradient communication (0 on one rank)
  double samples_per_second = 0.0;
  std::size_t peak_bytes = 0;   // host memory accounted by strata, peak so far (this rank's own
                                // account on thread ranks)
  bool skipped = false;         // mixed precision: the gradients overflowed, no update was made
  double loss_scale = 1.0;      // the loss scale the step ran with (1 without a scaler)
  std::size_t micro_batch = 0;  // samples per micro-step (batch::adaptive changes it)

  friend bool operator==(const step_metrics&, const step_metrics&) = default;
};

// One epoch, with its evaluation.
struct epoch_metrics {
  std::uint64_t epoch = 0;
  std::uint64_t steps = 0;
  std::size_t samples = 0;
  double train_loss = 0.0;  // mean over the epoch's samples
  double train_accuracy = 0.0;
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double seconds = 0.0;  // wall time of the epoch's steps
  double samples_per_second = 0.0;
  double data_seconds = 0.0;
  double compute_seconds = 0.0;
  double comm_seconds = 0.0;
  std::size_t peak_bytes = 0;
  std::uint64_t skipped_steps = 0;  // steps without an update (gradient overflow)

  friend bool operator==(const epoch_metrics&, const epoch_metrics&) = default;
};

inline nlohmann::json to_json(const step_metrics& m) {
  return {{"type", "step"},
          {"epoch", m.epoch},
          {"step", m.step},
          {"epoch_step", m.epoch_step},
          {"samples", m.samples},
          {"loss", m.loss},
          {"accuracy", m.accuracy},
          {"lr", m.lr},
          {"data_s", m.data_seconds},
          {"compute_s", m.compute_seconds},
          {"comm_s", m.comm_seconds},
          {"samples_per_s", m.samples_per_second},
          {"peak_bytes", m.peak_bytes},
          {"skipped", m.skipped},
          {"loss_scale", m.loss_scale},
          {"micro_batch", m.micro_batch}};
}

inline nlohmann::json to_json(const epoch_metrics& m) {
  return {{"type", "epoch"},
          {"epoch", m.epoch},
          {"steps", m.steps},
          {"samples", m.samples},
          {"train_loss", m.train_loss},
          {"train_accuracy", m.train_accuracy},
          {"test_loss", m.test_loss},
          {"test_accuracy", m.test_accuracy},
          {"seconds", m.seconds},
          {"samples_per_s", m.samples_per_second},
          {"data_s", m.data_seconds},
          {"compute_s", m.compute_seconds},
          {"comm_s", m.comm_seconds},
          {"peak_bytes", m.peak_bytes},
          {"skipped_steps", m.skipped_steps}};
}

// One JSON object per line; flushed per epoch row so that a crash loses at most the current
// epoch's step rows. Doubles are written with enough digits to read back exactly. A fresh run
// truncates the file; a resumed run appends to it.
class metrics_writer {
 public:
  metrics_writer() = default;
  explicit metrics_writer(const std::string& path, bool append = false) : path_(path) {
    if (path_.empty()) {
      return;
    }
    out_.open(path_, append ? std::ios::app : std::ios::trunc);
    if (!out_) {
      throw error("metrics: cannot open " + path_ + " for writing");
    }
  }

  bool enabled() const noexcept { return out_.is_open(); }
  const std::string& path() const noexcept { return path_; }

  void write(const step_metrics& m) { line(to_json(m), false); }
  void write(const epoch_metrics& m) { line(to_json(m), true); }
  void write(const nlohmann::json& row) { line(row, true); }

 private:
  void line(const nlohmann::json& row, bool flush) {
    if (!out_.is_open()) {
      return;
    }
    out_ << row.dump() << '\n';
    if (flush) {
      out_.flush();
    }
    if (!out_) {
      throw error("metrics: writing " + path_ + " failed");
    }
  }

  std::string path_{};
  std::ofstream out_{};
};

}  // namespace strata::train
