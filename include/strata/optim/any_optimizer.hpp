// SPDX-License-Identifier: Apache-2.0
#pragma once

// any_optimizer: the optimizer a run's configuration names, chosen at run time. It holds an sgd
// or an adamw by value and forwards each call by std::visit (no virtual calls), so its updates
// are bit for bit those of the concrete optimizer.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "strata/optim/adamw.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/sgd.hpp"

namespace strata::optim {

struct optimizer_choice {
  enum class kind_type { sgd, adamw };

  kind_type kind = kind_type::sgd;
  sgd_config sgd{};      // used when kind is sgd
  adamw_config adamw{};  // used when kind is adamw

  friend bool operator==(const optimizer_choice&, const optimizer_choice&) = default;
};

inline std::string to_string(optimizer_choice::kind_type kind) {
  switch (kind) {
    case optimizer_choice::kind_type::sgd:
      return "sgd";
    case optimizer_choice::kind_type::adamw:
      return "adamw";
  }
  return "kind_type(" + std::to_string(static_cast<int>(kind)) + ")";
}

inline std::string to_string(const optimizer_choice& c) {
  return "optimizer_choice{.kind = " + to_string(c.kind) + ", .sgd = " + to_string(c.sgd) +
         ", .adamw = " + to_string(c.adamw) + "}";
}

class any_optimizer {
 public:
  using optimizer_category = optimizer_tag;
  using variant_type = std::variant<sgd, adamw>;

  explicit any_optimizer(variant_type optimizer) : optimizer_(std::move(optimizer)) {}

  optimizer_choice::kind_type kind() const noexcept {
    return std::holds_alternative<sgd>(optimizer_) ? optimizer_choice::kind_type::sgd
                                                   : optimizer_choice::kind_type::adamw;
  }
  const variant_type& optimizer() const noexcept { return optimizer_; }

  std::size_t state_per_parameter() const noexcept {
    return std::visit([](const auto& o) { return o.state_per_parameter(); }, optimizer_);
  }
  void update(const update_args& args) const {
    std::visit([&args](const auto& o) { o.update(args); }, optimizer_);
  }
  void begin_step() noexcept {
    std::visit([](auto& o) { o.begin_step(); }, optimizer_);
  }
  std::uint64_t step_count() const noexcept {
    return std::visit([](const auto& o) { return o.step_count(); }, optimizer_);
  }
  void set_step_count(std::uint64_t n) noexcept {
    std::visit([n](auto& o) { o.set_step_count(n); }, optimizer_);
  }
  std::string describe() const {
    return std::visit([](const auto& o) { return o.describe(); }, optimizer_);
  }

 private:
  variant_type optimizer_;
};

static_assert(check_optimizer<any_optimizer>());

// Builds the chosen optimizer from its config; throws std::invalid_argument as its constructor
// does, or for an unknown kind.
inline any_optimizer make_optimizer(const optimizer_choice& choice) {
  switch (choice.kind) {
    case optimizer_choice::kind_type::sgd:
      return any_optimizer(sgd(choice.sgd));
    case optimizer_choice::kind_type::adamw:
      return any_optimizer(adamw(choice.adamw));
  }
  throw std::invalid_argument("optimizer_choice.kind must be sgd or adamw, got " +
                              to_string(choice.kind));
}

}  // namespace strata::optim
