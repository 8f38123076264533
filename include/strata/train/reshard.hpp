// SPDX-License-Identifier: Apache-2.0
#pragma once

// Checkpoints that resume under another layout (docs/tensor.md, "Resharding").
//
// Save. Every rank describes the blobs that hold its data: its parameters (the blob the executor
// reads them from) and its optimizer state (the executor's optimizer_blobs(): the shards of its
// flat parameters each holds), with its store's tensors by global name, whole shape, split and
// the slice it holds. Rank 0 gathers the descriptions (collective over the trainer's group) and
// writes them as the state's "tensors" manifest with the layout that wrote them:
//   {"version": 1, "layout": "...", "samples_per_batch": N (a loader batch over every data-parallel
//   rank), "state_per_parameter": k,
//    "stores": [[[name, rows, cols, split, first, local rows, local cols, offset], ...], ...],
//    "files": {"rank-0.params.bin": {"store": 0, "holds": "params"},
//              "rank-0.optimizer.bin": {"store": 0, "holds": "optimizer", "shards": [[0, n]]}}}
//
// Load. Under the layout that wrote it, every blob is read as it is (bit for bit). Under another
// one, checkpoint_reader assembles every tensor whole from the files the manifest lists (every
// element of every tensor, and of its optimizer state, at least once; the copies of a tensor
// that several ranks hold whole must agree bit for bit) and cuts each blob the new
// layout reads from them: the parameters and the optimizer state move bit for bit. A file the
// manifest does not describe (top-k residuals, a user's executor without optimizer_blobs) holds
// state that belongs to its layout: the checkpoint then resumes under that layout only, and
// another is refused naming the file. A tensor whose name or shape differs from this rank's is a
// checkpoint_error naming it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/any_comm.hpp"
#include "strata/core/dtype.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/train/checkpoint.hpp"

namespace strata::train::detail {

inline constexpr int tensor_manifest_version = 1;

// The blobs an executor describes as this rank's optimizer state; none where it describes
// none (parallel::described_optimizer_blobs).
template <class Executor>
std::vector<parallel::optimizer_blob> optimizer_blobs_of(const Executor& e) {
  return parallel::described_optimizer_blobs(e).value_or(std::vector<parallel::optimizer_blob>{});
}

inline const char* split_name(model::tensor_split s) {
  return s == model::tensor_split::rows ? "rows" : s == model::tensor_split::cols ? "cols" : "none";
}

// This rank's store and the blobs that hold its data, as the manifest lists them.
inline nlohmann::json describe_rank(const model::param_store& store, const std::string& params_blob,
                                    const std::vector<parallel::optimizer_blob>& optimizer) {
  nlohmann::json entries = nlohmann::json::array();
  for (const model::param_entry& e : store.entries()) {
    entries.push_back({e.name, e.global.rows, e.global.cols, split_name(e.global.split),
                       e.slice_first, e.spec.rows, e.spec.cols, e.offset});
  }
  nlohmann::json files = nlohmann::json::object();
  files[params_blob] = {{"holds", "params"}};
  for (const parallel::optimizer_blob& b : optimizer) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& [first, size] : b.shards) {
      shards.push_back({first, size});
    }
    files[b.name] = {{"holds", "optimizer"}, {"shards", shards}};
  }
  return {{"store", entries}, {"files", files}};
}

// Collective over `group` (null: one rank): every rank's describe_rank, merged on rank 0 into
// the manifest (other ranks get null). Ranks that hold the same data (replicas) describe the
// same files alike; two descriptions of one file that differ are a logic_error.
inline nlohmann::json tensor_manifest(comm::any_comm* group, const nlohmann::json& mine,
                                      const std::string& layout, std::uint64_t samples_per_batch,
                                      std::size_t state_per_parameter) {
  constexpr int tag = 41;
  std::vector<nlohmann::json> all{mine};
  if (group != nullptr && group->size() > 1) {
    if (group->rank() != 0) {
      const std::string text = mine.dump();
      const auto size = static_cast<std::int64_t>(text.size());
      group->send(&size, 1, dtype::int64, 0, tag);
      group->send(text.data(), text.size(), dtype::uint8, 0, tag);
      return nullptr;
    }
    for (int r = 1; r < group->size(); ++r) {
      std::int64_t size = 0;
      group->recv(&size, 1, dtype::int64, r, tag);
      std::string text(static_cast<std::size_t>(size), '\0');
      group->recv(text.data(), text.size(), dtype::uint8, r, tag);
      all.push_back(nlohmann::json::parse(text));
    }
  }
  nlohmann::json stores = nlohmann::json::array();
  nlohmann::json files = nlohmann::json::object();
  for (const nlohmann::json& d : all) {
    std::size_t store = stores.size();
    for (std::size_t s = 0; s < stores.size(); ++s) {
      if (stores[s] == d.at("store")) {
        store = s;
      }
    }
    if (store == stores.size()) {
      stores.push_back(d.at("store"));
    }
    for (const auto& [name, what] : d.at("files").items()) {
      nlohmann::json f = what;
      f["store"] = store;
      if (files.contains(name) && files.at(name) != f) {
        throw std::logic_error("checkpoint manifest: two ranks describe " + name + " differently");
      }
      files[name] = f;
    }
  }
  return {{"version", tensor_manifest_version},
          {"layout", layout},
          {"samples_per_batch", samples_per_batch},
          {"state_per_parameter", state_per_parameter},
          {"stores", stores},
          {"files", files}};
}

