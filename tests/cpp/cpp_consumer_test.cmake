# CTest driver (cmake -P) for examples/cpp_consumer: installs this build tree's C++
# package into a fresh prefix, configures and builds the example against it alone
# (find_package(aitune CONFIG)), saves a checkpoint of a fixture model with
# make_test_checkpoint, runs the example on it and compares its output with numpy's.
# ONNX Runtime comes from the library compiled into the package (ORT_LIBRARY, the CMake
# option AITUNE_ORT_LIBRARY), then from AITUNE_ORT_LIBRARY in the environment.
# Needs: BUILD_DIR SOURCE_DIR WORK_DIR MODELS_DIR MAKE_CHECKPOINT GENERATOR MAKE_PROGRAM
#        CXX_COMPILER PYTHON ORT_LIBRARY
cmake_minimum_required(VERSION 3.22)

# Runs a command; fails the test with its output unless it exits 0. Sets step_output.
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cpp_consumer_example: ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

function(expect_output regex)
  if(NOT step_output MATCHES "${regex}")
    message(FATAL_ERROR "cpp_consumer_example: output does not match '${regex}':\n${step_output}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
step(install ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" --component aitune_cpp)
foreach(f include/aitune/checkpoint.hpp include/aitune/deps/dlpack/dlpack.h lib/libaitune_core.a
          lib/cmake/aitune/aituneConfig.cmake)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "cpp_consumer_example: the install lacks ${f}")
  endif()
endforeach()
# The package must not point back into the source or build tree.
file(GLOB package_files "${prefix}/lib/cmake/aitune/*.cmake")
foreach(f ${package_files})
  file(READ "${f}" text)
  foreach(tree "${SOURCE_DIR}/include" "${SOURCE_DIR}/src" "${BUILD_DIR}/src")
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "cpp_consumer_example: ${f} refers to ${tree}")
    endif()
  endforeach()
endforeach()

step(configure ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/cpp_consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
     -DCMAKE_BUILD_TYPE=Release)
