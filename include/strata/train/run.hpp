// SPDX-License-Identifier: Apache-2.0
#pragma once

// run_identity: which checkpoints a training run may continue.
//
// A run writes its checkpoints under checkpoint_dir/<run name>/. The run name is run_name when
// set, else "run-" and the first 8 hex digits of the run's fingerprint: the xxh3 of every
// configuration key outside continuable_keys whose value is not its default (data slice, seed,
// batch, precision, parallel layout, optimizer and schedule settings, ...; a key a later version
// adds at its default leaves the fingerprint as it was), of the model's parameter tensors (name,
// shape, initialisation, weight decay), its input and output shapes, and the trainer's policies
// (with or without a loss scaler). Two runs with different settings therefore never share a
// directory. It cannot see code: layers without parameters (an activation, a dropout rate) and
// the augmentation. After changing those, name the run (run_name) or start afresh.
//
// Keys that may differ while a run is continued (continuable_keys): how long it trains (epochs;
// the learning-rate schedule is recomputed for the new count), where files are and go, how data
// is read, how progress is shown, when it stops, how long a wait may take, which collectives are
// fingerprinted, and how many test samples are evaluated.
//
// Every checkpoint's state carries the record (to_json: name, fingerprint, every key's value,
// the model's tensors), so a refusal names what differs: "lr: 0.05 in the checkpoint, 0.1 in
// this run", "model: 1.weight is 1024x784 in the checkpoint, 512x784 in this run".

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/model/param_store.hpp"

namespace strata::train {

// Keys a continued run may change (see the header comment).
inline constexpr std::array<std::string_view, 19> continuable_keys{"epochs",
                                                                   "data_dir",
                                                                   "loader_workers",
                                                                   "prefetch_depth",
                                                                   "blas_threads",
                                                                   "gemm",
                                                                   "bf16_products",
                                                                   "loader_timeout",
                                                                   "checkpoint_dir",
                                                                   "checkpoint_keep",
                                                                   "checkpoint_interval",
                                                                   "resume",
                                                                   "run_name",
                                                                   "max_steps",
                                                                   "max_eval_samples",
                                                                   "metrics_file",
                                                                   "log_every",
                                                                   "comm_timeout",
                                                                   "comm_fingerprint"};

inline bool is_continuable_key(std::string_view key) noexcept {
  return std::find(continuable_keys.begin(), continuable_keys.end(), key) != continuable_keys.end();
}

// Keys of the layout: a run named with run_name continues under other values of these, and
// under another parallel policy, its checkpoint's tensors cut for the new layout
// (train/reshard.hpp; the loader batch over all data-parallel ranks must stay, which the
// reader checks). An unnamed run's directory still depends on them.
inline constexpr std::array<std::string_view, 14> layout_keys{
    "world_size",           "communication_backend",
    "batch_size_per_gpu",   "data_parallel_size",
    "tensor_parallel_size", "pipeline_parallel_size",
    "pipeline_schedule",    "micro_batches",
    "gradient_sync",        "bucket_size_mb",
    "zero_stage",           "hierarchy_group_size",
    "parameter_servers",    "dedicated_parameter_servers"};

inline bool is_layout_key(std::string_view key) noexcept {
  return std::find(layout_keys.begin(), layout_keys.end(), key) != layout_keys.end();
}

// A run's name, fingerprint, directory and the record its checkpoints carry.
struct run_identity {
  std::string name{};                 // the directory under checkpoint_dir
  std::string fingerprint{};          // 16 hex digits
  std::filesystem::path directory{};  // checkpoint_dir / name
  std::vector<std::pair<std::string, std::string>> settings{};  // every key, as TOML text
  std::vector<std::pair<std::string, std::string>> model{};     // tensor name, "RxC init ..."
  // The policies without the parallel one (recorded, not hashed): what a run continued under
  // another layout must keep.
  std::string layout_free_policies{};