// Reads a checkpoint's blobs for this rank: as they are under the layout that wrote them, else
// cut from the whole tensors (the header comment). Every check throws checkpoint_error naming
// the file, the parameter or the manifest field, before anything of this rank is changed by
// the blob concerned.
class checkpoint_reader {
 public:
  // `mine`: describe_rank of this rank under this run's `layout`; `store`: its parameters.
  checkpoint_reader(const loaded_checkpoint& c, const std::string& layout, nlohmann::json mine,
                    const model::param_store& store, std::size_t state_per_parameter)
      : c_(&c), mine_(std::move(mine)), store_(&store), per_(state_per_parameter) {
    if (!c.state.contains("tensors")) {
      return;  // written before the manifest: under its own layout only (check_layer_split)
    }
    const nlohmann::json& t = c.state.at("tensors");
    if (!t.is_object() || !t.contains("layout") || !t.at("layout").is_string()) {
      fail("manifest.json", "its state's \"tensors\" has no layout");
    }
    from_ = t.at("layout").get<std::string>();
    reshards_ = from_ != layout;
  }

  // Whether the blobs are cut anew (the checkpoint was written under another layout).
  bool reshards() const noexcept { return reshards_; }
  const std::string& written_under() const noexcept { return from_; }

  // Fills `into` from blob `name` of the checkpoint, or of what the checkpoint's layout-free
  // contents give for it under this rank's layout.
  void operator()(std::string_view name, std::span<float> into) {
    if (!reshards_) {
      c_->copy_blob(name, into);
      return;
    }
    assemble();
    const nlohmann::json& files = mine_.at("files");
    if (!files.contains(name)) {
      fail(std::string(name), "this run reads " + std::string(name) +
                                  ", which no layout-free tensor gives (state of one layout); "
                                  "the checkpoint was written under " +
                                  from_ + " and resumes under that layout only");
    }
    for (const slot& s : my_slots()) {
      (void)whole_of(s, std::string(name));  // every tensor checked before anything is written
    }
    const nlohmann::json& f = files.at(std::string(name));
    std::fill(into.begin(), into.end(), 0.0f);
    if (f.at("holds") == "params") {
      cut_params(name, into);
    } else {
      cut_state(name, f.at("shards"), into);
    }
  }

 private:
  struct slot {
    std::string name;
    std::size_t rows = 0, cols = 0;
    model::tensor_split split = model::tensor_split::none;
    std::size_t first = 0, local_rows = 0, local_cols = 0, offset = 0;

    std::size_t elements() const noexcept { return local_rows * local_cols; }
    // The whole tensor's index of the slice's element k.
    std::size_t whole_index(std::size_t k) const noexcept {
      std::size_t r = k / local_cols;
      std::size_t col = k % local_cols;
      if (split == model::tensor_split::rows) {
        r += first;
      } else if (split == model::tensor_split::cols) {
        col += first;
      }
      return r * cols + col;
    }
  };
  struct whole {
    std::size_t rows = 0, cols = 0;
    std::vector<float> values;
    std::vector<float> state;                        // slot s of element i at s x rows x cols + i
    std::vector<std::uint8_t> has_value, has_state;  // per element: some file held it
  };

  [[noreturn]] void fail(const std::string& file, const std::string& message) const {
    checkpoint_fail(c_->info.path / file, "reshard",
                    "checkpoint " + c_->info.name + ": " + message);
  }

  static slot mine_slot(const model::param_entry& e) {
    return {.name = e.name,
            .rows = e.global.rows,
            .cols = e.global.cols,
            .split = e.global.split,
            .first = e.slice_first,
            .local_rows = e.spec.rows,
            .local_cols = e.spec.cols,
            .offset = e.offset};
  }

