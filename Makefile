# Two commands on a fresh machine: `make demo` and `make test`. Each builds what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Rebuilt whenever pyproject.toml changes.
READY  := $(VENV)/.ready

.PHONY: demo test unit integration browser terminal backends lint docs bench clean

$(READY): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(READY)  ## the main job: a simulated agent-loop step, traced, ending with the report of its own run
	$(BIN)/python examples/agent_loop.py

test: $(READY)  ## unit tests (every claimed Python, and the oldest dependencies), the doc blocks, integration tests against each RL-Insight release, the HTML report in chromium, watch in tmux, Phoenix and MLflow, tests on real verl (nox)
	$(BIN)/nox -s unit unit_oldest doc_blocks integration browser terminal backends verl   # backends builds the Phoenix tests/verl start

unit: $(READY)
	$(BIN)/nox -s unit

integration: $(READY)
	$(BIN)/nox -s integration

browser: $(READY)  ## the HTML report rendered by headless chromium (installed with apt-get when missing)
	$(BIN)/nox -s browser

terminal: $(READY)  ## verl-otel-bridge watch in a real terminal, tmux (installed with apt-get when missing)
	$(BIN)/nox -s terminal

backends: $(READY)  ## exporter otlp read back through real Phoenix and MLflow servers (needs root: unshare -n)
	$(BIN)/nox -s backends

lint: $(READY)  ## ruff (lint + format check), mypy --strict, and the import contracts (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

docs: $(READY)  ## the documentation site, built strictly into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(READY)  ## benchmarks against bare OpenTelemetry and verl's direct RL-Insight calls, and the plugin inside real verl
	$(BIN)/nox -s bench
	$(BIN)/nox -s verl -- bench
	$(BIN)/nox -s verl -- bench-trainer
	$(BIN)/nox -s verl -- bench-captures

clean:
	rm -rf $(VENV) .nox .pytest_cache site