  nlohmann::json to_json() const {
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& [k, v] : settings) {
      keys[k] = v;
    }
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [n, s] : model) {
      tensors.push_back({n, s});
    }
    nlohmann::json out{
        {"name", name}, {"fingerprint", fingerprint}, {"settings", keys}, {"model", tensors}};
    if (!layout_free_policies.empty()) {
      out["layout_free_policies"] = layout_free_policies;
    }
    return out;
  }
};

namespace detail {
inline std::string hex16(std::uint64_t h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}
}  // namespace detail

// `shapes`: the model's input and output ("1x28x28 -> 1x1x10"); `policies`: the trainer's
// (names, and whether its precision has a loss scaler). Both are recorded as model entries.
// `layout_free`: the policies without the parallel one (recorded only; empty: a run that does
// not continue under another layout).
inline run_identity make_run_identity(const config::train_config& cfg,
                                      const std::vector<model::param_entry>& tensors,
                                      std::string_view shapes = {}, std::string_view policies = {},
                                      std::string_view layout_free = {});
inline run_identity make_run_identity(const config::train_config& cfg,
                                      const model::param_store& params,
                                      std::string_view shapes = {}, std::string_view policies = {},
                                      std::string_view layout_free = {}) {
  return make_run_identity(cfg, params.entries(), shapes, policies, layout_free);
}
// The same from the model's tensors (every rank's list, whatever part of the model it holds).
inline run_identity make_run_identity(const config::train_config& cfg,
                                      const std::vector<model::param_entry>& tensors,
                                      std::string_view shapes, std::string_view policies,
                                      std::string_view layout_free) {
  config::check_run_name(cfg.run_name);
  run_identity id;
  id.layout_free_policies = std::string(layout_free);
  std::string hashed = "run record 1\n";
  const config::train_config defaults{};
  config::visit_keys([&](const auto& key) {
    std::string value = config::value_text(cfg, key);
    if (!is_continuable_key(key.name) && value != config::value_text(defaults, key)) {
      hashed += std::string(key.name) + "=" + value + "\n";
    }
    id.settings.emplace_back(std::string(key.name), std::move(value));
  });
  for (const model::param_entry& e : tensors) {
    std::string shape = std::to_string(e.spec.rows) + "x" + std::to_string(e.spec.cols) + " init " +
                        std::to_string(static_cast<int>(e.spec.init)) + " fan " +
                        std::to_string(e.spec.fan_in) + "/" + std::to_string(e.spec.fan_out) +
                        (e.spec.weight_decay ? "" : " no-decay");
    hashed += "tensor " + e.name + " " + shape + "\n";
    id.model.emplace_back(e.name, std::move(shape));
  }
  for (const auto& [what, text] : {std::pair{"shapes", shapes}, std::pair{"policies", policies}}) {
    if (!text.empty()) {
      hashed += std::string(what) + " " + std::string(text) + "\n";
      id.model.emplace_back(what, std::string(text));
    }
  }
  id.fingerprint = detail::hex16(XXH3_64bits(hashed.data(), hashed.size()));
  id.name = cfg.run_name.empty() ? "run-" + id.fingerprint.substr(0, 8) : cfg.run_name;
  id.directory = std::filesystem::path(cfg.checkpoint_dir) / id.name;
  return id;
}

namespace detail {
// Both records name their layout-free policies: the layout may change between them.
inline bool layout_may_change(const nlohmann::json& saved, const run_identity& now) {
  return !now.layout_free_policies.empty() && saved.is_object() &&
         saved.contains("layout_free_policies") && saved.at("layout_free_policies").is_string();
}
}  // namespace detail