  // The whole tensor `s` names, its shape checked against this rank's.
  whole& whole_of(const slot& s, const std::string& file) {
    const auto it = wholes_.find(s.name);
    if (it == wholes_.end()) {
      fail(file, "parameter " + s.name + " (" + std::to_string(s.rows) + "x" +
                     std::to_string(s.cols) + " in this run) is not in the checkpoint");
    }
    if (it->second.rows != s.rows || it->second.cols != s.cols) {
      fail(file, "parameter " + s.name + " is " + std::to_string(it->second.rows) + "x" +
                     std::to_string(it->second.cols) + " in the checkpoint, " +
                     std::to_string(s.rows) + "x" + std::to_string(s.cols) + " in this run");
    }
    return it->second;
  }

  // The manifest's files read into whole tensors, once.
  void assemble() {
    if (assembled_) {
      return;
    }
    try {
      assemble_from(c_->state.at("tensors"));
    } catch (const nlohmann::json::exception& e) {
      fail("manifest.json", std::string("its \"tensors\" manifest is malformed: ") + e.what());
    }
    assembled_ = true;
  }

  void assemble_from(const nlohmann::json& t) {
    if (t.at("version").get<int>() != tensor_manifest_version) {
      fail("manifest.json", "tensor manifest version " + t.at("version").dump() + " (this build " +
                                "reads " + std::to_string(tensor_manifest_version) + ")");
    }
    const auto per = t.at("state_per_parameter").get<std::size_t>();
    if (per != per_) {
      fail("manifest.json", "the optimizer keeps " + std::to_string(per) +
                                " floats per parameter in the checkpoint, " + std::to_string(per_) +
                                " in this run");
    }
    std::vector<std::vector<slot>> stores;
    for (const nlohmann::json& s : t.at("stores")) {
      std::vector<slot>& out = stores.emplace_back();
      for (const nlohmann::json& e : s) {
        const std::string split = e.at(3).get<std::string>();
        out.push_back({.name = e.at(0).get<std::string>(),
                       .rows = e.at(1).get<std::size_t>(),
                       .cols = e.at(2).get<std::size_t>(),
                       .split = split == "rows"   ? model::tensor_split::rows
                                : split == "cols" ? model::tensor_split::cols
                                                  : model::tensor_split::none,
                       .first = e.at(4).get<std::size_t>(),
                       .local_rows = e.at(5).get<std::size_t>(),
                       .local_cols = e.at(6).get<std::size_t>(),
                       .offset = e.at(7).get<std::size_t>()});
        const slot& sl = out.back();
        whole& w = wholes_[sl.name];
        if (w.values.empty()) {
          w.rows = sl.rows;
          w.cols = sl.cols;
          w.values.assign(sl.rows * sl.cols, 0.0f);
          w.state.assign(per * sl.rows * sl.cols, 0.0f);
          w.has_value.assign(sl.rows * sl.cols, 0);
          w.has_state.assign(sl.rows * sl.cols, 0);
        } else if (w.rows != sl.rows || w.cols != sl.cols) {
          fail("manifest.json", "parameter " + sl.name + " has two shapes in the manifest");
        }
      }
    }
    const nlohmann::json& files = t.at("files");
    for (const auto& [name, bytes] : c_->blobs) {
      if (!files.contains(name)) {
        fail(name, name + " holds state of the layout that wrote it (" + from_ +
                       ") that no other layout can take: resume under that layout");
      }
    }
    for (const auto& [name, f] : files.items()) {
      const std::vector<std::byte>& raw = c_->blob(name);
      std::vector<float> floats(raw.size() / sizeof(float));
      if (!floats.empty()) {  // an empty blob (SGD without momentum) may have no memory
        std::memcpy(floats.data(), raw.data(), floats.size() * sizeof(float));
      }
      const std::vector<slot>& store = stores.at(f.at("store").get<std::size_t>());
      if (f.at("holds") == "params") {
        for (const slot& s : store) {
          if (s.offset + s.elements() > floats.size()) {
            fail(name, name + " has " + std::to_string(floats.size()) + " floats, parameter " +
                           s.name + " ends at " + std::to_string(s.offset + s.elements()));
          }
          whole& w = wholes_.at(s.name);
          for (std::size_t k = 0; k < s.elements(); ++k) {
            const std::size_t g = s.whole_index(k);
            put(w.values[g], w.has_value[g] != 0, floats[s.offset + k], s.name, name);
            w.has_value[g] = 1;
          }
        }
        continue;
      }
      std::size_t at = 0;
      for (const nlohmann::json& shard : f.at("shards")) {
        const auto first = shard.at(0).get<std::size_t>();
        const auto size = shard.at(1).get<std::size_t>();
        if (at + size * per > floats.size()) {
          fail(name, name + " has " + std::to_string(floats.size()) +
                         " floats, fewer than its shards' optimizer state");
        }
        for_each_piece(store, first, size, [&](const slot& s, std::size_t lo, std::size_t n) {
          whole& w = wholes_.at(s.name);
          const std::size_t base = at + (lo - first) * per;
          const std::size_t count = w.rows * w.cols;
          for (std::size_t j = 0; j < n; ++j) {
            const std::size_t g = s.whole_index(lo - s.offset + j);
            for (std::size_t slot_index = 0; slot_index < per; ++slot_index) {
              put(w.state[slot_index * count + g], w.has_state[g] != 0,
                  floats[base + slot_index * n + j], s.name, name);
            }
            w.has_state[g] = 1;
          }
        });
        at += size * per;
      }
    }
    for (const auto& [name, w] : wholes_) {
      const auto values = static_cast<std::size_t>(
          std::count(w.has_value.begin(), w.has_value.end(), std::uint8_t{1}));
      const auto states = static_cast<std::size_t>(
          std::count(w.has_state.begin(), w.has_state.end(), std::uint8_t{1}));
      const std::size_t count = w.rows * w.cols;
      if (values != count || (per > 0 && states != count)) {
        fail("manifest.json", "its files hold " + std::to_string(values) + " values and " +
                                  std::to_string(states) + " optimizer states of the " +
                                  std::to_string(count) + " elements of parameter " + name);
      }
    }
  }

