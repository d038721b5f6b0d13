# Flywheel: `make up` runs it on the embedded default, `make test` runs the whole suite.
# With DATABASE_URL and REDIS_URL set, both use that PostgreSQL and that Redis instead.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed-$(shell cat requirements.txt requirements-cookbook.txt client/pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: up down demo test lint docs docs-serve format fuzz bench venv browser-deps screenshots sandbox-deps sandbox-image sandbox-image-pytest sandbox-check bench-sandbox bench-rewards bench-runs bench-live bench-learner bench-learner-processes bench-lora gpu-check gpu-wheels bench-tiers bench-api bench-traces bench-agents bench-agent-lift demo-flywheel demo-hack bench-all hosts-deps test-hosts bench-tinker bench-estimate bench-sweep verifiers-venv

venv: $(INSTALLED)

$(INSTALLED): requirements.txt requirements-cookbook.txt client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-cookbook.txt
	rm -f $(VENV)/.installed-* && touch $@

# `flywheel env` (verifiers environments against runs) from a virtualenv of its own: verifiers pins
# openai and mcp apart from the server. Pinned whole, installed without resolving; the client editable.
VERIFIERS_VENV := .venv-verifiers
VERIFIERS_INSTALLED := $(VERIFIERS_VENV)/.installed-$(shell cat requirements-verifiers.txt client/pyproject.toml | sha1sum | cut -c1-12)

verifiers-venv: $(VERIFIERS_INSTALLED)

$(VERIFIERS_INSTALLED): requirements-verifiers.txt client/pyproject.toml
	test -x $(VERIFIERS_VENV)/bin/python || $(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/pip install --quiet --no-deps -r requirements-verifiers.txt
	$(VERIFIERS_VENV)/bin/pip install --quiet --no-deps -e ./client
	$(VERIFIERS_VENV)/bin/pip check
	rm -f $(VERIFIERS_VENV)/.installed-* && touch $@

up: venv
	$(PY) manage.py flywheel_up

down: venv
	$(PY) manage.py flywheel_down

# The GRPO demo on the demo project, followed to the end (make up first).
demo: up
	$(PY) manage.py launch_demo

# The flywheel on the demo project: GRPO, a scripted style reviewer's labels, Train on reviews and its
# control, the held-out lift over the control (make up first; prints one line of JSON last).
demo-flywheel: up
	$(PY) manage.py demo_flywheel

# A reward hack caught live: GRPO against a planted hackable rule; a monitor alerts and pauses it.
demo-hack: up
	$(PY) manage.py demo_hack

# Debian's Chromium for the browser tests; Playwright never downloads a browser here.
browser-deps:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "browser tests need Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; fi; }

# Debian's bubblewrap and docker.io, and a Docker engine answering (dockerd started in the
# background if none answers).
sandbox-deps:
	scripts/sandbox-deps.sh

# The default Docker sandbox image, built locally from this host's Debian packages (no registry).
sandbox-image: sandbox-deps
	scripts/build-sandbox-image.sh

# The same, with pytest: the image that code items whose tests pytest runs name (`sandbox.image`).
sandbox-image-pytest: sandbox-deps
	scripts/build-sandbox-image.sh flywheel-sandbox:pytest python3-pytest

sandbox-check: venv sandbox-image
	$(PY) manage.py check_sandboxes --backend all

# pytest exits 5 when it collected no test: a suite that ran nothing must not pass.
test: venv browser-deps sandbox-image sandbox-image-pytest
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# iproute2 and socat, what `make test-hosts` simulates hosts with (network namespaces, relays).
hosts-deps:
	@command -v ip >/dev/null && command -v socat >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 socat >/dev/null; \
	  else echo "make test-hosts needs root, iproute2 and socat" >&2; exit 1; fi; }

# Many hosts on this machine (root): web + scheduler, learner, rollout + eval hosts in network
# namespaces, a GRPO run across them, a rollout host killed and replaced mid-run, the same run on
# one host for comparison, and a rollout worker grading through a remote Docker engine over TLS.
# On DATABASE_URL / REDIS_URL when set, like `make test`. Not part of `make test`.
test-hosts: venv hosts-deps sandbox-image
	$(PY) -m pytest -q -p no:cacheprovider -o python_files=scale_out.py tests/scale_out.py $(PYTEST_ARGS)

# Screenshots of the run, compare, trajectory and review-queue pages at 1,280 and 1,920 px, light
# and dark, into docs/screenshots/ (made-up data in the test database; headless Chromium).
screenshots: venv browser-deps
	$(PY) -m pytest -q -p no:cacheprovider -o python_files=screenshots.py tests/screenshots.py

