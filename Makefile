# One command each: `make setup`, `make test`, `make demo`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-all coverage pytest lint typecheck unit mutation demo crds clean

setup: $(STAMP)

# torch is pinned in the `training` extra (TORCH, read from pyproject.toml) and installed first by pip, which takes
# the CPU build a machine's pip is pointed at (find-links); everything else is installed by uv, in parallel (about
# 50 s where pip alone took 160). uv reads no pip configuration: asked for torch itself, it would download PyPI's
# CUDA build, several GB; with torch installed, the pin is met and uv leaves it. pip writes no byte code for torch
# (`--no-compile`): compiling its 2,285 modules took 15 of the setup's 41 s, on one core before any test starts; the
# 1,431 that the tests import are compiled on first import instead (below), beside the other tests.
TORCH := $(shell grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
UV := $(BIN)/python -m uv pip install --quiet --python
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile '$(TORCH)' uv==0.13.8
	$(UV) $(BIN)/python -e '.[operator,training,dev]'
	$(MAKE) $(MLFLOW_SERVER)
	touch $(STAMP)

# Python writes byte code for what it imports, here, even where PYTHONDONTWRITEBYTECODE is set (as on CI runners
# and in many images): uv installs packages without byte code, and the tests start hundreds of processes (Ray's
# workers, torchrun's ranks) that would each compile Ray, transformers, kopf and the Kubernetes client from source
# again (8.4 CPU-s for those imports from source, 5.5 with byte code). Written once, on first import, only for what
# is imported; compiling every installed package at install instead took a minute of setup.
unexport PYTHONDONTWRITEBYTECODE

# The MLflow tracking server the tests start (`mlflow server`, SQLite store): full mlflow pins pyarrow<26, older
# than the training extra's, so it lives in a virtualenv of its own, outside the project's (pyproject.toml); uv
# installs into it, so it needs no pip of its own (`--without-pip`: 0.2 s, where installing pip took 4).
MLFLOW_SERVER := .tools/mlflow-server/bin/mlflow
$(MLFLOW_SERVER):
	test -x .tools/mlflow-server/bin/python || $(PYTHON) -m venv --without-pip .tools/mlflow-server
	$(UV) .tools/mlflow-server/bin/python mlflow==3.17.2

# Under `make test` both run beside pytest at a lower priority (niceness 10): they only need to end before it does,
# while the Ray nodes pytest starts in its first minutes must register within Ray's fixed 30 s.
lint: setup
	nice -n 10 $(BIN)/ruff check operator training tests bench
	nice -n 10 $(BIN)/ruff format --check operator training tests bench

typecheck: setup
	nice -n 10 $(BIN)/mypy operator/fsdp_operator training/fsdp_train

# The default run leaves out the end-to-end cases marked `slow` (each e2e suite keeps a representative case
# in it) and the full `faults` and `load` suites (their samples stay in); `make test-all` adds the slow cases
# (`pytest -m faults` / `pytest -m load` run those suites). `make coverage` is the default run with line and branch
# coverage: its tracing makes the in-process tests about three times slower (the reconcile and spec-fuzz modules:
# 8.8 s, 27 s with it), which `make test` does not pay.
# An explicit -m replaces pyproject's addopts -m, so the default marks are spelled out here in full.
PYTEST_MARKS ?= not slow and not faults and not load
COVERAGE ?=
# The slowest cases, printed by every run, so that a suite growing past its time budget says where.
DURATIONS := --durations=15
# pytest-xdist: most tests wait (on processes, sockets, an operator's next pass) rather than compute, so more
# workers than cores pay off; 4 on 2 cores (6 made the run longer: at its peak it is CPU-bound). `--dist
# loadgroup` spreads tests one by one, except the groups that tests/conftest.py keeps on one worker: the tests
# that start Ray clusters (one at a time per lane), and the tests of a module sharing a module-scoped fixture
# (built once). PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 4
# --no-loadscope-reorder: units in the order tests/conftest.py sorts them (the longest first), not by test count.
PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# ruff and mypy run beside the tests (`-j`: mypy's minute on one core, while the tests mostly wait); any of the
# three failing fails the target, after all three have finished.
test: setup
	$(MAKE) --no-print-directory -j 3 -k lint typecheck pytest

test-all: setup
	$(MAKE) --no-print-directory -j 3 -k lint typecheck pytest PYTEST_MARKS=

coverage: setup
	$(MAKE) --no-print-directory pytest COVERAGE='--cov --cov-report=term'

pytest: setup
	$(BIN)/python -m pytest -q -ra $(if $(PYTEST_MARKS),-m "$(PYTEST_MARKS)") $(PARALLEL) $(COVERAGE) $(DURATIONS)

unit: setup
	$(BIN)/python -m pytest -q tests/unit

# Mutation testing of the pure core (docs/testing.md): slow, CPU-heavy, never part of `make test`.
# mutmut names mutants after file paths, so the packages are copied flat into build/mutation first.
# MUTANTS narrows the run (`make mutation MUTANTS='fsdp_operator.decide.status*'`) and the modules mutated;
# MUTATION_TESTS replaces the test selection (`MUTATION_TESTS=tests/unit/test_status_rules.py`: a module's own tests,
# docs/testing.md lists each module's); MUTATION_JOBS sets the parallelism.
MUTATION_DIR := build/mutation
MUTATION_JOBS ?= 2
MUTANTS ?=
MUTATION_TESTS ?=

mutation: setup
	rm -rf $(MUTATION_DIR) && mkdir -p $(MUTATION_DIR)
	cp -r operator/fsdp_operator training/fsdp_train tests examples crds charts docs pyproject.toml $(MUTATION_DIR)/
	$(BIN)/python tests/support/mutation_scores.py --narrow $(MUTATION_DIR)/pyproject.toml "$(MUTANTS)" $(MUTATION_TESTS)
	cd $(MUTATION_DIR) && PATH=$(CURDIR)/$(BIN):$$PATH nice -n 15 mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS) > mutmut.log
	$(BIN)/python tests/support/mutation_scores.py $(MUTATION_DIR)/mutants

demo: setup
	$(BIN)/fsdpctl run-local -f examples/tiny-cpu.yaml

# The CRD and docs/api.md are generated from the field declarations in operator/fsdp_operator/api/spec.py
# (through schema.py); tests fail when these copies drift.
crds: setup
	{ echo '# Generated by `make crds` (`fsdpctl crd`) from the field declarations in operator/fsdp_operator/api/spec.py; do not edit (a test checks it).'; \
	  $(BIN)/fsdpctl crd; } > crds/fsdptrainingjob.yaml
	cp crds/fsdptrainingjob.yaml charts/fsdp-operator/crds/fsdptrainingjob.yaml
	$(BIN)/python -c 'from fsdp_operator.api import generate; from fsdp_operator.decide import lifecycle; \
	  print(generate.api_reference() + lifecycle.conditions_reference(), end="")' > docs/api.md

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
