# SPDX-License-Identifier: Apache-2.0
# Which build targets the tests of each ctest label need, so that `scripts/test <label>` builds
# only those: a family (batch, comm, config, core, data, model, optim, parallel, precision,
# train) or a kind (unit, static, fail, mpi, example, install, docs, cuda).

# strata_label_targets(LABELS <label>... TARGETS <target>...): the tests labelled <label> run
# <target>s (TARGETS may be empty: the tests build what they need themselves).
function(strata_label_targets)
  cmake_parse_arguments(arg "" "" "LABELS;TARGETS" ${ARGN})
  foreach(_label IN LISTS arg_LABELS)
    set_property(GLOBAL APPEND PROPERTY STRATA_TEST_LABELS ${_label})
    set_property(GLOBAL APPEND PROPERTY STRATA_TEST_TARGETS_${_label} ${arg_TARGETS})
  endforeach()
endfunction()

# Called once every test is declared: one custom target test_deps_<label> per label.
function(strata_add_label_targets)
  get_property(_labels GLOBAL PROPERTY STRATA_TEST_LABELS)
  list(REMOVE_DUPLICATES _labels)
  foreach(_label IN LISTS _labels)
    get_property(_targets GLOBAL PROPERTY STRATA_TEST_TARGETS_${_label})
    add_custom_target(test_deps_${_label})
    if(_targets)
      list(REMOVE_DUPLICATES _targets)
      add_dependencies(test_deps_${_label} ${_targets})
    endif()
  endforeach()
endfunction()
