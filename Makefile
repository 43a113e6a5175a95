# The two commands of the README:
#   make demo   installs what is missing, builds, runs `mha demo`
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
JOBS ?= 2
# Debian's Python: it has numpy, pytest and torch (the PATH python3 may not).
PYTHON ?= /usr/bin/python3

.PHONY: deps build demo test test-cpp test-python clean

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PYTHON)
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	./$(BUILD)/mha demo

test: build
	$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

test-python:
	MHA_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(CURDIR)/$(BUILD)/python \
	  $(PYTHON) -m pytest -q tests/python

clean:
	rm -rf $(BUILD)