// What keeps `now` from continuing the run recorded in `saved` (a checkpoint's "run" state): the
// model's tensors, then each key outside continuable_keys, as one sentence each. Empty: it may.
// Between records that both name their layout-free policies, the layout keys and the parallel
// policy are not differences (layout_changes lists them).
inline std::vector<std::string> run_differences(const nlohmann::json& saved,
                                                const run_identity& now) {
  std::vector<std::string> out;
  if (!saved.is_object() || !saved.contains("settings") || !saved.contains("model")) {
    out.emplace_back("the checkpoint has no run record (written by an earlier strata)");
    return out;
  }
  const nlohmann::json& tensors = saved.at("model");
  if (!tensors.is_array()) {
    out.emplace_back("the checkpoint's run record has no model list");
    return out;
  }
  const bool relayout = detail::layout_may_change(saved, now);
  if (relayout && saved.at("layout_free_policies").get<std::string>() != now.layout_free_policies) {
    out.push_back("policies: " + saved.at("layout_free_policies").get<std::string>() +
                  " in the checkpoint, " + now.layout_free_policies + " in this run");
  }
  const std::size_t n = std::min(tensors.size(), now.model.size());
  for (std::size_t i = 0; i < n; ++i) {
    const nlohmann::json& t = tensors[i];
    const bool pair = t.is_array() && t.size() == 2 && t[0].is_string() && t[1].is_string();
    const std::string name = pair ? t[0].get<std::string>() : "?";
    const std::string shape = pair ? t[1].get<std::string>() : "?";
    if (relayout && name == "policies" && now.model[i].first == "policies") {
      continue;  // compared without the parallel policy above
    }
    if (name != now.model[i].first || shape != now.model[i].second) {
      out.push_back(name == now.model[i].first
                        ? "model: " + name + " is " + shape + " in the checkpoint, " +
                              now.model[i].second + " in this run"
                        : "model: entry " + std::to_string(i) + " is " + name + " " + shape +
                              " in the checkpoint, " + now.model[i].first + " " +
                              now.model[i].second + " in this run");
      break;
    }
  }
  if (out.empty() && tensors.size() != now.model.size()) {
    out.push_back("model: " + std::to_string(tensors.size()) + " entries in the checkpoint, " +
                  std::to_string(now.model.size()) + " in this run");
  }
  // A key the checkpoint's version did not have counts as its default there.
  std::vector<std::pair<std::string, std::string>> defaults;
  const config::train_config d{};
  config::visit_keys([&](const auto& key) {
    defaults.emplace_back(std::string(key.name), config::value_text(d, key));
  });
  const nlohmann::json& keys = saved.at("settings");
  for (std::size_t i = 0; i < now.settings.size(); ++i) {
    const auto& [k, v] = now.settings[i];
    if (is_continuable_key(k) || (relayout && is_layout_key(k))) {
      continue;
    }
    const std::string then = keys.is_object() && keys.contains(k) && keys.at(k).is_string()
                                 ? keys.at(k).get<std::string>()
                                 : defaults[i].second;
    if (then != v) {
      out.push_back(k + ": " + then + " in the checkpoint, " + v + " in this run");
    }
  }
  return out;
}

// The value of `key` in a saved run record, if it has one.
inline std::optional<std::string> saved_setting(const nlohmann::json& saved, std::string_view key) {
  if (saved.is_object() && saved.contains("settings") && saved.at("settings").is_object() &&
      saved.at("settings").contains(key) && saved.at("settings").at(std::string(key)).is_string()) {
    return saved.at("settings").at(std::string(key)).get<std::string>();
  }
  return std::nullopt;
}

// The layout keys, and the policies, whose values differ between `saved` and `now` when the
// layout may change between them (else none), as "key: A in the checkpoint, B in this run".
inline std::vector<std::string> layout_changes(const nlohmann::json& saved,
                                               const run_identity& now) {
  std::vector<std::string> out;
  if (!detail::layout_may_change(saved, now)) {
    return out;
  }
  std::vector<std::string> defaults;
  const config::train_config d{};
  config::visit_keys([&](const auto& key) { defaults.push_back(config::value_text(d, key)); });
  for (std::size_t i = 0; i < now.settings.size(); ++i) {
    const auto& [k, v] = now.settings[i];
    const std::string then = saved_setting(saved, k).value_or(defaults[i]);
    if (is_layout_key(k) && then != v) {
      out.push_back(k + ": " + then + " in the checkpoint, " + v + " in this run");
    }
  }
  const nlohmann::json none = nlohmann::json::array();
  const nlohmann::json& saved_model =
      saved.contains("model") && saved.at("model").is_array() ? saved.at("model") : none;
  for (const nlohmann::json& t : saved_model) {
    if (t.is_array() && t.size() == 2 && t[0] == "policies") {
      for (const auto& [name, text] : now.model) {
        if (name == "policies" && t[1] != text) {
          out.push_back("policies: " + t[1].get<std::string>() + " in the checkpoint, " + text +
                        " in this run");
        }
      }
    }
  }
  return out;
}

