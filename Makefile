# Two commands do everything: `make test` and `make demo` (`make docs` builds the documentation).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint docs bench fuzz demo clean

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

# The documentation and the API reference from the docstrings; --strict fails on any warning
# (a broken link, a reference to a name that is gone).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint docs
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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/site
