# Two set-up commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create and use the virtual environment .venv themselves.
# Another Python in a venv of its own: `make test PY=python3.13 VENV=.venv313` (as CI).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-cross lint venv pods bench bench-fleet clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

pods:
	$(MAKE) -C examples/pods

demo: $(STAMP)
	$(BIN)/python -m kube32.sim.demo $(ARGS)

# ruff (pycodestyle, pyflakes, bugbear, complexity <= 15) over the whole tree (kube32,
# tests, bench, tools) and mypy, as configured in pyproject.toml; CI runs it before the suite.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP) pods
	$(BIN)/python -m pytest -q -x --durations=15 $(PYTEST_ARGS)

# Workers of other CPUs (arm64, armhf, s390x) under qemu-user join this machine's
# control plane (tests/cross; root; the first run builds root filesystems into a cache).
test-cross: $(STAMP) pods
	$(BIN)/python -m tests.cross.rootfs
	KUBE32_CROSS_REQUIRED=1 $(BIN)/python -m pytest -q -x --durations=10 tests/cross $(PYTEST_ARGS)

# Every bench (the fleet's at small sizes), then docs/benchmarks.md.
bench: $(STAMP) pods
	$(BIN)/python -m bench

# The fleet at scale (issue 25: 100, 300 and 1,000 devkit boards, 10 counter pods each, a
# drain of 50 nodes and the loss of up to 100), py-spy profiles of the control plane at the
# largest size in bench/fleet-profile*.txt; its section of docs/benchmarks.md and
# docs/fleet-growth.png are replaced in place (`make bench` keeps them).  About 45 minutes.
FLEET_SIZES ?= 100,300,1000
bench-fleet: $(STAMP) pods
	$(BIN)/pip install -q py-spy
	$(BIN)/python -m bench.bench_fleet --sizes $(FLEET_SIZES) --pods-per-node 10 --drain 50 --lose 100 \
		--profile --json bench/fleet-figures.json

clean:
	rm -rf $(VENV) build *.egg-info
