// SPDX-License-Identifier: Apache-2.0
#pragma once

// batch::adaptive: the micro-batch follows the memory that is free, the optimisation does not.
//
// The global batch per rank per optimizer step, G = batch_size_per_gpu x
// gradient_accumulation_steps in the config, stays fixed. The policy picks a micro-batch m in
// [min, max] (max <= G) and runs ceil(G / m) micro-steps, the last one smaller when m does not
// divide G, whose gradients are summed before the one update; the step's gradient is the mean
// over the same G samples whatever m is, so the optimisation is that of batch::accumulate, up to
// the order of the additions. Only the last micro-step communicates.
//
// adaptive_controller decides m. After each successful step it models the measured peak as
// peak(m) = base + slope x m and proposes the largest m whose peak stays under
// budget x (1 - margin): it grows at most x max_growth per step and only past a hysteresis band,
// and shrinks as soon as the peak enters the upper band above budget x (1 - margin / 2). On
// several ranks the proposals are reduced with min (agree_micro_batch) before apply(), so every
// rank runs the same number of micro-steps and so the same collective sequence. A step that
// fails to allocate (memory_error) releases what it holds; the trainer then calls after_oom(),
// which at least halves m, and re-runs the same samples with the smaller micro-batch.
//
// Memory is observed through a memory_monitor: tracker_monitor over a memory_tracker (the host
// tracker of strata::host, or any other). The CUDA monitor, which also asks the driver
// (cudaMemGetInfo), comes with the CUDA backend.

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/batch/concepts.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/execution_space.hpp"
#include "strata/core/format.hpp"
#include "strata/core/host.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/policy.hpp"

