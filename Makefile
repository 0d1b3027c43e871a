# Every target works on a fresh machine: the venv is created on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The dependencies' wheels, for the tests that install the package offline into fresh venvs.
WHEELHOUSE := $(VENV)/wheelhouse
WHEELS := $(WHEELHOUSE)/.complete

.PHONY: all demo test e2e fuzz lint docs bench soak crash goodput clean venv wheelhouse examples \
	kubelet-proto

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip "setuptools>=77"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The examples' extra (torch, for examples/pytorch/, `make e2e` and the torchrun MTTR
# benchmark; the package itself never imports it). TORCH is installed first: here, the
# CPU build this machine keeps on disk; elsewhere e.g.
# TORCH="torch --index-url https://download.pytorch.org/whl/cpu" (a plain `pip install
# torch` on x86_64 Linux downloads the CUDA build, several GB).
TORCH ?= torch==2.13.0
EXAMPLES := $(VENV)/.examples-installed
$(EXAMPLES): $(STAMP)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev,examples]'
	touch $@

examples: $(EXAMPLES)

$(WHEELS): $(STAMP)
	rm -rf $(WHEELHOUSE)
	$(BIN)/pip wheel --quiet --no-build-isolation --wheel-dir $(WHEELHOUSE) '.[kubernetes,kubelet]'
	rm -f $(WHEELHOUSE)/sn_monitor-*.whl
	touch $@

wheelhouse: $(WHEELS)

# The kubelet's pod-resources API in Python, from its api.proto
# (sn_monitor/agent/workloads/kubelet/v1/): protoc from grpcio-tools at GRPC_TOOLS. A newer
# GRPC_TOOLS raises the kubelet extra's lower bounds in pyproject.toml (the generated code
# refuses older grpcio and protobuf): raise them with it.
GRPC_TOOLS ?= grpcio-tools==1.85.4
KUBELET_API := sn_monitor/agent/workloads/kubelet/v1/api.proto
kubelet-proto: $(STAMP)
	$(BIN)/pip install --quiet $(GRPC_TOOLS)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. \
		$(KUBELET_API)

demo: $(STAMP)
	$(BIN)/sn-monitor demo

# The Llama 3 failure trace on a 2,048-node job for 54 simulated days, every policy side by
# side (docs/benchmarks/goodput.md); GOODPUT_ARGS for others, e.g. --days 7 or --trace FILE.
GOODPUT_ARGS ?=
goodput: $(STAMP)
	$(BIN)/sn-monitor goodput $(GOODPUT_ARGS)

# Two pytest workers, a test file each at a time (pytest-xdist, --dist loadfile: a file's
# module fixtures stay in one worker): most integration tests wait on the processes they
# started, and every test passes with the machine busy. TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= 2
test: $(STAMP) $(WHEELS)
	WHEELHOUSE=$(WHEELHOUSE) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile \
		--ignore=tests/e2e

# The end-to-end runs that take minutes each (tests/e2e/): a real PyTorch job (torchrun,
# gloo, DCP, a dead node replaced by a spare, final weights compared with an
# uninterrupted run; five real failures named by logs analyze and a live controller) and
# the demo's scenarios (default, fail-slow, remediation, job-failure). Not in `make test`;
# .ci/run runs both.
e2e: $(EXAMPLES)
	REQUIRE_TORCH=1 $(BIN)/pytest -q -o timeout=900 tests/e2e

# The schema-driven fuzz of the API and the property tests, with budgets 20 to 100 times
# those of `make test` (tests/fuzzing.py): several minutes.
FUZZ_EXAMPLES ?= 400
fuzz: $(STAMP)
	SN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SN_HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q -o timeout=3600 \
		tests/integration/test_api_fuzz.py tests/unit/test_hostile_input.py \
		tests/unit/test_rules_property.py tests/unit/test_kmsg.py

# The site is built too (--strict: a broken link or anchor fails; never --quiet, which
# hides the warnings --strict counts).
lint: $(STAMP)
	$(BIN)/ruff check sn_monitor tests bench examples docs
	$(BIN)/mypy
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# The documentation site (mkdocs.yml, docs/) into build/site: open build/site/index.html,
# or `.venv/bin/mkdocs serve` to read it at http://127.0.0.1:8000 as you edit. The
# reference pages (CLI, config keys, metrics, API) are generated from the code as it builds
# (docs/hooks/reference.py); --strict turns a broken link or anchor into an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# Every benchmark part (bench/__main__.py), each to its end even when another fails, then
# a line per part with the date and the load average; exits 1 if any part could not
# measure. BENCH_ARGS=--quick: the smoke runs, results in a temporary directory (not
# bench/results/); BENCH_ARGS="--only controller_bench" for one part.
BENCH_ARGS ?=
bench: $(EXAMPLES)
	command -v prometheus-node-exporter >/dev/null || (apt-get install -y -q prometheus-node-exporter || echo "node_exporter not installed: comparison skipped")
	$(BIN)/python -m bench $(BENCH_ARGS)

# 30 minutes of load on one controller; then make crash.
soak: $(STAMP)
	$(BIN)/python -m bench.soak --progress
	$(MAKE) crash

# The controller killed at every point of a job recovery, three times each
# (tests/integration/test_recovery_crash.py, once each in make test); the counts of each
# round in build/crash-report.jsonl.
crash: $(STAMP)
	mkdir -p build && rm -f build/crash-report.jsonl
	SN_CRASH_ROUNDS=3 SN_CRASH_REPORT=build/crash-report.jsonl $(BIN)/pytest -q \
		-o timeout=1800 tests/integration/test_recovery_crash.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
