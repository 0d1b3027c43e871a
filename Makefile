# Every target works on a fresh machine: the venv is created on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all demo test lint bench soak clean venv

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sn-monitor demo

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check sn_monitor tests bench examples
	$(BIN)/mypy

bench: $(STAMP)
	command -v prometheus-node-exporter >/dev/null || (apt-get install -y -q prometheus-node-exporter || echo "node_exporter not installed: comparison skipped")
	$(BIN)/python -m bench.agent_bench
	$(BIN)/python -m bench.controller_bench
	$(BIN)/python -m bench.recovery_bench
	$(BIN)/python -m bench.simulate_bench

soak: $(STAMP)
	$(BIN)/python -m bench.soak --progress

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
