// SPDX-License-Identifier: Apache-2.0
#pragma once

// Crash points of the checkpoint writer, for the fault suite: the process kills itself (SIGKILL:
// no destructor, no flush, as the OOM killer or a lost node would end it) at one phase of a save,
// so that a test can prove a restart finds the newest committed checkpoint.
//
// Through the environment (read once, at the first crash point a process reaches):
//   STRATA_CHECKPOINT_FAULT="phase=<phase>,save=<N>"
// The process dies the N-th time (1 = the first) one of its saves reaches <phase>:
//   shards    the first file is staged, the others are not
//   manifest  every file is staged, manifest.json is not written
//   rename    the staging directory is complete (manifest synced), not renamed into place
//   latest    the checkpoint has its final name, `latest` still names the previous one
//   cleanup   `latest` names it; leftovers and checkpoints beyond `keep` are not removed
// It writes one line to stderr before it dies, naming the phase, the save and the directory.

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "strata/core/fault_env.hpp"

namespace strata::train {

enum class checkpoint_phase : std::uint8_t { shards, manifest, rename, latest, cleanup };

inline constexpr std::string_view checkpoint_phase_names[] = {"shards", "manifest", "rename",
                                                              "latest", "cleanup"};

constexpr std::string_view to_string(checkpoint_phase p) noexcept {
  return checkpoint_phase_names[static_cast<std::size_t>(p)];
}

struct checkpoint_fault {
  checkpoint_phase phase = checkpoint_phase::shards;
  std::uint64_t save = 1;
};

// Parses "phase=manifest,save=2"; throws strata::error naming the variable and the field.
inline checkpoint_fault parse_checkpoint_fault(std::string_view text) {
  const ::strata::detail::fault_text t("STRATA_CHECKPOINT_FAULT", text);
  checkpoint_fault out;
  bool has_phase = false;
  t.each_field([&](std::string_view field, std::string_view key, std::string_view value) {
    if (key == "phase") {
      has_phase = false;
      for (std::size_t i = 0; i < std::size(checkpoint_phase_names); ++i) {
        if (value == checkpoint_phase_names[i]) {
          out.phase = static_cast<checkpoint_phase>(i);
          has_phase = true;
        }
      }
      if (!has_phase) {
        throw t.fail("unknown phase '" + std::string(value) +
                     "' (shards, manifest, rename, latest or cleanup)");
      }
    } else if (key == "save") {
      out.save = t.number(key, value);
      if (out.save == 0) {
        throw t.fail("save must be a positive integer, not '0'");
      }
    } else {
      throw t.fail("unknown field '" + std::string(field) + "' (phase=..., save=N)");
    }
  });
  if (!has_phase) {
    throw t.fail("phase=... is required");
  }
  return out;
}

// The fault STRATA_CHECKPOINT_FAULT plans, read once; nullopt when unset or empty. A
// checkpoint_store reads it when it is made, so that a bad value stops the program before it
// trains.
inline const std::optional<checkpoint_fault>& planned_checkpoint_fault() {
  static const std::optional<checkpoint_fault> fault =
      ::strata::detail::parse_fault_variable("STRATA_CHECKPOINT_FAULT", parse_checkpoint_fault);
  return fault;
}

namespace detail {

// Called by checkpoint_store at each phase of a save; kills the process where the environment
// says so, else returns. Cheap when the variable is not set.
inline void checkpoint_crash_point(checkpoint_phase phase, const std::filesystem::path& dir) {
  const std::optional<checkpoint_fault>& fault = planned_checkpoint_fault();
  if (!fault || fault->phase != phase) {
    return;
  }
  static std::mutex mutex;
  static std::uint64_t reached = 0;
  const std::lock_guard lock(mutex);
  if (++reached != fault->save) {
    return;
  }
  std::fprintf(stderr,
               "strata: STRATA_CHECKPOINT_FAULT: killing this process at phase %s of save %llu "
               "(%s)\n",
               std::string(to_string(phase)).c_str(), static_cast<unsigned long long>(reached),
               dir.string().c_str());
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace detail
}  // namespace strata::train
