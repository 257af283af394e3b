# The pinned ONNX Runtime C API headers (1.29.0, ORT_API_VERSION 29), downloaded at configure
# time when AITUNE_ORT_ROOT holds none, so that a fresh clone builds with a plain
# `pip install .` (README, Install). The same npm tarball, sha256 and download cache as
# scripts/fetch-onnxruntime.sh (which scripts/setup.sh runs, and which needs npm; this needs
# only CMake). The headers go into the build tree, never into the source tree.

set(AITUNE_ORT_HEADERS_URL
    "https://registry.npmjs.org/com.github.asus4.onnxruntime/-/com.github.asus4.onnxruntime-0.4.9.tgz"
    CACHE STRING "Where the pinned ONNX Runtime headers' npm tarball is downloaded from (sha256-checked)")
set(AITUNE_ORT_HEADERS_SHA256 "e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d")
set(AITUNE_ORT_HEADERS_IN_TARBALL "package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers")

# Sets ${out_root} to a folder whose include/ holds the pinned headers, downloading the
# tarball into the download cache first where it is missing or its sha256 differs.
function(aitune_fetch_ort_headers out_root)
  if(DEFINED ENV{AITUNE_DOWNLOAD_CACHE} AND NOT "$ENV{AITUNE_DOWNLOAD_CACHE}" STREQUAL "")
    set(cache "$ENV{AITUNE_DOWNLOAD_CACHE}")
  elseif(DEFINED ENV{HOME})
    set(cache "$ENV{HOME}/.cache/aitune/downloads")
  else()
    set(cache "${CMAKE_BINARY_DIR}/_downloads")
  endif()
  set(tgz "${cache}/com.github.asus4.onnxruntime-0.4.9.tgz")
  if(EXISTS "${tgz}")
    file(SHA256 "${tgz}" actual)
    if(NOT actual STREQUAL AITUNE_ORT_HEADERS_SHA256)
      message(STATUS "aitune: ${tgz} has sha256 ${actual}, not the pinned one; downloading it again")
      file(REMOVE "${tgz}")
    endif()
  endif()
  if(NOT EXISTS "${tgz}")
    message(STATUS "aitune: downloading the pinned ONNX Runtime 1.29.0 headers (${AITUNE_ORT_HEADERS_URL})")
    file(MAKE_DIRECTORY "${cache}")
    # Into a .part file first: an interrupted or refused download leaves no tarball behind
    # that a later configure would take for the real one.
    file(DOWNLOAD "${AITUNE_ORT_HEADERS_URL}" "${tgz}.part" STATUS status TLS_VERIFY ON)
    list(GET status 0 code)
    if(code EQUAL 0)
      file(SHA256 "${tgz}.part" actual)
    endif()
    if(NOT code EQUAL 0 OR NOT actual STREQUAL AITUNE_ORT_HEADERS_SHA256)
      file(REMOVE "${tgz}.part")
      if(NOT code EQUAL 0)
        list(GET status 1 reason)
        set(reason "the download failed: ${reason}")
      else()
        set(reason "its sha256 is ${actual}, expected ${AITUNE_ORT_HEADERS_SHA256}")
      endif()
      message(FATAL_ERROR "aitune: could not get the ONNX Runtime headers from ${AITUNE_ORT_HEADERS_URL}: "
                          "${reason}. Run scripts/fetch-onnxruntime.sh, or point AITUNE_ORT_ROOT at a folder "
                          "whose include/ holds onnxruntime_cxx_api.h")
    endif()
    file(RENAME "${tgz}.part" "${tgz}")
  endif()
  set(root "${CMAKE_BINARY_DIR}/_deps/onnxruntime")
  set(staging "${CMAKE_BINARY_DIR}/_deps/onnxruntime-staging")
  file(REMOVE_RECURSE "${root}" "${staging}")
  file(ARCHIVE_EXTRACT INPUT "${tgz}" DESTINATION "${staging}" PATTERNS "${AITUNE_ORT_HEADERS_IN_TARBALL}/*.h")
  file(GLOB headers "${staging}/${AITUNE_ORT_HEADERS_IN_TARBALL}/*.h")
  file(COPY ${headers} DESTINATION "${root}/include")
  file(REMOVE_RECURSE "${staging}")
  if(NOT EXISTS "${root}/include/onnxruntime_cxx_api.h")
    message(FATAL_ERROR "aitune: ${tgz} holds no ${AITUNE_ORT_HEADERS_IN_TARBALL}/onnxruntime_cxx_api.h")
  endif()
  message(STATUS "aitune: ONNX Runtime 1.29.0 headers in ${root}/include")
  set(${out_root} "${root}" PARENT_SCOPE)
endfunction()
