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

.PHONY: help install lock tools run test test-fast test-registry model-registry test-cluster cluster cluster-full cluster-build compile lint typecheck bench bench-quick image clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# An existing .venv is reused: the install runs only when the stamp is missing or pyproject.toml is
# newer, and then pip keeps every installed requirement that still fits (torch is not fetched again);
# only this package and new or changed requirements are installed. pip's cache (~/.cache/pip) is used.
# The versions are constraints.txt's (the environment the tests last passed in); `make lock` re-resolves them.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@# setuptools notes every editable install of a package-dir layout ("Editable installation. Please be
	@# careful with folders ...") as a warning; it is information, not a problem, so the install stays quiet.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --disable-pip-version-check \
		-c constraints.txt -e '.[local,dev]'
	@touch $@

install: $(STAMP) ## create .venv (if missing) and install the package with its local and dev extras

LOCK_VENV := .venv-lock
lock: ## re-resolve pyproject.toml's requirements in a fresh environment and pin the result in constraints.txt
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(LOCK_VENV)/bin/python -m pip install -q \
		--disable-pip-version-check -e '.[local,dev]'
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf $(LOCK_VENV)
	@echo "constraints.txt re-resolved: \`make install\` now installs it (git diff constraints.txt says what moved)"

run: $(STAMP) ## run the whole training pipeline locally (kfp.local) on the embedded object store
	$(CLI) run-local --param dataset_uri=$(DATASET) $(foreach p,$(PARAMS),--param $(p)) --summary-json runs/last-summary.json

# tests/cluster (`make test-cluster`) and tests/model_registry (`make test-registry`: a MariaDB from Debian's
# mariadb-server and the registry built once from its Go module) run in targets of their own; .ci/run calls both.
REGISTRY_TESTS := tests/model_registry

tools: $(STAMP) ## build the Go tools the tests use (kustomize) from their modules, once; cached in ~/.cache/cifar10-kfp
	$(PY) -m localcluster.gobuild kustomize

test: $(STAMP) tools ## run the whole test suite (tests/cluster and tests/model_registry run in their own targets)
	$(PY) -m pytest --ignore=tests/cluster --ignore=$(REGISTRY_TESTS) $(PYTEST_ARGS)

test-fast: $(STAMP) tools ## run the tests not marked slow
	$(PY) -m pytest --ignore=tests/cluster --ignore=$(REGISTRY_TESTS) -m "not slow and not reliability" $(PYTEST_ARGS)

cluster-build: $(STAMP) ## build the real control plane's Go binaries (once per version, cached in ~/.cache/cifar10-kfp)
	$(PY) -m localcluster.gobuild --all
	$(PY) -m localcluster.kfp_ui_build

test-cluster: cluster-build ## run tests/cluster against a real control plane, Trainer and JobSet on 127.0.0.1
	$(PY) -m pytest tests/cluster --timeout=900 $(PYTEST_ARGS)

cluster: cluster-build ## start the real control plane + Trainer in the foreground; prints export KUBECONFIG=...
	$(PY) -m localcluster $(CLUSTER_ARGS)

cluster-full: cluster-build ## as cluster, plus the real KFP 2.17.0 backend and its object store (MULTI_USER=1: multi-user, profiles team-a/b)
	$(PY) -m localcluster --kfp $(if $(MULTI_USER),--multi-user) $(CLUSTER_ARGS)

test-registry: $(STAMP) ## the tests against a real Kubeflow Model Registry server (needs mariadb-server and go)
	$(PY) -m pytest $(REGISTRY_TESTS) $(PYTEST_ARGS)

model-registry: $(STAMP) ## build (once) and run Kubeflow Model Registry with its own MariaDB, in the foreground
	$(PY) -m localcluster.model_registry

compile: $(STAMP) ## compile the pipelines to pipelines/compiled/*.yaml
	$(CLI) compile --output-dir pipelines/compiled

lint: $(STAMP) ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy finds packages by folder name; components/ and pipelines/ install as cifar10_kfp_components and
# cifar10_kfp_pipelines (pyproject's package-dir), so links under build/ give mypy those names.
MYPY_PATH := build/mypy-path
typecheck: $(STAMP) ## mypy over cifar10_kfp/, components/ and pipelines/ (configured in pyproject.toml)
	@mkdir -p $(MYPY_PATH)
	@ln -sfn ../../components $(MYPY_PATH)/cifar10_kfp_components
	@ln -sfn ../../pipelines $(MYPY_PATH)/cifar10_kfp_pipelines
	MYPYPATH=$(MYPY_PATH) $(PY) -m mypy -p cifar10_kfp -p cifar10_kfp_components -p cifar10_kfp_pipelines

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
