# cmake/check_layers.cmake: fails when an include points up a layer.
#
#   cmake -DMHA_ROOT=<repository root> [-DMHA_STAMP=<file>] -P cmake/check_layers.cmake
#
# Reads the layer table (cmake/layers.cmake, beside this script), then every
# `#include "..."` line of every .h/.cpp under each layer's folders and of
# every public header in include/mha/, and places the included file in a
# layer:
#   "mha/<name>"          the public header's layer (MHA_LAYER_HEADERS_*);
#                         a public header in no list is an error
#   "<folder>/..."        the layer holding src/<folder> (e.g. "nn/padding.h")
#   "<name>" beside it    the layer of the file next to the includer
# Anything else (a system header written with quotes) is not mha's and is
# skipped. An include whose layer comes after the includer's in MHA_LAYERS
# is an error naming the file, the line, the include and both layers. The
# build runs this before compiling any layer (the target mha_layer_check);
# ctest runs cmake/test_check_layers.cmake, which plants upward includes in a
# copy of the tree and expects this to fail.
cmake_minimum_required(VERSION 3.20)
if(NOT MHA_ROOT)
  message(FATAL_ERROR "check_layers: pass -DMHA_ROOT=<repository root>")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/layers.cmake)

# layer index of a repository-relative path (under a layer folder), or -1.
function(_mha_layer_of_path rel out)
  set(best -1)
  set(best_len 0)
  set(i 0)
  foreach(layer IN LISTS MHA_LAYERS)
    foreach(dir IN LISTS MHA_LAYER_DIRS_${layer})
      string(LENGTH "${dir}/" n)
      string(SUBSTRING "${rel}" 0 ${n} head)
      if(head STREQUAL "${dir}/" AND n GREATER best_len)
        set(best ${i})
        set(best_len ${n})
      endif()
    endforeach()
    math(EXPR i "${i} + 1")
  endforeach()
  if(best EQUAL -1 AND rel MATCHES "^include/mha/(.+)$")
    _mha_layer_of_header("${CMAKE_MATCH_1}" best)
  endif()
  set(${out} ${best} PARENT_SCOPE)
endfunction()

# layer index of a public header "<name>" (as in "mha/<name>"), or -2 if in no list.
function(_mha_layer_of_header name out)
  set(i 0)
  foreach(layer IN LISTS MHA_LAYERS)
    if(name IN_LIST MHA_LAYER_HEADERS_${layer})
      set(${out} ${i} PARENT_SCOPE)
      return()
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} -2 PARENT_SCOPE)
endfunction()

set(files "")
foreach(layer IN LISTS MHA_LAYERS)
  foreach(dir IN LISTS MHA_LAYER_DIRS_${layer})
    file(GLOB_RECURSE found RELATIVE ${MHA_ROOT} ${MHA_ROOT}/${dir}/*.h ${MHA_ROOT}/${dir}/*.cpp)
    list(APPEND files ${found})
  endforeach()
endforeach()
file(GLOB_RECURSE found RELATIVE ${MHA_ROOT} ${MHA_ROOT}/include/mha/*.h)
list(APPEND files ${found})
list(SORT files)
list(REMOVE_DUPLICATES files)

set(problems "")
set(checked 0)
foreach(rel IN LISTS files)
  _mha_layer_of_path("${rel}" from)
  if(from EQUAL -2)
    list(APPEND problems "${rel}: a public header in no layer: add it to a MHA_LAYER_HEADERS_* list in cmake/layers.cmake")
    continue()
  endif()
  list(GET MHA_LAYERS ${from} from_name)
  get_filename_component(here ${rel} DIRECTORY)
  file(STRINGS ${MHA_ROOT}/${rel} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(inc "${CMAKE_MATCH_1}")
    math(EXPR checked "${checked} + 1")
    set(to -1)
    if(inc MATCHES "^mha/(.+)$")
      _mha_layer_of_header("${CMAKE_MATCH_1}" to)
      if(to EQUAL -2)
        list(APPEND problems "${rel}: #include \"${inc}\": a public header in no layer: add it to a MHA_LAYER_HEADERS_* list in cmake/layers.cmake")
        continue()
      endif()
    else()
      _mha_layer_of_path("src/${inc}" to)
      if(to EQUAL -1 AND EXISTS ${MHA_ROOT}/${here}/${inc})
        _mha_layer_of_path("${here}/${inc}" to)
      endif()
    endif()
    if(to GREATER from)
      list(GET MHA_LAYERS ${to} to_name)
      # The line number, for the message: newlines before the line, plus one.
      file(READ ${MHA_ROOT}/${rel} content)
      string(FIND "${content}" "${line}" pos)
      string(SUBSTRING "${content}" 0 ${pos} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines n)
      math(EXPR n "${n} + 1")
      list(APPEND problems
        "${rel}:${n}: #include \"${inc}\" points up, from layer ${from_name} to layer ${to_name}")
    endif()
  endforeach()
endforeach()

if(problems)
  list(JOIN problems "\n  " text)
  list(JOIN MHA_LAYERS " < " order)
  message(FATAL_ERROR "mha layer check: an include may point only into its own layer or a lower one "
    "(${order}; cmake/layers.cmake, docs/architecture.md \"Layers\"):\n  ${text}\n")
endif()
list(LENGTH files n_files)
if(MHA_STAMP)
  file(WRITE ${MHA_STAMP} "${n_files} files, ${checked} includes: every include points down or across\n")
endif()
