# tpu-template: bake, demo and test the template. `make help` lists targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := build/demo
PYTEST_ARGS ?=

.PHONY: help venv test test-fast demo lint bench clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP) ## Create the virtual environment with everything the tests need

test: $(STAMP) ## Run every template test (sets itself up on a fresh machine)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest tests $(PYTEST_ARGS)

demo: $(STAMP) ## Bake the default project into build/demo and train it on XLA:CPU
	rm -rf $(DEMO_DIR)
	mkdir -p $(dir $(DEMO_DIR))
	$(BIN)/cookiecutter . --no-input --output-dir $(dir $(DEMO_DIR)) project_name=demo
	$(MAKE) -C $(DEMO_DIR) install train-single VENV=$(abspath $(VENV)) ARGS="--max-steps 60 --log-every 10"

lint: $(STAMP) ## Lint the template's own Python (hooks and tests)
	$(BIN)/ruff check hooks tests
	$(BIN)/ruff format --check hooks tests

clean: ## Remove build outputs (keeps the virtual environment)
	rm -rf build .pytest_cache
