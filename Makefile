# kvconform: two commands set up a fresh machine.
#   make run    installs what is needed, runs the whole corpus against the installed vLLM, writes build/report/
#   make test   installs what is needed, lints (ruff, mypy), runs the project's own tests but
#               the slow ones (pytest -m "not slow and not network", two xdist workers)
#   make test-slow   the rest of the project's tests: each imports vLLM in subprocesses, copies
#                    vLLM's tree, downloads a release or drives a browser (.ci/run runs both;
#                    the long campaigns are make campaigns)
#   make browser installs Debian's chromium for the report's browser test, if it is missing
#   make nightly     what every nightly runs (tools/nightly.sh, docs/gpu.md): the corpus with every
#                    check, fuzzing and exploring at the nightly budget, the mutation campaign, the
#                    CUDA tests.
#                    NIGHTLY_PYTHON=python3 judges that interpreter's vLLM, no .venv; VLLM_SRC=DIR
#                    judges a vLLM source checkout's tree; NIGHTLY_PARTS="corpus" runs one part
#   make install-nightly  kvconform and what the nightly needs (no vLLM, no torch) into
#                    NIGHTLY_PYTHON, which has the vLLM under test; VLLM_WHEEL=FILE installs that first
#   make install-light    kvconform alone (PyYAML, packaging) in .venv-light: for CI steps that only
#                    read reports (kvconform merge); no vLLM, no torch
#   make gpu-bundle  builds .gpu/, what a GPU machine without vLLM needs (docs/gpu.md)
#   make gpu-engine-bundle VLLM=0.25.0  builds .gpu-engine/VLLM/parts, vLLM's compiled engine
#                    for such a machine, in parts under 60 MB (docs/engine-mode.md)
#   make fuzz        searches generated trajectories for divergences (fuzz-nightly: the nightly budget)
#   make explore     searches generated scheduler workloads for 120 s (a pull request's budget;
#                    explore-nightly: the nightly budget)
#   make coverage-vllm  which of vLLM's reservation code the corpus executes, per file,
#                    function and scenario (build/vllm-coverage/, docs/coverage.md)
#   make mutation    the mutation campaign: how many mutants of vLLM's reservation code the
#                    suite kills (build/mutation/, docs/mutation.md)
#   make bench       measures kvconform's cost against vLLM's allocator: build/bench.json, a
#                    row in docs/benchmarks.md, profiles in build/profiles (docs/benchmarks.md)
#   make release-matrix  the corpus with every check against each vLLM release from 0.25.0 to
#                    the newest on pip's index: build/matrix/matrix.html (docs/releases.md)
#   make upstream-check  each finding's reproducer, in a copy of its release's own test tree,
#                    fails on the release and passes with its fix, and vLLM's own CPU-runnable
#                    tests stay green with the fixes (docs/findings.md; 12 min with the peer
#                    surveys cached, an hour more before)
#   make campaigns   release-matrix-claimed and upstream-check: the long campaigns, run before
#                    closing an issue that changes scenarios or findings, not by .ci/run (which
#                    stays under an hour on empty caches)
#
# The environment lives in .venv (git-ignored), pinned by constraints.txt (vLLM 0.34.0, the newest
# claimed release: tests/test_environment_pin.py holds the two together).
# It is rebuilt only when pyproject.toml or constraints.txt change. Caches (pip's, in
# PIP_CACHE_DIR; release trees, vLLM's cache, Hypothesis' database) live under
# $(KVCONFORM_CACHE), outside the repo.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvconform-installed
REPORT_DIR ?= build/report
NIGHTLY_DIR ?= build/nightly
NIGHTLY_PYTHON ?= $(BIN)/python
export KVCONFORM_CACHE ?= $(HOME)/.cache/kvconform
export PIP_CACHE_DIR ?= $(KVCONFORM_CACHE)/pip
export PIP_DISABLE_PIP_VERSION_CHECK := 1
LIGHT_VENV ?= .venv-light

# The browser test opens report.html in headless Chromium: Debian's package, installed
# once by apt-get (as root, or through sudo without a password). Where that is not
# possible the target says so and the test skips with the reason.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo "sudo -n")

FUZZ_SEED ?= $(shell date +%Y%m%d)

.PHONY: run test test-slow lint constraints clean browser nightly gpu-bundle fuzz fuzz-nightly explore explore-nightly bench gpu-engine-bundle
.PHONY: install install-light install-nightly

