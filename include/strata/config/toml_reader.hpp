// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reading a train_config from TOML (toml++) and setting single keys from text (the command line).
// Errors name the file, line and column, the key, the value and what is allowed.

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include <toml++/toml.h>

#include "strata/config/suggest.hpp"
#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/error.hpp"

namespace strata::config {

namespace detail {

inline config_location location_of(std::string_view key, std::string_view file,
                                   const toml::source_region& where) {
  return config_location{.key = std::string(key),
                         .file = std::string(file),
                         .line = static_cast<std::uint32_t>(where.begin.line),
                         .column = static_cast<std::uint32_t>(where.begin.column)};
}

inline std::string toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date/time";
    default:
      return "nothing";
  }
}

template <named_enum E>
E parse_enum_or_throw(std::string_view text, const config_location& where) {
  if (const auto value = parse_enum<E>(text)) {
    return *value;
  }
  std::string message =
      "value '" + std::string(text) + "' is not allowed; allowed: " + allowed_values<E>();
  const auto& names = enum_names<E>::names;
  if (const auto best = closest_name(text, std::span<const std::string_view>(names))) {
    message += "; did you mean '" + std::string(*best) + "'?";
  }
  throw config_error(where, message);
}

// Sets one key from a TOML node.
template <class Key>
void set_from_node(train_config& cfg, const Key& key, const toml::node& node,
                   const config_location& where) {
  auto& target = cfg.*(key.member);
  const auto wrong_type = [&] {
    return config_error(where, "expected " + std::string(type_text(key)) + " (" +
                                   allowed_text(key) + "), found " + toml_type_name(node));
  };
  if constexpr (std::is_same_v<Key, int_key>) {
    if (!node.is_integer()) {
      throw wrong_type();
    }
    target = *node.value<std::int64_t>();
  } else if constexpr (std::is_same_v<Key, real_key>) {
    if (!node.is_number()) {
      throw wrong_type();
    }
    target = *node.value<double>();
  } else if constexpr (std::is_same_v<Key, bool_key>) {
    if (!node.is_boolean()) {
      throw wrong_type();
    }
    target = *node.value<bool>();
  } else if constexpr (std::is_same_v<Key, string_key>) {
    if (!node.is_string()) {
      throw wrong_type();
    }
    target = *node.value<std::string>();
  } else {
    using enum_type = std::remove_cvref_t<decltype(target)>;
    // An enum with values named true and false (resume) also takes a TOML boolean.
    if (node.is_boolean() && parse_enum<enum_type>("true") && parse_enum<enum_type>("false")) {
      target = *parse_enum<enum_type>(*node.value<bool>() ? "true" : "false");
    } else if (!node.is_string()) {
      throw wrong_type();
    } else {
      target = parse_enum_or_throw<enum_type>(*node.value<std::string_view>(), where);
    }
  }
  check_range(cfg, key, where);
}

// The [policy] table: each value kept as text, a key checked for its spelling only (the
// policy that declares it checks the value).
inline void set_policy_table(train_config& cfg, const toml::node& node, std::string_view source) {
  const toml::table* table = node.as_table();
  if (table == nullptr) {
    throw config_error(
        location_of("policy", source, node.source()),
        "expected a table ([policy] with keys that policies declare), got " + toml_type_name(node));
  }
  for (const auto& entry : *table) {
    const toml::key& toml_key = entry.first;
    const toml::node& value = entry.second;
    const std::string name(toml_key.str());
    const config_location where = location_of("policy." + name, source, value.source());
    if (!valid_policy_key_name(name)) {
      throw config_error(where,
                         "a policy key is lower-case letters, digits and '_', from a letter");
    }
    if (const auto* i = value.as_integer()) {
      cfg.policy[name] = std::to_string(i->get());
    } else if (const auto* d = value.as_floating_point()) {
      cfg.policy[name] = format_real(d->get());
    } else if (const auto* b = value.as_boolean()) {
      cfg.policy[name] = b->get() ? "true" : "false";
    } else if (const auto* t = value.as_string()) {
      cfg.policy[name] = t->get();
    } else {
      throw config_error(where, "expected an integer, a float, a boolean or a string, got " +
                                    toml_type_name(value));
    }
  }
}

}  // namespace detail

