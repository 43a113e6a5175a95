# Runs Doxygen and fails, printing every warning, if it warned at all.
# (WARN_AS_ERROR=FAIL_ON_WARNINGS already fails the run; the log is printed
# here because Doxygen writes warnings to the log file, not the terminal.)
execute_process(COMMAND ${DOXYGEN} ${DOXYFILE} RESULT_VARIABLE rc)
set(warnings "")
if(EXISTS ${LOG})
  file(READ ${LOG} warnings)
endif()
if(NOT rc EQUAL 0 OR NOT warnings STREQUAL "")
  message(FATAL_ERROR "docs: Doxygen warnings (every public entity needs a comment):\n${warnings}")
endif()