namespace strata::batch {

// ---- memory budget ------------------------------------------------------------------------------

namespace detail {

inline std::string_view trim(std::string_view text) noexcept {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && blank(text.front())) {
    text.remove_prefix(1);
  }
  while (!text.empty() && blank(text.back())) {
    text.remove_suffix(1);
  }
  return text;
}

// The whole text of a small file (/proc, /sys); empty when it cannot be read.
inline std::string read_small_file(const char* path) noexcept {
  try {
    std::ifstream in(path);
    if (!in) {
      return {};
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  } catch (...) {
    return {};
  }
}

// "41.2 MiB"
inline std::string mib(std::size_t bytes) {
  char text[64] = {};
  const double value = static_cast<double>(bytes) / (1024.0 * 1024.0);
  const auto result = std::to_chars(text, text + sizeof(text), value, std::chars_format::fixed, 1);
  return std::string(text, result.ptr) + " MiB";
}

}  // namespace detail

// The limit in a cgroup memory file, in bytes: cgroup v2 memory.max ("max" or a number) or
// cgroup v1 memory.limit_in_bytes (a number; "no limit" is a value near 2^63). 0 when there is
// no limit or the text is not a number; values of 2^60 bytes or more count as no limit.
inline std::size_t parse_cgroup_limit(std::string_view text) noexcept {
  text = detail::trim(text);
  if (text.empty() || text == "max") {
    return 0;
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return 0;
  }
  if (value >= (std::uint64_t{1} << 60) || value > std::numeric_limits<std::size_t>::max()) {
    return 0;
  }
  return static_cast<std::size_t>(value);
}

// The memory this process may use, from the texts of /proc/meminfo, the cgroup v2 memory.max and
// the cgroup v1 memory.limit_in_bytes (empty text = file absent): the smallest of MemTotal and
// the limits that are set; 0 when none is known.
inline std::size_t physical_memory_bytes(std::string_view meminfo, std::string_view cgroup_v2,
                                         std::string_view cgroup_v1) noexcept {
  std::size_t best = 0;
  for (const std::size_t value : {strata::detail::parse_meminfo(meminfo).total,
                                  parse_cgroup_limit(cgroup_v2), parse_cgroup_limit(cgroup_v1)}) {
    if (value != 0 && (best == 0 || value < best)) {
      best = value;
    }
  }
  return best;
}

// The same for this process, read from /proc/meminfo and /sys/fs/cgroup (v2 first, v1 when v2 is
// absent); 0 when unknown (not Linux, nothing readable).
// The cgroup v2 directory of this process ("0::/user.slice/x.scope" -> "/user.slice/x.scope"),
// from the text of /proc/self/cgroup; empty when there is no v2 line.
inline std::string cgroup_v2_path(std::string_view proc_self_cgroup) {
  std::size_t start = 0;
  while (start < proc_self_cgroup.size()) {
    std::size_t end = proc_self_cgroup.find('\n', start);
    if (end == std::string_view::npos) {
      end = proc_self_cgroup.size();
    }
    const std::string_view line = proc_self_cgroup.substr(start, end - start);
    if (line.substr(0, 3) == "0::") {
      return std::string(line.substr(3));
    }
    start = end + 1;
  }
  return {};
}

inline std::size_t physical_memory_bytes() noexcept {
  const std::string meminfo = detail::read_small_file("/proc/meminfo");
  // The limit of this process's own cgroup, where it is readable, else the root's (inside a
  // container the process's cgroup is the root of its namespace).
  std::string v2;
  const std::string own = cgroup_v2_path(detail::read_small_file("/proc/self/cgroup"));
  if (!own.empty() && own != "/" && own.find("..") == std::string::npos) {
    v2 = detail::read_small_file(("/sys/fs/cgroup" + own + "/memory.max").c_str());
  }
  if (v2.empty() || parse_cgroup_limit(v2) == 0) {
    const std::string root = detail::read_small_file("/sys/fs/cgroup/memory.max");
    if (!root.empty()) {
      v2 = root;
    }
  }
  const std::string v1 =
      v2.empty() ? detail::read_small_file("/sys/fs/cgroup/memory/memory.limit_in_bytes")
                 : std::string();
  return physical_memory_bytes(meminfo, v2, v1);
}

// share x physical_memory_bytes(): the host budget when memory_budget_mb is 0. Throws
// std::invalid_argument when share is not in (0, 1], and config_error (key memory_budget_mb)
// when the machine's memory is unknown.
inline std::size_t default_memory_budget(double share = 0.8) {
  if (!(share > 0.0 && share <= 1.0)) {
    throw std::invalid_argument("default_memory_budget: share must be in (0, 1], got " +
                                format_shortest(share));
  }
  const std::size_t total = physical_memory_bytes();
  if (total == 0) {
    throw config_error({.key = "memory_budget_mb"},
                       "the machine's memory size is unknown (neither /proc/meminfo nor a cgroup "
                       "limit could be read); set memory_budget_mb");
  }
  return static_cast<std::size_t>(std::floor(share * static_cast<double>(total)));
}

// ---- memory monitors ----------------------------------------------------------------------------

// What the controller reads after a step:
//   1. budget(): the bytes the step may reach, > 0;
//   2. reset_peak(): starts a new peak measurement (before the step);
//   3. peak(): the most bytes in use since the last reset_peak().
template <class M>
concept memory_monitor = requires(M& m) {
  { m.budget() } -> std::same_as<std::size_t>;
  { m.reset_peak() } -> std::same_as<void>;
  { m.peak() } -> std::same_as<std::size_t>;
};

// A memory_monitor over a memory_tracker, e.g. tracker_monitor(strata::host{}.memory(), budget).
// Its budget is the tracker's when set, else `fallback_budget`. It keeps a reference: inside a
// host_account (a thread rank), it must not outlive the account.
class tracker_monitor {
 public:
  explicit tracker_monitor(memory_tracker& tracker, std::size_t fallback_budget = 0) noexcept
      : tracker_(&tracker), fallback_budget_(fallback_budget) {}

  std::size_t budget() const noexcept {
    const std::size_t own = tracker_->budget();
    return own != 0 ? own : fallback_budget_;
  }
  void reset_peak() noexcept { tracker_->reset_peak(); }
  std::size_t peak() const noexcept { return tracker_->stats().peak; }

  memory_tracker& tracker() const noexcept { return *tracker_; }

 private:
  memory_tracker* tracker_;
  std::size_t fallback_budget_;
};

// The monitor of an execution space: its tracker, and for a device space (strata::cuda) also
// what the device itself reports through memory_info() (cudaMemGetInfo): bytes in use on the
// device that the tracker does not account (the CUDA context, other processes, libraries'
// workspaces) count against the budget, since they are gone for the step as well. A host space
// reads only its tracker: the machine's other processes are not the step's to judge.
//   1. budget(): the tracker's budget if set, else `fallback_budget`, else share x the device's
//      total memory;
//   2. peak(): the tracker's peak since reset_peak(), plus (device spaces) the untracked bytes
//      in use measured then.
template <execution_space Space>
class space_monitor {
 public:
  explicit space_monitor(Space space = Space{}, std::size_t fallback_budget = 0,
                         double share = 0.8) noexcept
      : space_(std::move(space)), fallback_budget_(fallback_budget), share_(share) {}