# The documentation site (MkDocs Material) from docs/, with the REST reference generated from the
# OpenAPI schema; strict, so a broken link, a missing anchor or a page outside the navigation fails.
docs: venv
	$(PY) scripts/api_reference.py docs/reference/api.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@echo "the site is in site/ (open site/index.html)"

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The REST API fuzzed from its live schema (schemathesis) on a fresh embedded Flywheel, with a
# launcher's token; fails on any 5xx or answer outside the schema. FUZZ_MAX_EXAMPLES,
# FUZZ_MAX_SECONDS and FUZZ_SEED bound and reproduce it.
fuzz: venv
	$(PY) scripts/fuzz_api.py

# Benchmarks are not tests: each prints its figures as one line of JSON at the end.
bench: venv
	$(PY) benchmarks/bench_import.py

bench-sandbox: venv sandbox-image
	$(PY) benchmarks/bench_sandbox.py

bench-rewards: venv sandbox-image
	$(PY) benchmarks/bench_rewards.py

bench-runs: venv sandbox-deps
	$(PY) benchmarks/bench_runs.py

bench-api: venv
	$(PY) benchmarks/bench_api.py

# The same-batch comparisons: 64 held-out items, 3 repeats, about 6 minutes here (the script's own
# defaults, 160 items x 10 tiers with the model.generate baseline, take far longer on 2 cores).
BENCH_TIERS_ARGS ?= --heldout 64 --max-new-tokens 32 --repeats 3 --no-generate \
	--only capability,b1-prompt-lookup,b1-draft,b16,b16-prompt-lookup,speed
bench-tiers: venv sandbox-deps
	$(PY) benchmarks/bench_tiers.py $(BENCH_TIERS_ARGS)

# The peer is MLflow's trace ingestion (OTLP batches), from the venv bench-live uses.
bench-traces: venv
	test -x $(MLFLOW_VENV)/bin/python || { python3 -m venv $(MLFLOW_VENV) && $(MLFLOW_VENV)/bin/pip install --quiet mlflow==3.17.2; }
	MLFLOW_PYTHON=$(MLFLOW_VENV)/bin/python $(PY) benchmarks/bench_traces.py

bench-lora: venv sandbox-image
	$(PY) benchmarks/bench_lora.py

# On a CUDA machine: a ~0.5B random-init Qwen2 in bf16: the decoder against HF generate, the speed
# tier, the learner (full and LoRA: samples/s, MFU, peak memory), a GRPO run through real workers
# (one JSON line). A bare GPU host has no .venv: after `sh .gpu-wheels/install.sh` it runs python3.12.
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(shell command -v python3.12 || command -v python3))
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py

# For a GPU host with only Python 3.12 and its ML stack: Flywheel's runtime as CPython 3.12 wheels in
# .gpu-wheels/ (under 64 MiB, with an offline install.sh), at the versions this venv tested.
gpu-wheels: venv
	$(PY) scripts/gpu_wheels.py

bench-learner: venv sandbox-image
	$(PY) benchmarks/bench_learner.py

# A run's learner on 2 processes (accelerate launch, DDP over gloo) against 1, same global batch.
bench-learner-processes: venv
	$(PY) benchmarks/bench_learner_processes.py

# Agent episodes: KV-cache reuse across turns vs re-encoding, one sequence per episode vs rows per turn.
bench-agents: venv
	$(PY) benchmarks/bench_agents.py

# Agents that learn: the tiny base taught the tool-call protocol (short SFT), then GRPO through the
# real workers; held-out pass rate, invalid actions and steps before and after, two transcripts.
bench-agent-lift: venv sandbox-deps
	$(PY) benchmarks/bench_agent_lift.py

# The Tinker API's cost to a training loop: the official client through a live server against the
# same loop in one process (trained tokens/s), and its sampling against the rollout decoder's.
bench-tinker: venv
	$(PY) benchmarks/bench_tinker.py

# A run's estimate against what it then records: two tiers calibrated by short runs, three settings.
bench-estimate: venv sandbox-image
	$(PY) benchmarks/bench_estimate.py

# The issue's sweeps on real workers: lr x group size with ASHA against the default, and one recipe
# across three base models (their lift and cost).
bench-sweep: venv sandbox-image
	$(PY) benchmarks/bench_sweep.py

# MLflow is the baseline only: it lives in a venv of its own, never in the project's.
MLFLOW_VENV ?= /tmp/mlflow-venv
bench-live: venv
	test -x $(MLFLOW_VENV)/bin/python || { python3 -m venv $(MLFLOW_VENV) && $(MLFLOW_VENV)/bin/pip install --quiet mlflow==3.17.2; }
	$(PY) benchmarks/bench_live.py

# Every bench* target above, one after another; writes benchmarks/RESULTS.md from their JSON lines
# (BENCH_ONLY=bench-api,bench-traces for a subset; the other rows are kept).
bench-all: venv
	$(PY) benchmarks/bench_all.py
