# SPDX-License-Identifier: Apache-2.0
# Checks that the C++ shown in README.md and docs/*.md is compiled code:
#   1. every ```cpp block has, on the line above it, a marker
#        <!-- snippet: path/to/file.cpp#name -->
#      naming a file of the repository (a test or an example that is compiled) and a region of it;
#   2. the block is, line for line, the region between `// snippet-begin: name` and
#      `// snippet-end: name` of that file, dedented by the begin marker's indentation;
#   3. a marker stands only above a ```cpp block, C++ is fenced as ```cpp (not c++, cxx, cc, cu,
#      cuda, hpp, cuh), and every fence is closed, so that no C++ block escapes 1 and 2.
# What is not C++ goes in other fences (```sh, ```toml, ```text for trees, output, sketches).
# Every failure names the doc and its line, and for a marker also the file and the region.
# Run: cmake -DSOURCE_DIR=... -P this file.
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)

# Sets out_var to the region `name` of `file` (relative to SOURCE_DIR), dedented. `where` (doc
# and line) and the marker go into the error when the file, the markers or the region are wrong.
function(strata_snippet_region where file name out_var)
  set(_marker "${where}: <!-- snippet: ${file}#${name} -->")
  if(NOT EXISTS "${SOURCE_DIR}/${file}" OR IS_DIRECTORY "${SOURCE_DIR}/${file}")
    message(FATAL_ERROR "${_marker}: the snippet source ${file} does not exist")
  endif()
  file(READ "${SOURCE_DIR}/${file}" _src)
  set(_begin_marker "// snippet-begin: ${name}\n")
  set(_end_marker "// snippet-end: ${name}\n")
  string(FIND "${_src}" "${_begin_marker}" _b)
  string(FIND "${_src}" "${_end_marker}" _e)
  if(_b EQUAL -1 OR _e EQUAL -1)
    message(FATAL_ERROR "${_marker}: ${file} has no region '${name}' (the lines "
      "'// snippet-begin: ${name}' and '// snippet-end: ${name}')")
  endif()
  # One region per name, begin before end.
  string(FIND "${_src}" "${_begin_marker}" _b_last REVERSE)
  string(FIND "${_src}" "${_end_marker}" _e_last REVERSE)
  if(NOT _b EQUAL _b_last OR NOT _e EQUAL _e_last)
    message(FATAL_ERROR "${_marker}: ${file} has more than one region '${name}'")
  endif()
  if(_e LESS _b)
    message(FATAL_ERROR "${_marker}: in ${file}, '// snippet-end: ${name}' comes before "
      "'// snippet-begin: ${name}'")
  endif()
  string(LENGTH "${_begin_marker}" _blen)
  math(EXPR _start "${_b} + ${_blen}")
  math(EXPR _n "${_e} - ${_start}")
  string(SUBSTRING "${_src}" ${_start} ${_n} _code)
  # A region inside a function is shown dedented: drop the end marker's indentation and the
  # begin marker's indentation from every line.
  string(REGEX REPLACE "[ ]+$" "" _code "${_code}")
  string(SUBSTRING "${_src}" 0 ${_start} _before)
  string(REGEX MATCH "([ ]*)// snippet-begin: ${name}\n$" _indent_line "${_before}")
  set(_indent "${CMAKE_MATCH_1}")
  if(NOT _indent STREQUAL "")
    # (CMake's ^ matches at every search position, so anchor on newlines only.)
    string(REPLACE "\n${_indent}" "\n" _code "\n${_code}")
    string(SUBSTRING "${_code}" 1 -1 _code)
  endif()
  set(${out_var} "${_code}" PARENT_SCOPE)
endfunction()

# Characters that a CMake list splits on or groups by stand in for themselves while a doc is
# walked line by line (as one list element per line), and are put back in the code of a block.
string(ASCII 1 _semicolon)
string(ASCII 2 _open_bracket)
string(ASCII 3 _close_bracket)
string(ASCII 4 _backslash)

