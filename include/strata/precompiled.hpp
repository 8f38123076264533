// SPDX-License-Identifier: Apache-2.0
#pragma once

// A header to precompile in a program that trains with strata: the standard library, Eigen,
// nlohmann/json, toml++, CLI11 and the headers of strata a trainer program includes, parsed once
// rather than in every translation unit and on every rebuild (about a fifth of a one-trainer
// translation unit's compile; docs/development.md). With CMake:
//
//   target_precompile_headers(my_trainer PRIVATE <strata/precompiled.hpp>)
//   target_precompile_headers(my_other_trainer REUSE_FROM my_trainer)   // same flags
//
// Where STRATA_HAVE_MPI is defined (a target that links strata::mpi) it includes the MPI
// backend too; a program's translation units then all need the same definitions.

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/strata.hpp"
#include "strata/train/configured.hpp"
#include "strata/train/gradient_fault.hpp"
#include "strata/train/trainer.hpp"
