# The two commands of the README:
#   make demo   installs what is missing, builds, runs `mha demo`
#   make test   installs what is missing, builds (warnings are errors), runs
#               every test: the C++ and Python tests, the install checks, the
#               API reference, the sanitizer builds (build-asan, build-tsan)
#               and the fuzzers
# and the parts of `make test`, each runnable alone:
#   make docs          API reference -> build/docs/html (warnings fail)
#   make test-install  cmake --install + examples/consumer + pkg-config; pip install into a venv
#   make test-asan     C++ tests under ASan + UBSan + LSan (clang, build-asan)
#   make test-tsan     C++ tests under TSan (clang + libomp's Archer, build-tsan)
#   make test-fuzz     each fuzzer for FUZZ_SECONDS on the seed corpus (build-asan)
#   make lint          every writer uses write_file_atomic; every error is in docs/errors.md
BUILD ?= build
JOBS ?= 2
# The two torch lines the Python tests run on: Debian's Python with Debian's
# torch 1.13 and numpy 1.24, and a virtual environment of the PATH python3
# with torch 2.13 and numpy 2 (requirements/torch2.txt, made by
# scripts/python-env.sh). One extension serves both (CPython 3.11's ABI),
# built with the environment's pybind11 (numpy 2 needs >= 2.12).
PYTHON ?= /usr/bin/python3
VENV ?= build-venv
PYTHON2 = $(VENV)/bin/python
PYBIND11_DIR = $$($(PYTHON2) -m pybind11 --cmakedir)
FUZZ_SECONDS ?= 30
# Compiler warnings as errors (CMake's MHA_WERROR, cmake/warnings.cmake): `make
# test`, hence CI (.ci/run), turns it ON; `make demo` and `make build` leave the
# build folder's setting as it is (OFF unless set). `make test WERROR=OFF` opts out.
WERROR ?=
CMAKE_WERROR = $(if $(WERROR),-DMHA_WERROR=$(WERROR))


.PHONY: test-lane-main test-lane-asan
.PHONY: deps build demo test test-cpp test-python test-python-torch1 test-python-torch2 clean docs test-install test-asan test-tsan test-fuzz lint

deps:
	@bash scripts/install-deps.sh
	@bash scripts/python-env.sh $(VENV)

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$(PYBIND11_DIR) $(CMAKE_WERROR)
	cmake --build $(BUILD) -j$(JOBS)

# The demo builds only what it runs (the tool) and the Python module the
# README uses next, not the test suite (`make test` builds that).
demo: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$(PYBIND11_DIR)
	cmake --build $(BUILD) -j$(JOBS) --target mha_tool mha_python
	./$(BUILD)/mha demo

# After the build, `make test` runs its parts in two lanes at once: the
# cores idle during much of each test run (single-threaded Python tests,
# sanitizer runtimes), and the other lane's builds fill them. The ASan lane
# (its build, its run, the fuzzers) is the longest part alone, so the rest
# is the other lane. Each part's output is printed whole when it ends.
# Measured on the 2-core machine from a clean clone: the build ~500 s (with
# the torch 2.x environment), C++ tests ~110 s, both Python lines ~230 s,
# install checks ~300 s, docs ~10 s, ASan build ~430 s and run ~850 s,
# fuzzers ~40 s, TSan build ~230 s and run ~260 s: one after another 50 min,
# in these two lanes 39 min (2361 s).
test: WERROR = ON
test: build
	$(MAKE) --no-print-directory -j2 --output-sync=target test-lane-main test-lane-asan

# The lanes call the parts' commands without their `build`/`deps` steps (done
# above), so that neither reconfigures the build folder the other reads.
test-lane-main:
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory lint
	cmake --build $(BUILD) --target docs
	JOBS=$(JOBS) scripts/check-install.sh $(BUILD)
	JOBS=$(JOBS) scripts/check-python-install.sh
	JOBS=$(JOBS) scripts/test-sanitizers.sh tsan

test-lane-asan:
	JOBS=$(JOBS) scripts/test-sanitizers.sh asan
	JOBS=$(JOBS) scripts/fuzz.sh $(FUZZ_SECONDS)

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# Every Python test on both torch lines, the two at once (most Python tests
# run on one core; each line's output is printed whole when it ends).
test-python:
	$(MAKE) --no-print-directory -j2 --output-sync=target test-python-torch1 test-python-torch2

test-python-torch1:
	MHA_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(CURDIR)/$(BUILD)/python \
	  $(PYTHON) -m pytest -q tests/python

test-python-torch2:
	MHA_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(CURDIR)/$(BUILD)/python \
	  $(PYTHON2) -m pytest -q tests/python

docs: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$(PYBIND11_DIR) > /dev/null
	cmake --build $(BUILD) --target docs

test-install: build
	JOBS=$(JOBS) scripts/check-install.sh $(BUILD)
	JOBS=$(JOBS) scripts/check-python-install.sh

test-asan: deps
	JOBS=$(JOBS) scripts/test-sanitizers.sh asan

test-tsan: deps
	JOBS=$(JOBS) scripts/test-sanitizers.sh tsan

test-fuzz: deps
	JOBS=$(JOBS) scripts/fuzz.sh $(FUZZ_SECONDS)

lint:
	$(PYTHON) scripts/check-atomic-writes.py
	$(PYTHON) scripts/check-error-catalogue.py

clean:
	rm -rf $(BUILD) build-asan build-tsan build-python $(VENV)
