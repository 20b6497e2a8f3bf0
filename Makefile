# Two commands do all the set-up on a fresh machine:
#   make dev    create .venv if needed, install, run `edge dev` on the repository's wrangler-like.toml
#   (`make install` alone, then `source .venv/bin/activate`, puts `edge` on the shell's PATH)
#   make test   the same set-up, then the whole suite
# Both are idempotent: the install step re-runs only when pyproject.toml changes, and the native
# step (the CPU ops' one library, kernels/native_build.py; the simulator's and the policy's hot paths
# compiled by mypyc: engine/native.py) only when their sources change; if it fails the model takes
# its reference paths and the hot paths run interpreted, correct and slower.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch 2.13.0: the CPU build from local disk on the project's CI machines, the CUDA build elsewhere.
TORCH ?= torch==2.13.0
PIP := $(BIN)/python -m pip --disable-pip-version-check --quiet

.PHONY: dev test lint install native clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install "$(TORCH)"
	$(PIP) install -e '.[test,native]'
	@touch $(STAMP)

# edge lands in $(BIN), on no shell's PATH until the venv is activated: say so, unless it is
install: $(STAMP) native
	@if [ "$$VIRTUAL_ENV" != "$(abspath $(VENV))" ]; then \
		echo "edge-workers is installed in $(VENV)/: run 'source $(VENV)/bin/activate' to use edge, python and pytest from it (or call $(BIN)/edge)"; fi

# exit 1: no build (no compiler, a type error): warn and run interpreted; exit 2: a module listed in
# engine.native.MODULES has no source (it moved): stop, since it would run 3x slower unnoticed
native: $(STAMP)
	@$(BIN)/python -c "import sys, engine.native as n; sys.exit(n.main())"; rc=$$?; \
		if [ $$rc = 2 ]; then exit 2; fi; \
		if [ $$rc != 0 ]; then echo "warning: the native build failed (above); the hot paths run interpreted" >&2; fi

dev: install
	$(BIN)/edge dev $(ARGS)

# The suite's modules spread over the cores (pytest-xdist; a module's tests and its server stay on
# one worker): about half the wall time on 2 cores. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= auto
test: install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadscope $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info .native
