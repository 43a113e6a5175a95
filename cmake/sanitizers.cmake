# cmake/sanitizers.cmake: builds of every target under sanitizers, and the
# libFuzzer targets. Included before any target is defined, so the flags
# reach the library, the tool and the tests alike. Used by
# scripts/test-sanitizers.sh (build-asan, build-tsan) and scripts/fuzz.sh.
#
#   -DMHA_SANITIZE=address,undefined   ASan + UBSan (any recoverable UB aborts)
#   -DMHA_SANITIZE=thread              TSan (use clang: its libomp has the
#                                      Archer annotations that make OpenMP
#                                      visible to TSan; GCC's libgomp has none)
#   -DMHA_BUILD_FUZZERS=ON             tests/fuzz targets (clang only)
set(MHA_SANITIZE "" CACHE STRING "Sanitizers for every target, e.g. address,undefined or thread")
option(MHA_BUILD_FUZZERS "Build the libFuzzer targets in tests/fuzz (clang)" OFF)

if(MHA_SANITIZE)
  add_compile_options(-fsanitize=${MHA_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${MHA_SANITIZE})
  if(MHA_SANITIZE MATCHES "undefined")
    # Report and stop at the first undefined behaviour, as a test must.
    add_compile_options(-fno-sanitize-recover=all)
  endif()
endif()

if(MHA_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MHA_BUILD_FUZZERS needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage instrumentation everywhere; only the fuzz targets link libFuzzer.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
