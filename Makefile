# Two commands on a fresh machine: `make demo` and `make test`. Each builds what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Rebuilt whenever pyproject.toml changes.
READY  := $(VENV)/.ready

.PHONY: demo test unit integration bench lint docs clean

$(READY): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(READY)  ## the main job: a simulated agent loop, traced, printed as a span tree
	$(BIN)/python examples/agent_loop.py

test: $(READY)  ## unit tests, then integration tests against each RL-Insight release
	$(BIN)/nox --no-error-on-missing-interpreters -s unit integration

unit: $(READY)
	$(BIN)/nox -s unit

integration: $(READY)
	$(BIN)/nox -s integration

clean:
	rm -rf $(VENV) .nox .pytest_cache
