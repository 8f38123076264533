// SPDX-License-Identifier: Apache-2.0
#pragma once

// The config family: train_config, its TOML reader, command line and validation.

#include "strata/config/command_line.hpp"
#include "strata/config/suggest.hpp"
#include "strata/config/toml_reader.hpp"
#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