  // A whole tensor's float at `index` from a file (`already`: another file gave it); a tensor held
  // whole by several ranks (not split) comes from each, and they must agree bit for bit.
  void put(float& into, bool already, float value, const std::string& tensor,
           const std::string& file) const {
    if (already && std::memcmp(&into, &value, sizeof value) != 0) {
      fail(file, file + " holds another value of parameter " + tensor +
                     " than an earlier file of the checkpoint");
    }
    into = value;
  }

  // f(slot, lo, n) for each tensor's piece [lo, lo + n) inside the shard [first, first + size)
  // of a store's flat parameters.
  template <class F>
  static void for_each_piece(const std::vector<slot>& store, std::size_t first, std::size_t size,
                             F&& f) {
    for (const slot& s : store) {
      const std::size_t lo = std::max(s.offset, first);
      const std::size_t hi = std::min(s.offset + s.elements(), first + size);
      if (lo < hi) {
        f(s, lo, hi - lo);
      }
    }
  }

  std::vector<slot> my_slots() const {
    std::vector<slot> out;
    for (const model::param_entry& e : store_->entries()) {
      out.push_back(mine_slot(e));
    }
    return out;
  }

  void cut_params(std::string_view name, std::span<float> into) {
    for (const slot& s : my_slots()) {
      const whole& w = whole_of(s, std::string(name));
      for (std::size_t k = 0; k < s.elements(); ++k) {
        into[s.offset + k] = w.values[s.whole_index(k)];
      }
    }
  }

  void cut_state(std::string_view name, const nlohmann::json& shards, std::span<float> into) {
    const std::vector<slot> store = my_slots();
    std::size_t at = 0;
    for (const nlohmann::json& shard : shards) {
      const auto first = shard.at(0).get<std::size_t>();
      const auto size = shard.at(1).get<std::size_t>();
      if (at + size * per_ > into.size()) {
        fail(std::string(name), std::string(name) + ": its shards hold more state than the " +
                                    std::to_string(into.size()) + " floats this run reads");
      }
      for_each_piece(store, first, size, [&](const slot& s, std::size_t lo, std::size_t n) {
        const whole& w = whole_of(s, std::string(name));
        const std::size_t base = at + (lo - first) * per_;
        const std::size_t count = w.rows * w.cols;
        for (std::size_t slot_index = 0; slot_index < per_; ++slot_index) {
          for (std::size_t j = 0; j < n; ++j) {
            into[base + slot_index * n + j] =
                w.state[slot_index * count + s.whole_index(lo - s.offset + j)];
          }
        }
      });
      at += size * per_;
    }
  }

  const loaded_checkpoint* c_;
  nlohmann::json mine_;
  const model::param_store* store_;
  std::size_t per_;
  std::string from_{};
  bool reshards_ = false;
  bool assembled_ = false;
  std::map<std::string, whole, std::less<>> wholes_{};
};

}  // namespace strata::train::detail
