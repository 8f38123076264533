// SPDX-License-Identifier: Apache-2.0
#pragma once

// "Did you mean" for unknown keys: the closest known name by edit distance.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::config {

// Levenshtein distance, case-insensitive, '-' treated as '_' (so --batch-size-per-gpu is close).
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  const auto norm = [](char ch) {
    if (ch == '-') {
      return '_';
    }
    return (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch - 'A' + 'a') : ch;
  };
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t cost = norm(a[i - 1]) == norm(b[j - 1]) ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate closest to `name`, if it is close enough to be a likely typo.
inline std::optional<std::string_view> closest_name(std::string_view name,
                                                    std::span<const std::string_view> candidates) {
  std::optional<std::string_view> best;
  std::size_t best_distance = 0;
  for (const auto candidate : candidates) {
    const std::size_t d = edit_distance(name, candidate);
    if (!best || d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  if (best && best_distance <= limit) {
    return best;
  }
  return std::nullopt;
}

// "unknown key 'batch_sise_per_gpu'; did you mean 'batch_size_per_gpu'?"
inline std::string unknown_key_message(std::string_view name,
                                       std::span<const std::string_view> candidates) {
  std::string out = "unknown key '" + std::string(name) + "'";
  if (const auto best = closest_name(name, candidates)) {
    out += "; did you mean '" + std::string(*best) + "'?";
  } else {
    out += "; see docs/config.md for the keys";
  }
  return out;
}

}  // namespace strata::config
