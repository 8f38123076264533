// SPDX-License-Identifier: Apache-2.0
#pragma once

// Command line of a strata program (CLI11): `--config FILE` (repeatable; later files override
// earlier ones), `--KEY VALUE` for every key of train_config (overrides the files),
// `--policy.NAME VALUE` for a key of the [policy] table (a policy's own; the trainer checks it),
// `--print-config` (TOML that reads back to the same config) and `--help`.
// A program adds its own options through app() before parse().

#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "strata/config/suggest.hpp"
#include "strata/config/toml_reader.hpp"
#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/error.hpp"

namespace strata::config {

// Exit status of a program whose configuration was rejected.
inline constexpr int config_error_exit_code = 2;

enum class command_action {
  run,           // train (or whatever the program does) with `config`
  print_config,  // print `text` (the resolved config as TOML) and exit 0
  help,          // print `text` (usage) and exit 0
};

struct command_line {
  train_config config;
  command_action action = command_action::run;
  std::string text;
  std::vector<std::string> config_files;
};

class cli {
 public:
  // `defaults` are the program's own defaults, applied before any file.
  explicit cli(std::string description, train_config defaults = {})
      : app_(std::move(description)), defaults_(std::move(defaults)) {
    app_.allow_extras();
    app_.add_option("--config", files_, "TOML configuration file(s); later ones override earlier")
        ->type_name("FILE");
    app_.add_flag("--print-config", print_, "Print the resolved configuration as TOML and exit");
    std::size_t i = 0;
    visit_keys([&](const auto& key) {
      const std::string help = std::string(key.doc) + " [" + allowed_text(key) + "]";
      app_.add_option("--" + std::string(key.name), overrides_[i++], help)
          ->type_name(std::string(type_text(key)))
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    });
  }

  cli(const cli&) = delete;
  cli& operator=(const cli&) = delete;

  // The underlying CLI11 application, for a program's own options.
  CLI::App& app() noexcept { return app_; }

  // Parses argv; throws config_error (with file "command line" or the TOML file) on bad input.
  command_line parse(int argc, const char* const* argv) {
    command_line out;
    try {
      app_.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      out.action = command_action::help;
      out.text = app_.help();
      return out;
    } catch (const CLI::ParseError& e) {
      throw config_error(config_location{.file = "command line"}, e.what());
    }
    const auto policy_keys = policy_overrides();
    out.config = defaults_;
    for (const auto& file : files_) {
      apply_toml_file(out.config, file);
    }
    for (const auto& [name, value] : policy_keys) {
      set_key(out.config, name, value, "command line");
    }
    std::size_t i = 0;
    visit_keys([&](const auto& key) {
      const auto& value = overrides_[i++];
      if (!value.empty()) {
        set_key(out.config, key.name, value, "command line");
      }
    });
    validate(out.config);
    out.config_files = files_;
    if (print_) {
      out.action = command_action::print_config;
      out.text = print_toml(out.config);
    }
    return out;
  }

 private:
  // The `--policy.NAME VALUE` (or `--policy.NAME=VALUE`) arguments, in order; any other argument
  // CLI11 left over is a config_error.
  std::vector<std::pair<std::string, std::string>> policy_overrides() const {
    std::vector<std::pair<std::string, std::string>> out;
    const std::vector<std::string> extras = app_.remaining();
    for (std::size_t i = 0; i < extras.size(); ++i) {
      const std::string_view arg = extras[i];
      if (arg.starts_with("--policy.")) {
        const std::size_t eq = arg.find('=');
        if (eq != std::string_view::npos) {
          out.emplace_back(std::string(arg.substr(2, eq - 2)), std::string(arg.substr(eq + 1)));
          continue;
        }
        if (i + 1 == extras.size() || std::string_view(extras[i + 1]).starts_with("--")) {
          throw config_error(
              config_location{.key = std::string(arg.substr(2)), .file = "command line"},
              "expected a value after '" + std::string(arg) + "'");
        }
        out.emplace_back(std::string(arg.substr(2)), extras[i + 1]);
        ++i;
        continue;
      }
      reject(extras[i]);
    }
    return out;
  }

  [[noreturn]] void reject(const std::string& extra) const {
    std::string_view arg = extra;
    if (arg.starts_with("--")) {
      arg.remove_prefix(2);
      arg = arg.substr(0, arg.find('='));
      std::vector<std::string_view> names(key_names.begin(), key_names.end());
      names.push_back("config");
      names.push_back("print-config");
      std::string message = "unknown option '--" + std::string(arg) + "'";
      if (const auto best = closest_name(arg, names)) {
        message += "; did you mean '--" + std::string(*best) + "'?";
      } else {
        message += "; run with --help for the options (a policy's own key: --policy.NAME VALUE)";
      }
      throw config_error(config_location{.file = "command line"}, message);
    }
    throw config_error(config_location{.file = "command line"},
                       "unexpected argument '" + extra + "'; keys are set as --KEY VALUE");
  }

  CLI::App app_;
  train_config defaults_;
  std::vector<std::string> files_;
  bool print_ = false;
  std::array<std::string, key_count> overrides_{};
};

// Runs `body(config)` for a program: parses the command line, prints help or the config when
// asked, and turns a config_error into a message on stderr and exit status 2.
template <class Body>
int run_main(int argc, const char* const* argv, cli& parser, Body&& body) {
  command_line parsed;
  try {
    parsed = parser.parse(argc, argv);
  } catch (const config_error& e) {
    std::cerr << e.what() << "\n";
    return config_error_exit_code;
  }
  if (parsed.action != command_action::run) {
    std::cout << parsed.text;
    return 0;
  }
  try {
    return std::forward<Body>(body)(std::as_const(parsed.config));
  } catch (const config_error& e) {
    std::cerr << e.what() << "\n";
    return config_error_exit_code;
  }
}

}  // namespace strata::config
