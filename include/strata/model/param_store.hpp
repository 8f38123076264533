// SPDX-License-Identifier: Apache-2.0
#pragma once

// param_store: every parameter of a model (or of one rank's shard) in one aligned contiguous
// buffer, the gradients in a second buffer of the same layout.
//
// Tensors are laid out in the order given, each group (a layer's parameters) starting on an
// `alignment` boundary and its tensors packed back to back, so that a layer sees its parameters
// as one span. Bucketed all-reduce, sharded optimizer state, checkpoints and precision casts are
// loops over ranges of these two buffers; padding between groups is zero and stays zero (its
// gradient is zero too).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/host.hpp"
#include "strata/core/rng.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

// The gradients' magnitude bound (param_store::grad_bound) below which they are all finite for
// certain: float's largest is about 2^128, and what the bound leaves out (rounding in the sums
// that formed the gradients, accumulation over micro-batches) is a factor far below 2^28.
inline constexpr double certainly_finite_bound = 0x1p100;

// One tensor's place in the store.
struct param_entry {
  std::string name{};  // "<group>.<tensor>", e.g. "2.weight"
  param_spec spec{};
  std::size_t offset = 0;  // in floats, from the start of the buffer
  std::size_t group = 0;
  // The tensor's place among the whole model's tensors: its initial values are drawn from it
  // (initialize), so a store holding part of the model (a pipeline stage) starts as the whole.
  std::size_t index = 0;
  // The whole tensor (spec is this rank's slice of it under tensor parallelism: requirement 10
  // of model/concepts.hpp; otherwise both are the same) and where the slice starts in it: its
  // first row (split rows) or column (split cols).
  param_spec global{};
  std::size_t slice_first = 0;

  friend bool operator==(const param_entry&, const param_entry&) = default;
};

// One group's (layer's) range.
struct param_group {
  std::string name{};
  std::size_t offset = 0;    // floats
  std::size_t elements = 0;  // of its tensors, without padding

  friend bool operator==(const param_group&, const param_group&) = default;
};

struct param_store_config {
  std::size_t alignment = 64;  // bytes; each group starts on this boundary
  // The buffers hold a multiple of this many floats (zeros at the end): sharding over n ranks
  // asks for n x 16, so that every rank's shard is as long and starts on 64 bytes.
  std::size_t size_multiple = 1;
  // For a store that holds part of a model (the layers of a pipeline stage): the index, among the
  // whole model's tensors, of each group's first tensor. Empty: the store is the whole model,
  // its tensors numbered in order.
  std::vector<std::size_t> group_first_tensor{};
  // The rank's place in its tensor-parallel group: tensors with a split hold this rank's slice.
  tensor_place tensor{};

  friend bool operator==(const param_store_config&, const param_store_config&) = default;
};

class param_store {
 public:
  param_store() = default;

