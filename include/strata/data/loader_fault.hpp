// SPDX-License-Identifier: Apache-2.0
#pragma once

// A loader worker that fails or stalls, for the fault suite: the prefetching loader consults
// the environment before it reads each sample.
//
//   STRATA_LOADER_FAULT="sample=<i>,action=throw|stall[,epoch=<e>]"
// When a worker reaches dataset sample i (in epoch e, or in any epoch without it) it throws
// strata::error (action=throw) or stops answering until the loader stops it (action=stall: the
// step then meets loader_timeout). Read once; unset or empty: nothing happens. In a loader
// without workers (loader_workers = 0) only `throw` acts: the caller's thread cannot be timed
// out.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "strata/core/error.hpp"
#include "strata/core/fault_env.hpp"

namespace strata::data {

struct loader_fault {
  enum class kind : std::uint8_t { throw_error, stall };
  std::uint64_t sample = 0;
  std::optional<std::uint64_t> epoch{};
  kind action = kind::throw_error;
  bool hits(std::uint64_t e, std::uint64_t index) const noexcept {
    return index == sample && (!epoch || *epoch == e);
  }
};

// Parses "sample=12,action=stall,epoch=1"; throws strata::error naming the variable and field.
inline loader_fault parse_loader_fault(std::string_view text) {
  const ::strata::detail::fault_text t("STRATA_LOADER_FAULT", text);
  loader_fault out;
  bool has_sample = false;
  bool has_action = false;
  t.each_field([&](std::string_view field, std::string_view key, std::string_view value) {
    if (key == "sample") {
      out.sample = t.number(key, value);
      has_sample = true;
    } else if (key == "epoch") {
      out.epoch = t.number(key, value);
    } else if (key == "action" && (value == "throw" || value == "stall")) {
      out.action = value == "throw" ? loader_fault::kind::throw_error : loader_fault::kind::stall;
      has_action = true;
    } else if (key == "action") {
      throw t.fail("unknown action '" + std::string(value) + "' (throw or stall)");
    } else {
      throw t.fail("unknown field '" + std::string(field) + "' (sample=I, action=A, epoch=E)");
    }
  });
  if (!has_sample || !has_action) {
    throw t.fail("sample=... and action=... are required");
  }
  return out;
}

// The fault STRATA_LOADER_FAULT plans, read once; nullopt when unset or empty. A prefetch_loader
// reads it when it is made, so that a bad value is an error in the caller's thread.
inline const std::optional<loader_fault>& planned_loader_fault() {
  static const std::optional<loader_fault> fault =
      ::strata::detail::parse_fault_variable("STRATA_LOADER_FAULT", parse_loader_fault);
  return fault;
}

namespace detail {

// Called before sample `index` of `epoch` is read; `stop` (null in the caller's thread) ends a
// stall when the loader stops its workers.
inline void loader_fault_point(std::uint64_t epoch, std::uint64_t index,
                               const std::atomic<bool>* stop) {
  const std::optional<loader_fault>& fault = planned_loader_fault();
  if (!fault || !fault->hits(epoch, index)) {
    return;
  }
  if (fault->action == loader_fault::kind::throw_error) {
    throw error("injected fault (STRATA_LOADER_FAULT): sample " + std::to_string(index) +
                " throws");
  }
  while (stop != nullptr && !stop->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace detail
}  // namespace strata::data