# constraints.txt is a lock: every package of the environment at one version, installed as it
# stands (--no-deps), so the resolver never runs. It has to be: vLLM 0.34.0 pins
# flashinfer-python==0.7.3, which the package index does not serve (0.7.2.post1 and 0.7.4 are),
# and no resolver accepts that pin unmet. flashinfer is CUDA-only and vLLM imports it lazily, on
# CUDA, never on the CPU paths kvconform drives; the lock keeps 0.7.2.post1, what 0.33.0 pinned.
# pip's own output goes to $(VENV)/install.log, printed only when a step fails: setuptools
# announces every editable install with a warning ("Editable installation. Please be careful
# with folders ..."), which says nothing about this project.
INSTALL_LOG := $(VENV)/install.log
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing the locked environment (constraints.txt) into $(VENV); pip's output: $(INSTALL_LOG)"
	@{ $(BIN)/python -m pip install -q --upgrade pip && \
		$(BIN)/python -m pip install -q --no-deps -r constraints.txt && \
		$(BIN)/python -m pip install -q --no-deps -e . ; } > $(INSTALL_LOG) 2>&1 || \
		{ cat $(INSTALL_LOG); exit 1; }
	touch $@

install: $(STAMP)

# For CI steps that only read reports: kvconform's own two dependencies, no vLLM, no torch.
install-light:
	test -x $(LIGHT_VENV)/bin/python || $(PYTHON) -m venv $(LIGHT_VENV)
	$(LIGHT_VENV)/bin/python -m pip install -q -c constraints.txt -e .

# kvconform into the interpreter whose vLLM is under test (vLLM's CI image), leaving that
# vLLM and its torch as they are; VLLM_WHEEL=FILE installs that wheel into it first.
VLLM_WHEEL ?=
install-nightly:
ifeq ($(NIGHTLY_PYTHON),$(BIN)/python)
	$(MAKE) install
else
	$(if $(VLLM_WHEEL),$(NIGHTLY_PYTHON) -m pip install -q '$(VLLM_WHEEL)')
	$(NIGHTLY_PYTHON) -m pip install -q -e '.[nightly]'
endif

run: $(STAMP)
	$(BIN)/kvconform run scenarios --checks all --report-dir $(REPORT_DIR)

# Two workers, each importing vLLM once (tests/conftest.py's session fixture); the tests that
# take seconds each are marked slow (pyproject.toml's markers) and run by test-slow.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	$(BIN)/python -m pytest tests -q -n $(TEST_WORKERS) -m "not slow and not network"

test-slow: $(STAMP) browser
	$(BIN)/python -m pytest tests -q -n $(TEST_WORKERS) -m "slow or network"

# Timings, not assertions: the targets are reported in build/bench.json and the row.
bench: $(STAMP)
	$(BIN)/python -m kvconform.bench scenarios --out build/bench.json --doc docs/benchmarks.md \
		--profile build/profiles

browser:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: could not install chromium; the browser test will be skipped"

# The vLLM under test: NIGHTLY_PYTHON's (default: .venv's pinned one), or VLLM_SRC's tree.
# SHARD=I/N: that share of the corpus, fuzz and mutation (a CI matrix job); EXPLORE_JOBS: the
# explorer's processes.
VLLM_SRC ?=
NIGHTLY_PARTS ?= corpus fuzz explore mutate cuda
SHARD ?=
nightly: $(if $(filter $(BIN)/python,$(NIGHTLY_PYTHON)),$(STAMP))
	PYTHON='$(NIGHTLY_PYTHON)' VLLM_SRC='$(VLLM_SRC)' NIGHTLY_PARTS='$(NIGHTLY_PARTS)' \
		EXPLORE_JOBS='$(EXPLORE_JOBS)' SHARD='$(SHARD)' bash tools/nightly.sh $(NIGHTLY_DIR)

# GPU_RELEASES: PyPI releases whose Python trees travel too; tools/gpu-run.sh runs the
# warmup scenarios against each (the 0.27.1 warmup bug, by its consequence, on the GPU).
GPU_RELEASES ?= 0.27.1

gpu-bundle: $(STAMP)
	$(BIN)/python tools/gpu_bundle.py build --out .gpu
	rm -rf .gpu/releases
	for v in $(GPU_RELEASES); do $(BIN)/python tools/gpu_bundle.py release $$v --out .gpu || exit 1; done

# Engine mode on the lent H200 (docs/engine-mode.md): vLLM's compiled wheel (VLLM: a release
# whose torch pin matches the machine's torch 2.11, 0.25.0 or 0.26.0), trimmed, and the wheels
# the image lacks, split in parts; tools/gpu-engine-run.sh joins and runs them there.
VLLM ?= 0.25.0