// A run found beside this one under checkpoint_dir: its directory, the newest checkpoint's name
// and run record (null when its manifest could not be read).
struct other_run {
  std::filesystem::path directory{};
  std::string checkpoint{};
  nlohmann::json record{};
};

// The runs in checkpoint_dir other than `self`: directories with a `latest` file. Read from the
// manifests alone (no file is verified); for messages.
inline std::vector<other_run> other_runs(const run_identity& self) {
  namespace fs = std::filesystem;
  std::vector<other_run> out;
  const fs::path root = self.directory.parent_path();
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return out;
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec) || entry.path().filename() == self.name) {
      continue;
    }
    std::ifstream latest(entry.path() / "latest");
    std::string name;
    if (!(latest >> name)) {
      continue;
    }
    other_run run{.directory = entry.path(), .checkpoint = name, .record = nullptr};
    std::ifstream manifest(entry.path() / name / "manifest.json");
    if (manifest) {
      const nlohmann::json m = nlohmann::json::parse(manifest, nullptr, false);
      if (m.is_object() && m.contains("state") && m.at("state").contains("run")) {
        run.record = m.at("state").at("run");
      }
    }
    out.push_back(std::move(run));
  }
  std::sort(out.begin(), out.end(),
            [](const other_run& a, const other_run& b) { return a.directory < b.directory; });
  return out;
}

// " (...)" when checkpoint_dir itself holds checkpoints of the layout before runs (a `latest`
// file): they have no run record and are not continued. Empty otherwise.
inline std::string old_layout_note(const run_identity& self) {
  std::error_code ec;
  const std::filesystem::path root = self.directory.parent_path();
  if (!std::filesystem::exists(root / "latest", ec)) {
    return {};
  }
  return " (" + root.string() +
         " also holds checkpoints written before runs had directories of their own; they are not "
         "continued)";
}

// For resume = true without a checkpoint of the run `self`: where it looked, the checkpoints it
// skipped, and the runs beside it with their first differences.
inline std::string no_checkpoint_message(const run_identity& self,
                                         const std::vector<checkpoint_error>& skipped) {
  std::string text = "resume = true, but " + self.directory.string() +
                     " holds no checkpoint of this run (" + self.name + ")";
  for (const checkpoint_error& e : skipped) {
    text += std::string("; skipped: ") + e.what();
  }
  for (const other_run& other : other_runs(self)) {
    text += "; " + other.directory.string() + " (" + other.checkpoint + ") is another run";
    if (other.record.is_null()) {
      continue;
    }
    std::vector<std::string> d;
    try {
      d = run_differences(other.record, self);
    } catch (const std::exception& e) {  // a manifest nobody verified: say so, go on
      d = {std::string("its run record cannot be read (") + e.what() + ")"};
    }
    for (std::size_t i = 0; i < d.size() && i < 3; ++i) {
      text += (i == 0 ? ": " : ", ") + d[i];
    }
    if (d.size() > 3) {
      text += ", and " + std::to_string(d.size() - 3) + " more";
    }
  }
  return text + old_layout_note(self) + ". resume = auto starts afresh when there is none";
}

// Moves a run directory that holds anything aside to the first free "<directory>.<N>" (N = 1,
// 2, ...) and returns where it went; nullopt when there was nothing to keep. Throws
// checkpoint_error when the rename fails.
inline std::optional<std::filesystem::path> set_aside(const std::filesystem::path& directory) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(directory, ec) || fs::is_empty(directory, ec)) {
    return std::nullopt;
  }
  for (int n = 1;; ++n) {
    fs::path to = directory;
    to += "." + std::to_string(n);
    if (fs::exists(fs::symlink_status(to, ec))) {
      continue;
    }
    fs::rename(directory, to, ec);
    if (ec) {
      throw checkpoint_error({.path = directory.string(), .check = "set aside"},
                             "cannot move the earlier run's checkpoints " + directory.string() +
                                 " to " + to.string() + ": " + ec.message());
    }
    return to;
  }
}

