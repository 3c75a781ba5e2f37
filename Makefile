# cifar10-kfp: the front door. `make help` lists the targets.
# A fresh clone needs exactly two commands: `make run` and `make test`. Each installs what it needs.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/cifar10-kfp
STAMP := $(VENV)/.installed-stamp
# The dataset for `make run`: the official CIFAR-10 URL by default; a path, file://, s3:// or https:// URI overrides it.
DATASET ?= https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz
# Extra pipeline parameters for `make run`, e.g. PARAMS="epochs=2 max_train_samples=2000".
PARAMS ?=
REGISTRY ?= ghcr.io/cifar10-kfp
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= $(REGISTRY)/cifar10-kfp:$(VERSION)
PYTEST_ARGS ?=

.PHONY: help install run test test-fast test-cluster cluster cluster-build compile lint bench bench-quick image clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@# setuptools notes every editable install of a package-dir layout ("Editable installation. Please be
	@# careful with folders ...") as a warning; it is information, not a problem, so the install stays quiet.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --disable-pip-version-check -e '.[local,dev]'
	@touch $@

install: $(STAMP) ## create .venv (if missing) and install the package with its local and dev extras

run: $(STAMP) ## run the whole training pipeline locally (kfp.local) on the embedded object store
	$(CLI) run-local --param dataset_uri=$(DATASET) $(foreach p,$(PARAMS),--param $(p)) --summary-json runs/last-summary.json

test: $(STAMP) ## run the whole test suite (tests/cluster runs in `make test-cluster`)
	$(PY) -m pytest --ignore=tests/cluster $(PYTEST_ARGS)

test-fast: $(STAMP) ## run the tests not marked slow
	$(PY) -m pytest --ignore=tests/cluster -m "not slow and not reliability" $(PYTEST_ARGS)

cluster-build: $(STAMP) ## build the real control plane's Go binaries (once per version, cached in ~/.cache/cifar10-kfp)
	$(PY) -m tests.support.cluster.gobuild --all

test-cluster: cluster-build ## run tests/cluster against a real control plane, Trainer and JobSet on 127.0.0.1
	$(PY) -m pytest tests/cluster --timeout=900 $(PYTEST_ARGS)

cluster: cluster-build ## start the real control plane + Trainer in the foreground; prints export KUBECONFIG=...
	$(PY) -m tests.support.cluster $(CLUSTER_ARGS)

compile: $(STAMP) ## compile the pipelines to pipelines/compiled/*.yaml
	$(CLI) compile --output-dir pipelines/compiled

lint: $(STAMP) ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP) ## run the CPU benchmarks (about 45 min) and write benchmarks/RESULTS.md
	$(PY) -m benchmarks.run

bench-quick: $(STAMP) ## every benchmark at a small size, in a few minutes
	$(PY) -m benchmarks.run --quick

image: ## build the component image for linux/amd64 with docker buildx and push it to $(REGISTRY)
	docker buildx build --platform linux/amd64 -f images/train/Dockerfile \
		--build-arg VERSION=$(VERSION) -t $(IMAGE) --push .
	@echo "pushed $(IMAGE); compile pipelines against it with: CIFAR10_KFP_IMAGE=$(IMAGE) make compile"

clean: ## remove local outputs (keeps .venv)
	rm -rf local_outputs runs .pytest_cache
