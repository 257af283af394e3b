# aitune: `make demo` (the main job) and `make test` (every test) set up a fresh machine
# first (scripts/setup.sh: Debian packages, .venv with ONNX Runtime from PyPI (the CUDA
# wheel and a CUDA torch where nvidia-smi finds a GPU), the pinned ORT headers from npm).
PYTHON ?= .venv/bin/python
BUILD_DIR ?= build/py
PIP_BUILD = $(PYTHON) -m pip install --no-build-isolation --no-deps -q \
	-C build-dir=$(BUILD_DIR) -C cmake.define.AITUNE_BUILD_TESTS=ON -C cmake.define.AITUNE_BUILD_CLI=ON

.PHONY: setup build test test-cpp test-python demo clean

setup:
	scripts/setup.sh

# Builds the engine, CLI, extension and C++ tests in one CMake tree and installs the
# package into .venv (the console script `aitune` included).
build: setup
	$(PIP_BUILD) .

test-cpp: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure

# pytest-xdist: one worker per core, at most 4 (each holds torch and ONNX Runtime in its own
# process); a file's tests stay in one worker (--dist loadfile: module fixtures made once,
# the Ray tests of test_serve.py never beside each other). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

test-python: build
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15 tests/python

test: test-cpp test-python

demo: build
	PATH="$(abspath $(dir $(PYTHON))):$$PATH" scripts/demo.sh

clean:
	rm -rf build
