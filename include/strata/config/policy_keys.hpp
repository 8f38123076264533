// SPDX-License-Identifier: Apache-2.0
#pragma once

// Keys a policy declares for itself, read from the configuration's [policy] table
// (train_config::policy; `--policy.NAME VALUE` on the command line). A policy of any family, a
// user's included, declares them as
//
//     static constexpr std::array config_keys{strata::config::policy_key{
//         .name = "local_sgd_period", .kind = strata::config::policy_value::integer,
//         .default_value = "4", .min = 1, .max = 1e6,
//         .doc = "Optimizer steps between two averages of the parameters."}};
//
// and reads one with policy_int / policy_real / policy_bool / policy_text (the declared default
// when the table does not set it). A trainer checks the table against the keys its policies
// declare (check_policy_keys): a key none of them declares, or a value of the wrong kind or out
// of range, is a config_error naming `policy.<key>` and the policy; a policy key's value other
// than its default is part of the run's identity (policy_settings_text), so that runs with other
// values never share checkpoints.

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"

namespace strata::config {

enum class policy_value { integer, real, boolean, text };

struct policy_key {
  std::string_view name;  // under [policy]: lower-case letters, digits and '_'
  policy_value kind = policy_value::integer;
  std::string_view default_value{};                       // as text: "4", "0.5", "true", "name"
  double min = -std::numeric_limits<double>::infinity();  // integer and real
  double max = std::numeric_limits<double>::infinity();
  std::string_view doc{};
};

// A policy P that declares keys: `P::config_keys`, a range of policy_key.
template <class P>
concept declares_policy_keys = requires {
  { P::config_keys.size() } -> std::convertible_to<std::size_t>;
  { P::config_keys[0] } -> std::convertible_to<const policy_key&>;
};

namespace detail {

inline std::string_view policy_value_name(policy_value k) noexcept {
  switch (k) {
    case policy_value::integer:
      return "an integer";
    case policy_value::real:
      return "a number";
    case policy_value::boolean:
      return "a boolean (true or false)";
    case policy_value::text:
      return "a string";
  }
  return "?";
}

inline config_error policy_value_error(const policy_key& key, std::string_view policy,
                                       const std::string& message) {
  std::string owner =
      policy.empty() ? std::string() : " (read by policy " + std::string(policy) + ")";
  return config_error({.key = "policy." + std::string(key.name)}, message + owner);
}

// The value of `key` as text: the table's, else the declared default.
inline std::string_view policy_value_text(const train_config& cfg, const policy_key& key) {
  const auto it = cfg.policy.find(std::string(key.name));
  return it == cfg.policy.end() ? key.default_value : std::string_view(it->second);
}

// Parses `text` as `key` wants it; throws config_error naming policy.<key> when it is not.
inline double parse_policy_number(const policy_key& key, std::string_view text,
                                  std::string_view policy) {
  double value = 0.0;
  if (key.kind == policy_value::integer) {
    std::int64_t i = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
      throw policy_value_error(key, policy, "expected an integer, got '" + std::string(text) + "'");
    }
    value = static_cast<double>(i);
  } else {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty() ||
        !std::isfinite(value)) {
      throw policy_value_error(key, policy, "expected a number, got '" + std::string(text) + "'");
    }
  }
  if (!(value >= key.min && value <= key.max)) {
    const auto bound = [&](double b) {
      return key.kind == policy_value::integer && std::isfinite(b)
                 ? std::to_string(static_cast<std::int64_t>(b))
                 : format_real(b);
    };
    throw policy_value_error(key, policy,
                             "value " + std::string(text) + " is out of range; allowed: " +
                                 bound(key.min) + " .. " + bound(key.max));
  }
  return value;
}

inline void check_policy_value(const policy_key& key, std::string_view text,
                               std::string_view policy) {
  switch (key.kind) {
    case policy_value::integer:
    case policy_value::real:
      parse_policy_number(key, text, policy);
      break;
    case policy_value::boolean:
      if (text != "true" && text != "false") {
        throw policy_value_error(key, policy,
                                 "expected true or false, got '" + std::string(text) + "'");
      }
      break;
    case policy_value::text:
      break;
  }
}

}  // namespace detail

// The value of `key` (the table's, else its default); config_error naming policy.<key> when it is
// not of the key's kind or out of its range.
inline std::int64_t policy_int(const train_config& cfg, const policy_key& key) {
  return static_cast<std::int64_t>(
      detail::parse_policy_number(key, detail::policy_value_text(cfg, key), {}));
}
inline double policy_real(const train_config& cfg, const policy_key& key) {
  return detail::parse_policy_number(key, detail::policy_value_text(cfg, key), {});
}
inline bool policy_bool(const train_config& cfg, const policy_key& key) {
  const std::string_view text = detail::policy_value_text(cfg, key);
  detail::check_policy_value(key, text, {});
  return text == "true";
}
inline std::string policy_text(const train_config& cfg, const policy_key& key) {
  return std::string(detail::policy_value_text(cfg, key));
}

// Checks the [policy] table against the keys that Policies declare: every key set must be
// declared by one of them, with a value of its kind and range; the declared defaults must be
// valid too. Throws config_error naming policy.<key> and the policies.
template <class... Policies>
void check_policy_keys(const train_config& cfg) {
  std::vector<std::pair<policy_key, std::string_view>> declared;
  const auto collect = [&]<class P>() {
    if constexpr (requires { P::config_keys; }) {
      static_assert(declares_policy_keys<P>,
                    "Policy: 'config_keys' must be an array of strata::config::policy_key");
    }
    if constexpr (declares_policy_keys<P>) {
      for (const policy_key& k : P::config_keys) {
        declared.emplace_back(k, P::name);
      }
    }
  };
  (collect.template operator()<Policies>(), ...);
  for (const auto& [key, policy] : declared) {
    detail::check_policy_value(key, key.default_value, policy);
    detail::check_policy_value(key, detail::policy_value_text(cfg, key), policy);
  }
  for (const auto& [name, value] : cfg.policy) {
    bool found = false;
    for (const auto& d : declared) {
      found = found || d.first.name == name;
    }
    if (!found) {
      std::string names;
      ((names += (names.empty() ? "" : ", ") + std::string(Policies::name)), ...);
      std::string keys;
      for (const auto& d : declared) {
        keys += (keys.empty() ? "" : ", ") + std::string(d.first.name);
      }
      throw config_error({.key = "policy." + name},
                         "no policy of this trainer declares it (" + names +
                             "; their keys: " + (keys.empty() ? "none" : keys) + ")");
    }
  }
}

// The [policy] keys of Policies whose value is not their default, as "name=value" in declaration
// order separated by ", " (empty when all are at their defaults): part of a run's identity.
template <class... Policies>
std::string policy_settings_text(const train_config& cfg) {
  std::string out;
  const auto add = [&]<class P>() {
    if constexpr (declares_policy_keys<P>) {
      for (const policy_key& k : P::config_keys) {
        const auto canonical = [&](std::string_view text) {
          if (k.kind == policy_value::integer) {
            return std::to_string(
                static_cast<std::int64_t>(detail::parse_policy_number(k, text, P::name)));
          }
          if (k.kind == policy_value::real) {
            return detail::format_real(detail::parse_policy_number(k, text, P::name));
          }
          return std::string(text);
        };
        const std::string v = canonical(detail::policy_value_text(cfg, k));
        if (v != canonical(k.default_value)) {
          out += (out.empty() ? "" : ", ") + std::string(k.name) + "=" + v;
        }
      }
    }
  };
  (add.template operator()<Policies>(), ...);
  return out;
}

}  // namespace strata::config
