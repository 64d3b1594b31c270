# Two set-up commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create and use the virtual environment .venv themselves.
# Another Python in a venv of its own: `make test PY=python3.13 VENV=.venv313` (as CI).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-cross lint venv pods bench clean

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

bench: $(STAMP) pods
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
