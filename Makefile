# hamq: two commands.  make run   — the main job;  make test  — everything CI checks.
# Both create .venv from pyproject.toml when it is missing or older than pyproject.toml.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SOURCES := hamq nameserver cli
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: run test lint typecheck pytest bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	@$(BIN)/hamq --help
	@echo "(the broker arrives with the next issues; make run will start it here)"

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES) tests benchmarks examples
	$(BIN)/ruff format --check $(SOURCES) tests benchmarks examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/hamq bench remoting

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis build *.egg-info
