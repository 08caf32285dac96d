# hamq: two commands.  make run   — the main job;  make test  — everything CI checks.
# Both create .venv from pyproject.toml when it is missing or older than pyproject.toml.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SOURCES := hamq nameserver cli
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: run test test-fast lint typecheck pytest bench venv clean protos

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[dev,spark]'
	@touch $(STAMP)

run: $(STAMP)
	@echo "Starting broker group broker-a: a SYNC_MASTER (127.0.0.1:10911) and its SLAVE"
	@echo "(127.0.0.1:10921), each with a nameserver (127.0.0.1:9876 and :9877) that both"
	@echo "register with, so clients find the slave while the master is down (hamq produce,"
	@echo "consume and admin ask both by default); data in ./data, logs in ./data/logs."
	@echo "In a second terminal:"
	@echo "    . .venv/bin/activate"
	@echo "    hamq produce --topic demo --count 1000"
	@echo "    hamq consume --topic demo --group g"
	@echo "Metrics: curl http://127.0.0.1:10919/metrics (master), :10929 (slave)."
	@echo "RocketMQ 5 clients (gRPC): endpoints 127.0.0.1:8081 (master), :8082 (slave)."
	@echo "Ctrl-C stops both (cleanly: the slave first)."
	@$(BIN)/hamq cluster up --profile 1m-1s-sync

test: lint typecheck pytest

# pytest-xdist workers: most tests wait on sockets and child processes, so two run side by
# side on two cores; a file's tests stay on one worker (its module fixtures once)
PYTEST_WORKERS ?= 2
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadfile

# the edit loop: the tests not marked slow (no processes, no multi-second runs)
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow" $(PYTEST_XDIST)

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES) tests benchmarks examples
	$(BIN)/ruff format --check $(SOURCES) tests benchmarks examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_XDIST)

# RocketMQ 5's gRPC messages: hamq/protocol/v2/*.proto -> the committed *_pb2.py/.pyi
protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		hamq/protocol/v2/definition.proto hamq/protocol/v2/service.proto

bench: $(STAMP)
	$(BIN)/hamq bench remoting

clean:
	rm -rf $(VENV) .venv-rmq5 .mypy_cache .pytest_cache .ruff_cache .hypothesis build *.egg-info
