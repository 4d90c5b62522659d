# The two set-up commands of the README, and the benchmark.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

# Start the bundled demo API on loopback, materialize every asset into data/fieldsales.duckdb,
# print a summary of the tables written.
demo: install
	$(BIN)/fieldsales-demo-run

# Install the test dependencies and run the whole suite (what .ci/run calls).
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pytest

# Floor vs this project vs dlt on the same demo data (not part of the test suite).
bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)