// Keys that may differ between the ranks of one job: where this rank reads data and writes its
// metrics, how its loader and GEMM use its machine, how it shows progress, and how long it
// waits. Every other key, and the model, must be the same on every rank.
inline constexpr std::array<std::string_view, 10> per_rank_keys{
    "data_dir",      "loader_workers", "prefetch_depth", "blas_threads", "gemm",
    "bf16_products", "loader_timeout", "metrics_file",   "log_every",    "comm_timeout"};

// Throws config_error on every rank when the ranks of `comm` were started with different
// settings (outside per_rank_keys) or a different model (tensors, shapes, policies): each key's
// value and the model record are hashed and gathered, so every rank finds the same differences.
// The error names the first key that differs, this rank's value and the ranks that differ from
// rank 0. A collective: every rank of `comm` calls it once, before training.
template <class Comm>
void check_ranks_agree(Comm& comm, const run_identity& run) {
  const std::size_t n = run.settings.size() + 1;  // every key, then the model
  std::vector<std::int64_t> mine(n, 0);
  for (std::size_t i = 0; i < run.settings.size(); ++i) {
    const auto& [key, value] = run.settings[i];
    const bool per_rank =
        std::find(per_rank_keys.begin(), per_rank_keys.end(), key) != per_rank_keys.end();
    mine[i] = per_rank ? 0 : static_cast<std::int64_t>(XXH3_64bits(value.data(), value.size()));
  }
  std::string model = "model record 1\n";
  for (const auto& [name, shape] : run.model) {
    model += name + " " + shape + "\n";
  }
  mine[n - 1] = static_cast<std::int64_t>(XXH3_64bits(model.data(), model.size()));
  const auto size = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> all(n * size, 0);
  comm.all_gather(mine.data(), all.data(), n, dtype::int64);
  std::vector<std::string> differences;
  std::string first_key;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<int> differ;
    for (std::size_t r = 1; r < size; ++r) {
      if (all[r * n + i] != all[i]) {
        differ.push_back(static_cast<int>(r));
      }
    }
    if (differ.empty()) {
      continue;
    }
    std::string ranks;
    for (const int r : differ) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (i + 1 == n) {
      std::string tensors;
      std::size_t count = 0;
      for (const auto& [name, shape] : run.model) {
        if (count++ < 3) {
          tensors += (tensors.empty() ? "" : ", ") + name + " " + shape;
        }
      }
      differences.push_back(
          "the model (tensors, input and output shapes, policies) differs "
          "on rank(s) " +
          ranks + " from rank 0's; this rank's has " + std::to_string(run.model.size()) +
          " entries: " + tensors + (count > 3 ? ", ..." : ""));
      if (first_key.empty()) {
        first_key = "model";
      }
    } else {
      const auto& [key, value] = run.settings[i];
      differences.push_back(key + " differs on rank(s) " + ranks +
                            " from rank 0 (this rank: " + key + " = " + value + ")");
      if (first_key.empty() || first_key == "model") {
        first_key = key;
      }
    }
  }
  if (differences.empty()) {
    return;
  }
  std::string message = "rank " + std::to_string(comm.rank()) + " of " + std::to_string(size) +
                        ": the ranks were started with different settings: ";
  for (std::size_t i = 0; i < differences.size(); ++i) {
    message += (i == 0 ? "" : "; ") + differences[i];
  }
  message += ". Every rank must run the same configuration and model; only ";
  for (std::size_t i = 0; i < per_rank_keys.size(); ++i) {
    message += (i == 0 ? "" : ", ") + std::string(per_rank_keys[i]);
  }
  message += " may differ";
  throw config_error(
      {.key = first_key == "model" ? std::string() : first_key, .file = {}, .line = 0, .column = 0},
      message);
}

}  // namespace strata::train