  // groups[g] are the tensors of group g, named group_names[g].
  param_store(const std::vector<std::string>& group_names,
              const std::vector<std::vector<param_spec>>& groups, param_store_config config = {})
      : config_(config) {
    if (group_names.size() != groups.size()) {
      throw std::invalid_argument("param_store: " + std::to_string(group_names.size()) +
                                  " group names for " + std::to_string(groups.size()) + " groups");
    }
    if (config_.alignment < sizeof(float) || (config_.alignment & (config_.alignment - 1)) != 0) {
      throw std::invalid_argument("param_store: alignment " + std::to_string(config_.alignment) +
                                  " is not a power of two of at least 4 bytes");
    }
    if (!config_.group_first_tensor.empty() && config_.group_first_tensor.size() != groups.size()) {
      throw std::invalid_argument("param_store: group_first_tensor has " +
                                  std::to_string(config_.group_first_tensor.size()) +
                                  " entries for " + std::to_string(groups.size()) + " groups");
    }
    const std::size_t align = config_.alignment / sizeof(float);
    std::size_t offset = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      offset = (offset + align - 1) / align * align;
      param_group group{.name = group_names[g], .offset = offset, .elements = 0};
      std::size_t index =
          config_.group_first_tensor.empty() ? entries_.size() : config_.group_first_tensor[g];
      for (const param_spec& whole : groups[g]) {
        const param_spec spec = local_spec(whole, config_.tensor);
        entries_.push_back({.name = group_names[g] + "." + spec.name,
                            .spec = spec,
                            .offset = offset,
                            .group = g,
                            .index = index++,
                            .global = whole,
                            .slice_first = slice_first(whole, config_.tensor)});
        offset += spec.elements();
        group.elements += spec.elements();
      }
      groups_.push_back(group);
    }
    if (config_.size_multiple == 0) {
      throw std::invalid_argument("param_store: size_multiple must be at least 1");
    }
    total_ = (offset + config_.size_multiple - 1) / config_.size_multiple * config_.size_multiple;
    values_ = buffer<float>(total_, {.alignment = config_.alignment, .zero_fill = true});
    grads_ = buffer<float>(total_, {.alignment = config_.alignment, .zero_fill = true});
  }

  param_store(param_store&&) noexcept = default;
  param_store& operator=(param_store&&) noexcept = default;

  // Floats in each buffer, padding included.
  std::size_t size() const noexcept { return total_; }
  // Parameters, padding excluded.
  std::size_t parameter_count() const noexcept {
    std::size_t n = 0;
    for (const auto& g : groups_) {
      n += g.elements;
    }
    return n;
  }
  const param_store_config& config() const noexcept { return config_; }
  const std::vector<param_entry>& entries() const noexcept { return entries_; }
  const std::vector<param_group>& groups() const noexcept { return groups_; }

  std::span<float> values() noexcept { return values_.span(); }
  std::span<const float> values() const noexcept { return values_.span(); }
  // The gradients. After discard_grads() and before a backward has written them, the first
  // call zeroes them: they read as zero_grads() would have left them. That first call writes,
  // the const one too: two threads must not make it at once on a discarded store (a store is
  // one rank's, read by its own thread).
  std::span<float> grads() noexcept {
    materialize_grads();
    grad_bound_ = unknown_bound;
    return grads_.span();
  }
  std::span<const float> grads() const noexcept {
    materialize_grads();
    return grads_.span();
  }

  // A group's (layer's) parameters and gradients.
  std::span<float> group_values(std::size_t g) { return slice(values_.span(), group_range(g)); }
  std::span<const float> group_values(std::size_t g) const {
    return slice(values_.span(), group_range(g));
  }
  std::span<float> group_grads(std::size_t g) {
    materialize_grads();
    grad_bound_ = unknown_bound;
    return slice(grads_.span(), group_range(g));
  }

  // For the model's backward and whoever consumes what it reports (data parallelism's buckets):
  // the gradient memory as it is, discarded or not. Whoever writes through it writes every
  // group's gradients before anything reads them (as sequential::backward does for layers that
  // declare writes_grads and zeroes for the others), then calls grads_written().
  std::span<float> grads_to_write() noexcept {
    grad_bound_ = unknown_bound;
    return grads_.span();
  }
  std::span<float> group_grads_to_write(std::size_t g) {
    grad_bound_ = unknown_bound;
    return slice(grads_.span(), group_range(g));
  }
  // `bound`: what the writer knows of them (grad_bound); by default nothing.
  void grads_written(double bound = unknown_bound) noexcept {
    grads_discarded_ = false;
    grad_bound_ = bound;
  }

  // A bound on the magnitude of every gradient, from whoever wrote them: 0 after zero_grads()
  // and discard_grads(); what the last grads_written() said (sequential::backward: the bound
  // before it plus what its layers reported, backward_args::grad_bound); infinity (nothing
  // known) once anything took the gradients through a non-const accessor since. A NaN is
  // never within a finite bound: below certainly_finite_bound every gradient is finite. A span
  // taken before grads_written() and written through after it is not seen: data parallelism's
  // reducers do so, and the trainer relies on the bound on one rank only.
  double grad_bound() const noexcept { return grad_bound_; }
  bool grads_certainly_finite() const noexcept { return grad_bound_ < certainly_finite_bound; }

  // A tensor by name ("2.weight").
  const param_entry& entry(std::string_view name) const {
    for (const auto& e : entries_) {
      if (e.name == name) {
        return e;
      }
    }
    std::string known;
    for (const auto& e : entries_) {
      known += (known.empty() ? "" : ", ") + e.name;
    }
    throw std::invalid_argument("param_store: no parameter '" + std::string(name) +
                                "'; parameters: " + known);
  }
  std::span<float> value(std::string_view name) {
    const auto& e = entry(name);
    return values_.span().subspan(e.offset, e.spec.elements());
  }
  std::span<const float> value(std::string_view name) const {
    const auto& e = entry(name);
    return values_.span().subspan(e.offset, e.spec.elements());
  }
  std::span<float> grad(std::string_view name) {
    materialize_grads();
    grad_bound_ = unknown_bound;
    const auto& e = entry(name);
    return grads_.span().subspan(e.offset, e.spec.elements());
  }

  void zero_grads() noexcept {
    grads_discarded_ = false;
    grad_bound_ = 0.0;
    if (total_ != 0) {
      values_.space().zero(grads_.data(), grads_.bytes());
    }
  }

  // A step's fresh gradients without a pass over them: they count as zero, and the model's next
  // backward writes them (layers that declare writes_grads) or zeroes a layer's range before
  // that layer adds. Reading them first (grads(), group_grads(), grad()) zeroes them then.
  // The alignment padding between groups, which no layer writes, is zeroed here (a few floats
  // per group), so that whatever reads the whole span (a reduction, a finiteness check) sees
  // zeros there as after zero_grads().
  void discard_grads() noexcept {
    grad_bound_ = 0.0;
    if (total_ == 0) {
      return;
    }
    grads_discarded_ = true;
    float* g = grads_.data();
    const auto zero = [&](std::size_t from, std::size_t to) {
      if (to > from) {
        values_.space().zero(g + from, (to - from) * sizeof(float));
      }
    };
    std::size_t end = 0;
    for (const param_group& group : groups_) {
      zero(end, group.offset);
      end = group.offset + group.elements;
    }
    zero(end, total_);
  }
  bool grads_discarded() const noexcept { return grads_discarded_; }

  // Seeded initialisation of every tensor by its init_kind: tensor t of the whole model
  // (param_entry::index) draws from the stream (seed, epoch 0, sample t, substream 0x1A17), so
  // a tensor's values do not depend on the others, on the alignment or on how the model is split
  // across ranks.
  void initialize(std::uint64_t seed) {
    for (const param_entry& e : entries_) {
      std::span<float> out = values_.span().subspan(e.offset, e.spec.elements());
      rng_stream rng = rng_stream::for_sample(seed, 0, e.index, init_substream);
      if (e.spec == e.global) {
        fill(out, e.spec, rng);
        continue;
      }
      // A slice: the whole tensor's values drawn as for a group of one, this rank's part kept,
      // so every tensor-parallel size starts from the same model.
      std::vector<float> whole(e.global.elements());
      fill(whole, e.global, rng);
      copy_slice(e, whole, out);
    }
  }

  // Writes entry e's slice `slice` into its whole tensor `whole` (global.elements() floats): the
  // inverse of copy_slice.
  static void place_slice(const param_entry& e, std::span<const float> slice,
                          std::span<float> whole) {
    const bool rows = e.global.split == tensor_split::rows;
    for (std::size_t r = 0; r < e.spec.rows; ++r) {
      const std::size_t to_row = rows ? e.slice_first + r : r;
      const std::size_t to_col = rows ? 0 : e.slice_first;
      std::copy_n(slice.begin() + static_cast<std::ptrdiff_t>(r * e.spec.cols), e.spec.cols,
                  whole.begin() + static_cast<std::ptrdiff_t>(to_row * e.global.cols + to_col));
    }
  }

  // Copies entry e's slice out of its whole tensor `whole` (global.elements() floats).
  static void copy_slice(const param_entry& e, std::span<const float> whole, std::span<float> out) {
    const bool rows = e.global.split == tensor_split::rows;
    for (std::size_t r = 0; r < e.spec.rows; ++r) {
      const std::size_t from_row = rows ? e.slice_first + r : r;
      const std::size_t from_col = rows ? 0 : e.slice_first;
      std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(from_row * e.global.cols + from_col),
                  e.spec.cols, out.begin() + static_cast<std::ptrdiff_t>(r * e.spec.cols));
    }
  }

  static constexpr std::uint32_t init_substream = 0x1A17;

 private:
  static constexpr double unknown_bound = std::numeric_limits<double>::infinity();

  struct range {
    std::size_t offset = 0;
    std::size_t elements = 0;
  };

  // Discarded gradients become zeros at their first read. A read through a const store counts:
  // the values it sees are the same either way.
  void materialize_grads() const noexcept {
    if (grads_discarded_) {
      values_.space().zero(const_cast<float*>(grads_.data()), grads_.bytes());
      grads_discarded_ = false;
    }
  }

  range group_range(std::size_t g) const {
    if (g >= groups_.size()) {
      throw std::out_of_range("param_store: group " + std::to_string(g) + " of " +
                              std::to_string(groups_.size()));
    }
    return {groups_[g].offset, groups_[g].elements};
  }

  template <class T>
  static std::span<T> slice(std::span<T> all, range r) {
    return all.subspan(r.offset, r.elements);
  }

  static void fill(std::span<float> out, const param_spec& spec, rng_stream& rng) {
    const double fan_in = static_cast<double>(spec.fan_in == 0 ? 1 : spec.fan_in);
    const double fan_sum =
        static_cast<double>(spec.fan_in + spec.fan_out == 0 ? 1 : spec.fan_in + spec.fan_out);
    auto uniform = [&](double bound) {
      for (float& v : out) {
        v = static_cast<float>(rng.uniform(-bound, bound));
      }
    };
    auto normal = [&](double stddev) {
      for (float& v : out) {
        v = static_cast<float>(rng.normal(0.0, stddev));
      }
    };
    switch (spec.init) {
      case init_kind::zeros:
        std::fill(out.begin(), out.end(), 0.0f);
        break;
      case init_kind::ones:
        std::fill(out.begin(), out.end(), 1.0f);
        break;
      case init_kind::kaiming_uniform:
        uniform(std::sqrt(6.0 / fan_in));
        break;
      case init_kind::kaiming_normal:
        normal(std::sqrt(2.0 / fan_in));
        break;
      case init_kind::xavier_uniform:
        uniform(std::sqrt(6.0 / fan_sum));
        break;
      case init_kind::xavier_normal:
        normal(std::sqrt(2.0 / fan_sum));
        break;
      case init_kind::uniform_fan_in:
        uniform(1.0 / std::sqrt(fan_in));
        break;
    }
  }

  param_store_config config_{};
  std::vector<param_entry> entries_{};
  std::vector<param_group> groups_{};
  std::size_t total_ = 0;
  buffer<float> values_{};
  buffer<float> grads_{};
  mutable bool grads_discarded_ = false;
  double grad_bound_ = unknown_bound;
};

