# kvconform: two commands set up a fresh machine.
#   make run    installs what is needed, runs the whole corpus against the installed vLLM, writes build/report/
#   make test   installs what is needed, runs the project's own tests
#   make browser installs Debian's chromium for the report's browser test, if it is missing
#   make bench  measures kvconform's cost against vLLM's allocator: build/bench.json, a row in
#               docs/benchmarks.md, profiles in build/profiles (see docs/benchmarks.md)
#
# The environment lives in .venv (git-ignored), pinned by constraints.txt (vLLM 0.33.0).
# It is rebuilt only when pyproject.toml or constraints.txt change. Caches (pip, release
# trees, vLLM's cache, Hypothesis' database) live under $(KVCONFORM_CACHE), outside the repo.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvconform-installed
REPORT_DIR ?= build/report
export KVCONFORM_CACHE ?= $(HOME)/.cache/kvconform
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The browser test opens report.html in headless Chromium: Debian's package, installed
# once by apt-get (as root, or through sudo without a password). Where that is not
# possible the target says so and the test skips with the reason.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo "sudo -n")

.PHONY: run test lint typecheck check constraints clean browser bench

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[vllm,test,report,bench]'
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kvconform run scenarios --report-dir $(REPORT_DIR)

test: $(STAMP) browser
	$(BIN)/python -m pytest tests -q

# Timings, not assertions: the targets are reported in build/bench.json and the row.
bench: $(STAMP)
	$(BIN)/python -m kvconform.bench scenarios --out build/bench.json --doc docs/benchmarks.md \
		--profile build/profiles

browser:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: could not install chromium; the browser test will be skipped"

lint: $(STAMP)
	$(BIN)/ruff check kvconform tests conftest.py
	$(BIN)/mypy

check: lint test

constraints: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^kvconform' > constraints.txt

clean:
	rm -rf build
