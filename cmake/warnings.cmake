# cmake/warnings.cmake: the one place that sets mha's compiler warnings.
#
#   mha_warnings(<target>)
#
# Every target mha builds calls it: the layer libraries, mha_plot, the tool
# and its library, the Python module, the C++ tests and the fuzzers. With
# -DMHA_WERROR=ON (set by `make test`, hence by CI: .ci/run) a warning fails
# the build; a user's plain build only prints it.
option(MHA_WERROR "Treat compiler warnings as errors (make test and CI turn it on)" OFF)

set(MHA_WARNING_FLAGS -Wall -Wextra -Wpedantic)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  # GCC 12 reports -Wrestrict inside libstdc++'s std::string for
  # `"literal" + std::string` (tests/cpp/test_decode.cpp): a false positive
  # of GCC 12's optimiser, gone in GCC 13.
  list(APPEND MHA_WARNING_FLAGS -Wno-restrict)
endif()
if(MHA_WERROR)
  list(APPEND MHA_WARNING_FLAGS -Werror)
endif()

function(mha_warnings target)
  target_compile_options(${target} PRIVATE ${MHA_WARNING_FLAGS})
endfunction()
