# Two commands do everything: `make test` and (with the command-line issue) `make demo`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint bench fuzz demo clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,sqlite,postgres]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check fencepost tests benchmarks
	$(BIN)/ruff format --check fencepost tests benchmarks
	$(BIN)/mypy --strict fencepost

test: lint
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/pytest -q

bench: $(STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/python benchmarks/bench.py

# The fuzz suite over the real graph at 10,000 examples (`make test` runs it at 2,000).
fuzz: $(STAMP)
	FENCEPOST_FUZZ_EXAMPLES=10000 LANGGRAPH_STRICT_MSGPACK=true $(BIN)/pytest -q tests/fuzz

# Runs every demo scenario through the real graph into .fencepost/runs.db, then prints the table.
demo: $(STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/fencepost demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
