# The two set-up commands of the README, and the benchmark.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installs again only when pyproject.toml changed since the last install (a stamp in the venv).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

install: $(VENV)/.installed

# Start the bundled demo API on loopback, materialize every asset into the lake under data/,
# print a summary of the tables written.
demo: install
	$(BIN)/fieldsales-demo-run

# Install the test dependencies and run the whole suite (what .ci/run calls).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

# Two pytest processes (pytest-xdist): the suite's tests are independent (temporary folders,
# ephemeral ports), and two workers keep both cores busy while one waits on a subprocess.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# Floor vs this project vs dlt on the same demo data (not part of the test suite).
bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)
