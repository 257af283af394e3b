# Finds the header-only dependencies (nlohmann/json, CLI11, DLPack), the ONNX Runtime
# headers fetched by scripts/fetch-onnxruntime.sh, the ONNX Runtime library compiled in as
# a default, and GoogleTest. scripts/setup.sh installs what a machine lacks; the one download
# here is the pinned ORT headers, where a fresh clone has none (cmake/AituneOrtHeaders.cmake).

find_package(Threads REQUIRED)

function(aitune_find_header var header package_hint)
  find_path(${var} ${header} HINTS ${AITUNE_DEPS_INCLUDE} /usr/include /usr/local/include)
  if(NOT ${var})
    message(FATAL_ERROR "aitune: ${header} not found; install ${package_hint} (scripts/setup.sh does) "
                        "or set AITUNE_DEPS_INCLUDE")
  endif()
endfunction()

aitune_find_header(AITUNE_JSON_INCLUDE nlohmann/json.hpp "nlohmann-json3-dev")
aitune_find_header(AITUNE_CLI11_INCLUDE CLI/CLI.hpp "libcli11-dev")
aitune_find_header(AITUNE_DLPACK_INCLUDE dlpack/dlpack.h "libdlpack-dev")

# The ONNX Runtime headers: AITUNE_ORT_ROOT/include (scripts/fetch-onnxruntime.sh fills the
# default one); where the default folder is empty (a fresh clone built by `pip install .`),
# the pinned headers are downloaded into the build tree (cmake/AituneOrtHeaders.cmake). A
# folder named by the user that lacks them is an error, not a reason to download.
option(AITUNE_FETCH_ORT_HEADERS "Download the pinned ONNX Runtime headers when the default AITUNE_ORT_ROOT has none" ON)
if(EXISTS "${AITUNE_ORT_ROOT}/include/onnxruntime_cxx_api.h")
  set(AITUNE_ORT_INCLUDE "${AITUNE_ORT_ROOT}/include")
elseif(AITUNE_FETCH_ORT_HEADERS AND AITUNE_ORT_ROOT STREQUAL "${PROJECT_SOURCE_DIR}/.deps/onnxruntime")
  include(AituneOrtHeaders)
  aitune_fetch_ort_headers(aitune_fetched_ort_root)
  set(AITUNE_ORT_INCLUDE "${aitune_fetched_ort_root}/include")
else()
  message(FATAL_ERROR "aitune: ONNX Runtime headers not found under ${AITUNE_ORT_ROOT}/include; "
                      "run scripts/fetch-onnxruntime.sh or set AITUNE_ORT_ROOT")
endif()

# Nothing links libonnxruntime: the engine loads it at run time (include/aitune/ort_runtime.hpp),
# from AITUNE_ORT_LIBRARY (environment), the Python environment's onnxruntime wheel, then
# this library compiled in (for programs without the Python front end: C++ consumers, the
# CLI executable, the C++ tests), then the system loader. Likewise the folders of the CUDA
# libraries that the GPU providers need. A build with tests takes both from the wheels of
# the Python that configures it (python/aitune/_ort_wheel.py) unless they are named.
set(AITUNE_ORT_LIBRARY "" CACHE FILEPATH
    "ONNX Runtime library (>= 1.29; the 1.31.1 wheel's onnxruntime/capi/libonnxruntime.so.1.31.1) compiled in as a default")
set(AITUNE_CUDA_LIBRARY_DIRS "" CACHE STRING
    "Folders (a CMake list) holding the CUDA 13 / cuDNN 9 libraries of the GPU providers, compiled in as a default")
set(AITUNE_DEFAULT_ORT_LIBRARY "${AITUNE_ORT_LIBRARY}")
set(AITUNE_DEFAULT_CUDA_LIBRARY_DIRS "${AITUNE_CUDA_LIBRARY_DIRS}")
if(AITUNE_BUILD_TESTS AND (NOT AITUNE_ORT_LIBRARY OR NOT AITUNE_CUDA_LIBRARY_DIRS))
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/python/aitune/_ort_wheel.py"
                  RESULT_VARIABLE aitune_wheel_rc OUTPUT_VARIABLE aitune_wheel_json ERROR_VARIABLE aitune_wheel_err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT aitune_wheel_rc EQUAL 0)
    message(FATAL_ERROR "aitune: python/aitune/_ort_wheel.py failed under ${Python3_EXECUTABLE}: ${aitune_wheel_err}")
  endif()
  if(NOT AITUNE_ORT_LIBRARY)
    string(JSON AITUNE_DEFAULT_ORT_LIBRARY GET "${aitune_wheel_json}" library)
  endif()
  if(NOT AITUNE_CUDA_LIBRARY_DIRS)
    string(JSON aitune_n LENGTH "${aitune_wheel_json}" cuda_library_dirs)
    if(aitune_n GREATER 0)
      math(EXPR aitune_last "${aitune_n} - 1")
      foreach(i RANGE ${aitune_last})
        string(JSON aitune_dir GET "${aitune_wheel_json}" cuda_library_dirs ${i})
        list(APPEND AITUNE_DEFAULT_CUDA_LIBRARY_DIRS "${aitune_dir}")
      endforeach()
    endif()
  endif()
  if(NOT AITUNE_DEFAULT_ORT_LIBRARY)
    message(WARNING "aitune: ${Python3_EXECUTABLE} has no onnxruntime wheel with libonnxruntime.so.1*; the C++ "
                    "tests will need AITUNE_ORT_LIBRARY (pip install onnxruntime==1.31.1, or scripts/setup.sh)")
  endif()
endif()
message(STATUS "aitune: ONNX Runtime library compiled in: ${AITUNE_DEFAULT_ORT_LIBRARY}")
message(STATUS "aitune: CUDA library folders compiled in: ${AITUNE_DEFAULT_CUDA_LIBRARY_DIRS}")

if(AITUNE_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    # Debian's libgtest-dev ships the sources; hosts that carry them name the dir.
    set(AITUNE_GTEST_SOURCE "/usr/src/googletest" CACHE PATH "GoogleTest source tree")
    if(NOT EXISTS "${AITUNE_GTEST_SOURCE}/CMakeLists.txt")
      message(FATAL_ERROR "aitune: GoogleTest not found; install libgtest-dev or set AITUNE_GTEST_SOURCE")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory(${AITUNE_GTEST_SOURCE} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()

# OpenSSL's libcrypto computes the sha256 of checkpoint artifacts (src/core/io/sha256.cpp).
# A host without libssl-dev (the GPU host) has neither the headers nor the unversioned
# libcrypto.so symlink that FindOpenSSL looks for: there the headers come from
# AITUNE_DEPS_INCLUDE (scripts/stage-gpu-build-deps.sh copies them; system headers win
# where both exist) and the library falls back to the runtime's libcrypto.so.3. Either
# can be named: -DOPENSSL_INCLUDE_DIR=DIR -DOPENSSL_CRYPTO_LIBRARY=/path/libcrypto.so.3
if(AITUNE_DEPS_INCLUDE)
  find_path(OPENSSL_INCLUDE_DIR NAMES openssl/ssl.h openssl/evp.h PATHS "${AITUNE_DEPS_INCLUDE}")
endif()
if(NOT OPENSSL_CRYPTO_LIBRARY)
  find_library(aitune_libcrypto_dev NAMES crypto NO_CACHE)
  if(NOT aitune_libcrypto_dev)
    find_library(OPENSSL_CRYPTO_LIBRARY NAMES libcrypto.so.3)
  endif()
endif()
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
