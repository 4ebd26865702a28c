# kvconform: two commands set up a fresh machine.
#   make run    installs what is needed, runs the whole corpus against the installed vLLM, writes build/report/
#   make test   installs what is needed, runs the project's own tests
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

.PHONY: run test lint typecheck check constraints clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[vllm,test]'
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kvconform run scenarios --checks all --report-dir $(REPORT_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest tests -q

lint: $(STAMP)
	$(BIN)/ruff check kvconform tests conftest.py
	$(BIN)/mypy

check: lint test

constraints: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^kvconform' > constraints.txt

clean:
	rm -rf build