// The store of the same groups holding every tensor whole (the layout of a group of one): what
// the slices of every rank of a tensor-parallel group make together.
inline param_store whole_store_like(const param_store& part) {
  std::vector<std::string> names;
  std::vector<std::vector<param_spec>> groups(part.groups().size());
  for (const param_group& g : part.groups()) {
    names.push_back(g.name);
  }
  for (const param_entry& e : part.entries()) {
    groups[e.group].push_back(e.global);
  }
  param_store_config config = part.config();
  config.tensor = {};
  return param_store(names, groups, config);
}

// The whole values from every rank's values of a tensor-parallel group (`ranks` x part.size()
// floats, rank 0's first; part is any rank's store), in whole_store_like(part)'s layout.
inline std::vector<float> gather_whole_values(const param_store& part, std::span<const float> ranks,
                                              std::size_t size) {
  const param_store whole = whole_store_like(part);
  std::vector<float> out(whole.size(), 0.0f);
  for (std::size_t i = 0; i < part.entries().size(); ++i) {
    param_entry e = part.entries()[i];
    const param_entry& w = whole.entries()[i];
    const std::span<float> into = std::span<float>(out).subspan(w.offset, w.spec.elements());
    for (std::size_t k = 0; k < size; ++k) {
      e.slice_first = slice_first(e.global, {.rank = k, .size = size});
      if (e.spec == e.global && k > 0) {
        break;  // held whole by every rank: rank 0's
      }
      param_store::place_slice(e, ranks.subspan(k * part.size() + e.offset, e.spec.elements()),
                               into);
    }
  }
  return out;
}

}  // namespace strata::model