file(GLOB _docs "${SOURCE_DIR}/README.md" "${SOURCE_DIR}/docs/*.md")
set(_checked 0)
foreach(_doc IN LISTS _docs)
  file(RELATIVE_PATH _doc_name "${SOURCE_DIR}" "${_doc}")
  file(READ "${_doc}" _text)
  string(REPLACE "\\" "${_backslash}" _text "${_text}")
  string(REPLACE ";" "${_semicolon}" _text "${_text}")
  string(REPLACE "[" "${_open_bracket}" _text "${_text}")
  string(REPLACE "]" "${_close_bracket}" _text "${_text}")
  string(REPLACE "\n" ";" _lines "${_text}")

  set(_line_no 0)
  set(_fence "")       # the open fence (``` or ~~~, as long as it was written); empty outside
  set(_fence_line 0)
  set(_mark_file "")   # the marker on the previous line, if any
  set(_mark_name "")
  set(_mark_line 0)
  set(_collect OFF)    # inside a marked ```cpp block: gather its lines into _block
  set(_block "")
  set(_unmarked 0)     # the line of an unmarked ```cpp block, reported with its first line
  foreach(_line IN LISTS _lines)
    math(EXPR _line_no "${_line_no} + 1")
    set(_shown "${_line}")
    string(REPLACE "${_backslash}" "\\" _shown "${_shown}")
    string(REPLACE "${_semicolon}" ";" _shown "${_shown}")
    string(REPLACE "${_open_bracket}" "[" _shown "${_shown}")
    string(REPLACE "${_close_bracket}" "]" _shown "${_shown}")
    if(NOT _unmarked EQUAL 0)
      message(FATAL_ERROR "${_doc_name}:${_unmarked}: a ```cpp block without a snippet marker "
        "(first line: '${_shown}'). Put the code between '// snippet-begin: name' and "
        "'// snippet-end: name' in a compiled test or example and write "
        "'<!-- snippet: path/to/file.cpp#name -->' on the line above the block; or, if it is "
        "not C++ (a sketch, output), use another fence (```text).")
    endif()

    if(NOT _fence STREQUAL "")
      # Inside a block: a line of the fence's character, at least as long, closes it.
      string(SUBSTRING "${_fence}" 0 1 _fence_char)
      if(_line MATCHES "^[ ]*(${_fence}[${_fence_char}]*)[ ]*$")
        if(_collect)
          strata_snippet_region("${_doc_name}:${_mark_line}" "${_mark_file}" "${_mark_name}"
            _code)
          if(NOT _code STREQUAL _block)
            message(FATAL_ERROR "${_doc_name}:${_fence_line}: the block differs from its "
              "snippet ${_mark_file}#${_mark_name}.\n"
              "--- in the doc ---\n${_block}--- in the source ---\n${_code}")
          endif()
          math(EXPR _checked "${_checked} + 1")
        endif()
        set(_fence "")
        set(_collect OFF)
        set(_mark_file "")
      elseif(_collect)
        string(APPEND _block "${_shown}\n")
      endif()
      continue()
    endif()

    if(_line MATCHES "^[ ]*(```+|~~~+)[ ]*([^ `]*)")
      # An opening fence; its language is the first word after it.
      set(_fence "${CMAKE_MATCH_1}")
      set(_language "${CMAKE_MATCH_2}")
      set(_fence_line ${_line_no})
      if(_language STREQUAL "cpp")
        if(_mark_file STREQUAL "")
          set(_unmarked ${_line_no})
        else()
          set(_collect ON)
          set(_block "")
        endif()
      elseif(_language MATCHES "^(c\\+\\+|C\\+\\+|cxx|cc|cu|cuda|hpp|cuh)$")
        message(FATAL_ERROR "${_doc_name}:${_line_no}: C++ is fenced as ```cpp (with a snippet "
          "marker above it), not ```${_language}")
      elseif(NOT _mark_file STREQUAL "")
        message(FATAL_ERROR "${_doc_name}:${_mark_line}: the snippet marker for "
          "${_mark_file}#${_mark_name} stands above a ```${_language} block, not a ```cpp block")
      endif()
    elseif(NOT _mark_file STREQUAL "")
      message(FATAL_ERROR "${_doc_name}:${_mark_line}: the snippet marker for "
        "${_mark_file}#${_mark_name} is not followed by a ```cpp block on the next line")
    elseif(_line MATCHES "^<!-- snippet: ([^ #]+)#([A-Za-z0-9_.-]+) -->$")
      set(_mark_file "${CMAKE_MATCH_1}")
      set(_mark_name "${CMAKE_MATCH_2}")
      set(_mark_line ${_line_no})
    elseif(_line MATCHES "^<!-- *snippet")
      message(FATAL_ERROR "${_doc_name}:${_line_no}: a snippet marker is written "
        "'<!-- snippet: path/to/file.cpp#name -->' alone on its line, not '${_shown}'")
    endif()
  endforeach()
  if(NOT _unmarked EQUAL 0)
    message(FATAL_ERROR "${_doc_name}:${_unmarked}: a ```cpp block without a snippet marker, "
      "at the end of the file")
  endif()
  if(NOT _fence STREQUAL "")
    message(FATAL_ERROR "${_doc_name}:${_fence_line}: the block opened here is never closed")
  endif()
  if(NOT _mark_file STREQUAL "")
    message(FATAL_ERROR "${_doc_name}:${_mark_line}: the snippet marker for "
      "${_mark_file}#${_mark_name} is not followed by a ```cpp block")
  endif()
endforeach()
if(_checked EQUAL 0)
  message(FATAL_ERROR "no snippets found in README.md or docs/: the README example must be one")
endif()
message(STATUS "${_checked} doc snippet(s) match their sources; every ```cpp block is one")
