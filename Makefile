# Two commands do everything: `make test` and `make demo` (`make docs` builds the documentation).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint docs bench fuzz demo clean agentdojo

# uv installs the dependencies (about ten times faster than pip: a clean `make test` spends
# seconds, not minutes, setting up its two environments); pip only installs uv itself.
UV := $(BIN)/uv

# pip is used once, to install uv: it is not upgraded first (seconds of a clean setup for nothing).
$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv

$(STAMP): $(BIN)/python pyproject.toml
	$(UV) pip install --quiet --python $(BIN)/python -e '.[dev,sqlite,postgres]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check fencepost tests benchmarks
	$(BIN)/ruff format --check fencepost tests benchmarks
	$(BIN)/mypy --strict fencepost

# The AgentDojo harness runs in a virtual environment of its own (agentdojo pins its own
# dependencies): make test builds it, since its smoke test runs in it; a failed build fails.
ADJ_VENV := benchmarks/agentdojo/.venv
ADJ_STAMP := $(ADJ_VENV)/.installed

$(ADJ_STAMP): $(BIN)/python pyproject.toml benchmarks/agentdojo/requirements.txt
	rm -rf $(ADJ_VENV)
	$(PY) -m venv --without-pip $(ADJ_VENV)
	$(UV) pip install --quiet --python $(ADJ_VENV)/bin/python -r benchmarks/agentdojo/requirements.txt -e .
	touch $(ADJ_STAMP)

# The documentation and the API reference from the docstrings; --strict fails on any warning
# (a broken link, a reference to a name that is gone).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Lint, the docs and the harness environment are built side by side (mypy, mkdocs and uv each use
# one core), each one's output kept together; any failure stops make test before the suite runs.
# The tests marked serial (a race whose fairness depends on its processes being scheduled) run
# first, alone; then the rest in two pytest-xdist workers, one a core, a module at a time
# (--dist loadfile: a module's tests and its module-scoped fixtures, such as a pool of racing
# processes, stay in one worker). Each worker has its own fork server and temporary directory;
# Postgres tests each work in a schema of their own. More workers than cores would only add
# load: the races start processes of their own.
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 --output-sync=target lint docs $(ADJ_STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/pytest -q -m serial
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/pytest -q -n 2 --dist loadfile -m "not serial" --durations=25

# All four AgentDojo suites under every policy, offline; writes benchmarks/agentdojo.md.
agentdojo: $(ADJ_STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(ADJ_VENV)/bin/python -m benchmarks.agentdojo --out benchmarks/agentdojo.md

bench: $(STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/python benchmarks/bench.py

# The fuzz suite over the real graph at 10,000 examples (`make test` runs it at 2,000).
fuzz: $(STAMP)
	FENCEPOST_FUZZ_EXAMPLES=10000 LANGGRAPH_STRICT_MSGPACK=true $(BIN)/pytest -q tests/fuzz

# Runs every demo scenario through the real graph into .fencepost/runs.db, then prints the table.
demo: $(STAMP)
	LANGGRAPH_STRICT_MSGPACK=true $(BIN)/fencepost demo

clean:
	rm -rf $(VENV) $(ADJ_VENV) .pytest_cache .mypy_cache .ruff_cache build/site