gpu-engine-bundle: $(STAMP)
	$(BIN)/python tools/gpu_engine_bundle.py build --vllm $(VLLM) --out .gpu-engine

# Generated trajectories (docs/fuzzing.md); reproducers of findings land in build/fuzz.
fuzz: $(STAMP)
	$(BIN)/kvconform fuzz --out build/fuzz

fuzz-nightly: $(STAMP)
	$(BIN)/kvconform fuzz --examples 20000 --seed $(FUZZ_SEED) --out build/fuzz

# Generated scheduler workloads over vLLM's real scheduler (docs/explore.md): 120 s of search on
# two processes, a pull request's budget; reproducers of findings land in build/explore.
EXPLORE_JOBS ?= 2
explore: $(STAMP)
	$(BIN)/kvconform explore --budget 120 --jobs $(EXPLORE_JOBS) --out build/explore

explore-nightly: $(STAMP)
	$(BIN)/kvconform explore --budget 1800 --jobs $(EXPLORE_JOBS) --seed $(FUZZ_SEED) --out build/explore

# Real bugs vLLM shipped and fixed, replayed through the corpus (docs/real-bugs.md).
REALBUGS_JOBS ?= 2
.PHONY: realbugs
realbugs: $(STAMP)
	$(BIN)/kvconform realbugs --report-dir build/realbugs --jobs $(REALBUGS_JOBS)

# Which lines and branches of vLLM's reservation code the corpus executes (coverage.py, every
# check, one context per scenario): build/vllm-coverage/ (docs/coverage.md).
.PHONY: coverage-vllm
coverage-vllm: $(STAMP)
	$(BIN)/kvconform coverage --vllm-code scenarios --report-dir build/vllm-coverage

# Mutation campaign over vLLM's reservation code (docs/mutation.md): reports in build/mutation.
# MUTATION_RELEASE: the release whose code scenarios/mutation-equivalents.yaml was audited on
# (its mutant ids and reasons are that code's); a campaign on another release reports the
# entries that no longer name a mutant, or are killed there, as stale.
MUTATION_RELEASE ?= 0.33.0
.PHONY: mutation
mutation: $(STAMP)
	$(BIN)/kvconform mutate --vllm-release $(MUTATION_RELEASE) --report-dir build/mutation

# One `kvconform run --checks all --vllm-release V` per release, each in its own process;
# releases below the minimum (0.28.0) are information rows, the others decide the status.
# A green matrix renews the release lock (scenarios/release-matrix.lock): make test then
# runs only the scenarios changed since against each claimed release.
# CLAIMED_RELEASES: what kvconform claims to judge; make campaigns holds every one green, and
# make test (tests/test_release_lock.py) the scenarios changed since the lock.
CLAIMED_RELEASES ?= 0.28.0..0.34.0
MATRIX_RELEASES ?= 0.25.0..
MATRIX_DIR ?= build/matrix
MATRIX_JOBS ?= 1
.PHONY: release-matrix release-matrix-claimed
release-matrix: $(STAMP)
	$(BIN)/kvconform matrix --releases $(MATRIX_RELEASES) --report-dir $(MATRIX_DIR) \
		--jobs $(MATRIX_JOBS) --lock scenarios/release-matrix.lock scenarios

release-matrix-claimed: $(STAMP)
	$(BIN)/kvconform matrix --releases $(CLAIMED_RELEASES) --report-dir $(MATRIX_DIR) \
		--jobs $(MATRIX_JOBS) scenarios

# docs/reproducers/upstream.yaml, through vLLM's own tests (kvconform/peer/). The peer suite's
# baseline and reach map are computed once per release and cached under $(KVCONFORM_CACHE).
.PHONY: upstream-check
upstream-check: $(STAMP)
	$(BIN)/python -m kvconform.upstream --work build/upstream

# The long campaigns, out of .ci/run (which must stay under an hour on empty caches): run
# before an issue that changes scenarios or findings is closed, and on a schedule.
.PHONY: campaigns
campaigns: release-matrix-claimed upstream-check

lint: $(STAMP)
	$(BIN)/ruff check kvconform tests tools conftest.py
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache


constraints: $(STAMP)
	{ sed -n '1,/^[^#]/{/^#/p}' constraints.txt; $(BIN)/python -m pip freeze --all --exclude-editable | grep -v '^pip==' | \
		grep -v '^kvconform' | sed -E 's|^vllm @ .*/vllm-([0-9][^-]*)-.*|vllm==\1|'; } > constraints.new
	mv constraints.new constraints.txt

clean:
	rm -rf build