// Sets key `name` from its text form, as given on the command line ("64", "0.1", "true",
// "bfloat16"). Unknown keys get a did-you-mean; bad values name the key, value and what is allowed.
inline void set_key(train_config& cfg, std::string_view name, std::string_view text,
                    std::string_view source = "command line") {
  if (name.starts_with("policy.")) {
    const std::string_view sub = name.substr(7);
    if (!valid_policy_key_name(sub)) {
      throw config_error(config_location{.key = std::string(name), .file = std::string(source)},
                         "a policy key is lower-case letters, digits and '_', from a letter");
    }
    cfg.policy[std::string(sub)] = std::string(text);
    return;
  }
  bool found = false;
  visit_keys([&](const auto& key) {
    if (found || key.name != name) {
      return;
    }
    found = true;
    using key_type = std::remove_cvref_t<decltype(key)>;
    const config_location where{.key = std::string(name), .file = std::string(source)};
    const auto bad = [&](std::string_view expected) {
      return config_error(where, "value '" + std::string(text) + "' is not " +
                                     std::string(expected) + "; allowed: " + allowed_text(key));
    };
    auto& target = cfg.*(key.member);
    if constexpr (std::is_same_v<key_type, int_key>) {
      std::int64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec == std::errc::result_out_of_range) {
        throw bad("a 64-bit integer");
      }
      if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
        throw bad("an integer");
      }
      target = value;
    } else if constexpr (std::is_same_v<key_type, real_key>) {
      double value = 0.0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
        throw bad("a number");
      }
      target = value;
    } else if constexpr (std::is_same_v<key_type, bool_key>) {
      if (text == "true" || text == "1" || text == "yes" || text == "on") {
        target = true;
      } else if (text == "false" || text == "0" || text == "no" || text == "off") {
        target = false;
      } else {
        throw bad("a boolean");
      }
    } else if constexpr (std::is_same_v<key_type, string_key>) {
      target = std::string(text);
    } else {
      using enum_type = std::remove_cvref_t<decltype(target)>;
      target = detail::parse_enum_or_throw<enum_type>(text, where);
    }
    check_range(cfg, key, where);
  });
  if (!found) {
    throw config_error(config_location{.file = std::string(source)},
                       unknown_key_message(name, key_names));
  }
}

// Applies every key of a TOML document to `cfg` (keys not in the document keep their values).
// `source` is the file name used in messages. Does not run the cross-key validation.
inline void apply_toml(train_config& cfg, std::string_view document, std::string_view source) {
  toml::table table;
  try {
    table = toml::parse(document, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source();
    throw config_error(config_location{.file = std::string(source),
                                       .line = static_cast<std::uint32_t>(where.begin.line),
                                       .column = static_cast<std::uint32_t>(where.begin.column)},
                       "TOML syntax error: " + std::string(e.description()));
  }
  for (const auto& entry : table) {
    // Named references, not a structured binding: the lambda below captures them (clang 14
    // cannot capture structured bindings; the fuzz targets build with clang).
    const toml::key& toml_key = entry.first;
    const toml::node& node = entry.second;
    const std::string_view name = toml_key.str();
    if (name == "policy") {
      detail::set_policy_table(cfg, node, source);
      continue;
    }
    bool found = false;
    visit_keys([&](const auto& key) {
      if (!found && key.name == name) {
        found = true;
        detail::set_from_node(cfg, key, node, detail::location_of(name, source, node.source()));
      }
    });
    if (!found) {
      auto where = detail::location_of({}, source, toml_key.source());
      throw config_error(where, unknown_key_message(name, key_names));
    }
  }
}

// Reads a TOML file into `cfg` (on top of its current values). Does not validate across keys.
inline void apply_toml_file(train_config& cfg, const std::filesystem::path& path) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    throw config_error(config_location{.file = name},
                       exists ? "cannot open the file for reading" : "no such file");
  }
  std::ostringstream text;
  text << in.rdbuf();
  apply_toml(cfg, text.str(), name);
}

// Defaults, then the TOML document, then cross-key validation.
inline train_config parse_toml(std::string_view document, std::string_view source = "<string>") {
  train_config cfg;
  apply_toml(cfg, document, source);
  validate(cfg, source);
  return cfg;
}

inline train_config load_toml_file(const std::filesystem::path& path) {
  train_config cfg;
  apply_toml_file(cfg, path);
  validate(cfg, path.string());
  return cfg;
}

}  // namespace strata::config
