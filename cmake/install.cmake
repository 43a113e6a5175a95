# cmake/install.cmake: `cmake --install` puts the library, every public header
# under include/mha/, the `mha` tool, a CMake package (mha::mha, with a version
# file) and a pkg-config file under the prefix. Included at the end of the top
# CMakeLists.txt, once every target exists.
#
#   find_package(mha 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE mha::mha)
#   target_link_libraries(app PRIVATE mha::plot)   # mha/plot.h: heatmaps, charts (cairo)
#   find_package(mha 0.1 REQUIRED COMPONENTS dist)  # when built with MPI:
#   target_link_libraries(app PRIVATE mha::dist)   # mha/dist.h, multi-process attention
#
# The package's config finds OpenBLAS and OpenMP itself (cmake/mhaConfig.cmake.in),
# so a user of the static library never names them; mha::plot also finds cairo
# through pkg-config.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MHA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mha CACHE STRING
    "Where the CMake package files go, relative to the prefix")

install(TARGETS mha mha_plot EXPORT mhaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Every header in include/mha/ is public, including the ones added later.
install(DIRECTORY include/mha DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/include/mha/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mha)

if(TARGET mha_tool)
  # A shared libmha sits in ../lib beside bin/mha.
  set_target_properties(mha_tool PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS mha_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT mhaTargets NAMESPACE mha:: FILE mhaTargets.cmake
  DESTINATION ${MHA_INSTALL_CMAKEDIR})

# mha::dist (MPI) in an export set of its own, so that mha::mha's users need
# no MPI: the package's config loads it when MPI is found (component "dist").
if(TARGET mha_dist)
  set_target_properties(mha_dist PROPERTIES EXPORT_NAME dist)
  install(TARGETS mha_dist EXPORT mhaDistTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT mhaDistTargets NAMESPACE mha:: FILE mhaDistTargets.cmake
    DESTINATION ${MHA_INSTALL_CMAKEDIR})
endif()
configure_package_config_file(cmake/mhaConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/mhaConfig.cmake
  INSTALL_DESTINATION ${MHA_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so 0.1 accepts only 0.1.z.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mhaConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/mhaConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/mhaConfigVersion.cmake
  DESTINATION ${MHA_INSTALL_CMAKEDIR})

# pkg-config: a static libmha needs its dependencies on the user's link line,
# a shared one carries them itself.
get_target_property(MHA_LIBRARY_TYPE mha TYPE)
if(MHA_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  set(MHA_PC_REQUIRES "openblas")
  set(MHA_PC_REQUIRES_PRIVATE "")
  set(MHA_PC_LIBS_EXTRA "${OpenMP_CXX_FLAGS}")
else()
  set(MHA_PC_REQUIRES "")
  set(MHA_PC_REQUIRES_PRIVATE "openblas")
  set(MHA_PC_LIBS_EXTRA "")
endif()
configure_file(cmake/mha.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mha.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mha.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
