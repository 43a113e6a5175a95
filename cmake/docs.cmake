# cmake/docs.cmake: the `docs` target, the API reference from include/mha/ by
# Doxygen (Debian's doxygen). Any warning, including an undocumented public
# class, function, member or enum value, fails the target; the warnings are
# printed and kept in <build>/docs/warnings.log.
find_package(Doxygen)
if(DOXYGEN_FOUND)
  # The comment filter is a Python script; any Python 3 runs it.
  if(Python_EXECUTABLE)
    set(Python_EXECUTABLE_FOR_DOCS ${Python_EXECUTABLE})
  else()
    find_program(Python_EXECUTABLE_FOR_DOCS NAMES python3 REQUIRED)
  endif()
  configure_file(docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/docs
    COMMAND ${CMAKE_COMMAND} -E rm -f ${PROJECT_BINARY_DIR}/docs/warnings.log
    COMMAND ${CMAKE_COMMAND} -DDOXYGEN=${DOXYGEN_EXECUTABLE} -DDOXYFILE=${PROJECT_BINARY_DIR}/Doxyfile
            -DLOG=${PROJECT_BINARY_DIR}/docs/warnings.log -P ${PROJECT_SOURCE_DIR}/cmake/run_doxygen.cmake
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    COMMENT "API reference -> ${PROJECT_BINARY_DIR}/docs/html/index.html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "docs: doxygen was not found (Debian: apt-get install doxygen)"
    COMMAND ${CMAKE_COMMAND} -E false)
endif()