step(build ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
set(example "${WORK_DIR}/build/cpp_consumer")

step(make_checkpoint "${MAKE_CHECKPOINT}" "${WORK_DIR}/ckpt" "${MODELS_DIR}/mlp_ext.onnx" mlp)
expect_output("graph mlp, 2 artifacts")  # the model and its external data

if(EXISTS "${prefix}/lib/libonnxruntime.so.1")
  message(FATAL_ERROR "cpp_consumer_example: the install carries an ONNX Runtime; it comes from the wheel")
endif()
file(READ "${prefix}/lib/cmake/aitune/aituneConfig.cmake" config_text)
if(NOT config_text MATCHES "set\\(aitune_ORT_LIBRARY \"([^\"]*)\"\\)" OR NOT CMAKE_MATCH_1 STREQUAL ORT_LIBRARY)
  message(FATAL_ERROR "cpp_consumer_example: aituneConfig.cmake should name the default ONNX Runtime ${ORT_LIBRARY}")
endif()

# ONNX Runtime from the library compiled in (the CMake option), not from the environment.
unset(ENV{AITUNE_ORT_LIBRARY})
step(run_inputs "${example}" "${WORK_DIR}/ckpt" --iterations 5 --input "x=${MODELS_DIR}/mlp_x.npy"
     --save-outputs "${WORK_DIR}/out")
message("${step_output}")
expect_output("module 'make_test_checkpoint', format version 2")
expect_output("graph mlp on cpu")
get_filename_component(ort_real "${ORT_LIBRARY}" REALPATH)
expect_output("ONNX Runtime [0-9.]+ loaded from ${ort_real}\n")  # the compiled-in default
expect_output("input x: float32\\[3, 64\\] from file")
expect_output("5 inferences after a first call of [0-9.e+-]+ us, mean ")  # the cold call apart
expect_output("output y: float32\\[3, 16\\] min")
# (Python code without ';': step() passes its arguments on as a CMake list.)
step(compare "${PYTHON}" -c "import sys, numpy as np\na, b = np.load(sys.argv[1]), np.load(sys.argv[2])\n\
if a.shape != b.shape or not np.allclose(a, b, atol=1e-5): sys.exit(f'output differs from numpy: {a} vs {b}')\n\
print('max abs difference', abs(a - b).max())"
     "${WORK_DIR}/out/y.npy" "${MODELS_DIR}/mlp_y.npy")
expect_output("max abs difference")

# AITUNE_ORT_LIBRARY (here a copy of the same library elsewhere) goes before the default.
file(MAKE_DIRECTORY "${WORK_DIR}/ort")
file(COPY_FILE "${ort_real}" "${WORK_DIR}/ort/libonnxruntime.so.1")
set(ENV{AITUNE_ORT_LIBRARY} "${WORK_DIR}/ort/libonnxruntime.so.1")
step(run_zeros "${example}" "${WORK_DIR}/ckpt" --iterations 2)
unset(ENV{AITUNE_ORT_LIBRARY})
expect_output("loaded from ${WORK_DIR}/ort/libonnxruntime.so.1\n")
expect_output("input x: float32\\[1, 64\\] zeros")  # the saved spec's smallest batch
expect_output("output y: float32\\[1, 16\\]")

# A misspelt --input name is refused naming the inputs (it was ignored: zeros, exit 0).
execute_process(COMMAND "${example}" "${WORK_DIR}/ckpt" --input "xx=${MODELS_DIR}/mlp_x.npy"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0 OR NOT out MATCHES "unknown input 'xx'; graph mlp takes: x")
  message(FATAL_ERROR "cpp_consumer_example: a misspelt --input gave exit ${rc}:\n${out}")
endif()
message(STATUS "misspelt input refused: ok")

# The same --input name twice is refused (the last file was used, silently).
execute_process(COMMAND "${example}" "${WORK_DIR}/ckpt" --input "x=${MODELS_DIR}/mlp_x.npy"
                --input "x=${MODELS_DIR}/mlp_y.npy" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0 OR NOT out MATCHES "--input names 'x' twice")
  message(FATAL_ERROR "cpp_consumer_example: a repeated --input gave exit ${rc}:\n${out}")
endif()
message(STATUS "repeated input refused: ok")

# Inputs not given are zeros at the batch of those given (they were zeros at the smallest
# batch: x of 3 rows plus y of 1, broadcast by Add, printed as if right, exit 0).
step(make_add_checkpoint "${MAKE_CHECKPOINT}" "${WORK_DIR}/add_ckpt" "${MODELS_DIR}/add.onnx" add)
step(write_x3 "${PYTHON}" -c "import sys, numpy as np\nnp.save(sys.argv[1], np.ones((3, 4), np.float32))"
     "${WORK_DIR}/x3.npy")
step(run_batch_of_given "${example}" "${WORK_DIR}/add_ckpt" --input "x=${WORK_DIR}/x3.npy")
expect_output("input y: float32\\[3, 4\\] zeros")
expect_output("output z: float32\\[3, 4\\]")
# --save-outputs that cannot be a directory is refused before any inference runs.
execute_process(COMMAND "${example}" "${WORK_DIR}/add_ckpt" --save-outputs "${WORK_DIR}/x3.npy/out"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "io: --save-outputs .* is not a directory" OR out MATCHES "inferences")
  message(FATAL_ERROR "cpp_consumer_example: --save-outputs under a file gave exit ${rc}:\n${out}")
endif()
message(STATUS "unwritable --save-outputs refused first: ok")

# A checkpoint with no graph (a front end's metadata alone) is named so (was a segfault:
# keys.front() of no keys).
step(no_graphs "${PYTHON}" -c "import json, shutil, sys\nshutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)\nm = json.load(open(sys.argv[2] + '/manifest.json'))\nm['graphs'] = []\njson.dump(m, open(sys.argv[2] + '/manifest.json', 'w'))"
     "${WORK_DIR}/add_ckpt" "${WORK_DIR}/no_graphs")
execute_process(COMMAND "${example}" "${WORK_DIR}/no_graphs" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "invalid_argument: checkpoint .*no_graphs' holds no graph to run")
  message(FATAL_ERROR "cpp_consumer_example: a checkpoint without graphs gave exit ${rc}:\n${out}")
endif()
message(STATUS "checkpoint without graphs named: ok")

# A damaged checkpoint is refused by the example too (exit 5, the file named).
step(corrupt "${PYTHON}" -c "import sys\nwith open(sys.argv[1], 'r+b') as f:\n    b = f.read(1)\n    f.seek(0)\n    f.write(bytes([b[0] ^ 1]))"
     "${WORK_DIR}/ckpt/graphs/mlp/mlp_ext.onnx.data")
execute_process(COMMAND "${example}" "${WORK_DIR}/ckpt" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 5 OR NOT out MATCHES "checkpoint_corrupt: .*mlp_ext.onnx.data.*sha256")
  message(FATAL_ERROR "cpp_consumer_example: a damaged checkpoint gave exit ${rc}:\n${out}")
endif()
message(STATUS "damaged checkpoint refused: ok")

# A number that is not one is a usage error naming the option (was "cpp_consumer: stoi").
foreach(bad "--iterations;abc" "--iterations;99999999999" "--device-id;x1")
  execute_process(COMMAND "${example}" "${WORK_DIR}/ckpt" ${bad} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  list(GET bad 0 option)
  if(NOT rc EQUAL 1 OR NOT out MATCHES "invalid_argument: ${option} ")
    message(FATAL_ERROR "cpp_consumer_example: '${bad}' gave exit ${rc}:\n${out}")
  endif()
endforeach()
message(STATUS "bad numbers refused: ok")