  std::size_t budget() const {
    const std::size_t own = space_.memory().budget();
    if (own != 0) {
      return own;
    }
    if (fallback_budget_ != 0) {
      return fallback_budget_;
    }
    const memory_snapshot info = space_.memory_info();
    return static_cast<std::size_t>(share_ * static_cast<double>(info.device_total));
  }
  void reset_peak() {
    space_.memory().reset_peak();
    outside_ = untracked_in_use();
  }
  std::size_t peak() const { return space_.memory().stats().peak + outside_; }

 private:
  std::size_t untracked_in_use() const {
    if constexpr (Space::host_accessible) {
      return 0;
    } else {
      const memory_snapshot info = space_.memory_info();
      if (info.device_total == 0 || info.device_free > info.device_total) {
        return 0;
      }
      const std::size_t used = info.device_total - info.device_free;
      return used > info.stats.in_use ? used - info.stats.in_use : 0;
    }
  }

  Space space_;
  std::size_t fallback_budget_;
  double share_;
  std::size_t outside_ = 0;
};

// ---- the controller -----------------------------------------------------------------------------

struct adaptive_config {
  std::size_t global_batch = 0;   // G, samples per rank per optimizer step, >= 1
  std::size_t min_micro = 1;      // >= 1 and <= the largest micro-batch
  std::size_t max_micro = 0;      // 0 = global_batch; values above global_batch act as it
  std::size_t initial_micro = 0;  // 0 = the largest that the estimate fits in the budget
  double margin = 0.05;           // target peak = budget x (1 - margin); in [0, 0.5)
  double max_growth = 2.0;        // at most x max_growth per decision; > 1
  double hysteresis = 0.10;       // grow only to more than current x (1 + hysteresis); in [0, 1)

  // Throws std::invalid_argument naming the field and its value.
  void validate() const;

  friend bool operator==(const adaptive_config&, const adaptive_config&) = default;
};

inline std::string to_string(const adaptive_config& c) {
  return "adaptive_config{.global_batch = " + std::to_string(c.global_batch) +
         ", .min_micro = " + std::to_string(c.min_micro) +
         ", .max_micro = " + std::to_string(c.max_micro) +
         ", .initial_micro = " + std::to_string(c.initial_micro) +
         ", .margin = " + format_shortest(c.margin) +
         ", .max_growth = " + format_shortest(c.max_growth) +
         ", .hysteresis = " + format_shortest(c.hysteresis) + "}";
}

namespace detail {

[[noreturn]] inline void throw_adaptive_error(std::string_view field, std::string_view rule,
                                              const std::string& value) {
  throw std::invalid_argument("adaptive_config." + std::string(field) + " must be " +
                              std::string(rule) + ", got " + value);
}

}  // namespace detail

inline void adaptive_config::validate() const {
  if (global_batch == 0) {
    detail::throw_adaptive_error("global_batch", ">= 1", "0");
  }
  const std::size_t largest = max_micro == 0 ? global_batch : std::min(max_micro, global_batch);
  if (min_micro == 0 || min_micro > largest) {
    detail::throw_adaptive_error(
        "min_micro", "in [1, " + std::to_string(largest) + "] (max_micro, at most global_batch)",
        std::to_string(min_micro));
  }
  if (!(margin >= 0.0 && margin < 0.5)) {
    detail::throw_adaptive_error("margin", "in [0, 0.5)", format_shortest(margin));
  }
  if (!(max_growth > 1.0 && std::isfinite(max_growth))) {
    detail::throw_adaptive_error("max_growth", "finite and > 1", format_shortest(max_growth));
  }
  if (!(hysteresis >= 0.0 && hysteresis < 1.0)) {
    detail::throw_adaptive_error("hysteresis", "in [0, 1)", format_shortest(hysteresis));
  }
}

// One change of the micro-batch, for the training log.
struct adaptive_event {
  std::uint64_t step = 0;
  std::size_t from = 0;  // 0 for "start"
  std::size_t to = 0;
  std::string reason{};  // "start", "grow", "shrink", "agree" (set by other ranks), "oom"
  std::size_t peak = 0;  // bytes: measured; estimated for "start"; asked for for "oom"
  std::size_t budget = 0;

