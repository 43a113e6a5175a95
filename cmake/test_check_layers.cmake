# cmake/test_check_layers.cmake: the test of cmake/check_layers.cmake (ctest
# runs it as `layer_check`). The real tree passes; copies of it with an
# include planted that points up a layer fail, naming the file, the include
# and both layers; one planted downward include passes.
#
#   cmake -DMHA_SOURCE=<repository root> -DMHA_WORK=<scratch folder> -P cmake/test_check_layers.cmake
cmake_minimum_required(VERSION 3.20)
set(check ${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake)
set(failures "")

function(run_check root out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DMHA_ROOT=${root} -P ${check}
    RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  # The message is wrapped at spaces: compare with the lines joined.
  string(REGEX REPLACE "[ \t]*\n[ \t]*" " " text "${o}${e}")
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_text} "${text}" PARENT_SCOPE)
endfunction()

# name: a label; file: repository-relative file to plant `line` in (appended);
# expect: a regular expression the output must match, or PASS.
function(plant name file line expect)
  set(tree ${MHA_WORK}/${name})
  file(REMOVE_RECURSE ${tree})
  file(MAKE_DIRECTORY ${tree})
  file(COPY ${MHA_SOURCE}/src ${MHA_SOURCE}/include DESTINATION ${tree})
  file(APPEND ${tree}/${file} "${line}\n")
  run_check(${tree} rc text)
  if(expect STREQUAL "PASS")
    if(NOT rc EQUAL 0)
      set(failures "${failures}\n${name}: the check failed on an include that points down:\n${text}" PARENT_SCOPE)
    endif()
  elseif(rc EQUAL 0)
    set(failures "${failures}\n${name}: the check passed with ${file} including ${line}" PARENT_SCOPE)
  elseif(NOT text MATCHES "${expect}")
    set(failures "${failures}\n${name}: the message does not match '${expect}':\n${text}" PARENT_SCOPE)
  else()
    message(STATUS "${name}: fails as it should")
  endif()
  file(REMOVE_RECURSE ${tree})
endfunction()

run_check(${MHA_SOURCE} rc text)
if(NOT rc EQUAL 0)
  set(failures "${failures}\nthe real tree fails the check:\n${text}")
endif()

plant(cpu_to_nn src/cpu/dispatch.cpp "#include \"nn/attention_state.h\""
  "src/cpu/dispatch\\.cpp:[0-9]+: #include \"nn/attention_state\\.h\" points up, from layer cpu to layer nn")
# kernels/ is the interface; the CPU kernels implement it, never the other way.
plant(kernels_to_cpu src/kernels/validate.cpp "#include \"cpu/fused/limits.h\""
  "src/kernels/validate\\.cpp:[0-9]+: #include \"cpu/fused/limits\\.h\" points up, from layer kernels to layer cpu")
plant(core_to_train_public src/core/tensor.cpp "#include \"mha/model.h\""
  "src/core/tensor\\.cpp:[0-9]+: #include \"mha/model\\.h\" points up, from layer core to layer train")
plant(io_to_plot src/io/safetensors.cpp "#include \"plot/canvas.h\""
  "src/io/safetensors\\.cpp:[0-9]+: #include \"plot/canvas\\.h\" points up, from layer core to layer plot")
plant(public_header_up include/mha/tensor.h "#include \"mha/multihead.h\""
  "include/mha/tensor\\.h:[0-9]+: #include \"mha/multihead\\.h\" points up, from layer core to layer nn")
plant(unlisted_public_header src/nn/linear.cpp "#include \"mha/not_in_any_layer.h\""
  "src/nn/linear\\.cpp: #include \"mha/not_in_any_layer\\.h\": a public header in no layer")
plant(downward src/train/loss.cpp "#include \"core/memory.h\"" PASS)

if(failures)
  message(FATAL_ERROR "layer check test:${failures}")
endif()
message(STATUS "layer check test: the tree passes, every planted upward include fails")
