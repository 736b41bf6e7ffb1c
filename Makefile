# fabricscope: the two commands are `make demo` and `make test`.
# Each runs the idempotent setup first (OS packages, venv, generated code).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: image demo test test-unit lint setup proto docs clean-labs profiler

demo: setup
	$(VENV)/bin/fabricscope demo

test: setup lint
	$(PY) -m pytest -ra $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check --quiet .

# Tests that need no root, no BPF and no network namespaces.
test-unit: setup
	$(PY) -m pytest -ra tests/unit $(PYTEST_ARGS)

setup:
	@bash scripts/setup.sh

# The agent and collector images: Debian root filesystems with the wheel installed
# (deploy/image/build.sh), imported into podman as localhost/fabricscope-*:VERSION.
image: setup
	@VENV=$(VENV) bash deploy/image/build.sh

# Generated wire code (never edited by hand; ignored by git).
proto: fabricscope/v1/telemetry_pb2.py

fabricscope/v1/telemetry_pb2.py: proto/fabricscope/v1/telemetry.proto
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. $<
	touch fabricscope/v1/__init__.py

# Rendered documentation and generated operator files (tests fail when these are stale);
# docs/DIAGNOSIS.md's generated blocks come from `python -m fabricscope.diagnosis.docs`.
docs:
	$(PY) -m fabricscope.schema > docs/SCHEMA.md
	$(PY) -m fabricscope.config > docs/config.md
	$(PY) -m fabricscope.surface.alerting
	$(PY) -m fabricscope.surface.grafana
	$(PY) -m fabricscope.surface.kubernetes
	$(PY) -m fabricscope.diagnosis.docs

# Remove every fabricscope lab left on this machine (normally never needed).
clean-labs:
	$(VENV)/bin/fabricscope lab down --all

# The NCCL profiler plugin (docs/nccl-profiler.md).
profiler: ; $(MAKE) -C profiler