  friend bool operator==(const adaptive_event&, const adaptive_event&) = default;
};

// "step 12: micro-batch 64 -> 128 (grow; peak 41.2 MiB of 100.0 MiB)"
inline std::string to_string(const adaptive_event& e) {
  return "step " + std::to_string(e.step) + ": micro-batch " + std::to_string(e.from) + " -> " +
         std::to_string(e.to) + " (" + e.reason + "; peak " + detail::mib(e.peak) + " of " +
         detail::mib(e.budget) + ")";
}

// Decides the micro-batch of each step; see the top of this file. Not thread-safe: one per rank.
//
//   adaptive_controller ctl({.global_batch = 256, .min_micro = 8}, estimate, budget, in_use);
//   for each step s:
//     monitor.reset_peak();
//     try { run split(256, ctl.micro_batch()) micro-steps; }
//     catch (const memory_error& e) { release the step; ctl.after_oom(s, e); redo the step; }
//     const std::size_t mine = ctl.propose(s, monitor.peak(), monitor.budget());
//     ctl.apply(s, agree_micro_batch(comm, mine), monitor.peak(), monitor.budget());
class adaptive_controller {
 public:
  // estimate_bytes(m): the bytes a step with micro-batch m adds to what is allocated, monotone
  // in m; may be empty, then only measurements guide the controller. budget: bytes, > 0.
  // base_bytes: the bytes allocated before the first step (parameters, optimizer state).
  adaptive_controller(adaptive_config cfg, std::function<std::size_t(std::size_t)> estimate_bytes,
                      std::size_t budget, std::size_t base_bytes)
      : cfg_(std::move(cfg)), estimate_(std::move(estimate_bytes)), budget_(budget) {
    cfg_.validate();
    check_budget("adaptive_controller", budget);
    min_ = cfg_.min_micro;
    max_ = cfg_.max_micro == 0 ? cfg_.global_batch : std::min(cfg_.max_micro, cfg_.global_batch);
    std::size_t start = cfg_.initial_micro != 0 ? clamp(cfg_.initial_micro) : min_;
    if (cfg_.initial_micro == 0 && estimate_) {
      // The largest m in [min, max] whose estimated peak fits; min when none does.
      const double limit = target(budget);
      const auto fits = [&](std::size_t m) {
        return static_cast<double>(saturating_add(base_bytes, estimate_(m))) <= limit;
      };
      std::size_t lo = min_;
      std::size_t hi = max_;
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      start = lo;
    }
    micro_ = start;
    const std::size_t expected =
        estimate_ ? saturating_add(base_bytes, estimate_(micro_)) : base_bytes;
    events_.push_back({.step = 0,
                       .from = 0,
                       .to = micro_,
                       .reason = "start",
                       .peak = expected,
                       .budget = budget});
  }

  const adaptive_config& config() const noexcept { return cfg_; }
  std::size_t micro_batch() const noexcept { return micro_; }
  std::size_t min_micro() const noexcept { return min_; }
  // The largest micro-batch: max_micro, at most global_batch.
  std::size_t max_micro() const noexcept { return max_; }
  const std::vector<adaptive_event>& events() const noexcept { return events_; }

  // ceil(global_batch / m): the micro-steps of one optimizer step at micro-batch m >= 1.
  std::size_t micro_steps(std::size_t m) const {
    check_micro("adaptive_controller::micro_steps", m);
    return (cfg_.global_batch + m - 1) / m;
  }

  // The sizes of the micro-batches of one step: m, m, ..., and the rest (smaller) last; they sum
  // to `global`. Empty when global is 0.
  static std::vector<std::size_t> split(std::size_t global, std::size_t m) {
    check_micro("adaptive_controller::split", m);
    std::vector<std::size_t> sizes(global / m, m);
    if (global % m != 0) {
      sizes.push_back(global % m);
    }
    return sizes;
  }

