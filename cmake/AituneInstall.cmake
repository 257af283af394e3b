# Install rules of the C++ package: libaitune_core.a as aitune::core with its public
# headers, DLPack's header (the public headers include it), the aitune executable, and a
# CMake package for `find_package(aitune CONFIG)`:
#   cmake --install BUILD --prefix PREFIX --component aitune_cpp
# In a wheel build (scikit-build-core sets SKBUILD) these rules are EXCLUDE_FROM_ALL, so
# the wheel holds only what python/src installs; they still run when the component is
# named, which is how tests/cpp installs the `make test` tree. Elsewhere a plain
# `cmake --install BUILD` installs them too. Everything goes to bin/, include/, lib/.
# ONNX Runtime is not installed: programs load it at run time (AITUNE_ORT_LIBRARY, or the
# library compiled in with the CMake option AITUNE_ORT_LIBRARY; see aitune/ort_runtime.hpp).
include(CMakePackageConfigHelpers)

set(aitune_install_exclude "")
if(SKBUILD)
  set(aitune_install_exclude EXCLUDE_FROM_ALL)
endif()
set(aitune_cmake_dir lib/cmake/aitune)

set_target_properties(aitune_core PROPERTIES EXPORT_NAME core)
install(TARGETS aitune_core EXPORT aituneTargets
        ARCHIVE DESTINATION lib COMPONENT aitune_cpp ${aitune_install_exclude}
        INCLUDES DESTINATION include include/aitune/deps)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/aitune" DESTINATION include
        COMPONENT aitune_cpp ${aitune_install_exclude} FILES_MATCHING PATTERN "*.hpp")
install(FILES "${AITUNE_DLPACK_INCLUDE}/dlpack/dlpack.h" DESTINATION include/aitune/deps/dlpack
        COMPONENT aitune_cpp ${aitune_install_exclude})
if(TARGET aitune)
  install(TARGETS aitune RUNTIME DESTINATION bin COMPONENT aitune_cpp ${aitune_install_exclude})
endif()

install(EXPORT aituneTargets NAMESPACE aitune:: FILE aituneTargets.cmake DESTINATION ${aitune_cmake_dir}
        COMPONENT aitune_cpp ${aitune_install_exclude})
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/aituneConfig.cmake.in"
                              "${CMAKE_CURRENT_BINARY_DIR}/aituneConfig.cmake"
                              INSTALL_DESTINATION ${aitune_cmake_dir})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/aituneConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/aituneConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/aituneConfigVersion.cmake"
        DESTINATION ${aitune_cmake_dir} COMPONENT aitune_cpp ${aitune_install_exclude})
