# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates and fills its own virtual environment (.venv) on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The versions `make test` and `make demo` were last run green with: a release of any
# dependency reaches CI only through `make lock`, not by appearing on PyPI.
LOCK := constraints.txt

.PHONY: demo test bench bench-hta protos image lock clean

EXTRAS := '.[dev,ray,plot]' torch==2.13.0  # the CPU build the samples were made with

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(LOCK) -e $(EXTRAS)
	touch $@

demo: $(STAMP)
	$(BIN)/rankscope demo

# pytest exits 5 when it collects nothing; that is a failure here, loudly.
test: $(STAMP)
	@$(BIN)/python -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: FAILED, pytest collected no tests" >&2; fi; \
	exit $$rc

# Benchmarks print ratios measured side by side in one run; they are not tests.
bench: $(STAMP)
	$(BIN)/python bench/analyze_scale.py
	$(BIN)/python bench/upload_throughput.py
	$(BIN)/python bench/sweep_scale.py

# HTA lives in its own environment: it is what we compare against, not a dependency.
.venv-hta/bin/python:
	$(PYTHON) -m venv .venv-hta
	.venv-hta/bin/python -m pip install -q holistictraceanalysis

bench-hta: $(STAMP) .venv-hta/bin/python
	$(BIN)/python bench/vs_hta.py --hta-python .venv-hta/bin/python

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# The image deploy/kubernetes runs, tagged with the package's version, as the manifests name it.
# Build arguments pass on: make image DOCKER_BUILD_ARGS='--build-arg DCGM_PACKAGE=...'
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
image:
	docker build -f deploy/container/Dockerfile -t rankscope:$(VERSION) $(DOCKER_BUILD_ARGS) .

# Take the newest releases pyproject admits into constraints.txt (then run make test).
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q -e $(EXTRAS)
	{ echo '# make lock wrote this: the versions make test and make demo install (pip -c).'; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed 's/+[a-z0-9.]*$$//'; } > $(LOCK)
	rm -rf .venv-lock

clean:
	rm -rf $(VENV) .venv-hta build *.egg-info