  // This rank's micro-batch for the next step, after a successful step that ran with
  // micro_batch() and reached `peak` bytes in total (base included) of `budget`. Records the
  // measurement; micro_batch() changes only in apply().
  std::size_t propose(std::uint64_t step, std::size_t peak, std::size_t budget) {
    static_cast<void>(step);
    check_budget("adaptive_controller::propose", budget);
    budget_ = budget;
    record(micro_, peak, budget);
    const std::size_t current = micro_;
    const double margin = cfg_.margin;
    std::size_t proposal = current;
    const std::size_t fit = model_fit(budget);
    if (static_cast<double>(peak) > static_cast<double>(budget) * (1.0 - margin / 2.0)) {
      // Upper band: shrink, by at least one, never below min.
      proposal = fit < current ? fit : (current > min_ ? current - 1 : min_);
    } else if (static_cast<double>(fit) > static_cast<double>(current) * (1.0 + cfg_.hysteresis)) {
      const double cap = std::floor(static_cast<double>(current) * cfg_.max_growth);
      const std::size_t grow_cap = cap >= static_cast<double>(max_)
                                       ? max_
                                       : std::max(current + 1, static_cast<std::size_t>(cap));
      proposal = std::min(fit, grow_cap);
    }
    proposal = clamp(proposal);
    last_proposal_ = proposal;
    return proposal;
  }

  // Takes the micro-batch agreed by every rank (the min of their proposals), clamped to
  // [min, max], and logs the change: "grow" or "shrink", or "agree" when it is not this rank's
  // own last proposal.
  void apply(std::uint64_t step, std::size_t agreed, std::size_t peak, std::size_t budget) {
    const std::size_t next = clamp(agreed);
    if (budget != 0) {
      budget_ = budget;
    }
    if (next == micro_) {
      return;
    }
    const char* reason = next > micro_ ? "grow" : "shrink";
    if (last_proposal_ != 0 && agreed != last_proposal_) {
      reason = "agree";
    }
    events_.push_back({.step = step,
                       .from = micro_,
                       .to = next,
                       .reason = reason,
                       .peak = peak,
                       .budget = budget_});
    micro_ = next;
  }

  // After a step failed to allocate (and released what it held): the micro-batch becomes at
  // most half the current one, and at most what the model of the last measurements fits, never
  // below min. The measurements are dropped, since the memory outside the step may have changed.
  // Returns the new micro-batch. Throws memory_error when the micro-batch is already min.
  std::size_t after_oom(std::uint64_t step, const memory_error& e) {
    const std::size_t budget = e.budget() != 0 ? e.budget() : budget_;
    const std::size_t asked = saturating_add(e.in_use(), e.requested());
    if (micro_ <= min_) {
      throw memory_error(
          {.space = e.space(),
           .requested = e.requested(),
           .in_use = e.in_use(),
           .budget = e.budget()},
          "step " + std::to_string(step) + " does not fit even at micro-batch " +
              std::to_string(min_) + " (the smallest allowed) within the memory budget of " +
              detail::mib(budget) +
              "; raise memory_budget_mb, lower adaptive_batch_min, or make the model smaller");
    }
    std::size_t next = std::max(min_, micro_ / 2);
    if (points_ != 0) {
      next = std::min(next, model_fit(budget));
    }
    next = clamp(next);
    events_.push_back({.step = step,
                       .from = micro_,
                       .to = next,
                       .reason = "oom",
                       .peak = asked,
                       .budget = budget});
    micro_ = next;
    points_ = 0;
    last_proposal_ = 0;
    return next;
  }

 private:
  struct point {
    std::size_t micro = 0;
    std::size_t peak = 0;
  };

  static void check_budget(const char* where, std::size_t budget) {
    if (budget == 0) {
      throw std::invalid_argument(std::string(where) + ": budget must be > 0 bytes, got 0");
    }
  }

  static void check_micro(const char* where, std::size_t m) {
    if (m == 0) {
      throw std::invalid_argument(std::string(where) + ": micro-batch must be >= 1, got 0");
    }
  }

  static std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
    return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                           : a + b;
  }

  std::size_t clamp(std::size_t m) const noexcept { return std::clamp(m, min_, max_); }

  double target(std::size_t budget) const noexcept {
    return static_cast<double>(budget) * (1.0 - cfg_.margin);
  }

