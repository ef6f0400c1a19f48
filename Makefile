# tpu-template: bake, demo and test the template. `make help` lists targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# SkyPilot's client, apart (its click pin clashes with requirements-dev.txt): the spot tests
# parse the baked tasks with it.
SKY_VENV ?= .venv-sky
SKY_STAMP := $(SKY_VENV)/.installed
DEMO_DIR := build/demo
BENCH_DIR := build/bench
BENCH_ARGS ?=
PYTEST_ARGS ?=
# Workers `make test` and `test-fast` run the test files on, each file whole on one worker
# (its module fixtures, the gcloud tier's sshds, the Docker daemon stay one); 0: serially.
TEST_JOBS ?= 2
PARALLEL = -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
# Where torch comes from; empty: the package index. The CPU build saves ~3 GB of CUDA
# libraries where https://download.pytorch.org/whl/cpu is reachable (see README).
TORCH_INDEX_URL ?=

.PHONY: help venv test test-pythons test-full test-docker test-gcloud test-fast demo lint bench clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX_URL),$(BIN)/python -m pip install --quiet --index-url '$(TORCH_INDEX_URL)' torch==2.9.0)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

$(SKY_STAMP): requirements-sky.txt
	test -x $(SKY_VENV)/bin/python || $(PYTHON) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/python -m pip install --quiet -r requirements-sky.txt
	touch $(SKY_STAMP)

venv: $(STAMP) $(SKY_STAMP) ## Create the virtual environments with everything the tests need

test: $(STAMP) $(SKY_STAMP) ## Run every template test (sets itself up on a fresh machine)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m "not pythons and not full" $(PARALLEL) $(PYTEST_ARGS)

test-pythons: $(STAMP) ## Bakes for Python 3.10 and 3.12: make install && make test-fast, the user's way
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m pythons $(PYTEST_ARGS)

test-full: $(STAMP) ## What make test leaves out: whole bake suites, torch_tpu hf, cross-backend resume (over an hour)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m full $(PARALLEL) $(PYTEST_ARGS)

test-fast: $(STAMP) $(SKY_STAMP) ## The template tests without the Docker and gcloud tiers and the baked suites
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m "not docker and not gcloud and not suite and not pythons and not full" $(PARALLEL) $(PYTEST_ARGS)

test-docker: $(STAMP) ## Run only the Docker tier (builds and runs the baked project's image)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m docker $(PYTEST_ARGS)

test-gcloud: $(STAMP) ## Run only the gcloud tier (a pod project's cloud targets via gcloud + sshd)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests -m gcloud $(PYTEST_ARGS)

demo: $(STAMP) ## Bake the default project into build/demo and train it on XLA:CPU
	rm -rf $(DEMO_DIR)
	mkdir -p $(dir $(DEMO_DIR))
	$(BIN)/cookiecutter . --no-input --output-dir $(dir $(DEMO_DIR)) project_name=demo
	$(MAKE) -C $(DEMO_DIR) install train-single VENV=$(abspath $(VENV)) ARGS="--max-steps 60 --log-every 10"

bench: $(STAMP) ## Bake the default project into build/bench and run its benchmark (+ Accelerate)
	rm -rf $(BENCH_DIR)
	mkdir -p $(BENCH_DIR)
	$(BIN)/cookiecutter . --no-input --output-dir $(BENCH_DIR) project_name=bench-project
	$(BIN)/pip install --quiet accelerate==1.15.0
	cd $(BENCH_DIR)/bench-project && PJRT_DEVICE=CPU PYTHONPATH=src $(abspath $(BIN))/python \
		benchmarks/bench.py --out $(abspath $(BENCH_DIR)) $(BENCH_ARGS)

lint: $(STAMP) ## Lint the template's own Python (hooks and tests)
	$(BIN)/ruff check hooks tests local_extensions.py
	$(BIN)/ruff format --check hooks tests local_extensions.py

clean: ## Remove build outputs (keeps the virtual environment)
	rm -rf build .pytest_cache