  // Keeps the last two measurements at distinct micro-batches. A new one at the latest
  // micro-batch replaces it; when its peak moved by more than max(margin / 2, 1%) of the budget,
  // the memory outside the step changed, and the older point, taken before, is dropped too.
  void record(std::size_t m, std::size_t peak, std::size_t budget) {
    const point now{.micro = m, .peak = peak};
    if (points_ == 0) {
      history_[0] = now;
      points_ = 1;
      return;
    }
    point& last = history_[points_ - 1];
    if (last.micro == m) {
      const double moved = std::fabs(static_cast<double>(peak) - static_cast<double>(last.peak));
      const double tolerance = static_cast<double>(budget) * std::max(cfg_.margin / 2.0, 0.01);
      if (moved > tolerance) {
        history_[0] = now;
        points_ = 1;
      } else {
        last = now;
      }
      return;
    }
    if (points_ == 2) {
      history_[0] = history_[1];
    }
    history_[points_ == 2 ? 1 : points_] = now;
    points_ = 2;
  }

  // The largest micro-batch in [min, max] whose modelled peak base + slope x m stays under the
  // target. The slope comes from the last two measurements when they rise with m, else from the
  // estimate at the latest micro-batch, else it is peak / m (base 0, the most cautious); the
  // base is the latest peak minus slope x m. Requires a measurement.
  std::size_t model_fit(std::size_t budget) const {
    const point& last = history_[points_ - 1];
    const double m = static_cast<double>(last.micro);
    double slope = 0.0;
    if (points_ == 2) {
      const point& first = history_[0];
      slope = (static_cast<double>(last.peak) - static_cast<double>(first.peak)) /
              (m - static_cast<double>(first.micro));
    }
    if (!(slope > 0.0) && estimate_) {
      slope = static_cast<double>(estimate_(last.micro)) / m;
    }
    if (!(slope > 0.0)) {
      slope = static_cast<double>(last.peak) / m;
    }
    if (!(slope > 0.0)) {
      return clamp(last.micro);  // nothing measured: no reason to move
    }
    const double base = std::max(0.0, static_cast<double>(last.peak) - slope * m);
    const double room = target(budget) - base;
    if (room <= 0.0) {
      return min_;
    }
    const double fit = std::floor(room / slope);
    if (fit >= static_cast<double>(max_)) {
      return max_;
    }
    return clamp(static_cast<std::size_t>(fit));
  }

  adaptive_config cfg_;
  std::function<std::size_t(std::size_t)> estimate_;
  std::size_t budget_ = 0;  // the last budget seen
  std::size_t min_ = 1;
  std::size_t max_ = 1;
  std::size_t micro_ = 1;
  std::size_t last_proposal_ = 0;  // this rank's last proposal; 0 = none (yet, or since an OOM)
  std::array<point, 2> history_{};
  std::size_t points_ = 0;
  std::vector<adaptive_event> events_{};
};

// The micro-batch every rank takes: the min of the ranks' proposals (one all_reduce of one
// int64). Collective: every rank of `c` calls it once per decision.
template <comm::comm_backend_collectives Comm>
std::size_t agree_micro_batch(Comm& c, std::size_t proposal) {
  if (proposal == 0 ||
      proposal > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())) {
    throw std::invalid_argument("agree_micro_batch: proposal must be in [1, 2^63), got " +
                                std::to_string(proposal));
  }
  const auto mine = static_cast<std::int64_t>(proposal);
  std::int64_t agreed = 0;
  c.all_reduce(&mine, &agreed, 1, dtype::int64, comm::reduce_op::min);
  return static_cast<std::size_t>(agreed);
}

// The policy (batch/concepts.hpp): one loader batch of G = batch_size_per_gpu x
// gradient_accumulation_steps samples per step, run in micro-batches of the controller's size
// under memory_budget(); an allocation that fails releases the step's workspace and runs the
// same samples again in smaller micro-batches from fresh gradients. Then the controller sees the
// step's peak, the ranks agree on the minimum of their proposals, and the next step takes it.
class adaptive {
 public:
  using policy_category = batch_policy_tag;
  static constexpr std::string_view name = "adaptive";
  // The evaluation workspace is not kept: the memory goes back to the training steps.
  static constexpr bool frees_evaluation_memory = true;

  explicit adaptive(const config::train_config& cfg)
      : per_rank_(static_cast<std::size_t>(cfg.batch_size_per_gpu)),
        global_(per_rank_ * static_cast<std::size_t>(cfg.gradient_accumulation_steps)),
        min_(static_cast<std::size_t>(cfg.adaptive_batch_min)),
        max_(static_cast<std::size_t>(cfg.adaptive_batch_max)) {}
  static void check_config(const config::train_config& cfg) {
    refuse_foreign_keys(cfg, name, {.accumulation = true, .adaptive = true});
    if (!cfg.adaptive_batch) {
      throw config_error(
          {.key = "adaptive_batch", .file = {}, .line = 0, .column = 0},
          "the trainer's batch policy is batch::adaptive; set adaptive_batch = true");
    }
  }

  std::size_t loader_batch() const noexcept { return global_; }
  std::size_t loader_batches(std::uint64_t) const noexcept { return 1; }
  std::size_t micro_batch() const noexcept { return last_micro_; }

  // The controller for this fit(). Its first micro-batch is batch_size_per_gpu, or less when
  // the runner's estimate says that does not fit the budget, or the restored one. It keeps a
  // reference to the runner, which lives as long as the fit().
  template <step_runner R>
  void begin(R& runner) {
    const std::size_t budget = runner.memory_budget();
    const std::size_t base = runner.memory().stats().in_use;
    auto estimate = [&runner](std::size_t m) { return runner.activation_bytes(m); };
    adaptive_config ac{
        .global_batch = global_, .min_micro = min_, .max_micro = max_, .initial_micro = 0};
    const adaptive_controller probe(ac, estimate, budget, base);
    ac.initial_micro = std::min(probe.micro_batch(), per_rank_);
    if (next_ != 0) {
      ac.initial_micro = next_;  // resumed: where the saved run was
    }
    ac.initial_micro = std::clamp(ac.initial_micro, ac.min_micro, std::min(global_, ac.max_micro));
    controller_.emplace(ac, estimate, budget, base);
    logged_ = 0;
    log(runner);
  }

  template <step_runner R>
  model::loss_result run(R& runner, const samples& b, bool /*last*/) {
    memory_tracker& tracker = runner.memory();
    const std::size_t budget = runner.memory_budget();
    model::loss_result loss{};
    std::size_t peak = 0;
    for (;;) {
      const std::size_t m = controller_->micro_batch();
      try {
        const scoped_budget limit(tracker, budget);
        if (runner.workspace_capacity() != m) {
          runner.set_workspace(0);
          runner.set_workspace(m);
        }
        tracker.reset_peak();
        runner.restart();
        loss = {};
        std::size_t offset = 0;
        // The gradients go out once every micro-batch is done (none overlaps): a re-run after
        // an allocation failure must not find them sent.
        for (const std::size_t n : adaptive_controller::split(b.size, m)) {
          const model::loss_result part = runner.micro_step(b.slice(offset, n), false);
          loss.loss_sum += part.loss_sum;
          loss.correct += part.correct;
          offset += n;
        }
        peak = tracker.stats().peak;
        last_micro_ = m;
        break;
      } catch (const memory_error& e) {
        runner.set_workspace(0);
        controller_->after_oom(runner.step(), e);  // throws when even the smallest failed
        log(runner);
      }
    }
    const std::size_t proposal = controller_->propose(runner.step(), peak, budget);
    controller_->apply(runner.step(), runner.agree_min(proposal), peak, budget);
    next_ = controller_->micro_batch();
    log(runner);
    return loss;
  }

  // The micro-batch the next step starts from (0: none decided yet).
  nlohmann::json state() const { return {{"micro_batch", next_}}; }
  void restore(const nlohmann::json& j) {
    next_ = j.is_object() && j.contains("micro_batch") ? j.at("micro_batch").get<std::size_t>() : 0;
  }

 private:
  template <class R>
  void log(R& runner) {
    const auto& events = controller_->events();
    for (; logged_ < events.size(); ++logged_) {
      runner.message("adaptive batch: " + to_string(events[logged_]));
    }
  }

  std::size_t per_rank_;
  std::size_t global_;
  std::size_t min_;
  std::size_t max_;
  std::optional<adaptive_controller> controller_{};
  std::size_t logged_ = 0;
  std::size_t next_ = 0;        // the controller's choice for the next step
  std::size_t last_micro_ = 0;  // the micro-batch of the last step run
};

}  // namespace strata::batch
